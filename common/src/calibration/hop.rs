//! The cost of a hop, fitted to the step it is measured in: the latency per hop between
//! workers for which the schedule, simulated with the step's own mean pass times, ends
//! when the step's passes ended.
//!
//! What a send span times is the hand-off to the transport; what the receiver waits for
//! also holds the frame's way through both runtimes and the loopback or network, and
//! the jitter of pass times around their means. Fitting the hop to the step's makespan
//! counts all of it, as the planner has to: a schedule's idle is made at its hops.

use crate::cost::{Costs, StageCost};
use crate::run::worker::StepReport;
use crate::schedule::Schedule;
use crate::simulate::simulate_validated;
use crate::validate::validate;

/// Bisection rounds: the hop to a trillionth of the makespan.
const ROUNDS: usize = 40;

/// Every stage's mean pass times as the workers reported them for one step (a fused BW
/// as B with W = 0), or `None` when a stage was not reported.
fn measured_stages(stages: usize, reports: &[StepReport]) -> Option<Vec<StageCost>> {
    let mut out: Vec<Option<StageCost>> = vec![None; stages];
    for t in reports.iter().flat_map(|r| &r.stage_times) {
        let slot = out.get_mut(t.stage as usize)?;
        *slot = Some(StageCost {
            f: t.f,
            b: t.b,
            w: t.w,
            mem: 1.0,
        });
    }
    out.into_iter().collect()
}

/// The per-hop latency (seconds, ≥ 0) with which `schedule` simulated on the reported
/// pass times lasts `makespan`; `None` without a hop between workers, without every
/// stage's times, or when the schedule cannot be simulated.
pub(super) fn fitted_hop(
    schedule: &Schedule,
    reports: &[StepReport],
    makespan: f64,
) -> Option<f64> {
    let placement = &schedule.placement;
    let crosses = schedule.workers.len() > 1;
    if !crosses || !makespan.is_finite() || makespan <= 0.0 {
        return None;
    }
    let stages = measured_stages(placement.stages() as usize, reports)?;
    let index = validate(schedule).ok()?;
    let span = |hop: f64| -> Option<f64> {
        let costs = Costs::per_stage(placement, stages.clone(), hop).ok()?;
        Some(simulate_validated(schedule, &index, &costs).ok()?.makespan)
    };
    if span(0.0)? >= makespan {
        return Some(0.0);
    }
    // A hop as long as the whole step already ends past it.
    let (mut lo, mut hi) = (0.0, makespan);
    if span(hi)? < makespan {
        return Some(hi);
    }
    for _ in 0..ROUNDS {
        let mid = 0.5 * (lo + hi);
        if span(mid)? < makespan {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Request, ScheduleKind, generate};
    use crate::run::worker::StageTimes;
    use crate::simulate::simulate;

    fn reports(schedule: &Schedule, times: &[(f64, f64, f64)]) -> Vec<StepReport> {
        (0..schedule.workers.len() as u32)
            .map(|w| StepReport {
                worker_index: w,
                stage_times: (0..schedule.placement.stages())
                    .filter(|&s| schedule.placement.worker_of(s) == w)
                    .map(|s| {
                        let (f, b, w) = times[s as usize];
                        StageTimes {
                            stage: s,
                            f,
                            b,
                            w,
                            edge: [0.0; 3],
                        }
                    })
                    .collect(),
                ..StepReport::default()
            })
            .collect()
    }

    #[test]
    fn the_hop_that_made_a_step_last_what_it_did_is_found() {
        for kind in [
            ScheduleKind::OneFOneB,
            ScheduleKind::ZbH1,
            ScheduleKind::VHalf,
        ] {
            let schedule = generate(&Request::new(kind, 2, 8)).expect("generate");
            let stages = schedule.placement.stages() as usize;
            let times: Vec<(f64, f64, f64)> = (0..stages)
                .map(|s| (0.010 + 0.001 * s as f64, 0.011, 0.009))
                .collect();
            let costs = |hop| {
                let stages = times
                    .iter()
                    .map(|&(f, b, w)| StageCost { f, b, w, mem: 1.0 })
                    .collect();
                Costs::per_stage(&schedule.placement, stages, hop).expect("costs")
            };
            let truth = 0.0007;
            let makespan = simulate(&schedule, &costs(truth)).expect("sim").makespan;
            let hop = fitted_hop(&schedule, &reports(&schedule, &times), makespan).expect("fit");
            let again = simulate(&schedule, &costs(hop)).expect("sim").makespan;
            assert!(
                (again - makespan).abs() < 1e-9 * makespan,
                "{kind:?}: {again} vs {makespan}"
            );
            assert!(hop > 0.0 && hop <= truth * (1.0 + 1e-9), "{kind:?}: {hop}");
        }
    }

    #[test]
    fn a_step_no_longer_than_its_passes_has_no_hop_cost() {
        let schedule = generate(&Request::new(ScheduleKind::OneFOneB, 2, 4)).expect("1f1b");
        let times = [(0.01, 0.01, 0.01); 2];
        let r = reports(&schedule, &times);
        assert_eq!(fitted_hop(&schedule, &r, 0.05), Some(0.0));
        // A stage without times: nothing to fit.
        assert_eq!(fitted_hop(&schedule, &r[..1], 1.0), None);
    }
}
