//! The addresses pipewise dials: [`grpc_uri`] (and [`http_uri`], its plain-text form).

use crate::error::{Error, Result};

/// The `http://` URI of a gRPC address given as `host:port` or `http://host:port`
/// (`https://` is refused: this side speaks no TLS to it); see [`grpc_uri`].
pub fn http_uri(address: &str) -> Result<String> {
    grpc_uri(address, false)
}

/// Whether `address` names its scheme: `Some(true)` for `https://`, `Some(false)` for
/// `http://` (either case), `None` for a bare `host:port`.
pub fn names_tls(address: &str) -> Option<bool> {
    let (scheme, _) = address.split_once("://")?;
    if scheme.eq_ignore_ascii_case("https") {
        Some(true)
    } else if scheme.eq_ignore_ascii_case("http") {
        Some(false)
    } else {
        None
    }
}

/// The URI of a gRPC address given as `host:port`, `http://host:port` or
/// `https://host:port`, spoken to with TLS when `tls` says so: a bare `host:port` gets that
/// scheme, and a scheme that contradicts it is refused (plain text to a TLS port, or TLS
/// to a plain one, would fail later with a less clear error). Other schemes are refused,
/// and so is a port beyond 65535.
pub fn grpc_uri(address: &str, tls: bool) -> Result<String> {
    let bad = |reason: String| Error::Address {
        address: address.to_string(),
        reason,
    };
    let uri = match (address.split_once("://"), names_tls(address)) {
        (None, _) if tls => format!("https://{address}"),
        (None, _) => format!("http://{address}"),
        (Some(_), Some(named)) if named == tls => address.to_string(),
        (Some(_), Some(true)) => {
            return Err(bad("https:// is not supported without TLS settings here \
                            (a CA to check the server with: --tls-ca)"
                .into()));
        }
        (Some(_), Some(false)) => {
            return Err(bad(
                "http:// (plain text) where TLS is on; use https:// or host:port".into(),
            ));
        }
        (Some((scheme, _)), None) => {
            return Err(bad(format!(
                "{scheme}:// is not supported (http://host:port, https://host:port or \
                 host:port)"
            )));
        }
    };
    let parsed: http::Uri = uri
        .parse()
        .map_err(|e| bad(format!("not a host:port address: {e}")))?;
    let Some(authority) = parsed.authority() else {
        return Err(bad("no host named".into()));
    };
    // A port too large for 16 bits parses as no port at all.
    let port_text = authority
        .as_str()
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if port_text && authority.port_u16().is_none() {
        return Err(bad("the port must be at most 65535".into()));
    }
    // gRPC calls go to the root; a path would be dropped without a word (a path-routed
    // ingress would then answer for another service).
    if let Some(extra) = parsed
        .path_and_query()
        .map(|p| p.as_str())
        .filter(|p| *p != "/" && !p.is_empty())
    {
        return Err(bad(format!(
            "a path ({extra}) is not supported; pipewise's gRPC services are served at the \
             root (http://host:port)"
        )));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::http_uri;

    #[test]
    fn addresses_are_plain_http_with_a_16_bit_port() {
        assert_eq!(
            http_uri("127.0.0.1:50051").ok().as_deref(),
            Some("http://127.0.0.1:50051")
        );
        assert_eq!(http_uri("HTTP://h:1").ok().as_deref(), Some("HTTP://h:1"));
        assert_eq!(http_uri("[::1]:7").ok().as_deref(), Some("http://[::1]:7"));
        assert_eq!(http_uri("http://h:1/").ok().as_deref(), Some("http://h:1/"));
        for (bad, says) in [
            ("https://h:1", "https:// is not supported without TLS"),
            ("ftp://h:1", "ftp:// is not supported"),
            ("h:99999", "at most 65535"),
            ("http://", "not a host:port"),
            ("http://[::1", "not a host:port"),
            (
                "http://h:1/some/path",
                "a path (/some/path) is not supported",
            ),
            ("h:1/x?y=1", "a path (/x?y=1) is not supported"),
        ] {
            let err = http_uri(bad).expect_err(bad).to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn tls_addresses_are_https_and_a_contradicting_scheme_is_refused() {
        use super::{grpc_uri, names_tls};
        assert_eq!(grpc_uri("h:1", true).ok().as_deref(), Some("https://h:1"));
        assert_eq!(
            grpc_uri("HTTPS://h:1", true).ok().as_deref(),
            Some("HTTPS://h:1")
        );
        let err = grpc_uri("http://h:1", true).expect_err("plain").to_string();
        assert!(
            err.contains("http:// (plain text) where TLS is on"),
            "{err}"
        );
        assert_eq!(names_tls("https://h:1"), Some(true));
        assert_eq!(names_tls("Http://h:1"), Some(false));
        assert_eq!(names_tls("h:1"), None);
        assert_eq!(names_tls("ftp://h:1"), None);
    }
}
