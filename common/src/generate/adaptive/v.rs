//! The adaptive V-shape scheduler (see the [module docs](super), "Adaptive V").

use super::estimate::{Distinct, block_makespan, steady_peak};
use super::offsets::{SplitOffsets, split_candidates};
use super::search::{Bounds, EPS, Planned, Starts, check_inputs, consider_simulated};
use crate::cost::Costs;
use crate::error::Result;
use crate::generate::block::{BuildingBlock, VOffsets, reorder_warmup};
use crate::generate::finish::finish_for_caps;
use crate::generate::kind::ScheduleKind;
use crate::generate::list_v;
use crate::generate::paper_v::{hand_built_v, search_v_block};
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

/// Passes (candidates × 6dn) the full evaluation may spend: 8 candidates up to 6dn = 75k
/// (d = 16, n = 780), fewer above, at least one.
const FULL_BUDGET: u64 = 600_000;

/// Passes (evaluations × 6dn) the full evaluation of blocks may spend in all, the best few
/// included, when it adds the blocks of lower peaks that [`monotone_selection`] picks and
/// fills blocks within their own peak too: 100 evaluations at 6dn = 2k, 50 at 4k (e.g.
/// d = 12, n = 37: 2664), up to [`MONOTONE_UP_TO`].
const MONOTONE_BUDGET: u64 = 200_000;

/// Passes per schedule (6dn) above which only the best few blocks are evaluated (d = 16,
/// n = 128 is above: planning it stays within its 1 s target).
const MONOTONE_UP_TO: u64 = 8192;

/// Most candidates fully evaluated.
const MAX_FULL_EVALUATIONS: u64 = 8;

/// Below this size (6dn passes) the fixed V-Min / V-Half / V-ZB blocks are always fully
/// evaluated when they fit; above it only when the proxy ranks them among the best.
const ALWAYS_FIXED: u64 = 200_000;

/// Simulated passes the proxy may spend (blocks × 6dn).
const PROXY_BUDGET: u64 = 12_000_000;

/// Blocks always ranked by the proxy, whatever the budget.
const MIN_PROXIES: u64 = 16;

/// Passes (6dn per run) that list scheduling may spend.
const LIST_BUDGET: u64 = 1_000_000;

/// The blocks to evaluate in full out of `ranked` (proxy makespan, peak, block): every
/// block that is among the `full` best by proxy of the blocks whose peak is at most its own,
/// best first, and the proxy of the `full`-th best of all. The first rule does not depend on
/// the limit, so a larger limit evaluates every block a smaller one does (the best few of
/// all would drop blocks of a low peak once enough blocks of a higher peak with a better
/// proxy fit, and a realised schedule can be worse than its proxy says: more memory could
/// give a slower schedule). At most `full` blocks join per distinct peak, and at most
/// `most` in all: the best `full` of all first, then the others by proxy (over that budget a
/// larger limit may again drop a block a smaller one evaluates).
fn monotone_selection(
    mut ranked: Vec<(f64, f64, BuildingBlock)>,
    full: usize,
    most: usize,
) -> (Vec<BuildingBlock>, f64) {
    let by_proxy = |a: &(f64, f64, BuildingBlock), b: &(f64, f64, BuildingBlock)| {
        a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1))
    };
    // By peak (then proxy), level by level: the best `full` so far after each level.
    ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(by_proxy(a, b)));
    let mut chosen = vec![false; ranked.len()];
    // Indices of the best `full` of the levels so far, best first.
    let mut top: Vec<usize> = Vec::with_capacity(full + 1);
    let mut i = 0;
    while i < ranked.len() {
        let level = ranked[i].1;
        while i < ranked.len() && ranked[i].1 <= level + EPS {
            let at = top.partition_point(|&t| by_proxy(&ranked[t], &ranked[i]).is_le());
            if at < full {
                top.insert(at, i);
                top.truncate(full);
            }
            i += 1;
        }
        for &t in &top {
            chosen[t] = true;
        }
    }
    let cutoff = top
        .last()
        .filter(|_| top.len() == full)
        .map_or(f64::INFINITY, |&t| ranked[t].0);
    // Over budget: the best `full` of all (the last level's top), then the others by proxy.
    let mut first: Vec<BuildingBlock> = top.iter().map(|&t| ranked[t].2.clone()).collect();
    for &t in &top {
        chosen[t] = false;
    }
    let mut others: Vec<(f64, f64, BuildingBlock)> = ranked
        .into_iter()
        .zip(chosen)
        .filter_map(|(r, c)| c.then_some(r))
        .collect();
    others.sort_by(by_proxy);
    let room = most.saturating_sub(first.len());
    first.extend(others.into_iter().take(room).map(|(_, _, b)| b));
    (first, cutoff)
}

/// Repeat → warm-up reorder → cool-down reorder, compaction and W filling within each of
/// `limits`: the best fitting variant of one block for each limit, in order (the steps no
/// limit changes run once).
fn realise(
    block: &BuildingBlock,
    name: &str,
    n: u32,
    costs: &Costs,
    limits: &[f64],
) -> Result<Vec<Option<(Schedule, Simulation)>>> {
    let repeated = block.repeat(name, n)?;
    let warm = reorder_warmup(repeated)?;
    let warm_sim = simulate(&warm, costs)?;
    let mut best: Vec<Option<(Schedule, Simulation)>> = vec![None; limits.len()];
    for (b, &limit) in best.iter_mut().zip(limits) {
        consider_simulated(b, (warm.clone(), warm_sim.clone()), limit);
    }
    // Finished only within the limits the warm-up order itself fits.
    let fitting: Vec<usize> = (0..limits.len()).filter(|&i| best[i].is_some()).collect();
    let caps: Vec<Option<f64>> = fitting.iter().map(|&i| Some(limits[i])).collect();
    for (i, finished) in fitting
        .into_iter()
        .zip(finish_for_caps(warm, costs, &caps)?)
    {
        consider_simulated(&mut best[i], finished, limits[i]);
    }
    Ok(best)
}

/// The adaptive V-shape scheduler: the least-makespan V schedule whose simulated peak
/// activation memory fits `bounds.limit` on every worker, under the true per-stage `costs`
/// of the `2d` stages, its local search within `bounds`' budget.
pub fn adaptive_v(d: u32, n: u32, costs: &Costs, bounds: Bounds) -> Result<Planned> {
    adaptive_v_knowing(d, n, costs, bounds, None)
}

/// [`adaptive_v`] given one fixed schedule as [`hand_built_v`] builds it under the same
/// costs (kind, schedule, simulation), so that a caller that has built it already does not
/// pay for it twice.
pub(crate) fn adaptive_v_knowing(
    d: u32,
    n: u32,
    costs: &Costs,
    bounds: Bounds,
    hand_built: Option<(ScheduleKind, &(Schedule, Simulation))>,
) -> Result<Planned> {
    let limit = bounds.limit;
    let placement = Placement::V { workers: d };
    check_inputs(d, n, limit, costs, &placement)?;
    const NAME: &str = "adaptive-v";

    let all = split_candidates(d);
    let considered = all.len();
    // Every V schedule holds both of a worker's activations of a microbatch when its second
    // chunk's forward starts, and list scheduling with a reserve of one activation plans at
    // exactly that floor, so it is the smallest limit that fits (every block's peak, which
    // covers both lifetimes, is at least the floor).
    let smallest = list_v::memory_floor(d, costs);
    // (block length, peak, offsets) of every distinct fitting block. Blocks are rebuilt from
    // their offsets when needed rather than kept: there are O(d) candidates of 6d passes each
    // (316k at d = 256), and keeping them took gigabytes at a few hundred workers.
    let mut seen = Distinct::default();
    let mut fitting: Vec<(i64, f64, SplitOffsets)> = Vec::new();
    for o in all {
        crate::cancel::check()?;
        let block = o.block(d);
        let peak = steady_peak(&block, costs);
        if peak <= limit + EPS && seen.insert(&block, fitting.len(), |i| fitting[i].2.block(d)) {
            fitting.push((block.length(), peak, o));
        }
    }
    // Proxy: the squeezed makespan under the true costs, for as many blocks as the budget
    // allows, shortest blocks first.
    fitting.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let per_proxy = 6 * u64::from(d) * u64::from(n);
    let proxies = (PROXY_BUDGET / per_proxy.max(1)).max(MIN_PROXIES) as usize;
    let mut ranked: Vec<(f64, f64, BuildingBlock)> = Vec::new();
    for (_, peak, o) in fitting.into_iter().take(proxies) {
        crate::cancel::check()?;
        let block = o.block(d);
        ranked.push((block_makespan(&block, n, costs), peak, block));
    }
    let mut best = Starts::new(6 * d as usize * n as usize, bounds);
    let mut evaluated = 0usize;
    let full = (FULL_BUDGET / per_proxy.max(1)).clamp(1, MAX_FULL_EVALUATIONS) as usize;
    // Up to MONOTONE_UP_TO, the budget for blocks of lower peaks and own-peak fills.
    let monotone = per_proxy <= MONOTONE_UP_TO;
    let most = if monotone {
        (MONOTONE_BUDGET / per_proxy.max(1)).max(full as u64) as usize
    } else {
        full
    };
    let (mut blocks, cutoff) = monotone_selection(ranked, full, most);
    // The fixed schedules of each memory class, so that the result is never worse than them
    // (on large shapes only when the proxy ranks them among the best anyway).
    for fixed in [VOffsets::v_min(d), VOffsets::v_half(d)]
        .into_iter()
        .map(Ok)
        .chain([search_v_block(d, [4, 2, 4, 2], false)])
        .flatten()
    {
        let block = fixed.block(d);
        let small = per_proxy <= ALWAYS_FIXED;
        if !block.collision_free()
            || steady_peak(&block, costs) > limit + EPS
            || blocks.contains(&block)
            || (!small && block_makespan(&block, n, costs) > cutoff)
        {
            continue;
        }
        blocks.push(block);
    }
    // Also filled within a block's own peak, which does not depend on the limit (a larger
    // limit then finds the own-peak fills a smaller one finds), as the budget allows.
    let mut own_fills = if monotone {
        most.saturating_sub(blocks.len())
    } else {
        0
    };
    for block in &blocks {
        evaluated += 1;
        let mut limits = vec![limit];
        let own = steady_peak(block, costs);
        if own + EPS < limit && own_fills > 0 {
            own_fills -= 1;
            evaluated += 1;
            limits.push(own);
        }
        for realised in realise(block, NAME, n, costs, &limits)? {
            best.offer(realised);
        }
    }
    // The fixed schedules themselves, as the paper builds them (their W filling and,
    // for V-ZB, the greedy V scheduler), so that neither bubble is ever above them in their
    // memory class: on a tie in makespan the lower span bubble wins.
    if per_proxy <= ALWAYS_FIXED {
        for kind in [ScheduleKind::VMin, ScheduleKind::VHalf, ScheduleKind::VZb] {
            let built = match hand_built {
                Some((known, built)) if known == kind => Ok(built.clone()),
                _ => hand_built_v(kind, d, n, costs),
            };
            if let Ok((schedule, sim)) = built {
                evaluated += 1;
                let schedule = Schedule {
                    name: NAME.into(),
                    ..schedule
                };
                best.offer_fitting((schedule, sim));
            }
        }
    }
    // List scheduling in time order with the true costs and hops, for as many runs as the
    // budget allows.
    let runs = (LIST_BUDGET / per_proxy.max(1)).max(1) as usize;
    let (listed, made) = list_v::search(d, n, costs, limit, NAME, runs)?;
    evaluated += made;
    best.offer(listed);
    best.conclude(NAME, costs, smallest, (considered, evaluated))
}
