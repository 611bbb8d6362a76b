//! The adaptive zero-bubble scheduler on one stage per worker (see the [module
//! docs](super), "Adaptive zero bubble").

use std::collections::HashSet;

use super::estimate::order_peak;
use super::search::{
    Bounds, EPS, Planned, Starts, better, check_inputs, consider, consider_simulated,
};
use crate::cost::Costs;
use crate::error::Result;
use crate::generate::classic::{Backward, one_f_one_b};
use crate::generate::compact::fill_weights;
use crate::generate::finish::finish_for_caps;
use crate::placement::Placement;
use crate::simulate::simulate;

/// Passes (shapes × 3dn) adaptive zero bubble may spend finishing shapes: every shape up to
/// 3dn·(2d − 1) = 2M (e.g. d = 32, n = 330), above that the ones the proxy ranks best.
const ZB_FULL_BUDGET: u64 = 2_000_000;

/// Shapes adaptive zero bubble always finishes, whatever the budget.
const ZB_MIN_FULL: u64 = 4;

/// Warm-up forwards of worker `w` for the adaptive zero-bubble family, index `c` in
/// `0 ..= 2(d − 1)`: `c < d − 1` stays below 1F1B (`min(d − w − 1, c)`), then 1F1B plus
/// `c − (d − 1)` extra up to ZB-H2's `2(d − w − 1)`.
fn zb_warmup(d: u32, w: u32, c: u32) -> usize {
    let base = d - w - 1;
    if c < d - 1 {
        base.min(c) as usize
    } else {
        (base + base.min(c - (d - 1))) as usize
    }
}

/// The adaptive zero-bubble scheduler on one stage per worker: the least-makespan member of
/// the warm-up family (see the module documentation) whose peak fits `bounds.limit`, after
/// W filling within the limit and the local search (within `bounds`' budget).
pub fn adaptive_zb(d: u32, n: u32, costs: &Costs, bounds: Bounds) -> Result<Planned> {
    let limit = bounds.limit;
    let placement = Placement::OnePerWorker { workers: d };
    check_inputs(d, n, limit, costs, &placement)?;
    const NAME: &str = "adaptive-zb";
    let mut best = Starts::new(3 * d as usize * n as usize, bounds);
    let mut smallest = f64::INFINITY;
    let mut evaluated = 0usize;
    let mut seen: HashSet<Vec<usize>> = HashSet::new();
    let shapes = 2 * (d - 1) + 1;
    let shape = |warm: &[usize]| {
        one_f_one_b(
            NAME,
            placement.clone(),
            n,
            Backward::Split,
            |w| (0..n).map(|mb| (w, mb)).collect(),
            |w| (0..n).map(|mb| (w, mb)).collect(),
            |w| warm[w as usize],
        )
    };
    // Every distinct warm-up shape that fits.
    let mut fitting: Vec<Vec<usize>> = Vec::new();
    for c in 0..shapes {
        let warm: Vec<usize> = (0..d).map(|w| zb_warmup(d, w, c).min(n as usize)).collect();
        if !seen.insert(warm.clone()) {
            continue;
        }
        let peak = order_peak(&shape(&warm), costs);
        smallest = smallest.min(peak);
        if peak <= limit + EPS {
            fitting.push(warm);
        }
    }
    // The whole finishing (cool-down reorder, compaction, both W fillings) costs several
    // times a proxy: on large shapes only the shapes with the best proxies get it. The
    // proxy is the better of the order as repeated and its lazy W filling; the sort is
    // stable, so the smaller warm-up goes first on ties.
    let per_shape = 3 * u64::from(d) * u64::from(n);
    let full = (ZB_FULL_BUDGET / per_shape.max(1)).max(ZB_MIN_FULL) as usize;
    if fitting.len() > full {
        let mut ranked = Vec::with_capacity(fitting.len());
        for warm in fitting {
            let base = shape(&warm);
            let sim = simulate(&base, costs)?;
            let filled = simulate(&fill_weights(&base, costs, limit, false)?, costs)?;
            let key = if better(&filled, &sim) { filled } else { sim };
            ranked.push((key.makespan, key.bubble_span, warm));
        }
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        fitting = ranked.into_iter().take(full).map(|(_, _, w)| w).collect();
    }
    // Each shape is also finished within its own peak, which does not depend on the limit
    // (a larger limit then finds the own-peak finishes a smaller one finds), when the
    // budget allows both.
    let own_fills = 2 * fitting.len() <= full;
    for warm in fitting {
        evaluated += 1;
        let base = shape(&warm);
        let mut local = None;
        consider(&mut local, base.clone(), costs, limit)?;
        let own = order_peak(&base, costs);
        let caps = if own_fills && own + EPS < limit {
            vec![Some(own), Some(limit)]
        } else {
            vec![Some(limit)]
        };
        for finished in finish_for_caps(base, costs, &caps)? {
            consider_simulated(&mut local, finished, limit);
        }
        best.offer(local);
    }
    best.conclude(NAME, costs, smallest, (shapes as usize, evaluated))
}
