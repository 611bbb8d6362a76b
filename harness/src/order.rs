//! The replicas' step reports in a fixed order: the cost model fits a step on its first
//! replica's reports and adds the other replicas' pass times as they come, so a fit (and
//! what auto or a re-plan predicts from it) depends on whether another replica's reports of
//! a step came before or after the first replica's. A worker of another replica reports a
//! step only once the job's event for it was seen (the first replica's reports made it).

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::time::Instant;

use pipewise_common::job::layout;

use crate::{LIMIT, WorkerPace};

/// Blocks `pace`'s worker, of replica `replica`, before it reports step `step` (0-based) of
/// `run` until the job's event for that step was seen since the run started (at once for
/// replica 0; a killed worker waits no more).
pub(crate) fn after_the_first_replica(pace: &WorkerPace, run: u64, step: u64, replica: u32) {
    if replica == 0 {
        return;
    }
    let job = layout::job_of(run);
    let deadline = Instant::now() + LIMIT;
    let mut st = pace.gate.lock();
    loop {
        // The run's first step registered it at the gate (see `WorkerPace::before_step`).
        let since = st.runs.get(&run).map_or(0, |(_, since)| *since);
        let made = st
            .seen
            .get(&job)
            .is_some_and(|steps| steps.get(since..).unwrap_or_default().contains(&(step + 1)));
        if made || pace.killed.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            eprintln!("harness: {} reported step {step} unordered", pace.id);
            return;
        }
        st = pace
            .gate
            .changed
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
