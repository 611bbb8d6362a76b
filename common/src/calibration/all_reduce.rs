//! The replicas' gradient sums in the cost model: what summing a stage's gradients costs,
//! measured from the workers' `AllReduce` spans, and when a step's sums end once its
//! passes are simulated. A worker sums its stages one at a time beside its passes, each as
//! soon as the stage's last gradient pass (`W`, or the fused `BW`) ends; the step's
//! collectives wait for the last sum.

use std::ops::Range;

use crate::model::ModelSpec;
use crate::pass::PassKind;
use crate::placement::Placement;
use crate::run::worker::StepReport;
use crate::simulate::Simulation;
use crate::trace::{Activity, passes_end};

/// Seconds per summed gradient value before any sum is measured (the planner's default).
pub(super) const DEFAULT_SECS_PER_VALUE: f64 = crate::auto::DEFAULT_SUM_MS_PER_VALUE * 1e-3;

/// The gradient values of each stage (its parameters).
pub(super) fn stage_values(model: &ModelSpec, ranges: &[Range<usize>]) -> Vec<u64> {
    ranges
        .iter()
        .map(|r| model.range_params(r.clone()))
        .collect()
}

/// Seconds per value of the step's sums over all `reports` (each sum waits for the
/// replicas' slowest contribution and shares the summing worker with the others: the mean
/// is what a sum costs under that load), and the seconds from the step's start to the end
/// of the reporting workers' last pass or send (the passes' makespan, without the sums
/// past it and the sync); `None` when no report has a sum.
pub(super) fn observed(reports: &[StepReport], values: &[u64]) -> Option<(f64, f64)> {
    let (mut secs, mut summed) = (0.0, 0u64);
    let mut makespan: f64 = 0.0;
    for r in reports {
        for s in &r.spans {
            if let Activity::AllReduce { stage } = s.activity {
                secs += s.duration();
                summed += values.get(stage as usize).copied().unwrap_or(0);
            }
        }
        let end = r.spans.iter().map(|s| s.end).reduce(f64::max);
        if let (Some(end), Some(passes)) = (end, passes_end(&r.spans)) {
            // The report's spans end with its step (the sync's end): its start is that less
            // its wall time.
            makespan = makespan.max(r.wall_secs - (end - passes));
        }
    }
    (summed > 0).then(|| (secs / summed as f64, makespan))
}

/// When the last of the step's sums ends, on the clock of `sim` (the simulated passes of a
/// schedule over `placement`): every worker sums its stages in the order their last
/// gradient pass ends, one after another, `values[s] · secs_per_value` each.
pub(crate) fn sums_end(
    sim: &Simulation,
    placement: &Placement,
    values: &[u64],
    secs_per_value: f64,
) -> f64 {
    let mut end: f64 = 0.0;
    for (w, timeline) in sim.timeline.iter().enumerate() {
        let mut finals: Vec<(f64, u32)> = placement
            .stages_of(w as u32)
            .into_iter()
            .filter_map(|s| {
                timeline
                    .iter()
                    .filter(|t| {
                        t.pass.stage == s && matches!(t.pass.kind, PassKind::W | PassKind::BW)
                    })
                    .map(|t| t.end)
                    .reduce(f64::max)
                    .map(|at| (at, s))
            })
            .collect();
        finals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut t: f64 = 0.0;
        for (at, s) in finals {
            let v = values.get(s as usize).copied().unwrap_or(0) as f64;
            t = t.max(at) + v * secs_per_value;
        }
        end = end.max(t);
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Costs;
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::simulate::simulate;
    use crate::trace::Span;

    #[test]
    fn the_last_sum_ends_after_its_stages_last_w() {
        let s = generate(&Request::new(ScheduleKind::OneFOneB, 2, 4)).expect("schedule");
        let costs = Costs::uniform(&s.placement, crate::Times::UNIT).expect("costs");
        let sim = simulate(&s, &costs).expect("simulate");
        // No values: the sums take nothing and end with the stages' last gradient pass.
        let last_w = sim
            .timeline
            .iter()
            .flatten()
            .filter(|t| matches!(t.pass.kind, PassKind::W | PassKind::BW))
            .map(|t| t.end)
            .fold(0.0, f64::max);
        assert_eq!(sums_end(&sim, &s.placement, &[0, 0], 1.0), last_w);
        // Stage 1 (worker 1) finishes first; a long sum of it outlasts worker 0's passes.
        let stage1_end = sim.timeline[1].last().expect("passes").end;
        let end = sums_end(&sim, &s.placement, &[1, 100], 0.1);
        assert!((end - (stage1_end + 10.0)).abs() < 1e-9, "{end}");
        assert!(end > sim.makespan);
    }

    #[test]
    fn the_cost_is_the_mean_and_the_makespan_ends_with_the_last_pass() {
        let span = |activity, start, end| Span {
            activity,
            start,
            end,
        };
        let pass = crate::pass::Pass::w(0, 0);
        // A step of 4 s from 10.0: passes until `passes`, the sum, the sync until 14.0.
        let report = |passes: f64, sum_secs: f64| StepReport {
            wall_secs: 4.0,
            spans: vec![
                span(Activity::Pass(pass), 10.0, passes),
                span(Activity::AllReduce { stage: 0 }, passes, passes + sum_secs),
                span(Activity::Sync, 13.0, 14.0),
            ],
            ..StepReport::default()
        };
        let reports = [report(12.0, 0.5), report(11.0, 1.5)];
        let (per_value, makespan) = observed(&reports, &[100]).expect("sums");
        assert!((per_value - 0.01).abs() < 1e-12, "{per_value}");
        assert!((makespan - 2.0).abs() < 1e-12, "{makespan}");
        assert_eq!(observed(&[StepReport::default()], &[100]), None);
    }
}
