//! One step of a job as its watchers see it: [`StepEvent`], what the coordinator makes of the
//! step's reports. The coordinator streams it (`pipewise_proto::convert` carries it over the
//! wire), the CLI prints it, and `pipewise local` writes it to `summary.json` as it
//! serializes: the figures a step line shows, peaks in worker order, the validation loss as
//! `val_loss`; the rest is the coordinator's and stays out.

use std::sync::Arc;

use serde::{Serialize, Serializer};

use crate::Schedule;
use crate::cost::Costs;
use crate::trace::StepTrace;

/// One step's event.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct StepEvent {
    /// Job id.
    #[serde(skip)]
    pub job: u64,
    /// Step number (1-based).
    pub step: u64,
    /// Mean loss over the step's microbatches (NaN: none, e.g. emulated compute).
    pub loss: f64,
    /// Wall time of the step.
    pub step_time_ms: f64,
    /// The schedule's simulated bubble, from the costs known before the step.
    pub planned_bubble: f64,
    /// Measured bubble: 1 − time in passes / (workers × step wall time).
    pub measured_bubble: f64,
    /// The part of the measured bubble spent waiting for a core rather than for a peer:
    /// the workers' run-queue delay during their waits / (workers × step wall time).
    pub core_wait_bubble: f64,
    /// The part of the workers' time in passes spent waiting for a core (passes stretched
    /// by workers sharing cores).
    pub pass_core_wait: f64,
    /// (worker, peak activation bytes) for every worker, in any order (serialized as
    /// `peak_activation_bytes`, the bytes in worker order: [`StepEvent::peak_bytes`]).
    #[serde(
        rename = "peak_activation_bytes",
        serialize_with = "peaks_in_worker_order"
    )]
    pub peaks: Vec<(u32, u64)>,
    /// The step time predicted from the same costs (0: not predicted).
    pub predicted_step_time_ms: f64,
    /// What `schedule = "auto"` chose and why, on the first step of a run it chose.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub plan_choice: String,
    /// `[validation]`: the validation loss, on the steps after which the job evaluated.
    #[serde(rename = "val_loss", skip_serializing_if = "Option::is_none")]
    pub validation_loss: Option<f64>,
    /// `[validation]`: the validation loss before the job's first step, on step 1's event
    /// (`summary.json` gives it a record of its own, step 0's).
    #[serde(skip)]
    pub initial_validation_loss: Option<f64>,
    /// Why the job was re-planned before this step, if it was.
    #[serde(skip)]
    pub replan_reason: String,
    /// Every worker's predicted peak activation bytes under the plan and split the step
    /// ran (empty when the runner cannot predict them).
    #[serde(skip)]
    pub predicted_peaks: Vec<u64>,
    /// The job's latest checkpoint known to be complete when the step was reported (its
    /// step; 0: none), where the job resumes after a coordinator restart.
    #[serde(skip)]
    pub checkpoint: u64,
    /// (worker, measured bubble: 1 − its time in passes / step wall time) for every worker.
    #[serde(skip)]
    pub worker_bubbles: Vec<(u32, f64)>,
    /// The data-parallel replica whose workers' reports make this event (0 without
    /// replicas; every replica runs the same plan).
    #[serde(skip)]
    pub replica: u32,
    /// (worker, seconds its stages' gradient sums over the replicas took, seconds of them
    /// past its last pass) for every worker (zeros without replicas).
    #[serde(skip)]
    pub all_reduce: Vec<(u32, f64, f64)>,
    /// The schedule the job runs from this step on, on the first step after a re-plan.
    #[serde(skip)]
    pub replanned: Option<Arc<Schedule>>,
    /// What every worker did when during the step, if the runner recorded it (the job
    /// manager keeps it for `GetStepTrace` and strips it from watchers' events).
    #[serde(skip)]
    pub trace: Option<Arc<StepTrace>>,
    /// The per-stage costs the step was planned on, kept with its trace (stripped like it).
    #[serde(skip)]
    pub planned_costs: Option<Arc<Costs>>,
}

impl StepEvent {
    /// Every worker's peak activation bytes, in worker order.
    pub fn peak_bytes(&self) -> Vec<u64> {
        let mut peaks = self.peaks.clone();
        peaks.sort_unstable();
        peaks.into_iter().map(|(_, bytes)| bytes).collect()
    }
}

/// `peaks`' bytes in worker order (see [`StepEvent::peak_bytes`]).
fn peaks_in_worker_order<S: Serializer>(peaks: &[(u32, u64)], s: S) -> Result<S::Ok, S::Error> {
    let mut peaks = peaks.to_vec();
    peaks.sort_unstable();
    s.collect_seq(peaks.into_iter().map(|(_, bytes)| bytes))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// `summary.json`'s record of a step: its figures under their names, peaks in worker
    /// order, the validation loss as `val_loss`; what is empty or the coordinator's is not
    /// written.
    #[test]
    fn serializes_as_a_summary_record() {
        let e = StepEvent {
            job: 7,
            step: 3,
            loss: 2.5,
            step_time_ms: 12.0,
            planned_bubble: 0.25,
            measured_bubble: 0.5,
            core_wait_bubble: 0.125,
            pass_core_wait: 0.0625,
            peaks: vec![(1, 20), (0, 10)],
            predicted_step_time_ms: 11.0,
            validation_loss: Some(2.75),
            initial_validation_loss: Some(3.0),
            replan_reason: "slow".into(),
            checkpoint: 2,
            replica: 1,
            ..StepEvent::default()
        };
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            "{\"step\":3,\"loss\":2.5,\"step_time_ms\":12.0,\"planned_bubble\":0.25,\
             \"measured_bubble\":0.5,\"core_wait_bubble\":0.125,\"pass_core_wait\":0.0625,\
             \"peak_activation_bytes\":[10,20],\"predicted_step_time_ms\":11.0,\
             \"val_loss\":2.75}"
        );
        assert_eq!(e.peak_bytes(), [10, 20]);
        let chose = StepEvent {
            plan_choice: "1f1b: fastest".into(),
            loss: f64::NAN,
            ..StepEvent::default()
        };
        let v: serde_json::Value = serde_json::to_value(&chose).unwrap();
        assert_eq!(v["plan_choice"], "1f1b: fastest");
        assert!(v["loss"].is_null(), "{v}");
        assert!(v.get("val_loss").is_none());
    }
}
