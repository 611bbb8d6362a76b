//! Credentials on the wire: the bearer token a client or worker sends in the
//! `authorization` metadata ([`BearerToken`], [`bearer_of`]), and the fixed-time comparison
//! every token and run secret is checked with ([`same_secret`]).

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;

use crate::ConvertError;

/// The metadata key that carries the token (`authorization: Bearer <token>`).
pub const AUTHORIZATION: &str = "authorization";

/// The longest token accepted (a token file's first line).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// A client interceptor that adds `authorization: Bearer <token>` to every call (none
/// without a token). Its `Debug` form never shows the token.
#[derive(Clone, Default)]
pub struct BearerToken(Option<AsciiMetadataValue>);

impl BearerToken {
    /// Sends `token`, which must be 1 to [`MAX_TOKEN_BYTES`] visible ASCII characters.
    pub fn new(token: &str) -> Result<Self, ConvertError> {
        let bad = |reason: &str| ConvertError::Invalid {
            field: "token",
            reason: reason.to_string(),
        };
        if token.is_empty() {
            return Err(bad("is empty"));
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(bad(&format!("is longer than {MAX_TOKEN_BYTES} bytes")));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("must be visible ASCII characters (no spaces)"));
        }
        let value = AsciiMetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| bad("is not a valid header value"))?;
        Ok(BearerToken(Some(value)))
    }

    /// Sends no token.
    pub fn none() -> Self {
        BearerToken(None)
    }
}

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = if self.0.is_some() { "set" } else { "none" };
        write!(f, "BearerToken({set})")
    }
}

impl Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

/// The token of a call's `authorization: Bearer <token>` metadata, if it has one.
pub fn bearer_of(metadata: &MetadataMap) -> Option<&[u8]> {
    let value = metadata.get(AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then_some(token)
        .filter(|t| !t.is_empty())
}

/// Whether `a` and `b` are equal, in a time that depends on their lengths only (not on
/// where they first differ), so a guesser learns nothing from how long a refusal takes.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keeps the compiler from ending the loop at the first difference.
    std::hint::black_box(diff) == 0
}

/// Whether a TLS alert says the peer refused this side's certificate (not signed by a CA it
/// trusts, expired, revoked, not for this use, or not allowed in): the coordinator counts a
/// client's such alert as its own certificate refused, and a client reports the server's.
pub fn refuses_certificate(alert: tokio_rustls::rustls::AlertDescription) -> bool {
    use tokio_rustls::rustls::AlertDescription as A;
    matches!(
        alert,
        A::BadCertificate
            | A::UnknownCA
            | A::DecryptError
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::AccessDenied
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_out_as_a_bearer_header_and_reads_back() {
        let mut token = BearerToken::new("s3cret-Token_1").expect("valid");
        assert_eq!(format!("{token:?}"), "BearerToken(set)");
        let request = token.call(tonic::Request::new(())).expect("added");
        assert_eq!(bearer_of(request.metadata()), Some(&b"s3cret-Token_1"[..]));
        let request = BearerToken::none()
            .call(tonic::Request::new(()))
            .expect("nothing added");
        assert_eq!(bearer_of(request.metadata()), None);
    }

    #[test]
    fn bad_tokens_are_refused_by_name() {
        for (bad, says) in [
            ("", "empty"),
            ("two words", "visible ASCII"),
            ("caf\u{e9}", "visible ASCII"),
            (&"x".repeat(MAX_TOKEN_BYTES + 1), "longer than"),
        ] {
            let err = BearerToken::new(bad).expect_err(bad).to_string();
            assert!(err.starts_with("token: ") && err.contains(says), "{err}");
        }
    }

    #[test]
    fn other_schemes_carry_no_token() {
        let mut metadata = MetadataMap::new();
        for value in ["Basic abc", "Bearer ", "Bearer", "bearer tok"] {
            metadata.insert(AUTHORIZATION, value.parse().expect("ascii"));
            let expected = (value == "bearer tok").then_some(&b"tok"[..]);
            assert_eq!(bearer_of(&metadata), expected, "{value}");
        }
    }

    #[test]
    fn secrets_compare_by_every_byte() {
        assert!(same_secret(b"abcd", b"abcd"));
        assert!(!same_secret(b"abcd", b"abce"));
        assert!(!same_secret(b"abcd", b"xbcd"));
        assert!(!same_secret(b"abc", b"abcd"));
        assert!(same_secret(b"", b""));
    }
}
