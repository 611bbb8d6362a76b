//! TLS on a worker's connections: [`TlsSettings`] (a CA and this side's certificate) and
//! [`endpoint`], which dials an address with TLS when it should.
//!
//! With a certificate and a CA ([`TlsSettings::mutual`]) a worker's activation server asks
//! every peer for a certificate signed by that CA, and its peer clients present their own:
//! activations and collectives travel over mutual TLS. The coordinator is dialled with TLS
//! when its URL says `https://`, or names no scheme and a CA is given.

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use super::address::{grpc_uri, names_tls};
use crate::error::{Error, Result, with_causes};

/// The TLS material of a worker or client (PEM, read by the caller).
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// The CA that servers' (and, on a worker's activation server, peers') certificates are
    /// checked against. Without it a `https://` coordinator is checked against the
    /// system's roots.
    pub ca: Option<Certificate>,
    /// This side's certificate chain and key: presented to the coordinator (which may
    /// require one) and to peers, and served by the activation server.
    pub identity: Option<Identity>,
}

impl TlsSettings {
    /// Whether peers speak mutual TLS: this side has both a certificate and a CA.
    pub fn mutual(&self) -> bool {
        self.ca.is_some() && self.identity.is_some()
    }

    /// The activation server's TLS: this side's certificate, every client's checked
    /// against the CA; `None` unless [`TlsSettings::mutual`].
    pub(crate) fn server(&self) -> Option<ServerTlsConfig> {
        let (ca, identity) = (self.ca.clone()?, self.identity.clone()?);
        Some(ServerTlsConfig::new().identity(identity).client_ca_root(ca))
    }

    fn client(&self) -> ClientTlsConfig {
        let config = match &self.ca {
            Some(ca) => ClientTlsConfig::new().ca_certificate(ca.clone()),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        match &self.identity {
            Some(identity) => config.identity(identity.clone()),
            None => config,
        }
    }
}

/// What an [`endpoint`] dials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dial {
    /// The coordinator: TLS when the URL says `https://`, or names no scheme and a CA is
    /// given.
    Coordinator,
    /// A peer's activation or collective service: TLS exactly when
    /// [`TlsSettings::mutual`].
    Peer,
}

/// The endpoint of `address` (`host:port`, `http://…` or `https://…`), with `settings`'
/// TLS when `dial` says it is spoken there; `what` names it in errors.
pub fn endpoint(address: &str, settings: &TlsSettings, dial: Dial, what: &str) -> Result<Endpoint> {
    let tls = match dial {
        // An explicit http:// with a CA given is a contradiction: refused by `grpc_uri`.
        Dial::Coordinator => match names_tls(address) {
            Some(named) => named || settings.ca.is_some(),
            None => settings.ca.is_some(),
        },
        Dial::Peer => settings.mutual(),
    };
    let uri = grpc_uri(address, tls)?;
    let endpoint = Endpoint::from_shared(uri).map_err(|e| Error::Address {
        address: address.to_string(),
        reason: e.to_string(),
    })?;
    if !tls {
        return Ok(endpoint);
    }
    endpoint
        .tls_config(settings.client())
        .map_err(|e| Error::Tls {
            what: what.to_string(),
            reason: with_causes(&e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_speak_tls_only_with_a_certificate_and_a_ca() {
        let plain = TlsSettings::default();
        assert!(!plain.mutual() && plain.server().is_none());
        let ok = endpoint("127.0.0.1:5", &plain, Dial::Peer, "peer 1").expect("plain");
        assert_eq!(ok.uri().scheme_str(), Some("http"));
        let err = endpoint("https://127.0.0.1:5", &plain, Dial::Peer, "peer 1")
            .expect_err("no TLS here")
            .to_string();
        assert!(
            err.contains("https:// is not supported without TLS"),
            "{err}"
        );
        let ca_only = TlsSettings {
            ca: Some(Certificate::from_pem("not read until a connection")),
            identity: None,
        };
        assert!(!ca_only.mutual());
    }

    #[test]
    fn the_coordinator_is_dialled_with_tls_when_its_url_or_a_ca_says_so() {
        let plain = TlsSettings::default();
        let uri = |e: Endpoint| e.uri().to_string();
        let e = endpoint("https://coordinator:443", &plain, Dial::Coordinator, "c").expect("roots");
        assert_eq!(uri(e), "https://coordinator:443/");
        let e = endpoint("coordinator:1", &plain, Dial::Coordinator, "c").expect("plain");
        assert_eq!(uri(e), "http://coordinator:1/");
        let err = endpoint(
            "http://coordinator:1",
            &TlsSettings {
                ca: Some(Certificate::from_pem("x")),
                identity: None,
            },
            Dial::Coordinator,
            "c",
        )
        .expect_err("CA given, plain URL")
        .to_string();
        assert!(err.contains("where TLS is on"), "{err}");
    }
}
