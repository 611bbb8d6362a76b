//! Who may call the coordinator: TLS on its port ([`ServerTls`]), tokens with roles
//! ([`Tokens`], checked on every call of a service by its [`Guard`]), and the per-run
//! secrets of activation frames ([`RunSecrets`]).
//!
//! Roles: the job API (`JobService`) takes the submitter token, the cluster API
//! (`ClusterService`: register, heartbeat, assignments, reports) the worker token. A call
//! without a token is `Unauthenticated`, and so is one with a token that is neither; the
//! other role's token is `PermissionDenied`. A role without a token file is open. With
//! `client_ca`, a worker must present a certificate that CA signed (a certificate from
//! another CA fails the TLS handshake; none at all is `Unauthenticated` on the cluster
//! API), while clients of the job API need none. Health and reflection stay open (probes).
//! Tokens are compared in fixed time and never logged. Every refusal goes to the
//! [`crate::audit`] trail (the handshakes' from [`crate::tls_accept`]).

use std::sync::Arc;

use pipewise_proto::auth::{bearer_of, same_secret};
use ring::hmac;
use tonic::metadata::MetadataMap;
use tonic::service::Interceptor;

use crate::audit::{Audit, Refusal};
use crate::error::{CoordinatorError, Result};

/// The coordinator's TLS: its certificate and key, and the CA that signs workers'
/// certificates (PEM).
#[derive(Clone)]
pub struct ServerTls {
    /// The certificate chain.
    pub cert_pem: Vec<u8>,
    /// Its private key.
    pub key_pem: Vec<u8>,
    /// When set, workers must present a certificate this CA signed.
    pub client_ca_pem: Option<Vec<u8>>,
}

/// The tokens of the two roles (a token file's first line, trimmed); `None`: that API is
/// open. The `Debug` form says only which are set.
#[derive(Clone, Default)]
pub struct Tokens {
    /// Taken by the job API.
    pub submitter: Option<String>,
    /// Taken by the cluster API.
    pub worker: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("submitter", &self.submitter.is_some())
            .field("worker", &self.worker.is_some())
            .finish()
    }
}

/// How a coordinator guards its port. The default is open: no TLS, no tokens.
#[derive(Clone, Default)]
pub struct Security {
    /// TLS on the port; `None`: plain text.
    pub tls: Option<ServerTls>,
    /// The roles' tokens.
    pub tokens: Tokens,
}

impl Security {
    /// Whether nothing is guarded (no TLS, no token).
    pub fn is_open(&self) -> bool {
        self.tls.is_none() && self.tokens.submitter.is_none() && self.tokens.worker.is_none()
    }

    /// One line for the start-up log: what is on (never a token).
    pub fn describe(&self) -> String {
        let tls = match &self.tls {
            None => "no TLS",
            Some(t) if t.client_ca_pem.is_some() => "TLS, workers need a client certificate",
            Some(_) => "TLS",
        };
        let role = |name: &str, token: &Option<String>| match token {
            Some(_) => format!("{name} token required"),
            None => format!("{name} API open"),
        };
        format!(
            "{tls}; {}; {}",
            role("submitter", &self.tokens.submitter),
            role("worker", &self.tokens.worker)
        )
    }

    pub(crate) fn guard(&self, role: Role, audit: &Arc<Audit>) -> Guard {
        Guard {
            tokens: Arc::new(self.tokens.clone()),
            audit: Arc::clone(audit),
            role,
            client_certificate: role == Role::Worker
                && self.tls.as_ref().is_some_and(|t| t.client_ca_pem.is_some()),
        }
    }
}

/// Which API a call is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The job API.
    Submitter,
    /// The cluster API.
    Worker,
}

impl Role {
    /// The role's name in messages and the audit log.
    pub fn name(self) -> &'static str {
        match self {
            Role::Submitter => "submitter",
            Role::Worker => "worker",
        }
    }
}

/// Checks every call of one service (a tonic interceptor).
#[derive(Clone)]
pub struct Guard {
    tokens: Arc<Tokens>,
    audit: Arc<Audit>,
    role: Role,
    client_certificate: bool,
}

impl Guard {
    /// Whether a call with `metadata`, from a peer that presented a certificate or not, may
    /// go on.
    pub fn check(&self, metadata: &MetadataMap, certified: bool) -> Result<()> {
        match self.refusal(metadata, certified) {
            None => Ok(()),
            Some(refusal) => Err(self.error(refusal)),
        }
    }

    /// Why a call is refused, if it is.
    fn refusal(&self, metadata: &MetadataMap, certified: bool) -> Option<Refusal> {
        if self.client_certificate && !certified {
            return Some(Refusal::NoClientCertificate);
        }
        let (mine, other) = match self.role {
            Role::Submitter => (&self.tokens.submitter, &self.tokens.worker),
            Role::Worker => (&self.tokens.worker, &self.tokens.submitter),
        };
        let expected = mine.as_ref()?;
        let Some(given) = bearer_of(metadata) else {
            return Some(Refusal::NoToken);
        };
        if same_secret(expected.as_bytes(), given) {
            return None;
        }
        if other
            .as_ref()
            .is_some_and(|t| same_secret(t.as_bytes(), given))
        {
            return Some(Refusal::WrongRole);
        }
        Some(Refusal::BadToken)
    }

    /// What the caller is told (no token in it: it is logged too).
    fn error(&self, refusal: Refusal) -> CoordinatorError {
        let role = self.role.name();
        match refusal {
            Refusal::NoClientCertificate => CoordinatorError::Unauthenticated(
                "the cluster API needs a client certificate signed by the coordinator's \
                 --tls-client-ca (give the worker --tls-cert and --tls-key)"
                    .into(),
            ),
            Refusal::NoToken => CoordinatorError::Unauthenticated(format!(
                "the {role} API needs a token (--token-file or PIPEWISE_TOKEN)"
            )),
            Refusal::WrongRole => {
                let other_role = match self.role {
                    Role::Submitter => Role::Worker,
                    Role::Worker => Role::Submitter,
                };
                CoordinatorError::PermissionDenied(format!(
                    "the {} token may not call the {role} API",
                    other_role.name()
                ))
            }
            // The handshake's refusals never reach a guard.
            _ => CoordinatorError::Unauthenticated(format!(
                "the token is not valid for the {role} API"
            )),
        }
    }
}

impl Interceptor for Guard {
    fn call(
        &mut self,
        request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        let certified = request.peer_certs().is_some_and(|c| !c.is_empty());
        match self.refusal(request.metadata(), certified) {
            None => Ok(request),
            Some(refusal) => {
                let error = self.error(refusal);
                self.audit.refused(
                    self.role.name(),
                    request.remote_addr(),
                    refusal,
                    &error.to_string(),
                );
                Err(error.into())
            }
        }
    }
}

/// The per-run secrets of activation frames: HMAC-SHA256 of the run id under a key drawn
/// at start, so every worker of a run gets the same secret and no run's tells another's.
pub struct RunSecrets {
    key: hmac::Key,
}

impl RunSecrets {
    /// A fresh key from the system's random source.
    pub fn new() -> Result<Self> {
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
            .map_err(|_| CoordinatorError::NoRandomness)?;
        Ok(RunSecrets { key })
    }

    /// The secret of run `run`.
    pub fn of(&self, run: u64) -> Vec<u8> {
        hmac::sign(&self.key, &run.to_le_bytes()).as_ref().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(token: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(t) = token {
            m.insert(
                "authorization",
                format!("Bearer {t}").parse().expect("ascii"),
            );
        }
        m
    }

    fn code(r: Result<()>) -> Option<tonic::Code> {
        r.err().map(|e| tonic::Status::from(e).code())
    }

    #[test]
    fn each_api_takes_its_role_token_only() {
        let security = Security {
            tls: None,
            tokens: Tokens {
                submitter: Some("sub-token".into()),
                worker: Some("work-token".into()),
            },
        };
        let audit = Arc::new(Audit::default());
        let jobs = security.guard(Role::Submitter, &audit);
        let cluster = security.guard(Role::Worker, &audit);
        use tonic::Code::{PermissionDenied, Unauthenticated};
        assert_eq!(code(jobs.check(&metadata(Some("sub-token")), false)), None);
        assert_eq!(
            code(cluster.check(&metadata(Some("work-token")), false)),
            None
        );
        assert_eq!(
            code(jobs.check(&metadata(None), false)),
            Some(Unauthenticated)
        );
        assert_eq!(
            code(jobs.check(&metadata(Some("work-token")), false)),
            Some(PermissionDenied)
        );
        assert_eq!(
            code(cluster.check(&metadata(Some("sub-token")), false)),
            Some(PermissionDenied)
        );
        assert_eq!(
            code(cluster.check(&metadata(Some("guess")), false)),
            Some(Unauthenticated)
        );
        assert!(!format!("{:?}", security.tokens).contains("token\""));
        assert!(!security.describe().contains("sub-token"));
    }

    #[test]
    fn an_open_coordinator_checks_nothing_and_says_so() {
        let open = Security::default();
        let audit = Arc::new(Audit::default());
        assert!(open.is_open());
        assert_eq!(
            open.describe(),
            "no TLS; submitter API open; worker API open"
        );
        assert_eq!(
            code(
                open.guard(Role::Worker, &audit)
                    .check(&metadata(None), false)
            ),
            None
        );
    }

    #[test]
    fn a_required_client_certificate_is_checked_on_the_cluster_api_only() {
        let security = Security {
            tls: Some(ServerTls {
                cert_pem: Vec::new(),
                key_pem: Vec::new(),
                client_ca_pem: Some(Vec::new()),
            }),
            tokens: Tokens::default(),
        };
        let none = metadata(None);
        let audit = Arc::new(Audit::default());
        assert_eq!(
            code(security.guard(Role::Worker, &audit).check(&none, false)),
            Some(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            code(security.guard(Role::Worker, &audit).check(&none, true)),
            None
        );
        assert_eq!(
            code(security.guard(Role::Submitter, &audit).check(&none, false)),
            None
        );
    }

    #[test]
    fn run_secrets_are_stable_per_run_and_differ_between_runs() -> Result<()> {
        let secrets = RunSecrets::new()?;
        assert_eq!(secrets.of(7), secrets.of(7));
        assert_eq!(secrets.of(7).len(), 32);
        assert_ne!(secrets.of(7), secrets.of(7 + (1 << 48)));
        assert_ne!(RunSecrets::new()?.of(7), secrets.of(7));
        Ok(())
    }
}
