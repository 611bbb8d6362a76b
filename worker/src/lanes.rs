//! Lanes: independent work run side by side, one item per CPU thread, each item's kernels on
//! that one thread.
//!
//! The model's GEMMs (512 × 256 × 768 and alike) scale poorly when each is cut over the
//! threads; whole passes of different microbatches share nothing but the parameters they
//! read, so on a worker with several threads they can run side by side instead. Each lane
//! is a rayon pool of one thread: inside it [`threads`] is 1, so the kernels (and candle's
//! own rayon loops) stay on that thread. Every kernel gives the same bits on any thread
//! count, so where a pass runs never changes a result.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use candle_core::Device;
use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{Error, Result};
use crate::kernels::cpu::threads;

/// Environment variable: `0` turns side-by-side microbatches off (each pass then cuts its
/// work over every thread, and a one-worker job holds the stashes its schedule plans).
pub const SIDE_BY_SIDE_ENV: &str = "PIPEWISE_SIDE_BY_SIDE";

/// How many lanes work for `device` may use: the kernels' thread count on the CPU, one
/// elsewhere (a GPU runs one pass at a time) or where [`SIDE_BY_SIDE_ENV`] is `0`.
pub(crate) fn lanes_for(device: &Device) -> usize {
    static OFF: OnceLock<bool> = OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var(SIDE_BY_SIDE_ENV).is_ok_and(|v| v.trim() == "0"));
    if device.is_cpu() && !off {
        threads().max(1)
    } else {
        1
    }
}

/// One item's result with when it started and how long it took.
#[derive(Debug)]
pub(crate) struct Ran<R> {
    /// What the item returned.
    pub(crate) value: R,
    /// When it started.
    pub(crate) started: Instant,
    /// When it ended.
    pub(crate) ended: Instant,
}

/// Runs `f` and times it.
pub(crate) fn timed<R>(f: impl FnOnce() -> R) -> Ran<R> {
    let started = Instant::now();
    let value = f();
    Ran {
        value,
        started,
        ended: Instant::now(),
    }
}

/// The one-thread pools, made on first use and kept (a pool's thread lives as long as it).
static POOLS: Mutex<Vec<Arc<ThreadPool>>> = Mutex::new(Vec::new());

/// The first `n` lanes, making the missing ones.
fn pools(n: usize) -> Result<Vec<Arc<ThreadPool>>> {
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    while pools.len() < n {
        let pool = ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|i| format!("pipewise-lane-{i}"))
            .build()
            .map_err(|e| Error::InvalidArgument {
                field: "threads",
                reason: format!("cannot start a compute lane: {e}"),
            })?;
        pools.push(Arc::new(pool));
    }
    Ok(pools[..n].to_vec())
}

/// `f` of every item, in order, each timed. Two or more items run side by side, one lane
/// each (the caller's thread waits); a single item runs on the caller's thread with every
/// kernel thread.
pub(crate) fn side_by_side<T: Send, R: Send>(
    items: Vec<T>,
    f: impl Fn(T) -> R + Sync,
) -> Result<Vec<Ran<R>>> {
    if items.len() <= 1 {
        return Ok(items.into_iter().map(|item| timed(|| f(item))).collect());
    }
    let pools = pools(items.len())?;
    let f = &f;
    Ok(std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .into_iter()
            .zip(&pools)
            .map(|(item, pool)| scope.spawn(move || pool.install(|| timed(|| f(item)))))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Items come back in order, each having seen one kernel thread; a lone item runs on
    /// the caller's thread.
    #[test]
    fn items_run_one_per_lane_in_order() -> Result<()> {
        let out = side_by_side(vec![1, 2, 3], |i| (i * 10, threads()))?;
        let values: Vec<_> = out.iter().map(|r| r.value).collect();
        assert_eq!(values, [(10, 1), (20, 1), (30, 1)]);
        assert!(out.iter().all(|r| r.ended >= r.started));
        let pool = ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .map_err(|e| Error::InvalidArgument {
                field: "threads",
                reason: e.to_string(),
            })?;
        let lone = pool.install(|| side_by_side(vec![5], |i| (i, threads())))?;
        assert_eq!(lone[0].value, (5, 3));
        Ok(())
    }
}
