//! The run's secret ([`RunSecret`]): handed out in the assignment when the coordinator takes
//! tokens, carried by every activation frame and collective call among the run's workers,
//! and checked (in fixed time) before a frame or a contribution is taken.

use std::sync::RwLock;

use bytes::Bytes;
use pipewise_proto::auth::same_secret;

/// The current run's secret, shared by the sending and the receiving side, with the run it
/// belongs to; empty: the run has none, and anything is admitted (as without tokens).
#[derive(Default)]
pub(crate) struct RunSecret(RwLock<(u64, Bytes)>);

impl RunSecret {
    /// Switches to run `run`'s secret.
    pub(crate) fn set(&self, run: u64, secret: Bytes) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (run, secret);
    }

    /// The secret to send.
    pub(crate) fn get(&self) -> Bytes {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
            .clone()
    }

    /// Whether the secret held is run `run`'s: a call for another run that it does not
    /// admit may be for a run this worker has not taken up yet, not a forgery.
    pub(crate) fn holds(&self, run: u64) -> bool {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            == run
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
        secret.set(7, Bytes::from_static(b"0123456789abcdef"));
        assert!(secret.holds(7) && !secret.holds(8));
        assert!(secret.admits(b"0123456789abcdef"));
        assert!(!secret.admits(b""));
        assert!(!secret.admits(b"0123456789abcdeF"));
        assert_eq!(format!("{secret:?}"), "RunSecret(set)");
    }
}
