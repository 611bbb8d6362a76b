//! Jobs run by a [`JobRunner`] (tests' fakes): one task per running job runs the job's
//! steps on a blocking thread and reports every step and the outcome to the job manager. The coordinator is off the critical path: within a step, only the runner's
//! workers talk to each other.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use pipewise_common::job::{JobPlan, JobSpec};
use ractor::ActorRef;

use crate::error::CoordinatorError;
use crate::events::{Report, Start};
use crate::job_msg::JobMsg;

/// Runs a job's steps on a blocking thread: tests' fakes (worker processes run jobs
/// through [`crate::run::RunActor`]).
pub trait JobRunner: Send + Sync + 'static {
    /// Runs the steps of `spec` from `start` under `plan` (blocking), calling `report` after
    /// each step (and when it starts or stops waiting, e.g. for workers) and stopping early
    /// when `cancelled` is set. An `Err` fails the job with its text.
    fn run(
        &self,
        job: u64,
        spec: &JobSpec,
        plan: &JobPlan,
        start: Start,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
    ) -> crate::Result<()>;
}

/// What a job run by a [`JobRunner`] starts with.
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

/// Runs a job's steps through its [`JobRunner`] on a blocking thread beside the job
/// manager, which learns of every step and of the end.
pub fn spawn(args: DriverArgs) {
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
        crate::metrics::record_predicted_peaks(job, &peaks);
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
        .unwrap_or_else(|e| Err(CoordinatorError::Actor(format!("runner task failed: {e}"))));
        let was_cancelled = cancelled.load(std::sync::atomic::Ordering::SeqCst);
        let _ = manager.cast(JobMsg::Finished {
            job,
            outcome,
            cancelled: was_cancelled,
        });
    });
}
