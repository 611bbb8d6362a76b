//! One step's event (and its executed timeline) from every worker's report.

use pipewise_common::run::StepReport;

use crate::events::StepEvent;

pub use pipewise_common::run::supervisor::Shown;

/// One step's event from every worker's report.
pub(crate) fn event(
    job: u64,
    step: u64,
    planned: Shown,
    predicted_peaks: &[u64],
    reports: &[StepReport],
) -> StepEvent {
    let wall = reports.iter().map(|r| r.wall_secs).fold(0.0, f64::max);
    let busy: f64 = reports.iter().map(|r| r.busy_secs).sum();
    let core_wait: f64 = reports.iter().map(|r| r.core_wait_secs).sum();
    let pass_core_wait: f64 = reports.iter().map(|r| r.pass_core_wait_secs).sum();
    let worker_secs = reports.len() as f64 * wall;
    let loss = reports
        .iter()
        .map(|r| r.loss)
        .find(|l| !l.is_nan())
        .unwrap_or(f64::NAN);
    StepEvent {
        job,
        step: step + 1,
        loss,
        step_time_ms: wall * 1e3,
        planned_bubble: planned.bubble,
        predicted_step_time_ms: planned.step_ms,
        measured_bubble: if wall > 0.0 {
            1.0 - share(busy, worker_secs)
        } else {
            0.0
        },
        core_wait_bubble: share(core_wait, worker_secs),
        pass_core_wait: share(pass_core_wait, busy),
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
        replica: reports.first().map_or(0, |r| r.replica),
        validation_loss: reports.iter().find_map(|r| r.validation_loss),
        initial_validation_loss: reports.iter().find_map(|r| r.initial_validation_loss),
        all_reduce: reports
            .iter()
            .map(|r| {
                let (summing, exposed) = pipewise_common::trace::sums(&r.spans);
                (r.worker_index, summing, exposed)
            })
            .collect(),
        predicted_peaks: predicted_peaks.to_vec(),
        checkpoint: 0,
        replan_reason: String::new(),
        plan_choice: String::new(),
        replanned: None,
        trace: step_trace(job, step, reports),
        planned_costs: planned.costs,
    }
}

/// `part / whole`, 0 when there is no whole.
fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { part / whole } else { 0.0 }
}

/// The step's executed timeline from every worker's spans (`None` when a report carries
/// none: too many to send, or a malformed one dropped on the way).
fn step_trace(
    job: u64,
    step: u64,
    reports: &[StepReport],
) -> Option<std::sync::Arc<pipewise_common::trace::StepTrace>> {
    let mut workers = vec![Vec::new(); reports.len()];
    for r in reports {
        let slot = workers.get_mut(r.worker_index as usize)?;
        if r.spans.is_empty() {
            return None;
        }
        slot.extend_from_slice(&r.spans);
    }
    Some(std::sync::Arc::new(pipewise_common::trace::StepTrace {
        job,
        step: step + 1,
        workers,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipewise_common::trace::{Activity, Span};

    fn report(worker_index: u32, busy: f64, waits: (f64, f64)) -> StepReport {
        StepReport {
            worker_index,
            wall_secs: 1.0,
            busy_secs: busy,
            core_wait_secs: waits.0,
            pass_core_wait_secs: waits.1,
            ..Default::default()
        }
    }

    /// The measured bubble, its part waiting for a core (over workers × wall time) and the
    /// passes' part waiting for a core (over the time in passes).
    #[test]
    fn splits_the_bubble_by_what_it_waited_for() {
        let reports = [report(0, 0.5, (0.1, 0.05)), report(1, 0.7, (0.3, 0.25))];
        let e = event(1, 0, Shown::default(), &[], &reports);
        assert!(
            (e.measured_bubble - 0.4).abs() < 1e-12,
            "{}",
            e.measured_bubble
        );
        assert!(
            (e.core_wait_bubble - 0.2).abs() < 1e-12,
            "{}",
            e.core_wait_bubble
        );
        assert!(
            (e.pass_core_wait - 0.25).abs() < 1e-12,
            "{}",
            e.pass_core_wait
        );
        let bubbles: Vec<(u32, f64)> = vec![(0, 0.5), (1, 0.3)];
        assert_eq!(e.worker_bubbles.len(), 2);
        for (got, want) in e.worker_bubbles.iter().zip(&bubbles) {
            assert!(got.0 == want.0 && (got.1 - want.1).abs() < 1e-12, "{got:?}");
        }
    }

    /// A worker's gradient sums: all their seconds, and how far the last ran past its
    /// passes; a worker without sums has zeros, and the event names the reports' replica.
    #[test]
    fn the_sums_time_and_what_ran_past_the_passes() {
        let span = |activity, start, end| Span {
            activity,
            start,
            end,
        };
        let pass = pipewise_common::pass::Pass::w(0, 0);
        let mut summing = report(0, 0.5, (0.0, 0.0));
        summing.replica = 1;
        summing.spans = vec![
            span(Activity::Pass(pass), 0.0, 0.5),
            span(Activity::AllReduce { stage: 1 }, 0.3, 0.45),
            span(Activity::AllReduce { stage: 0 }, 0.5, 0.8),
            span(Activity::Sync, 0.8, 1.0),
        ];
        let mut plain = report(1, 0.5, (0.0, 0.0));
        plain.replica = 1;
        plain.spans = vec![span(Activity::Pass(pass), 0.0, 0.5)];
        let e = event(1, 0, Shown::default(), &[], &[summing, plain]);
        assert_eq!(e.replica, 1);
        let (w, total, exposed) = e.all_reduce[0];
        assert_eq!(w, 0);
        assert!((total - 0.45).abs() < 1e-12, "{total}");
        assert!((exposed - 0.3).abs() < 1e-12, "{exposed}");
        assert_eq!(e.all_reduce[1], (1, 0.0, 0.0));
    }
}
