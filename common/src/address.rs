//! The addresses workers advertise: [`undialable`] tells one that a peer cannot connect to.

use std::net::IpAddr;

/// Why peers cannot dial `address` (`host:port`, `http://host:port` or `https://host:port`,
/// as a worker advertises it); `None` when they can, as far as its text tells. Port 0 and
/// the unspecified hosts (`0.0.0.0`, `[::]`) mean "any" when listening and nothing when
/// connecting; an address without a port leaves the peer to guess one.
pub fn undialable(address: &str) -> Option<String> {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((host, after)) => (host, after.strip_prefix(':')),
            None => return Some("an IPv6 host without its closing `]`".into()),
        },
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    if host.is_empty() {
        return Some("no host".into());
    }
    let Some(port) = port.filter(|p| !p.is_empty()) else {
        return Some("no port".into());
    };
    match port.parse::<u16>() {
        Err(_) => return Some(format!("the port {port:?} is not a number from 1 to 65535")),
        Ok(0) => {
            return Some(
                "port 0 (it asks the system for a free port when listening; peers need the \
                 port that was picked)"
                    .into(),
            );
        }
        Ok(_) => {}
    }
    match host.parse::<IpAddr>() {
        Ok(ip) if ip.is_unspecified() => Some(format!(
            "the unspecified host {ip} (every interface when listening; no host to connect to)"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::undialable;

    #[test]
    fn port_0_unspecified_hosts_and_missing_parts_are_undialable() {
        for ok in [
            "10.91.0.2:50052",
            "worker-0:50052",
            "http://worker-0:1",
            "https://[fd00::2]:65535",
            "[::1]:7",
        ] {
            assert_eq!(undialable(ok), None, "{ok}");
        }
        for (bad, says) in [
            ("10.91.0.2:0", "port 0"),
            ("http://h:0/", "port 0"),
            ("0.0.0.0:50052", "unspecified host 0.0.0.0"),
            ("[::]:50052", "unspecified host ::"),
            ("https://[::]:1", "unspecified host ::"),
            ("worker-0", "no port"),
            ("worker-0:", "no port"),
            (":50052", "no host"),
            ("h:99999", "not a number from 1 to 65535"),
            ("[::1:5", "closing `]`"),
        ] {
            let why = undialable(bad).unwrap_or_default();
            assert!(why.contains(says), "{bad}: {why:?}");
        }
    }
}
