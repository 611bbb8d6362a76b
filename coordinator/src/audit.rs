//! The audit trail of refused callers: every refused call (a token or client certificate
//! the [`crate::security::Guard`] turns away) and every failed TLS handshake on the port
//! is counted in `pipewise_auth_refused_total{reason}` and logged at warn with the role,
//! the peer's address and the reason, never the token.
//!
//! A client retrying in a loop, or a scanner, must not flood the log: [`RateLimit`] (a
//! pure core on logical time) lets through one line per peer address and reason per
//! window, and the next line after a quiet window says how many were left out. The
//! counter counts every refusal.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Why a caller was turned away (the label values of `pipewise_auth_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A call without a token to an API that needs one.
    NoToken,
    /// A token that is neither role's.
    BadToken,
    /// The other role's token.
    WrongRole,
    /// A call to the cluster API without a client certificate, where one is required.
    NoClientCertificate,
    /// Plain text (e.g. an HTTP/2 client without TLS) on the TLS port.
    PlainTextOnTls,
    /// A client certificate that the coordinator's `--tls-client-ca` did not sign.
    UnknownIssuer,
    /// A client certificate refused for another reason (expired, not for a client, ...).
    BadClientCertificate,
    /// The client refused the coordinator's certificate (a fatal alert in the handshake:
    /// it does not trust the CA, or the name does not match).
    ServerCertificateRefused,
    /// No finished handshake within the handshake timeout.
    HandshakeTimeout,
    /// Any other failed handshake (the client left midway, no common protocol version, ...).
    TlsHandshake,
}

impl Refusal {
    /// Every reason, for the counter's zeroes at start.
    pub const ALL: [Refusal; 10] = [
        Refusal::NoToken,
        Refusal::BadToken,
        Refusal::WrongRole,
        Refusal::NoClientCertificate,
        Refusal::PlainTextOnTls,
        Refusal::UnknownIssuer,
        Refusal::BadClientCertificate,
        Refusal::ServerCertificateRefused,
        Refusal::HandshakeTimeout,
        Refusal::TlsHandshake,
    ];

    /// The metric's label value and the log's `reason`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::NoToken => "no_token",
            Refusal::BadToken => "bad_token",
            Refusal::WrongRole => "wrong_role",
            Refusal::NoClientCertificate => "no_client_certificate",
            Refusal::PlainTextOnTls => "plain_text_on_tls",
            Refusal::UnknownIssuer => "unknown_issuer",
            Refusal::BadClientCertificate => "bad_client_certificate",
            Refusal::ServerCertificateRefused => "server_certificate_refused",
            Refusal::HandshakeTimeout => "handshake_timeout",
            Refusal::TlsHandshake => "tls_handshake",
        }
    }
}

/// How long a peer's refusals of one reason stay quiet after one is logged.
pub const LOG_WINDOW: Duration = Duration::from_secs(60);
/// The most `(peer, reason)` pairs remembered: past it, refusals from peers not yet seen
/// share one entry (many addresses must not grow the table without bound).
const MAX_PEERS: usize = 4096;

/// One remembered `(peer, reason)`: when it was last logged and how many were not since.
#[derive(Debug, Clone, Copy)]
struct Last {
    logged_ms: u64,
    left_out: u64,
}

/// Which refusals are logged: at most one per peer address (its IP: every connection has
/// another port) and reason per window. Pure: the caller says what time it is.
#[derive(Debug)]
pub struct RateLimit {
    window_ms: u64,
    capacity: usize,
    /// `None`: an unknown peer, or any peer once the table is full.
    last: HashMap<(Option<IpAddr>, Refusal), Last>,
}

impl RateLimit {
    /// One line per peer and reason per `window`, remembering at most `capacity` pairs.
    pub fn new(window: Duration, capacity: usize) -> Self {
        RateLimit {
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            capacity: capacity.max(1),
            last: HashMap::new(),
        }
    }

    /// Whether a refusal of `reason` from `peer` at `now_ms` (milliseconds on any clock
    /// that does not go back) is logged: `Some(n)` with the `n` refusals of the pair left
    /// out since its last line, `None` when it is left out.
    pub fn admit(&mut self, peer: Option<IpAddr>, reason: Refusal, now_ms: u64) -> Option<u64> {
        let mut key = (peer, reason);
        if !self.last.contains_key(&key) && self.last.len() >= self.capacity {
            let window = self.window_ms;
            self.last
                .retain(|_, l| now_ms.saturating_sub(l.logged_ms) < window);
            if self.last.len() >= self.capacity {
                key = (None, reason);
            }
        }
        match self.last.get_mut(&key) {
            Some(l) if now_ms.saturating_sub(l.logged_ms) < self.window_ms => {
                l.left_out += 1;
                None
            }
            Some(l) => {
                let left_out = l.left_out;
                *l = Last {
                    logged_ms: now_ms,
                    left_out: 0,
                };
                Some(left_out)
            }
            None => {
                self.last.insert(
                    key,
                    Last {
                        logged_ms: now_ms,
                        left_out: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// The coordinator's audit trail: counts every refusal and logs the ones its
/// [`RateLimit`] lets through (on the monotonic clock).
#[derive(Debug)]
pub struct Audit {
    limit: Mutex<RateLimit>,
    origin: Instant,
}

impl Default for Audit {
    fn default() -> Self {
        Audit {
            limit: Mutex::new(RateLimit::new(LOG_WINDOW, MAX_PEERS)),
            origin: Instant::now(),
        }
    }
}

impl Audit {
    /// Records a refusal of `reason` of a caller of `role` (`"submitter"`, `"worker"`, or
    /// `"unknown"` before the handshake told which API it wanted) from `peer`; `detail`
    /// says what was wrong (it must never hold a token).
    pub fn refused(&self, role: &str, peer: Option<SocketAddr>, reason: Refusal, detail: &str) {
        crate::metrics::record_refusal(reason.label());
        let now_ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        let admitted = match self.limit.lock() {
            Ok(mut limit) => limit.admit(peer.map(|p| p.ip()), reason, now_ms),
            // A panic elsewhere while holding the lock: log rather than lose the trail.
            Err(_) => Some(0),
        };
        let Some(left_out) = admitted else {
            return;
        };
        let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
        tracing::warn!(
            role = %role,
            peer = %peer,
            reason = %reason.label(),
            left_out,
            "refused a caller (said once a minute per peer and reason at most; left_out: \
             those not said since): {detail}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn one_line_per_peer_and_reason_per_window_then_the_count_left_out() {
        let mut limit = RateLimit::new(Duration::from_secs(60), 16);
        assert_eq!(limit.admit(ip(1), Refusal::BadToken, 1_000), Some(0));
        assert_eq!(limit.admit(ip(1), Refusal::BadToken, 1_001), None);
        assert_eq!(limit.admit(ip(1), Refusal::BadToken, 60_999), None);
        // Another reason, another peer: each has its own window.
        assert_eq!(limit.admit(ip(1), Refusal::WrongRole, 2_000), Some(0));
        assert_eq!(limit.admit(ip(2), Refusal::BadToken, 2_000), Some(0));
        // A window after the last line: said again, with the two left out.
        assert_eq!(limit.admit(ip(1), Refusal::BadToken, 61_000), Some(2));
        assert_eq!(limit.admit(ip(1), Refusal::BadToken, 61_001), None);
        assert_eq!(limit.admit(ip(1), Refusal::BadToken, 200_000), Some(1));
        assert_eq!(limit.admit(None, Refusal::TlsHandshake, 0), Some(0));
        assert_eq!(limit.admit(None, Refusal::TlsHandshake, 59_999), None);
    }

    #[test]
    fn a_full_table_drops_stale_pairs_and_then_shares_one_entry() {
        let mut limit = RateLimit::new(Duration::from_secs(60), 2);
        assert_eq!(limit.admit(ip(1), Refusal::NoToken, 0), Some(0));
        assert_eq!(limit.admit(ip(2), Refusal::NoToken, 0), Some(0));
        // Full, nothing stale: new peers share the unknown peer's entry.
        assert_eq!(limit.admit(ip(3), Refusal::NoToken, 10), Some(0));
        assert_eq!(limit.admit(ip(4), Refusal::NoToken, 20), None);
        assert_eq!(limit.last.len(), 3);
        // A window later the stale pairs go, and a new peer has its own entry again.
        assert_eq!(limit.admit(ip(5), Refusal::NoToken, 70_000), Some(0));
        assert_eq!(limit.last.len(), 1);
        assert_eq!(limit.admit(ip(5), Refusal::NoToken, 70_001), None);
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let labels: std::collections::HashSet<_> = Refusal::ALL.map(Refusal::label).into();
        assert_eq!(labels.len(), Refusal::ALL.len());
        assert!(
            labels
                .iter()
                .all(|l| l.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
    }
}
