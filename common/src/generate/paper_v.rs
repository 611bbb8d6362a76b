//! The V-shape schedules of seed 000 as the paper builds them: V-Min, V-Half and V-ZB from
//! their building blocks (Sec. 3, App. F), and the search for a V building block's turn
//! offsets.

use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::generate::block::{VOffsets, reorder_warmup};
use crate::generate::finish::finish_simulated;
use crate::generate::greedy_v;
use crate::generate::kind::ScheduleKind;
use crate::schedule::Schedule;
use crate::simulate::Simulation;

/// Largest V-ZB shape (passes, 6dn) on which [`greedy_v`] runs beside the building block
/// (d = 16 up to n = 1024; d = 64 up to n = 256).
pub const GREEDY_V_PASSES: u64 = 100_000;

/// V-Min, V-Half or V-ZB as seed 000 builds them, under `costs`, with their simulation:
/// building block → repeat → squeeze → reorder (App. C's warm-up reorder, then
/// `generate::finish`'s compaction or W filling within the class); for V-ZB the greedy V
/// scheduler competes in the same memory class on shapes of up to [`GREEDY_V_PASSES`]
/// passes, and the lower span bubble wins.
pub fn hand_built_v(
    kind: ScheduleKind,
    d: u32,
    n: u32,
    costs: &Costs,
) -> Result<(Schedule, Simulation)> {
    let (name, offsets) = match kind {
        ScheduleKind::VMin => ("v-min", VOffsets::v_min(d)),
        ScheduleKind::VHalf => ("v-half", VOffsets::v_half(d)),
        ScheduleKind::VZb => ("v-zb", search_v_block(d, [4, 2, 4, 2], false)?),
        other => {
            return Err(Error::Unsupported {
                schedule: other.name().into(),
                reason: "not a fixed V-shape schedule".into(),
            });
        }
    };
    let warm = reorder_warmup(offsets.block(d).repeat(name, n)?)?;
    let (block, block_sim) = finish_simulated(warm, costs, None)?;
    // The greedy V scheduler competes in the block schedule's memory class; it wins when few
    // microbatches keep the block schedule out of its steady state, and is skipped on large
    // shapes, where it costs seconds and the block is near zero bubble.
    if kind != ScheduleKind::VZb || 6 * u64::from(d) * u64::from(n) > GREEDY_V_PASSES {
        return Ok((block, block_sim));
    }
    match greedy_v::greedy_v_simulated(d, n, costs, block_sim.max_peak_memory()) {
        Ok((greedy, greedy_sim)) if greedy_v::span_first(&greedy_sim, &block_sim) => {
            Ok((greedy, greedy_sim))
        }
        _ => Ok((block, block_sim)),
    }
}

/// Finds the turn offsets (δ(F_d⁰,F_d¹), δ(F_1¹,B_1¹), δ(B_d¹,B_d⁰)) for V-shape offsets
/// `[f_down, f_up, b_down, b_up]` that repeat without collision, preferring the lowest peak
/// memory (Eq. 1), then the shortest block.
pub fn search_v_block(
    d: u32,
    [f_down, f_up, b_down, b_up]: [i64; 4],
    fused: bool,
) -> Result<VOffsets> {
    let min_b = if fused { 2 } else { 1 };
    let mut best: Option<((i64, i64), VOffsets)> = None;
    for turn_f in 1..=8 {
        for turn_fb in 1..=8 {
            for turn_b in min_b..=8 {
                let o = VOffsets {
                    f_down,
                    f_up,
                    b_down,
                    b_up,
                    turn_f,
                    turn_fb,
                    turn_b,
                    fused,
                };
                let block = o.block(d);
                if !block.collision_free() {
                    continue;
                }
                let key = (block.peak_estimate(), block.length());
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, o));
                }
            }
        }
    }
    best.map(|(_, o)| o).ok_or_else(|| Error::NoBuildingBlock {
        schedule: "v-shape".into(),
        workers: d,
    })
}
