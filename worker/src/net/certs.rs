//! Certificates for tests and small clusters ([`issue`]): a CA and the coordinator's and a
//! worker's certificates it signs (rcgen; ECDSA P-256 keys). `pipewise certs` writes them
//! to files; the transport benchmark uses them in memory.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::error::{Error, Result};

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// Its private key (keep it secret).
    pub key: String,
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem").finish_non_exhaustive()
    }
}

/// What [`issue`] makes.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The CA (its key signs more certificates).
    pub ca: Pem,
    /// The coordinator's certificate.
    pub coordinator: Pem,
    /// A worker's certificate (served to peers and presented as a client).
    pub worker: Pem,
    /// The names and addresses both leaf certificates hold.
    pub names: Vec<String>,
}

/// A fresh CA and, signed by it, a coordinator and a worker certificate valid from an hour
/// ago for `days` days, for `localhost`, `127.0.0.1`, `::1` and `hosts` (names, wildcards
/// such as `*.workers.ns.svc`, or IP addresses), usable both to serve and as clients.
pub fn issue(hosts: &[String], days: u32) -> Result<Issued> {
    let failed = |what: &str| {
        let what = what.to_string();
        move |e: rcgen::Error| Error::Tls {
            what: format!("the {what} certificate"),
            reason: e.to_string(),
        }
    };
    let now = time::OffsetDateTime::now_utc();
    let validity = |p: &mut CertificateParams| {
        // An hour back, so a clock a little behind still accepts them.
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::days(i64::from(days));
    };
    let ca_key = KeyPair::generate().map_err(failed("CA"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(failed("CA"))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.distinguished_name
        .push(DnType::CommonName, "pipewise CA");
    validity(&mut ca);
    let ca_pem = Pem {
        cert: ca.self_signed(&ca_key).map_err(failed("CA"))?.pem(),
        key: ca_key.serialize_pem(),
    };
    let issuer = Issuer::new(ca, ca_key);
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    names.extend(hosts.iter().cloned());
    let leaf = |role: &str| -> Result<Pem> {
        let key = KeyPair::generate().map_err(failed(role))?;
        let mut params = CertificateParams::new(names.clone()).map_err(failed(role))?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("pipewise {role}"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        validity(&mut params);
        let cert = params.signed_by(&key, &issuer).map_err(failed(role))?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    };
    Ok(Issued {
        ca: ca_pem,
        coordinator: leaf("coordinator")?,
        worker: leaf("worker")?,
        names,
    })
}

impl Pem {
    /// As a tonic identity (certificate and key).
    pub fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert, &self.key)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_host_name_is_refused_and_good_ones_are_named() {
        let issued =
            super::issue(&["coordinator.ns.svc".into(), "10.1.2.3".into()], 2).expect("issued");
        assert!(issued.ca.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.worker.key.contains("PRIVATE KEY-----"));
        assert_eq!(issued.names.len(), 5);
        assert_ne!(issued.coordinator.cert, issued.worker.cert);
        let err = super::issue(&["caf\u{e9}.example".into()], 1).expect_err("not ASCII");
        assert!(err.to_string().contains("certificate"), "{err}");
    }
}
