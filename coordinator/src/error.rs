//! The coordinator's one error type, turned into a `tonic::Status` only at the gRPC edge.

/// Everything that can go wrong in the coordinator.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    /// The planning core refused the input (bad job spec, infeasible plan).
    #[error(transparent)]
    Plan(#[from] pipewise_common::Error),
    /// The durable job store failed.
    #[error("job store: {0}")]
    Store(String),
    /// No job with this id.
    #[error("job {0} not found")]
    NotFound(u64),
    /// A request field is invalid.
    #[error("invalid {field}: {reason}")]
    BadRequest {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A worker registers under the id of another worker that is alive.
    #[error(
        "worker_id: {id:?} is in use by the worker at {address} (last heartbeat {ago_s:.1} s \
         ago, assignment stream open); give this worker another id"
    )]
    InUse {
        /// The id.
        id: String,
        /// The address of the worker holding it.
        address: String,
        /// Seconds since that worker's last heartbeat.
        ago_s: f64,
    },
    /// A job's run failed (a worker's error, a loss that could not be re-planned, ...).
    #[error(transparent)]
    Run(#[from] pipewise_common::run::Failure),
    /// A job's output folder (its checkpoints) could not be created, read or cleared.
    #[error("cannot {action} {}: {source}", path.display())]
    Checkpoints {
        /// What was tried: create, read, remove.
        action: &'static str,
        /// The folder.
        path: std::path::PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A call without a valid credential (no token, a wrong one, no client certificate).
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid credential of a role this API does not take.
    #[error("{0}")]
    PermissionDenied(String),
    /// The TLS settings could not be used (a certificate or key the library refuses).
    #[error("TLS: {0}")]
    Tls(String),
    /// The system's random source gave no bytes (for the run secrets' key).
    #[error("no random bytes from the system for the run secrets' key")]
    NoRandomness,
    /// An actor could not be reached or failed.
    #[error("coordinator actor: {0}")]
    Actor(String),
}

/// Convenient alias.
pub type Result<T, E = CoordinatorError> = std::result::Result<T, E>;

impl From<CoordinatorError> for tonic::Status {
    fn from(e: CoordinatorError) -> tonic::Status {
        match &e {
            CoordinatorError::Plan(pipewise_common::Error::InvalidArgument { field, reason })
            | CoordinatorError::BadRequest { field, reason } => {
                tonic::Status::invalid_argument(format!("{field}: {reason}"))
            }
            CoordinatorError::Plan(other) => tonic::Status::invalid_argument(other.to_string()),
            CoordinatorError::NotFound(_) => tonic::Status::not_found(e.to_string()),
            CoordinatorError::InUse { .. } => tonic::Status::already_exists(e.to_string()),
            CoordinatorError::Unauthenticated(_) => tonic::Status::unauthenticated(e.to_string()),
            CoordinatorError::PermissionDenied(_) => {
                tonic::Status::permission_denied(e.to_string())
            }
            CoordinatorError::Store(_)
            | CoordinatorError::Actor(_)
            | CoordinatorError::Tls(_)
            | CoordinatorError::NoRandomness
            | CoordinatorError::Run(_)
            | CoordinatorError::Checkpoints { .. } => tonic::Status::internal(e.to_string()),
        }
    }
}

impl<T> From<ractor::RactorErr<T>> for CoordinatorError {
    fn from(e: ractor::RactorErr<T>) -> CoordinatorError {
        CoordinatorError::Actor(e.to_string())
    }
}

impl<T> From<ractor::MessagingErr<T>> for CoordinatorError {
    fn from(e: ractor::MessagingErr<T>) -> CoordinatorError {
        CoordinatorError::Actor(e.to_string())
    }
}
