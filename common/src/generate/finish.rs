//! The cost-aware end of the split-backward pipelines: App. C's cool-down reorder, then the
//! best of compaction and zero-bubble W filling.

use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::generate::block::reorder_cooldown;
use crate::generate::compact::{compact_simulated, fill_weights_indexed};
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate, simulate_validated};
use crate::validate::validate;

/// The cost-aware end of the split-backward pipelines: App. C cool-down reorder, then the
/// best of compaction and zero-bubble W filling (both within the memory class: the largest
/// per-worker peak of the reordered schedule).
pub(crate) fn finish(schedule: Schedule, costs: &Costs) -> Result<Schedule> {
    finish_simulated(schedule, costs, None).map(|(schedule, _)| schedule)
}

/// [`finish`] with W filling allowed up to `cap` activation memory per worker instead of
/// the reordered schedule's own peak (when larger), and the winner's simulation.
pub(crate) fn finish_simulated(
    schedule: Schedule,
    costs: &Costs,
    cap: Option<f64>,
) -> Result<(Schedule, Simulation)> {
    let mut finished = finish_for_caps(schedule, costs, &[cap])?;
    finished.pop().ok_or(Error::InvalidArgument {
        field: "schedule",
        reason: "no candidate schedule".into(),
    })
}

/// [`finish_simulated`] for each of `caps`, in order: the cool-down reorder and the
/// compaction, which no cap changes, run once for all of them.
pub(crate) fn finish_for_caps(
    schedule: Schedule,
    costs: &Costs,
    caps: &[Option<f64>],
) -> Result<Vec<(Schedule, Simulation)>> {
    let cooled = reorder_cooldown(schedule, costs)?;
    let index = validate(&cooled)?;
    let cooled_sim = simulate_validated(&cooled, &index, costs)?;
    let class = cooled_sim.max_peak_memory();
    let compacted = compact_simulated(cooled.clone(), &index, cooled_sim, costs)?;
    let mut out = Vec::with_capacity(caps.len());
    for cap in caps {
        let cap = cap.map_or(class, |c| c.max(class));
        let mut candidates = vec![compacted.clone()];
        for eager in [false, true] {
            let filled = fill_weights_indexed(&cooled, &index, costs, cap, eager)?;
            let sim = simulate(&filled, costs)?;
            candidates.push((filled, sim));
        }
        out.extend(best_of(candidates));
    }
    Ok(out)
}

/// The shortest makespan, then the lowest span bubble; the earlier candidate on ties.
fn best_of(
    candidates: impl IntoIterator<Item = (Schedule, Simulation)>,
) -> Option<(Schedule, Simulation)> {
    const EPS: f64 = 1e-9;
    let mut best: Option<(Schedule, Simulation)> = None;
    for (candidate, sim) in candidates {
        let better = best.as_ref().is_none_or(|(_, b)| {
            sim.makespan + EPS < b.makespan
                || (sim.makespan <= b.makespan + EPS && sim.bubble_span + EPS < b.bubble_span)
        });
        if better {
            best = Some((candidate, sim));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Times;
    use crate::generate::block::{VOffsets, reorder_warmup};
    use crate::generate::compact::{compact, fill_weights};
    use crate::generate::{Request, ScheduleKind, generate};

    /// Finishing for several caps at once gives, for each cap, the best of the public
    /// steps run one by one on the cool-down reorder: its compaction and both W fillings
    /// within the cap (at least the reorder's own peak).
    #[test]
    fn finishing_for_several_caps_matches_the_steps_one_by_one() {
        let hops = Times {
            b: 1.4,
            w: 0.7,
            comm: 0.5,
            ..Times::UNIT
        };
        for (d, n) in [(4u32, 8u32), (6, 13), (8, 16)] {
            let v_half = VOffsets::v_half(d)
                .block(d)
                .repeat("t", n)
                .expect("repeats");
            let v_half = reorder_warmup(v_half).expect("reorders");
            let zb = generate(&Request::new(ScheduleKind::ZbH1, d, n)).expect("generates");
            for schedule in [v_half, zb] {
                for t in [Times::UNIT, hops] {
                    let costs = Costs::uniform(&schedule.placement, t).expect("costs");
                    let caps = [
                        None,
                        Some(1.0),
                        Some(f64::from(d) / 2.0),
                        Some(f64::from(d)),
                    ];
                    let shared =
                        finish_for_caps(schedule.clone(), &costs, &caps).expect("finishes");
                    let cooled = reorder_cooldown(schedule.clone(), &costs).expect("reorders");
                    let class = simulate(&cooled, &costs).expect("valid").max_peak_memory();
                    assert_eq!(shared.len(), caps.len());
                    for (cap, got) in caps.into_iter().zip(shared) {
                        let cap = cap.map_or(class, |c| c.max(class));
                        let one_by_one = [
                            compact(cooled.clone(), &costs).expect("compacts"),
                            fill_weights(&cooled, &costs, cap, false).expect("fills"),
                            fill_weights(&cooled, &costs, cap, true).expect("fills"),
                        ]
                        .map(|s| {
                            let sim = simulate(&s, &costs).expect("valid");
                            (s, sim)
                        });
                        let want = best_of(one_by_one).expect("a candidate");
                        assert_eq!(got, want, "d={d} n={n} {t:?} cap={cap}");
                    }
                }
            }
        }
    }
}
