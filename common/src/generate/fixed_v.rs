//! The named V-shape schedules (V-Min, V-Half, V-ZB).
//!
//! A named V schedule is the best of its memory class: the paper's building block (App. F)
//! repeated, reordered and filled ([`hand_built_v`]), and, on shapes of up to
//! [`NAMED_SEARCH_PASSES`] passes, the adaptive V search
//! ([`crate::generate::adaptive::adaptive_v`]) at the class's limit ([`class_units`]); the
//! shorter makespan wins, the lower span bubble on equal makespans, the hand-built schedule
//! on a tie; V-ZB, the zero-bubble class, takes a
//! shorter makespan only at no more than [`VZB_SPAN_SLACK`] of extra span bubble (the
//! paper's metric). The search's candidates include the hand-built schedules, so on those
//! shapes the named schedule is never slower than `adaptive-v` at its class's limit (V-ZB:
//! unless that costs more span bubble than the slack). A hand-built schedule already at the
//! makespan's lower bound (the most work of a worker, or the critical path) is kept without
//! a search.

use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::generate::adaptive::{Bounds, adaptive_v_knowing};
use crate::generate::kind::ScheduleKind;
use crate::generate::paper_v::hand_built_v;
use crate::schedule::Schedule;
use crate::simulate::Simulation;

/// Largest shape (passes, 6dn) on which a named V schedule is also searched at its class's
/// limit: d = 16 up to n = 128, the shape of the adaptive search's one-second target, so
/// planning stays within about a second; on larger shapes the hand-built block, in its
/// steady state for most of the step, stands.
pub const NAMED_SEARCH_PASSES: u64 = 12_288;

const EPS: f64 = 1e-9;

/// The most span bubble (one percentage point) V-ZB gives up for a shorter makespan.
const VZB_SPAN_SLACK: f64 = 0.01;

/// The memory class of a fixed V kind on `d` workers: its peak activation memory per worker
/// in units of one microbatch's activation over `1/d` of the model (1F1B's peak is `d`):
/// V-Min ⌊(d + 4)/3⌋, V-Half ⌊(d + 2)/2⌋, V-ZB `d` (seed 000, Table 4's classes). `None`
/// for the other kinds.
pub fn class_units(kind: ScheduleKind, d: u32) -> Option<u32> {
    match kind {
        ScheduleKind::VMin => Some((d + 4) / 3),
        ScheduleKind::VHalf => Some((d + 2) / 2),
        ScheduleKind::VZb => Some(d),
        _ => None,
    }
}

/// The class limit of `kind` in `costs`' memory unit: [`class_units`] times one unit, the
/// activation of all `2d` stages over `d` (half a unit per stage with uniform costs).
fn class_limit(kind: ScheduleKind, d: u32, costs: &Costs) -> Option<f64> {
    let unit = costs.stages.iter().map(|c| c.mem).sum::<f64>() / f64::from(d);
    class_units(kind, d).map(|u| f64::from(u) * unit)
}

/// The named V schedule `kind` on `d` workers and `n` microbatches under `costs` (over the
/// `2d` stages of the V placement), with its simulation: the better of [`hand_built_v`] and
/// the adaptive search at the class's limit (see the module docs), its local search within
/// `local_search_budget` simulated passes (`adaptive-v`'s own budget keeps the named schedule
/// never slower than `adaptive-v`).
pub(crate) fn fixed_v(
    kind: ScheduleKind,
    d: u32,
    n: u32,
    costs: &Costs,
    local_search_budget: u64,
) -> Result<(Schedule, Simulation)> {
    let (hand, hand_sim) = hand_built_v(kind, d, n, costs)?;
    let at_bound = hand_sim.makespan <= hand_sim.bounds.lower_bound + EPS;
    let Some(limit) = class_limit(kind, d, costs) else {
        return Ok((hand, hand_sim));
    };
    if at_bound || 6 * u64::from(d) * u64::from(n) > NAMED_SEARCH_PASSES {
        return Ok((hand, hand_sim));
    }
    let hand_built = (hand, hand_sim);
    let known = Some((kind, &hand_built));
    let searched = match adaptive_v_knowing(
        d,
        n,
        costs,
        Bounds {
            limit,
            local_search_budget,
        },
        known,
    ) {
        Ok(p) => p,
        // Nothing of the search fits the class (a tiny shape, or costs whose memory floor
        // is above it): the hand-built schedule stands.
        Err(Error::MemoryLimit { .. }) => return Ok(hand_built),
        Err(e) => return Err(e),
    };
    let (s, h) = (&searched.simulation, &hand_built.1);
    let shorter = s.makespan + EPS < h.makespan;
    let tighter = s.makespan <= h.makespan + EPS && s.bubble_span + EPS < h.bubble_span;
    // V-ZB is the zero-bubble class: a shorter makespan is not taken at more than
    // `VZB_SPAN_SLACK` of extra span bubble (with hops, the search's shorter schedule can
    // idle more within a worker's span: Table 4, d = 16, n = 16, 21.7 % against the paper's
    // 18.7 %).
    let span_kept = kind != ScheduleKind::VZb || s.bubble_span <= h.bubble_span + VZB_SPAN_SLACK;
    if (shorter || tighter) && span_kept {
        let schedule = Schedule {
            name: kind.name().into(),
            ..searched.schedule
        };
        Ok((schedule, searched.simulation))
    } else {
        Ok(hand_built)
    }
}
