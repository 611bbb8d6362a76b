//! Why a TLS connection failed: tonic says only "transport error" (or a broken pipe, or
//! "connection closed"), and the cause lies in its errors' sources: a rustls error inside
//! an `io::Error`, the text of a TLS alert the server sent (hyper keeps only its text), or
//! the coordinator's HTTP/2 GOAWAY to a plain-text client. [`tls_cause`] finds it and
//! [`TlsCause::explain`] names it with the flag that fixes it.

use std::error::Error as StdError;

use tokio_rustls::rustls::{self, AlertDescription, CertificateError};

/// The likely cause of a failed TLS connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsCause {
    /// Plain text was sent to a port that speaks TLS (the server said so).
    ExpectsTls,
    /// TLS was spoken to a port that does not (its answer is not a TLS record).
    NotTls,
    /// The server's certificate is not signed by the CA this side trusts.
    UnknownIssuer,
    /// The server's certificate is refused for another reason (expired, another name).
    BadServerCertificate,
    /// The server requires a client certificate and this side presented none.
    CertificateRequired,
    /// The server refused this side's client certificate (another CA signed it).
    CertificateRefused,
}

impl TlsCause {
    /// The cause, in a sentence about `server` (e.g. "the coordinator").
    pub fn explain(self, server: &str) -> String {
        match self {
            TlsCause::ExpectsTls => format!(
                "{server} speaks TLS on this port but this side dialled plain text: dial \
                 https:// and give --tls-ca"
            ),
            TlsCause::NotTls => format!(
                "{server} does not speak TLS on this port (its answer is not TLS): dial \
                 http:// without --tls-ca, or give {server} --tls-cert and --tls-key"
            ),
            TlsCause::UnknownIssuer => format!(
                "{server}'s certificate is not signed by the CA this side trusts (--tls-ca; \
                 the system's roots without it)"
            ),
            TlsCause::BadServerCertificate => format!(
                "{server}'s certificate is not valid here (expired, or it does not name the \
                 host dialled)"
            ),
            TlsCause::CertificateRequired => format!(
                "{server} requires a client certificate and this side presented none: give \
                 --tls-cert and --tls-key"
            ),
            TlsCause::CertificateRefused => format!(
                "{server} refused this side's client certificate: it is not signed by the CA \
                 {server} trusts (its --tls-client-ca), or has expired"
            ),
        }
    }
}

/// The TLS cause of `e`, found in it or its sources; `None` when none of them tells one
/// (the failure is not TLS's, or says nothing more).
pub fn tls_cause(e: &(dyn StdError + 'static)) -> Option<TlsCause> {
    let mut next = Some(e);
    while let Some(error) = next {
        if let Some(cause) = cause_of(error) {
            return Some(cause);
        }
        next = error.source();
    }
    None
}

/// `what`, preceded by the TLS cause of `e` when there is one.
pub fn with_tls_cause(e: &(dyn StdError + 'static), server: &str, what: String) -> String {
    match tls_cause(e) {
        Some(cause) => format!("{}: {what}", cause.explain(server)),
        None => what,
    }
}

/// What one error of a chain tells by itself.
fn cause_of(error: &(dyn StdError + 'static)) -> Option<TlsCause> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return of_rustls(tls);
    }
    if let Some(h2) = error.downcast_ref::<h2::Error>() {
        // Only the coordinator's answer to plain text: a GOAWAY for inadequate security.
        return (h2.is_go_away() && h2.reason() == Some(h2::Reason::INADEQUATE_SECURITY))
            .then_some(TlsCause::ExpectsTls);
    }
    // An `io::Error` gives its inner error as neither source nor by type: look inside.
    if let Some(inner) = error
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
    {
        if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
            return of_rustls(tls);
        }
        return of_alert_text(&inner.to_string());
    }
    of_alert_text(&error.to_string())
}

fn of_rustls(e: &rustls::Error) -> Option<TlsCause> {
    match e {
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => Some(TlsCause::UnknownIssuer),
        rustls::Error::InvalidCertificate(_) => Some(TlsCause::BadServerCertificate),
        rustls::Error::InvalidMessage(_) => Some(TlsCause::NotTls),
        rustls::Error::AlertReceived(alert) => of_alert(*alert),
        _ => None,
    }
}

/// An alert the server sent about this side's certificate. The alerts of TLS 1.3 client
/// authentication come after this side finished its handshake, in the first read, where
/// the HTTP/2 layer keeps only the rustls error's text.
fn of_alert(alert: AlertDescription) -> Option<TlsCause> {
    match alert {
        AlertDescription::CertificateRequired => Some(TlsCause::CertificateRequired),
        a if pipewise_proto::auth::refuses_certificate(a) => Some(TlsCause::CertificateRefused),
        _ => None,
    }
}

/// [`of_alert`] of a rustls "received fatal alert: X" text.
fn of_alert_text(text: &str) -> Option<TlsCause> {
    let (_, name) = text.split_once("received fatal alert: ")?;
    let name = name.split(|c: char| !c.is_ascii_alphanumeric()).next()?;
    let alert = [
        AlertDescription::CertificateRequired,
        AlertDescription::BadCertificate,
        AlertDescription::UnknownCA,
        AlertDescription::DecryptError,
        AlertDescription::CertificateUnknown,
        AlertDescription::UnsupportedCertificate,
        AlertDescription::CertificateExpired,
        AlertDescription::CertificateRevoked,
        AlertDescription::AccessDenied,
    ]
    .into_iter()
    .find(|a| format!("{a:?}") == name)?;
    of_alert(alert)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a source, as tonic's and hyper's are.
    #[derive(Debug)]
    struct Outer(Box<dyn StdError + Send + Sync>);

    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("transport error")
        }
    }

    impl StdError for Outer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    fn io(inner: impl Into<Box<dyn StdError + Send + Sync>>) -> Outer {
        Outer(Box::new(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            inner,
        )))
    }

    #[test]
    fn rustls_errors_alerts_and_the_goaway_name_their_cause() {
        let cases: [(Outer, Option<TlsCause>); 8] = [
            (
                io(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                Some(TlsCause::UnknownIssuer),
            ),
            (
                io(rustls::Error::InvalidCertificate(CertificateError::Expired)),
                Some(TlsCause::BadServerCertificate),
            ),
            (
                io(rustls::Error::InvalidMessage(
                    rustls::InvalidMessage::InvalidContentType,
                )),
                Some(TlsCause::NotTls),
            ),
            // hyper keeps only the text of an alert that came after the handshake.
            (
                io("received fatal alert: CertificateRequired"),
                Some(TlsCause::CertificateRequired),
            ),
            (
                io("received fatal alert: DecryptError"),
                Some(TlsCause::CertificateRefused),
            ),
            (io("received fatal alert: InternalError"), None),
            (
                Outer(Box::new(h2::Error::from(h2::Reason::INADEQUATE_SECURITY))),
                None,
            ),
            (io("stream closed because of a broken pipe"), None),
        ];
        for (error, cause) in cases {
            assert_eq!(tls_cause(&error), cause, "{error:?}");
        }
        let text = with_tls_cause(
            &io("received fatal alert: UnknownCA"),
            "the coordinator",
            "transport error".into(),
        );
        assert!(
            text.starts_with("the coordinator refused this side's client certificate")
                && text.ends_with(": transport error"),
            "{text}"
        );
    }
}
