//! What the sending side's peer tasks and threads share: the errors they met, and a count
//! of those still running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Errors seen by the peer tasks, newest last (bounded).
#[derive(Debug, Default)]
pub(crate) struct PeerErrors {
    list: Mutex<Vec<String>>,
}

const MAX_ERRORS: usize = 64;

impl PeerErrors {
    pub(crate) fn push(&self, error: String) {
        let mut list = self
            .list
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if list.len() == MAX_ERRORS {
            list.remove(0);
        }
        list.push(error);
    }

    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .list
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// How many peer tasks run: one per peer the transport has, and a dropped peer's until its
/// back-off or call under way is over (it then ends without sending). Shown for tests, which
/// wait for a dropped peer's task to end rather than for its longest back-off.
#[derive(Debug, Default)]
pub(crate) struct RunningPeers(AtomicUsize);

impl RunningPeers {
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Counts one peer task in [`RunningPeers`] for as long as the task lives.
pub(crate) struct Counted(Arc<RunningPeers>);

impl Counted {
    pub(crate) fn new(running: &Arc<RunningPeers>) -> Counted {
        running.0.fetch_add(1, Ordering::SeqCst);
        Counted(Arc::clone(running))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}
