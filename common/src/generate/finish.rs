//! The cost-aware end of the split-backward pipelines: App. C's cool-down reorder, then the
//! best of compaction and zero-bubble W filling.

use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::generate::block::reorder_cooldown;
use crate::generate::compact::{compact, fill_weights};
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

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
    let cooled = reorder_cooldown(schedule, costs)?;
    let class = simulate(&cooled, costs)?.max_peak_memory();
    let cap = cap.map_or(class, |c| c.max(class));
    let candidates = [
        compact(cooled.clone(), costs)?,
        fill_weights(&cooled, costs, cap, false)?,
        fill_weights(&cooled, costs, cap, true)?,
    ];
    // The shortest makespan, then the lowest span bubble; the earlier candidate on ties.
    const EPS: f64 = 1e-9;
    let mut best: Option<(Schedule, Simulation)> = None;
    for candidate in candidates {
        let sim = simulate(&candidate, costs)?;
        let better = best.as_ref().is_none_or(|(_, b)| {
            sim.makespan + EPS < b.makespan
                || (sim.makespan <= b.makespan + EPS && sim.bubble_span + EPS < b.bubble_span)
        });
        if better {
            best = Some((candidate, sim));
        }
    }
    best.ok_or(Error::InvalidArgument {
        field: "schedule",
        reason: "no candidate schedule".into(),
    })
}
