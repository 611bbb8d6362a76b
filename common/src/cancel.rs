//! Cooperative cancellation of a long planning call.
//!
//! A caller that may stop waiting (the coordinator's planner, when the client that submitted
//! a job goes away) runs the call inside [`cancellable`] with a flag it can raise; the
//! planning loops poll [`check`] (every simulation does) and end with
//! [`Error::Cancelled`] soon after the flag is raised. Outside [`cancellable`], and while the
//! flag is down, results are those of the inputs alone: the flag only ever cuts a call short.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

thread_local! {
    static FLAG: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Runs `f` on this thread with `flag` as its cancellation flag (restoring the previous
/// one after, so calls nest).
pub fn cancellable<T>(flag: Arc<AtomicBool>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<AtomicBool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            FLAG.with(|cell| *cell.borrow_mut() = previous);
        }
    }
    let _restore = Restore(FLAG.with(|cell| cell.borrow_mut().replace(flag)));
    f()
}

/// [`Error::Cancelled`] when the flag of the enclosing [`cancellable`] call is raised.
pub fn check() -> Result<()> {
    let raised = FLAG.with(|cell| {
        cell.borrow()
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    });
    if raised {
        Err(Error::Cancelled)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Request, ScheduleKind, generate};

    fn plan() -> Result<crate::Schedule> {
        generate(&Request {
            memory_limit: Some(6.0),
            ..Request::new(ScheduleKind::AdaptiveV, 8, 16)
        })
    }

    #[test]
    fn a_raised_flag_ends_planning_and_a_lowered_one_changes_nothing() {
        let alone = plan().expect("plans");
        let down = Arc::new(AtomicBool::new(false));
        assert_eq!(cancellable(down, plan).expect("plans"), alone);
        let up = Arc::new(AtomicBool::new(true));
        assert_eq!(cancellable(up.clone(), plan), Err(Error::Cancelled));
        // Restored after the call, and nested calls restore the outer flag.
        assert_eq!(check(), Ok(()));
        cancellable(up, || {
            cancellable(Arc::new(AtomicBool::new(false)), || {
                assert_eq!(check(), Ok(()))
            });
            assert_eq!(check(), Err(Error::Cancelled));
        });
        assert_eq!(check(), Ok(()));
    }
}
