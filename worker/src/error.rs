//! The one error type of `pipewise-worker`, and how the gRPC edge reports it
//! ([`Error::code`], `From<Error> for tonic::Status`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong in stage compute, data loading, checkpoints, the transport
/// and the coordinator connection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // === Wrapped errors ===
    /// A tensor operation failed (shapes, dtypes, device).
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model spec (or another planning-core input) is invalid.
    #[error(transparent)]
    Spec(#[from] pipewise_common::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    // === Input errors ===
    /// An argument, a received frame or an assignment is out of range or inconsistent.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The offending field or argument.
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// An address cannot be dialled: a scheme other than `http://`, no host, a port past
    /// 65535 or a path.
    #[error("{address:?}: {reason}")]
    Address {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: String,
    },

    // === Data errors ===
    /// Training data or its tokenizer that cannot be used: a JSON Lines line without a
    /// `text` string, a token id past the vocabulary, fewer tokens than one window, text
    /// that is not UTF-8, a tokenizer larger than the model's vocabulary.
    #[error(
        "invalid {field}: {}{}: {reason}",
        path.display(),
        line.map(|l| format!(":{l}")).unwrap_or_default()
    )]
    Data {
        /// The job field that chose the file (`data.path`, `data.tokenizer`).
        field: &'static str,
        /// The file (or folder).
        path: PathBuf,
        /// The line of a line-by-line file, from 1.
        line: Option<u64>,
        /// What is wrong.
        reason: String,
    },

    // === Pass-order errors ===
    /// A pass came in an order the stage cannot serve (e.g. `B` before `F`, `W` before `B`,
    /// `F` twice for one microbatch).
    #[error("stage {stage}: {pass} of microbatch {mb}: {reason}")]
    PassOrder {
        /// The stage's piece range, as text (`block0..head`).
        stage: String,
        /// The pass (`F`, `B`, `W`).
        pass: &'static str,
        /// The microbatch.
        mb: u32,
        /// What is missing or already there.
        reason: String,
    },

    // === Transport and collective errors ===
    /// What a worker waited for (a peer's frame, the other workers, worker 0's answer) did
    /// not come in time.
    #[error("{awaited}: timed out after {:.3} s", after.as_secs_f64())]
    Timeout {
        /// What was awaited, and by whom.
        awaited: String,
        /// How long it was waited for.
        after: Duration,
    },
    /// What a worker waited for can no longer come: the transport, the in-process network
    /// or the collectives were closed (the run abandoned, a worker stopped, the transport
    /// dropped).
    #[error("{awaited}: {reason}")]
    Closed {
        /// What was awaited or sent, and by whom.
        awaited: String,
        /// Why it was closed.
        reason: String,
    },
    /// The activation service cannot listen at `address`.
    #[error("cannot bind {address}: {source}")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A gRPC call to a peer (worker 0's collectives) ended with status `code`.
    #[error("{call}: {code:?}: {message}")]
    Call {
        /// The call (`start barrier`, `step 3 SqNorm`).
        call: String,
        /// The peer's address.
        peer: String,
        /// The status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// A thread or async runtime the worker needs cannot be started.
    #[error("cannot start {what}: {source}")]
    Start {
        /// What (`the executor thread`).
        what: &'static str,
        /// The underlying error.
        source: std::io::Error,
    },

    /// The coordinator cannot be reached or refused this worker.
    #[error("coordinator: {0}")]
    Coordinator(String),

    /// TLS settings (a certificate, key or CA) that the TLS library refuses.
    #[error("TLS for {what}: {reason}")]
    Tls {
        /// Which connection or server (`the activation server`, `peer 2`).
        what: String,
        /// The library's reason, with its causes.
        reason: String,
    },

    /// A frame or collective call without the run's secret (a process that has not been
    /// given the run's assignment).
    #[error("{field}: not the run's secret")]
    RunSecret {
        /// The field (`TensorFrame.run_secret`, `ReduceRequest.run_secret`).
        field: &'static str,
    },

    // === Checkpoint errors ===
    /// A checkpoint does not fit the stage it is loaded into.
    #[error("checkpoint {}: {reason}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// A path a job field chose leads through a symlink below the data directory when it
    /// is used (one swapped in after the job's paths were checked).
    #[error(
        "invalid {field}: {} is a symlink; refusing to follow it out of the data directory",
        path.display()
    )]
    Confined {
        /// The job field (`checkpoint.folder`, `data.path`).
        field: &'static str,
        /// The symlink.
        path: PathBuf,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] on `field`.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    /// The gRPC status code that says what went wrong: bad input is `InvalidArgument`, a
    /// timeout `DeadlineExceeded`, a closed transport or an unreachable peer `Unavailable`,
    /// a failed call its own code.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Error::Spec(_)
            | Error::InvalidArgument { .. }
            | Error::Address { .. }
            | Error::Data { .. } => Code::InvalidArgument,
            Error::PassOrder { .. } | Error::Checkpoint { .. } | Error::Confined { .. } => {
                Code::FailedPrecondition
            }
            Error::Timeout { .. } => Code::DeadlineExceeded,
            Error::Closed { .. } | Error::Bind { .. } | Error::Coordinator(_) => Code::Unavailable,
            Error::Call { code, .. } => *code,
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                Code::NotFound
            }
            Error::RunSecret { .. } => Code::PermissionDenied,
            Error::Candle(_) | Error::Io { .. } | Error::Start { .. } | Error::Tls { .. } => {
                Code::Internal
            }
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// Convenient alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes, `: `-separated, without a cause the text before already ends
/// with: an error may say only "transport error", and some libraries' errors repeat their
/// source's text (tonic's transport errors printed "tcp connect error" twice).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.ends_with(&next) {
            text = format!("{text}: {next}");
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Error;

    /// Each failure reaches a gRPC caller with the code that fits it, its text intact.
    #[test]
    fn the_grpc_edge_maps_each_failure_to_its_code() {
        use tonic::Code;
        let timeout = Error::Timeout {
            awaited: "worker 1 waiting for the activation of stage 1 microbatch 0".into(),
            after: Duration::from_millis(200),
        };
        let closed = Error::Closed {
            awaited: "send to worker 2".into(),
            reason: "the transport is closed (worker 2 failed)".into(),
        };
        let bind = Error::Bind {
            address: ([127, 0, 0, 1], 1).into(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let call = Error::Call {
            call: "start barrier".into(),
            peer: "127.0.0.1:5000".into(),
            code: Code::Aborted,
            message: "job 7 was aborted by the coordinator".into(),
        };
        for (e, code, says) in [
            (timeout, Code::DeadlineExceeded, "timed out after 0.200 s"),
            (
                closed,
                Code::Unavailable,
                "send to worker 2: the transport is closed",
            ),
            (bind, Code::Unavailable, "cannot bind 127.0.0.1:1"),
            (call, Code::Aborted, "start barrier: Aborted: job 7"),
            (
                Error::invalid(
                    "frame",
                    "the activation is [2, 8] F32, expected [2, 16] F32",
                ),
                Code::InvalidArgument,
                "invalid frame: the activation",
            ),
        ] {
            let status = tonic::Status::from(e);
            assert_eq!(status.code(), code, "{status:?}");
            assert!(status.message().contains(says), "{status:?}");
        }
    }
}
