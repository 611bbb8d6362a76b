//! The data a run reports while it runs, shared by the run actor, the job manager and the
//! metrics: a step's event, where a job's runs start, and the events kept for late
//! watchers.

/// One step's report, as `WatchJob` streams it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepEventData {
    /// Job id.
    pub job: u64,
    /// Step number (1-based).
    pub step: u64,
    /// Mean loss over the step's microbatches.
    pub loss: f64,
    /// `[validation]`: the validation loss, on the steps after which the job evaluated.
    pub validation_loss: Option<f64>,
    /// `[validation]`: the validation loss before the job's first step, on step 1's event.
    pub initial_validation_loss: Option<f64>,
    /// Wall time of the step.
    pub step_time_ms: f64,
    /// The schedule's simulated bubble, from the costs known before the step.
    pub planned_bubble: f64,
    /// The step time predicted from the same costs (0: not predicted).
    pub predicted_step_time_ms: f64,
    /// Measured bubble: 1 − time in passes / (workers × step wall time).
    pub measured_bubble: f64,
    /// The part of the measured bubble spent waiting for a core rather than for a peer:
    /// the workers' run-queue delay during their waits / (workers × step wall time).
    pub core_wait_bubble: f64,
    /// The part of the workers' time in passes spent waiting for a core (passes stretched
    /// by workers sharing cores).
    pub pass_core_wait: f64,
    /// (worker, peak activation bytes) for every worker.
    pub peaks: Vec<(u32, u64)>,
    /// Every worker's predicted peak activation bytes under the plan and split the step
    /// ran (empty when the runner cannot predict them).
    pub predicted_peaks: Vec<u64>,
    /// The job's latest checkpoint known to be complete when the step was reported (its
    /// step; 0: none), where the job resumes after a coordinator restart.
    pub checkpoint: u64,
    /// (worker, measured bubble: 1 − its time in passes / step wall time) for every worker.
    pub worker_bubbles: Vec<(u32, f64)>,
    /// The data-parallel replica whose workers' reports make this event (0 without
    /// replicas; every replica runs the same plan).
    pub replica: u32,
    /// (worker, seconds its stages' gradient sums over the replicas took, seconds of them
    /// past its last pass) for every worker (zeros without replicas).
    pub all_reduce: Vec<(u32, f64, f64)>,
    /// Why the job was re-planned before this step, if it was.
    pub replan_reason: String,
    /// What `schedule = "auto"` chose and why, on the first step of a run it chose.
    pub plan_choice: String,
    /// The schedule the job runs from this step on, on the first step after a re-plan.
    pub replanned: Option<std::sync::Arc<pipewise_common::Schedule>>,
    /// What every worker did when during the step, if the runner recorded it (the job
    /// manager keeps it for `GetStepTrace` and strips it from watchers' events).
    pub trace: Option<std::sync::Arc<pipewise_common::trace::StepTrace>>,
    /// The per-stage costs the step was planned on, kept with its trace (stripped like it).
    pub planned_costs: Option<std::sync::Arc<pipewise_common::cost::Costs>>,
}

pub use pipewise_common::run::Start;

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
    jobs: std::collections::BTreeMap<u64, std::collections::VecDeque<StepEventData>>,
}

impl History {
    /// Keeps `event`, forgetting the oldest step or job past the limits.
    pub fn add(&mut self, event: StepEventData) {
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
    pub fn of(&self, job: u64) -> Vec<StepEventData> {
        self.jobs
            .get(&job)
            .map(|kept| kept.iter().cloned().collect())
            .unwrap_or_default()
    }
}
