//! The run's secret ([`RunSecret`]): handed out in the assignment when the coordinator takes
//! tokens, carried by every activation frame and collective call among the run's workers,
//! and checked (in fixed time) before a frame or a contribution is taken.

use std::sync::RwLock;

use bytes::Bytes;
use pipewise_proto::auth::same_secret;

/// The current run's secret, shared by the sending and the receiving side; empty: the run
/// has none, and anything is admitted (as without tokens).
#[derive(Default)]
pub(crate) struct RunSecret(RwLock<Bytes>);

impl RunSecret {
    /// Switches to a run's secret.
    pub(crate) fn set(&self, secret: Bytes) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = secret;
    }

    /// The secret to send.
    pub(crate) fn get(&self) -> Bytes {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether a frame or call carrying `given` may be taken.
    pub(crate) fn admits(&self, given: &[u8]) -> bool {
        let secret = self.get();
        secret.is_empty() || same_secret(&secret, given)
    }
}

impl std::fmt::Debug for RunSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = if self.get().is_empty() { "none" } else { "set" };
        write!(f, "RunSecret({set})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_secret_anything_is_admitted_and_with_one_only_it() {
        let secret = RunSecret::default();
        assert!(secret.admits(b"") && secret.admits(b"anything"));
        secret.set(Bytes::from_static(b"0123456789abcdef"));
        assert!(secret.admits(b"0123456789abcdef"));
        assert!(!secret.admits(b""));
        assert!(!secret.admits(b"0123456789abcdeF"));
        assert_eq!(format!("{secret:?}"), "RunSecret(set)");
    }
}
