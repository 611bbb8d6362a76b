//! The data a run reports while it runs, shared by the run actor, the job manager and the
//! metrics: a step's event ([`StepEvent`], the core's), where a job's runs start, and the
//! events kept for late watchers.

pub use pipewise_common::run::{Start, StepEvent};

/// Step events kept per job for late watchers: the latest ones (a ring), so a job's
/// memory does not grow with its steps; a watcher that subscribes later than this many
/// steps into a job starts at the oldest kept (`status` has the job's step and last loss).
pub const HISTORY_STEPS: usize = 1_000;
/// Jobs whose step events are kept (the most recent ones).
pub const HISTORY_JOBS: usize = 16;

/// The step events kept for late watchers: the latest [`HISTORY_STEPS`] of each of the
/// latest [`HISTORY_JOBS`] jobs.
#[derive(Debug, Default)]
pub struct History {
    jobs: std::collections::BTreeMap<u64, std::collections::VecDeque<StepEvent>>,
}

impl History {
    /// Keeps `event`, forgetting the oldest step or job past the limits.
    pub fn add(&mut self, event: StepEvent) {
        let kept = self.jobs.entry(event.job).or_default();
        kept.push_back(event);
        while kept.len() > HISTORY_STEPS {
            kept.pop_front();
        }
        while self.jobs.len() > HISTORY_JOBS {
            self.jobs.pop_first();
        }
    }

    /// The events kept of `job`, oldest first.
    pub fn of(&self, job: u64) -> Vec<StepEvent> {
        self.jobs
            .get(&job)
            .map(|kept| kept.iter().cloned().collect())
            .unwrap_or_default()
    }
}
