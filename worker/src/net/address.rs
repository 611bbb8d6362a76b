//! The addresses pipewise dials: [`http_uri`].

use crate::error::{Error, Result};

/// The `http://` URI of a gRPC address given as `host:port` or `http://host:port`. Other
/// schemes are refused: pipewise speaks gRPC without TLS (`https://` used to be accepted
/// and then spoken to in plain text), and so is a port beyond 65535.
pub fn http_uri(address: &str) -> Result<String> {
    let bad = |reason: String| Error::Address {
        address: address.to_string(),
        reason,
    };
    let uri = match address.split_once("://") {
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("http") => address.to_string(),
        Some((scheme, _)) => {
            return Err(bad(format!(
                "{scheme}:// is not supported; pipewise speaks gRPC without TLS \
                 (http://host:port or host:port; put TLS in a proxy or service mesh)"
            )));
        }
        None => format!("http://{address}"),
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
            ("https://h:1", "https:// is not supported"),
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
}
