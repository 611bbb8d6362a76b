//! How the async runtime's threads are scheduled: they must not preempt compute.
//!
//! A worker's compute runs on its own thread; the activation transport, the heartbeats and
//! the actors run on a small tokio runtime. Each frame a pass produces is handed to the
//! runtime, which wakes one of its threads. Linux's fair scheduler lets a thread that wakes
//! up preempt the thread that woke it, so on a machine with fewer free cores than threads the
//! compute thread that just queued a frame stopped until the runtime thread had written the
//! frame (0.1–0.5 ms for 512 KiB): the next pass started late, at every hop of the
//! schedule. With the runtime's threads in `SCHED_BATCH` (same weight and fairness as
//! normal threads, but a waking batch thread never preempts a running one) the network work
//! goes to a free core, or to the next scheduling tick, and compute carries on.
//!
//! Emulate bench, V-Half, d = 8, n = 64 over gRPC, alternating runs in one sitting: the
//! critical path's time in `send` fell from 18–28 ms to about 2 ms a step, and measured −
//! planned bubble from +2.9–3.8 to +2.2–2.7 points (the measurements:
//! `docs/experiments/status-history.md`).
//!
//! [`async_runtime`] builds the runtime the `pipewise` binary, [`crate::net::GrpcTransport`]
//! and the benches use. `PIPEWISE_SCHED=default` keeps the runtime's threads as normal
//! threads. Elsewhere than Linux with glibc it does nothing.

use std::sync::{Mutex, PoisonError};

/// What [`batch_this_thread`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadPolicy {
    /// The thread is now `SCHED_BATCH`.
    Batch,
    /// Not Linux with glibc: the thread stays as it was.
    Unsupported,
    /// The kernel refused the change (the thread stays as it was).
    Refused,
    /// Left as a normal thread on request (`PIPEWISE_SCHED=default`).
    Defaults,
}

impl std::fmt::Display for ThreadPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ThreadPolicy::Batch => "runtime threads SCHED_BATCH (they do not preempt compute)",
            ThreadPolicy::Unsupported => "runtime threads normal (not Linux with glibc)",
            ThreadPolicy::Refused => "runtime threads normal (the kernel refused SCHED_BATCH)",
            ThreadPolicy::Defaults => "runtime threads normal (PIPEWISE_SCHED=default)",
        })
    }
}

/// The policy the last runtime thread got (`None`: none started yet).
static LAST: Mutex<Option<ThreadPolicy>> = Mutex::new(None);

/// The policy the threads of the runtimes built by [`async_runtime`] got, `None` before the
/// first one started.
pub fn runtime_policy() -> Option<ThreadPolicy> {
    *LAST.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether the environment asks for normal threads (`PIPEWISE_SCHED=default`).
fn opted_out() -> bool {
    std::env::var_os("PIPEWISE_SCHED").is_some_and(|v| v == "default")
}

/// Makes the calling thread `SCHED_BATCH` (see the module docs).
pub fn batch_this_thread() -> ThreadPolicy {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `sched_setscheduler` reads the `sched_param` we pass, which lives on this
        // stack frame for the whole call, and changes only the scheduling policy of the
        // calling thread (pid 0); it touches no other memory of ours.
        #[allow(unsafe_code)]
        let result = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if result == 0 {
            ThreadPolicy::Batch
        } else {
            ThreadPolicy::Refused
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        ThreadPolicy::Unsupported
    }
}

/// What each runtime thread does first: [`batch_this_thread`], unless the environment has
/// `PIPEWISE_SCHED=default`.
fn on_runtime_thread() {
    let policy = if opted_out() {
        ThreadPolicy::Defaults
    } else {
        batch_this_thread()
    };
    if policy == ThreadPolicy::Refused {
        tracing::warn!("the kernel refused SCHED_BATCH for a runtime thread");
    }
    *LAST.lock().unwrap_or_else(PoisonError::into_inner) = Some(policy);
}

/// A multi-threaded tokio runtime (I/O and timers on) with `threads` worker threads named
/// `name`, each of them `SCHED_BATCH` (see the module docs).
pub fn async_runtime(threads: usize, name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .on_thread_start(on_runtime_thread)
        .enable_all()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's policy, as the kernel reports it.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn policy_now() -> libc::c_int {
        // SAFETY: takes no pointers; reads the calling thread's policy.
        #[allow(unsafe_code)]
        unsafe {
            libc::sched_getscheduler(0)
        }
    }

    #[test]
    fn runtime_threads_are_batch_and_others_are_not() {
        let runtime = async_runtime(2, "sched-test").expect("runtime");
        let inside = runtime.block_on(async {
            tokio::spawn(async {
                #[cfg(all(target_os = "linux", target_env = "gnu"))]
                return Some(policy_now());
                #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
                return None::<i32>;
            })
            .await
            .expect("task")
        });
        let reported = runtime_policy().expect("a runtime thread started");
        let opted_out = opted_out();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            // What the runtime says it did is what the kernel shows: SCHED_BATCH unless it was
            // opted out of or (in a sandbox that forbids it) refused.
            if opted_out {
                assert_eq!(reported, ThreadPolicy::Defaults);
            } else {
                assert_ne!(reported, ThreadPolicy::Unsupported);
            }
            let batch = reported == ThreadPolicy::Batch;
            assert_eq!(
                inside == Some(libc::SCHED_BATCH),
                batch,
                "{reported}: {inside:?}"
            );
            // The test's own thread (standing in for a compute thread) is untouched.
            assert_eq!(policy_now(), libc::SCHED_OTHER);
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        {
            let expected = if opted_out {
                ThreadPolicy::Defaults
            } else {
                ThreadPolicy::Unsupported
            };
            assert_eq!((reported, inside), (expected, None));
        }
    }
}
