//! The security flags: a client's or worker's TLS and token ([`ClientAuth`],
//! [`WorkerTls`]) and a coordinator's ([`CoordinatorSecurity`]), with the files they name
//! read and checked here (see docs/security.md).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pipewise_coordinator::security::{Security, ServerTls, Tokens};
use pipewise_proto::auth::BearerToken;
use pipewise_worker::net::TlsSettings;
use tonic::transport::{Certificate, Identity};

use crate::text_file::read_text;

/// The environment variable a client's or worker's token comes from without `--token-file`.
pub(crate) const TOKEN_ENV: &str = "PIPEWISE_TOKEN";

/// The largest certificate, key or token file read.
const MAX_FILE: u64 = 1 << 20;

/// How a client or worker proves itself to the coordinator and checks it.
#[derive(Debug, Args)]
pub(crate) struct ClientAuth {
    /// CA certificate (PEM) that the coordinator's certificate is checked against; with
    /// it, a `host:port` coordinator is dialled with TLS (an `https://` one without it is
    /// checked against the system's roots).
    #[arg(long, value_name = "PEM")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// File whose first line is the token sent to the coordinator (default: the
    /// PIPEWISE_TOKEN environment variable, if set).
    #[arg(long, value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
}

impl ClientAuth {
    /// The token to send: `--token-file`'s, else `PIPEWISE_TOKEN`'s, else none.
    pub(crate) fn token(&self) -> Result<BearerToken> {
        let token = match &self.token_file {
            Some(path) => Some(read_token(path, "--token-file")?),
            None => match std::env::var(TOKEN_ENV) {
                Ok(value) => Some(value.trim().to_string()),
                Err(std::env::VarError::NotPresent) => None,
                Err(std::env::VarError::NotUnicode(_)) => bail!("{TOKEN_ENV} is not UTF-8"),
            },
        };
        match token {
            Some(t) => BearerToken::new(&t).with_context(|| {
                self.token_file.as_ref().map_or(TOKEN_ENV.into(), |p| {
                    format!("--token-file {}", p.display())
                })
            }),
            None => Ok(BearerToken::none()),
        }
    }

    /// The CA, if given (no certificate of this side: clients need none).
    pub(crate) fn tls(&self) -> Result<TlsSettings> {
        Ok(TlsSettings {
            ca: self
                .tls_ca
                .as_deref()
                .map(|p| read_pem(p, "--tls-ca", PemKind::Certificate).map(Certificate::from_pem))
                .transpose()?,
            identity: None,
        })
    }
}

/// A worker's certificate, presented to the coordinator and used for mutual TLS with its
/// peers.
#[derive(Debug, Args)]
pub(crate) struct WorkerTls {
    /// This worker's certificate chain (PEM): presented to the coordinator and to peers,
    /// and served by its activation service; peers then speak mutual TLS, checked against
    /// --tls-ca.
    #[arg(long, value_name = "PEM", requires_all = ["tls_key", "tls_ca"])]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
}

impl WorkerTls {
    /// `auth`'s CA with this worker's certificate.
    pub(crate) fn settings(&self, auth: &ClientAuth) -> Result<TlsSettings> {
        let mut settings = auth.tls()?;
        settings.identity = identity(self.tls_cert.as_deref(), self.tls_key.as_deref())?;
        Ok(settings)
    }
}

/// A coordinator's TLS and tokens.
#[derive(Debug, Args)]
pub(crate) struct CoordinatorSecurity {
    /// The coordinator's certificate chain (PEM): its port then speaks TLS only.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// CA certificate (PEM) that must sign every worker's client certificate (clients of
    /// the job API need none).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub(crate) tls_client_ca: Option<PathBuf>,
    /// File whose first line is the token of the job API (submit, status, watch, cancel,
    /// trace); without it that API is open.
    #[arg(long, value_name = "FILE")]
    pub(crate) submitter_token_file: Option<PathBuf>,
    /// File whose first line is the token of the cluster API (workers); without it that
    /// API is open.
    #[arg(long, value_name = "FILE")]
    pub(crate) worker_token_file: Option<PathBuf>,
}

impl CoordinatorSecurity {
    /// The files read into the coordinator's [`Security`].
    pub(crate) fn load(&self) -> Result<Security> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls {
                cert_pem: read_pem(cert, "--tls-cert", PemKind::Certificate)?.into_bytes(),
                key_pem: read_pem(key, "--tls-key", PemKind::Key)?.into_bytes(),
                client_ca_pem: self
                    .tls_client_ca
                    .as_deref()
                    .map(|p| read_pem(p, "--tls-client-ca", PemKind::Certificate))
                    .transpose()?
                    .map(String::into_bytes),
            }),
            _ => None,
        };
        let token =
            |path: &Option<PathBuf>, flag| path.as_deref().map(|p| read_token(p, flag)).transpose();
        let tokens = Tokens {
            submitter: token(&self.submitter_token_file, "--submitter-token-file")?,
            worker: token(&self.worker_token_file, "--worker-token-file")?,
        };
        if tokens.submitter.is_some() && tokens.submitter == tokens.worker {
            bail!(
                "--submitter-token-file and --worker-token-file hold the same token: give \
                 each role its own"
            );
        }
        Ok(Security { tls, tokens })
    }
}

/// Says at start-up how the coordinator is guarded, and warns when it is open.
pub(crate) fn log_start(security: &Security) {
    if security.is_open() {
        tracing::warn!(
            "the coordinator is open: no TLS and no tokens, so anyone who reaches its port \
             can submit or cancel jobs and register workers (see docs/security.md)"
        );
    } else {
        tracing::info!("coordinator security: {}", security.describe());
    }
}

/// A certificate and its key as an identity, when both are given.
fn identity(cert: Option<&Path>, key: Option<&Path>) -> Result<Option<Identity>> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(Identity::from_pem(
            read_pem(cert, "--tls-cert", PemKind::Certificate)?,
            read_pem(key, "--tls-key", PemKind::Key)?,
        ))),
        _ => Ok(None),
    }
}

/// What a PEM file must hold.
#[derive(Debug, Clone, Copy)]
enum PemKind {
    Certificate,
    Key,
}

/// Reads a PEM file, refused (naming `flag`) when it holds no block of `kind`: the TLS
/// library would say only that a handshake failed.
fn read_pem(path: &Path, flag: &str, kind: PemKind) -> Result<String> {
    let text = read_text(path, MAX_FILE).with_context(|| flag.to_string())?;
    let found = match kind {
        PemKind::Certificate => text.contains("-----BEGIN CERTIFICATE-----"),
        PemKind::Key => text
            .lines()
            .any(|l| l.starts_with("-----BEGIN ") && l.ends_with("PRIVATE KEY-----")),
    };
    if !found {
        let what = match kind {
            PemKind::Certificate => "a PEM certificate (-----BEGIN CERTIFICATE-----)",
            PemKind::Key => "a PEM private key (-----BEGIN ... PRIVATE KEY-----)",
        };
        bail!("{flag} {}: holds no {what}", path.display());
    }
    Ok(text)
}

/// A token file's first line, trimmed; an empty one is refused (the token itself never
/// appears in a message).
fn read_token(path: &Path, flag: &str) -> Result<String> {
    let text = read_text(path, MAX_FILE).with_context(|| flag.to_string())?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        bail!("{flag} {}: the first line is empty", path.display());
    }
    BearerToken::new(&token).with_context(|| format!("{flag} {}", path.display()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("written");
        path
    }

    #[test]
    fn a_token_is_the_first_line_trimmed_and_bad_ones_are_named() {
        let dir = std::env::temp_dir().join(format!("pipewise-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let good = file(&dir, "good", "  abc123  \nignored\n");
        assert_eq!(
            read_token(&good, "--token-file").ok().as_deref(),
            Some("abc123")
        );
        for (name, text, says) in [
            ("empty", "\n", "the first line is empty"),
            ("spaced", "two words\n", "visible ASCII"),
        ] {
            let err = read_token(&file(&dir, name, text), "--worker-token-file").expect_err(name);
            let text = format!("{err:#}");
            assert!(
                text.contains("--worker-token-file") && text.contains(says),
                "{text}"
            );
        }
        let err = read_pem(&good, "--tls-ca", PemKind::Certificate).expect_err("no PEM");
        assert!(format!("{err:#}").contains("--tls-ca"), "{err:#}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
