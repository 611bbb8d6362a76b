//! The driver actor: one per running job. It runs the job's steps through the
//! [`JobRunner`] on a blocking thread and reports every step and the outcome to the job
//! manager. The coordinator is off the critical path: within a step, only the runner's
//! workers talk to each other.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use pipewise_common::job::{JobPlan, JobSpec};
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::job_manager::JobMsg;

/// One step's report, as `WatchJob` streams it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepEventData {
    /// Job id.
    pub job: u64,
    /// Step number (1-based).
    pub step: u64,
    /// Mean loss over the step's microbatches.
    pub loss: f64,
    /// Wall time of the step.
    pub step_time_ms: f64,
    /// The schedule's simulated bubble.
    pub planned_bubble: f64,
    /// Measured bubble: 1 − time in passes / (workers × step wall time).
    pub measured_bubble: f64,
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
    /// Why the job was re-planned before this step, if it was.
    pub replan_reason: String,
    /// The schedule the job runs from this step on, on the first step after a re-plan.
    pub replanned: Option<std::sync::Arc<pipewise_common::Schedule>>,
    /// What every worker did when during the step, if the runner recorded it (the job
    /// manager keeps it for `GetStepTrace` and strips it from watchers' events).
    pub trace: Option<std::sync::Arc<pipewise_common::trace::StepTrace>>,
}

/// What a runner tells the job manager while it runs a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// A finished step.
    Step(Box<StepEventData>),
    /// What the job waits for before its next step (e.g. "workers: 3 of 4 ready"); empty
    /// once it waits no longer. `GetJob` and `ListJobs` show it.
    Waiting(String),
}

/// Where a job's runs start: a new job at step 0; one the coordinator had queued or running
/// when it stopped, at the last checkpoint known to be complete, with run ids that none of
/// the earlier coordinator's runs had (its workers may still be running one of those).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Start {
    /// The first step: 0, or the step of a complete checkpoint.
    pub step: u64,
    /// Coordinator restarts the job has been through.
    pub restarts: u64,
    /// After a restart, the steps the store counted as done (no resume goes past them).
    pub through: u64,
}

/// Runs a job's steps. [`crate::cluster::ClusterRunner`] hands them to registered worker
/// processes (or `pipewise local`'s in-process worker nodes); tests provide fakes.
pub trait JobRunner: Send + Sync + 'static {
    /// Runs the steps of `spec` from `start` under `plan` (blocking), calling `report` after
    /// each step (and when it starts or stops waiting, e.g. for workers) and stopping early
    /// when `cancelled` is set. An `Err` fails the job with that text.
    fn run(
        &self,
        job: u64,
        spec: &JobSpec,
        plan: &JobPlan,
        start: Start,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
    ) -> Result<(), String>;
}

/// The driver of one job.
pub struct Driver;

/// What a driver starts with.
pub struct DriverArgs {
    /// Job id.
    pub job: u64,
    /// The spec.
    pub spec: JobSpec,
    /// Its plan.
    pub plan: JobPlan,
    /// Where its runs start.
    pub start: Start,
    /// Who runs the steps.
    pub runner: Arc<dyn JobRunner>,
    /// Set to stop after the current step.
    pub cancelled: Arc<AtomicBool>,
    /// The job manager, told about every step and the end.
    pub manager: ActorRef<JobMsg>,
}

impl Actor for Driver {
    type Msg = ();
    type State = ();
    type Arguments = DriverArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: DriverArgs,
    ) -> Result<(), ActorProcessingErr> {
        let DriverArgs {
            job,
            spec,
            plan,
            start,
            runner,
            cancelled,
            manager,
        } = args;
        if let Ok(peaks) = plan.predicted_peak_bytes(&spec) {
            crate::metrics::record_predicted_peaks(&peaks);
        }
        let tokens_per_step =
            f64::from(spec.training.global_batch_size) * f64::from(spec.model.seq_len);
        let samples_per_step = f64::from(spec.training.global_batch_size);
        tokio::spawn(async move {
            let progress = manager.clone();
            let flag = cancelled.clone();
            let outcome = tokio::task::spawn_blocking(move || {
                let mut report = |r: Report| {
                    // The manager outlives its drivers; a failed send only loses a report.
                    let _ = match r {
                        Report::Step(event) => {
                            crate::metrics::record_step(&event, tokens_per_step, samples_per_step);
                            progress.cast(JobMsg::Progress(event))
                        }
                        Report::Waiting(what) => progress.cast(JobMsg::Waiting(job, what)),
                    };
                };
                runner.run(job, &spec, &plan, start, &mut report, &flag)
            })
            .await
            .unwrap_or_else(|e| Err(format!("runner task failed: {e}")));
            let was_cancelled = cancelled.load(std::sync::atomic::Ordering::SeqCst);
            let _ = manager.cast(JobMsg::Finished {
                job,
                outcome,
                cancelled: was_cancelled,
            });
            myself.stop(None);
        });
        Ok(())
    }
}
