//! One step's event (and its executed timeline) from every worker's report.

use pipewise_common::job::{JobPlan, JobSpec};
use pipewise_common::{Costs, simulate};
use pipewise_proto::v1 as pb;

use crate::events::StepEventData;

/// The planned bubble of a job's plan (what `StepEvent.planned_bubble` reports): its
/// schedule simulated under [`JobSpec::planning_times`], unit pass times for real compute
/// and the `[compute]` times for an emulated job.
pub fn planned_bubble(plan: &JobPlan, spec: &JobSpec) -> f64 {
    Costs::uniform(&plan.schedule.placement, spec.planning_times())
        .and_then(|c| simulate(&plan.schedule, &c))
        .map(|s| s.bubble)
        .unwrap_or(f64::NAN)
}

/// One step's event from every worker's report.
pub(super) fn event(
    job: u64,
    step: u64,
    planned: f64,
    predicted_peaks: &[u64],
    reports: &[pb::StepReport],
) -> StepEventData {
    let wall = reports.iter().map(|r| r.wall_secs).fold(0.0, f64::max);
    let busy: f64 = reports.iter().map(|r| r.busy_secs).sum();
    let loss = reports
        .iter()
        .map(|r| r.loss)
        .find(|l| !l.is_nan())
        .unwrap_or(f64::NAN);
    StepEventData {
        job,
        step: step + 1,
        loss,
        step_time_ms: wall * 1e3,
        planned_bubble: planned,
        measured_bubble: if wall > 0.0 {
            1.0 - busy / (reports.len() as f64 * wall)
        } else {
            0.0
        },
        peaks: reports
            .iter()
            .map(|r| (r.worker_index, r.peak_activation_bytes))
            .collect(),
        worker_bubbles: reports
            .iter()
            .map(|r| {
                (
                    r.worker_index,
                    1.0 - r.busy_secs / wall.max(f64::MIN_POSITIVE),
                )
            })
            .collect(),
        predicted_peaks: predicted_peaks.to_vec(),
        checkpoint: 0,
        replan_reason: String::new(),
        replanned: None,
        trace: step_trace(job, step, reports),
    }
}

/// The step's executed timeline from every worker's spans (`None`, with a warning, when a
/// report carries none or a malformed one).
fn step_trace(
    job: u64,
    step: u64,
    reports: &[pb::StepReport],
) -> Option<std::sync::Arc<pipewise_common::trace::StepTrace>> {
    let mut workers = vec![Vec::new(); reports.len()];
    for r in reports {
        let slot = workers.get_mut(r.worker_index as usize)?;
        if r.spans.is_empty() {
            return None;
        }
        for span in &r.spans {
            match pipewise_common::trace::Span::try_from(*span) {
                Ok(s) => slot.push(s),
                Err(e) => {
                    tracing::warn!(job, step, worker = r.worker_index, "bad trace span: {e}");
                    return None;
                }
            }
        }
    }
    Some(std::sync::Arc::new(pipewise_common::trace::StepTrace {
        job,
        step: step + 1,
        workers,
    }))
}
