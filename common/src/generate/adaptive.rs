//! Memory-budget planning: the adaptive V-shape scheduler (seed 000, App. A and B) and the
//! adaptive zero-bubble scheduler for one stage per worker (the ZB-1P / ZB-2P family).
//!
//! # Adaptive V
//!
//! The search space is Eq. 3 of seed 000: the building block's "down" offsets (F on the
//! first half of the V, B on the second half) are `down_lo` between the first `K` workers and
//! `down_hi` from there on; the "up" offsets (F on the second half, B on the first) likewise
//! `up_lo` / `up_hi`; three turn offsets fix the pass order on the first and last worker.
//! Every F, B and W takes one cell and the block repeats every `T = 6` cells.
//!
//! 1. **Enumerate** every offset tuple and keep the collision-free ones. Collisions are
//!    checked in closed form: on worker `i` the F⁰, F¹, B¹ and B⁰ cells are sums of prefix
//!    offsets, so a tuple collides iff two of them share a residue modulo `T`; the W passes
//!    take the two residues left (App. A: "we can always greedily fill W").
//! 2. **Memory estimate** (Eq. 1 with the true per-stage memory): each stage holds
//!    `⌈lifespan / T⌉` microbatches at most. This is an upper bound of the repeated order's
//!    peak, so a tuple whose estimate fits the limit certainly fits.
//! 3. **Proxy**: the distinct repeated orders are simulated with the true costs at two small
//!    microbatch counts and the makespan at `n` is extrapolated linearly.
//! 4. **Full evaluation** of the best few, and of every block that is among the best few of
//!    the blocks of its own peak or less (as the budget allows: so that a larger limit
//!    evaluates what a smaller one does): repeat to `n`, squeeze, reorder the warm-up and
//!    the cool-down (App. C), compact and fill W passes within the limit and, as the budget
//!    allows, within the block's own peak ([`super::finish`]), then the local search of
//!    [`super::local`]. The fixed V-Min / V-Half / V-ZB blocks are
//!    always evaluated too when they fit, and on small shapes (up to [`ALWAYS_FIXED`]
//!    passes) so are the fixed schedules themselves as `pipewise plan` builds them
//!    ([`super::fixed_v`]: their W filling and, for V-ZB, the greedy V scheduler), so the
//!    result is never worse than the fixed schedule of the same memory class under the same
//!    costs: never a longer makespan, and on equal makespans never a higher span bubble.
//! 5. **List scheduling** ([`super::list_v`]): passes placed one at a time in time order
//!    with the true costs and hop latency, over a grid of start rates, bursts, W policies
//!    and memory reserves refined by pattern search, as many runs as [`LIST_BUDGET`]
//!    allows. Blocks repeat one timing for every microbatch, which costs the most when hops
//!    are long and `n` is small; there a non-periodic fill wins (e.g. d = 16, hops of half
//!    an F, 9 units, n = 16: 1470.2 against the best block's 1542.3 and 1F1B's 1490.0; 10
//!    units, n = 32: 2241.1 against 2267.7 and 2259.4). The best of 4 and 5 (least
//!    makespan, then least span bubble) goes to the local search, which lowers the makespan,
//!    then the span bubble; on small shapes (up to 4096 passes) the best three distinct
//!    schedules each go to it, and the best result wins (where the search ends depends on
//!    where it starts).
//!
//! # Adaptive zero bubble
//!
//! One stage per worker with the B/W split: worker `w` runs `warm(w)` forwards before its
//! first backward, from `min(d − w − 1, c)` (below 1F1B's memory) through 1F1B (`d − w − 1`)
//! to ZB-H2 (`2(d − w − 1)`); W passes then fill the bubbles within the limit
//! ([`super::fill_weights`]; also within the shape's own peak when the budget allows) and
//! the local search runs (from the best three on small shapes). The least makespan that
//! fits wins.
//! On large shapes (above `ZB_FULL_BUDGET` passes in all) the warm-ups are ranked by a
//! proxy (the order as repeated, or with lazy W filling) and only the best are finished.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use super::block::{BuildingBlock, Placed, VOffsets, reorder_warmup};
use super::classic::{Backward, one_f_one_b};
use super::list_v;
use super::local::improve;
use super::{ScheduleKind, fill_weights, finish_simulated, fixed_v, search_v_block};
use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::pass::{Pass, PassKind};
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

/// Cells per microbatch per worker in a V block (F, F, B, B, W, W).
const PERIOD: i64 = 6;
/// Largest "down" / "up" offset searched.
const MAX_OFFSET: i64 = 4;
/// Largest turn offset searched.
const MAX_TURN: i64 = 6;
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
/// Passes (shapes × 3dn) adaptive zero bubble may spend finishing shapes: every shape up to
/// 3dn·(2d − 1) = 2M (e.g. d = 32, n = 330), above that the ones the proxy ranks best.
const ZB_FULL_BUDGET: u64 = 2_000_000;
/// Shapes adaptive zero bubble always finishes, whatever the budget.
const ZB_MIN_FULL: u64 = 4;
const EPS: f64 = 1e-9;

/// The offsets of Eq. 3 (seed 000, App. A), with workers numbered from 0: the offset across
/// the boundary between workers `a` and `a + 1` is the "lo" value when both lie in the first
/// `k` workers (`a + 1 < k`), the "hi" value otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SplitOffsets {
    /// The split row `K` (1 ..= d; 1 means uniform "hi" offsets).
    pub k: u32,
    /// δ⁰ within the first `K` workers (F of the first half, B of the second half).
    pub down_lo: i64,
    /// δ⁰ from row `K` on.
    pub down_hi: i64,
    /// δ¹ within the first `K` workers (F of the second half, B of the first half).
    pub up_lo: i64,
    /// δ¹ from row `K` on.
    pub up_hi: i64,
    /// δ(F_d⁰, F_d¹): the forward turn on the last worker.
    pub turn_f: i64,
    /// δ(F_1¹, B_1¹): last forward to first backward on worker 0.
    pub turn_fb: i64,
    /// δ(B_d¹, B_d⁰): the backward turn on the last worker.
    pub turn_b: i64,
}

impl SplitOffsets {
    /// Uniform offsets (the building blocks of V-Min, V-Half and V-ZB). `None` when the down
    /// (or up) offsets of F and B differ, which Eq. 3 does not describe, or the block is fused.
    pub fn from_uniform(o: &VOffsets) -> Option<SplitOffsets> {
        (!o.fused && o.f_down == o.b_down && o.f_up == o.b_up).then_some(SplitOffsets {
            k: 1,
            down_lo: o.f_down,
            down_hi: o.f_down,
            up_lo: o.f_up,
            up_hi: o.f_up,
            turn_f: o.turn_f,
            turn_fb: o.turn_fb,
            turn_b: o.turn_b,
        })
    }

    fn across(&self, a: i64, lo: i64, hi: i64) -> i64 {
        if a + 1 < i64::from(self.k) { lo } else { hi }
    }

    fn down(&self, a: i64) -> i64 {
        self.across(a, self.down_lo, self.down_hi)
    }

    fn up(&self, a: i64) -> i64 {
        self.across(a, self.up_lo, self.up_hi)
    }

    /// The building block on `d` workers; W passes take the earliest free residue after
    /// their B.
    pub fn block(&self, d: u32) -> BuildingBlock {
        let d = i64::from(d);
        let mut passes = Vec::with_capacity(6 * d as usize);
        let mut push = |pass: Pass, cell: i64| passes.push(Placed { pass, cell, len: 1 });
        let stage = |s: i64| s as u32;
        let mut t = 0;
        for s in 0..d {
            push(Pass::f(stage(s), 0), t);
            t += if s + 1 < d { self.down(s) } else { self.turn_f };
        }
        for s in d..2 * d {
            push(Pass::f(stage(s), 0), t);
            t += if s + 1 < 2 * d {
                self.up(2 * d - 2 - s)
            } else {
                self.turn_fb
            };
        }
        for s in (d..2 * d).rev() {
            push(Pass::b(stage(s), 0), t);
            t += if s > d {
                self.down(2 * d - 1 - s)
            } else {
                self.turn_b
            };
        }
        for s in (0..d).rev() {
            push(Pass::b(stage(s), 0), t);
            if s > 0 {
                t += self.up(s - 1);
            }
        }
        let mut block = BuildingBlock {
            placement: Placement::V { workers: d as u32 },
            period: PERIOD,
            passes,
        };
        block.place_weights();
        block
    }
}

#[cfg(test)]
/// The cells of worker `i`'s four F/B passes (F⁰, F¹, B¹, B⁰) in closed form, for every
/// worker: prefix sums of the offsets.
fn fb_cells(o: &SplitOffsets, d: u32) -> Vec<[i64; 4]> {
    let d = i64::from(d);
    // p[i]: Σ down offsets over boundaries < i; s[i]: Σ up offsets over boundaries i..d−1.
    let mut p = vec![0i64; d as usize];
    for i in 1..d {
        p[i as usize] = p[i as usize - 1] + o.down(i - 1);
    }
    let mut s = vec![0i64; d as usize];
    for i in (0..d - 1).rev() {
        s[i as usize] = s[i as usize + 1] + o.up(i);
    }
    let total_down = p[d as usize - 1];
    let f1_base = total_down + o.turn_f;
    let b1_base = f1_base + s[0] + o.turn_fb;
    let b0_base = b1_base + total_down + o.turn_b;
    (0..d as usize)
        .map(|i| [p[i], f1_base + s[i], b1_base + p[i], b0_base + s[i]])
        .collect()
}

/// Enumerates the collision-free Eq. 3 tuples on `d` workers. The collision test only needs
/// the residues of `s[i] − p[i]` (see `fb_cells` in the tests), so the turn loops are O(1) each.
pub fn split_candidates(d: u32) -> Vec<SplitOffsets> {
    let mut out = Vec::new();
    let di = i64::from(d);
    let ks: Vec<u32> = (1..=d.max(1)).collect();
    for &k in &ks {
        for down_lo in 1..=MAX_OFFSET {
            for down_hi in 1..=MAX_OFFSET {
                for up_lo in 1..=MAX_OFFSET {
                    for up_hi in 1..=MAX_OFFSET {
                        // K = 1 covers the uniform tuples; other K only with a real split,
                        // and only where the lo offsets are used at all (K ≥ 2).
                        let uniform = down_lo == down_hi && up_lo == up_hi;
                        if (k == 1) != uniform {
                            continue;
                        }
                        if k > 1 && k >= d {
                            continue;
                        }
                        let base = SplitOffsets {
                            k,
                            down_lo,
                            down_hi,
                            up_lo,
                            up_hi,
                            turn_f: 0,
                            turn_fb: 0,
                            turn_b: 0,
                        };
                        let mut p = 0i64;
                        let mut s0 = 0i64;
                        for a in 0..di - 1 {
                            s0 += base.up(a);
                        }
                        let mut residues = 0u8;
                        let mut s = s0;
                        for i in 0..di {
                            residues |= 1 << (s - p).rem_euclid(PERIOD);
                            if i + 1 < di {
                                p += base.down(i);
                                s -= base.up(i);
                            }
                        }
                        let total_down = p;
                        let each = |f: &dyn Fn(i64) -> i64| {
                            (0..PERIOD).all(|r| residues & (1 << r) == 0 || f(r) % PERIOD != 0)
                        };
                        for turn_f in 1..=MAX_TURN {
                            // F⁰ and F¹ on one worker: F1 − F0 = D + tf + (s − p).
                            if !each(&|r| (total_down + turn_f + r).rem_euclid(PERIOD)) {
                                continue;
                            }
                            for turn_fb in 1..=MAX_TURN {
                                // B¹ − F⁰ = D + tf + s0 + tfb (same on every worker).
                                let c1 = total_down + turn_f + s0 + turn_fb;
                                if c1.rem_euclid(PERIOD) == 0 {
                                    continue;
                                }
                                // B¹ − F¹ = s0 + tfb − (s − p).
                                if !each(&|r| (s0 + turn_fb - r).rem_euclid(PERIOD)) {
                                    continue;
                                }
                                for turn_b in 1..=MAX_TURN {
                                    // B⁰ − F¹ = s0 + tfb + D + tb; B⁰ − B¹ = D + tb + (s − p);
                                    // B⁰ − F⁰ = c1 + D + tb + (s − p).
                                    let c2 = s0 + turn_fb + total_down + turn_b;
                                    if c2.rem_euclid(PERIOD) == 0
                                        || !each(&|r| (total_down + turn_b + r).rem_euclid(PERIOD))
                                        || !each(&|r| {
                                            (c1 + total_down + turn_b + r).rem_euclid(PERIOD)
                                        })
                                    {
                                        continue;
                                    }
                                    out.push(SplitOffsets {
                                        turn_f,
                                        turn_fb,
                                        turn_b,
                                        ..base
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The block's steady-state peak activation memory with the true per-stage memory: a
/// stage whose F is at cell `a` and whose W ends at cell `b` holds
/// `⌊(t − a)/T⌋ − ⌊(t − b)/T⌋` microbatches at cell `t` of the infinite repetition; the
/// largest per-worker sum over one period. Exact once the pipeline is full, and an upper
/// bound of the repeated order's peak for every microbatch count (Eq. 1 of seed 000 is the
/// per-stage maximum of the same count).
pub fn steady_peak(block: &BuildingBlock, costs: &Costs) -> f64 {
    let workers = block.placement.workers() as usize;
    let stages = block.placement.stages() as usize;
    let mut first = vec![i64::MAX; stages];
    let mut last = vec![i64::MIN; stages];
    for p in &block.passes {
        let s = p.pass.stage as usize;
        match p.pass.kind {
            PassKind::F => first[s] = first[s].min(p.cell),
            _ => last[s] = last[s].max(p.cell + p.len),
        }
    }
    let mut per_worker = vec![[0.0f64; PERIOD as usize]; workers];
    for s in 0..stages {
        let w = block.placement.worker_of(s as u32) as usize;
        let (a, b) = (first[s], last[s]);
        if a == i64::MAX || b == i64::MIN {
            continue;
        }
        for (t, slot) in per_worker[w].iter_mut().enumerate() {
            let t = t as i64;
            let count = (t - a).div_euclid(PERIOD) - (t - b).div_euclid(PERIOD);
            *slot += count.max(0) as f64 * costs.stages[s].mem;
        }
    }
    per_worker
        .iter()
        .flat_map(|w| w.iter().copied())
        .fold(0.0, f64::max)
}

/// The repeated block's squeezed makespan for `n` microbatches under `costs`, without
/// building the schedule: passes are processed in cell order, which is a topological order
/// of the dependencies (every offset is ≥ 1), so one sweep gives every start time.
pub fn block_makespan(block: &BuildingBlock, n: u32, costs: &Costs) -> f64 {
    let stages = block.placement.stages() as usize;
    let workers = block.placement.workers() as usize;
    let n_us = n as usize;
    let length = block
        .passes
        .iter()
        .map(|p| p.cell + p.len)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut by_cell: Vec<Vec<usize>> = vec![Vec::new(); length as usize];
    for (i, p) in block.passes.iter().enumerate() {
        by_cell[p.cell as usize].push(i);
    }
    let slot = |kind: PassKind, s: usize, m: usize| -> usize {
        let k = match kind {
            PassKind::F => 0,
            PassKind::B | PassKind::BW => 1,
            PassKind::W => 2,
        };
        (k * stages + s) * n_us + m
    };
    let mut end = vec![0.0f64; 3 * stages * n_us];
    let mut free = vec![0.0f64; workers];
    let worker: Vec<usize> = (0..stages)
        .map(|s| block.placement.worker_of(s as u32) as usize)
        .collect();
    let mut makespan = 0.0f64;
    let last_cell = length - 1 + PERIOD * (i64::from(n) - 1);
    for g in 0..=last_cell {
        let lo = ((g - length + 1).max(0) + PERIOD - 1) / PERIOD;
        let hi = (g / PERIOD).min(i64::from(n) - 1);
        for m in lo..=hi {
            let c = (g - PERIOD * m) as usize;
            for &i in &by_cell[c] {
                let p = block.passes[i].pass;
                let (s, m) = (p.stage as usize, m as usize);
                let w = worker[s];
                let hop = |dep_stage: usize| {
                    if worker[dep_stage] != w {
                        costs.comm
                    } else {
                        0.0
                    }
                };
                let mut ready = free[w];
                match p.kind {
                    PassKind::F => {
                        if s > 0 {
                            ready = ready.max(end[slot(PassKind::F, s - 1, m)] + hop(s - 1));
                        }
                    }
                    PassKind::B | PassKind::BW => {
                        ready = ready.max(end[slot(PassKind::F, s, m)]);
                        if s + 1 < stages {
                            ready = ready.max(end[slot(PassKind::B, s + 1, m)] + hop(s + 1));
                        }
                    }
                    PassKind::W => ready = ready.max(end[slot(PassKind::B, s, m)]),
                }
                let finish = ready + costs.duration(p.kind, p.stage);
                end[slot(p.kind, s, m)] = finish;
                free[w] = finish;
                makespan = makespan.max(finish);
            }
        }
    }
    makespan
}

/// Two blocks with the same signature repeat into the same per-worker orders: each worker's
/// pass cells relative to its first F.
fn signature(block: &BuildingBlock) -> Vec<i64> {
    let workers = block.placement.workers() as usize;
    let mut base = vec![i64::MAX; workers];
    for p in &block.passes {
        let w = block.placement.worker_of(p.pass.stage) as usize;
        base[w] = base[w].min(p.cell);
    }
    block
        .passes
        .iter()
        .map(|p| p.cell - base[block.placement.worker_of(p.pass.stage) as usize])
        .collect()
}

/// The distinct blocks seen so far, by [`signature`], in O(1) memory per block: a hash of
/// each signature, with the blocks that share it (rebuilt to compare, so a hash collision
/// never merges two different blocks).
#[derive(Default)]
struct Distinct {
    by_hash: HashMap<u64, Vec<usize>>,
}

impl Distinct {
    /// Records `block` as number `index` unless an equal one was recorded; `rebuild(i)`
    /// gives back block number `i`. True if `block` is new.
    fn insert(
        &mut self,
        block: &BuildingBlock,
        index: usize,
        rebuild: impl Fn(usize) -> BuildingBlock,
    ) -> bool {
        let sig = signature(block);
        let mut hasher = DefaultHasher::new();
        sig.hash(&mut hasher);
        let same = self.by_hash.entry(hasher.finish()).or_default();
        if same.iter().any(|&i| signature(&rebuild(i)) == sig) {
            return false;
        }
        same.push(index);
        true
    }
}

/// Peak activation memory of a schedule's order (allocation at F, release at B/W/BW); order
/// alone decides it, timing does not.
pub fn order_peak(schedule: &Schedule, costs: &Costs) -> f64 {
    schedule
        .workers
        .iter()
        .map(|ps| {
            let (mut now, mut peak) = (0.0f64, 0.0f64);
            for p in ps {
                now += costs.memory_change(*p);
                peak = peak.max(now);
            }
            peak
        })
        .fold(0.0, f64::max)
}

/// A planned schedule with its simulation and what the search did.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The schedule.
    pub schedule: Schedule,
    /// Its simulation under the costs it was planned for.
    pub simulation: Simulation,
    /// Building blocks (or warm-up shapes) considered.
    pub considered: usize,
    /// Candidates evaluated at full size: realised blocks, and list-scheduling runs
    /// (counted even when a run deadlocks and so is never simulated).
    pub evaluated: usize,
    /// Makespan of the best schedule found before the local search (the best of its
    /// starts; the result is never longer).
    pub before_local_search: f64,
}

fn better(a: &Simulation, b: &Simulation) -> bool {
    a.makespan + EPS < b.makespan
        || (a.makespan <= b.makespan + EPS && a.bubble_span + EPS < b.bubble_span)
}

fn check_inputs(d: u32, n: u32, limit: f64) -> Result<()> {
    if d == 0 {
        return Err(Error::InvalidArgument {
            field: "workers",
            reason: "must be at least 1".into(),
        });
    }
    if n == 0 {
        return Err(Error::InvalidArgument {
            field: "microbatches",
            reason: "must be at least 1".into(),
        });
    }
    if !limit.is_finite() || limit <= 0.0 {
        return Err(Error::InvalidArgument {
            field: "memory limit",
            reason: format!("must be a finite number > 0, got {limit}"),
        });
    }
    Ok(())
}

/// Keeps `candidate` in `best` if it is better.
fn keep_better(
    best: &mut Option<(Schedule, Simulation)>,
    candidate: Option<(Schedule, Simulation)>,
) {
    if let Some((s, sim)) = candidate
        && best.as_ref().is_none_or(|(_, b)| better(&sim, b))
    {
        *best = Some((s, sim));
    }
}

/// Passes per schedule up to which the local search starts from the [`STARTS`] best
/// distinct schedules rather than from the best alone (where it ends is not monotone in
/// where it starts: a larger limit whose best start is better could end worse).
const SEVERAL_STARTS_UP_TO: usize = 4096;
/// Starts of the local search on small shapes.
const STARTS: usize = 3;

/// The best few distinct schedules found (best first): the local search's starts.
struct Starts {
    kept: Vec<(Schedule, Simulation)>,
    size: usize,
}

impl Starts {
    /// Room for [`STARTS`] schedules of `passes` passes each if that is at most
    /// [`SEVERAL_STARTS_UP_TO`], else one.
    fn new(passes: usize) -> Starts {
        let size = if passes <= SEVERAL_STARTS_UP_TO {
            STARTS
        } else {
            1
        };
        Starts {
            kept: Vec::with_capacity(size + 1),
            size,
        }
    }

    /// Keeps `candidate` if it is among the best few and not one already kept.
    fn offer(&mut self, candidate: Option<(Schedule, Simulation)>) {
        let Some((schedule, sim)) = candidate else {
            return;
        };
        if self.kept.iter().any(|(s, _)| s.workers == schedule.workers) {
            return;
        }
        let at = self.kept.partition_point(|(_, b)| !better(&sim, b));
        if at < self.size {
            self.kept.insert(at, (schedule, sim));
            self.kept.truncate(self.size);
        }
    }

    /// [`Starts::offer`] if the candidate fits `limit`.
    fn offer_fitting(&mut self, candidate: (Schedule, Simulation), limit: f64) {
        if candidate.1.max_peak_memory() <= limit + EPS {
            self.offer(Some(candidate));
        }
    }
}

/// The end of both searches: the typed error if nothing fit, else the local search from
/// each start, the best result and its simulation.
fn conclude(
    name: &str,
    starts: Starts,
    costs: &Costs,
    limit: f64,
    smallest: f64,
    local_search_budget: u64,
    (considered, evaluated): (usize, usize),
) -> Result<Planned> {
    let before = starts.kept.first().map(|(_, sim)| sim.makespan);
    let mut best: Option<(Schedule, Simulation)> = None;
    for (schedule, _) in starts.kept {
        let schedule = improve(schedule, costs, limit, local_search_budget)?;
        let simulation = simulate(&schedule, costs)?;
        keep_better(&mut best, Some((schedule, simulation)));
    }
    let (Some(before), Some((schedule, simulation))) = (before, best) else {
        return Err(Error::MemoryLimit {
            schedule: name.into(),
            limit,
            smallest,
        });
    };
    Ok(Planned {
        schedule,
        simulation,
        considered,
        evaluated,
        before_local_search: before,
    })
}

/// Keeps the better of `best` and `candidate` if the candidate fits `limit`.
fn consider(
    best: &mut Option<(Schedule, Simulation)>,
    candidate: Schedule,
    costs: &Costs,
    limit: f64,
) -> Result<()> {
    let sim = simulate(&candidate, costs)?;
    consider_simulated(best, (candidate, sim), limit);
    Ok(())
}

/// [`consider`] for a candidate already simulated under the same costs.
fn consider_simulated(
    best: &mut Option<(Schedule, Simulation)>,
    (candidate, sim): (Schedule, Simulation),
    limit: f64,
) {
    if sim.max_peak_memory() > limit + EPS {
        return;
    }
    if best.as_ref().is_none_or(|(_, b)| better(&sim, b)) {
        *best = Some((candidate, sim));
    }
}

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

/// Repeat → warm-up reorder → cool-down reorder, compaction and W filling within `limit`:
/// the fitting variants of one block, best first.
fn realise(
    block: &BuildingBlock,
    name: &str,
    n: u32,
    costs: &Costs,
    limit: f64,
) -> Result<Option<(Schedule, Simulation)>> {
    let repeated = block.repeat(name, n)?;
    let warm = reorder_warmup(repeated)?;
    let mut best = None;
    consider(&mut best, warm.clone(), costs, limit)?;
    if best.is_some() {
        consider_simulated(
            &mut best,
            finish_simulated(warm, costs, Some(limit))?,
            limit,
        );
    }
    Ok(best)
}

/// The adaptive V-shape scheduler: the least-makespan V schedule whose simulated peak
/// activation memory fits `limit` on every worker, under the true per-stage `costs` of the
/// `2d` stages. `local_search_budget` bounds the local search in pass simulations (0 turns it
/// off).
pub fn adaptive_v(
    d: u32,
    n: u32,
    costs: &Costs,
    limit: f64,
    local_search_budget: u64,
) -> Result<Planned> {
    check_inputs(d, n, limit)?;
    let placement = Placement::V { workers: d };
    costs.check_for(&placement)?;
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
            let length = block
                .passes
                .iter()
                .map(|p| p.cell + p.len)
                .max()
                .unwrap_or(0);
            fitting.push((length, peak, o));
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
    let mut best = Starts::new(6 * d as usize * n as usize);
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
        best.offer(realise(block, NAME, n, costs, limit)?);
        let own = steady_peak(block, costs);
        if own + EPS < limit && own_fills > 0 {
            own_fills -= 1;
            evaluated += 1;
            best.offer(realise(block, NAME, n, costs, own)?);
        }
    }
    // The fixed schedules themselves, as `pipewise plan` builds them (their W filling and,
    // for V-ZB, the greedy V scheduler), so that neither bubble is ever above them in their
    // memory class: on a tie in makespan the lower span bubble wins.
    if per_proxy <= ALWAYS_FIXED {
        for kind in [ScheduleKind::VMin, ScheduleKind::VHalf, ScheduleKind::VZb] {
            if let Ok((schedule, sim)) = fixed_v(kind, d, n, costs) {
                evaluated += 1;
                let schedule = Schedule {
                    name: NAME.into(),
                    ..schedule
                };
                best.offer_fitting((schedule, sim), limit);
            }
        }
    }
    // List scheduling in time order with the true costs and hops, for as many runs as the
    // budget allows.
    let runs = (LIST_BUDGET / per_proxy.max(1)).max(1) as usize;
    let (listed, made) = list_v::search(d, n, costs, limit, NAME, runs)?;
    evaluated += made;
    best.offer(listed);
    conclude(
        NAME,
        best,
        costs,
        limit,
        smallest,
        local_search_budget,
        (considered, evaluated),
    )
}

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
/// the warm-up family (see the module documentation) whose peak fits `limit`, after W
/// filling within the limit and the local search.
pub fn adaptive_zb(
    d: u32,
    n: u32,
    costs: &Costs,
    limit: f64,
    local_search_budget: u64,
) -> Result<Planned> {
    check_inputs(d, n, limit)?;
    let placement = Placement::OnePerWorker { workers: d };
    costs.check_for(&placement)?;
    const NAME: &str = "adaptive-zb";
    let mut best = Starts::new(3 * d as usize * n as usize);
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
        if own_fills && own + EPS < limit {
            consider_simulated(
                &mut local,
                finish_simulated(base.clone(), costs, Some(own))?,
                limit,
            );
        }
        consider_simulated(
            &mut local,
            finish_simulated(base, costs, Some(limit))?,
            limit,
        );
        best.offer(local);
    }
    conclude(
        NAME,
        best,
        costs,
        limit,
        smallest,
        local_search_budget,
        (shapes as usize, evaluated),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Times;

    #[test]
    fn closed_form_collision_test_matches_the_block() {
        for d in [1u32, 2, 3, 5, 8] {
            let fast: HashSet<SplitOffsets> = split_candidates(d).into_iter().collect();
            // Every enumerated tuple really is collision-free, and the cells agree.
            for o in &fast {
                let block = o.block(d);
                assert!(block.collision_free(), "{o:?} on d={d}");
                let cells = fb_cells(o, d);
                for p in block.passes.iter().filter(|p| p.pass.kind != PassKind::W) {
                    let w = block.placement.worker_of(p.pass.stage) as usize;
                    let first_half = p.pass.stage < d;
                    let idx = match (p.pass.kind, first_half) {
                        (PassKind::F, true) => 0,
                        (PassKind::F, false) => 1,
                        (PassKind::B, false) => 2,
                        _ => 3,
                    };
                    assert_eq!(cells[w][idx], p.cell, "{o:?} {}", p.pass);
                }
            }
            // And a brute-force check over a slice of the space finds no tuple it missed.
            for k in 1..d.max(2) {
                for (down_lo, up_hi) in [(1, 1), (2, 1), (1, 3), (4, 2)] {
                    for turn_fb in 1..=MAX_TURN {
                        let o = SplitOffsets {
                            k,
                            down_lo,
                            down_hi: 2,
                            up_lo: 1,
                            up_hi,
                            turn_f: 2,
                            turn_fb,
                            turn_b: 1,
                        };
                        let uniform = down_lo == 2 && up_hi == 1;
                        if k == 1 && !uniform {
                            continue; // the lo offsets are unused: the uniform tuple (2, up_hi)
                        }
                        let canonical = if uniform {
                            SplitOffsets { k: 1, ..o }
                        } else {
                            o
                        };
                        if o.block(d).collision_free() {
                            assert!(fast.contains(&canonical), "missed {o:?} on d={d}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn fast_block_evaluation_matches_the_simulator() {
        for d in [2u32, 3, 5] {
            let placement = Placement::V { workers: d };
            let costs = Costs::per_stage(
                &placement,
                (0..2 * d)
                    .map(|s| crate::cost::StageCost {
                        f: 1.0 + 0.1 * f64::from(s),
                        b: 1.3,
                        w: 0.6 + 0.05 * f64::from(s % 3),
                        mem: 0.5 + 0.1 * f64::from(s % 2),
                    })
                    .collect(),
                0.2,
            )
            .expect("costs");
            for o in split_candidates(d).iter().step_by(53) {
                let block = o.block(d);
                for n in [1u32, 4, 3 * d + 7] {
                    let s = block.repeat("t", n).expect("repeat");
                    let sim = simulate(&s, &costs).expect("valid");
                    let fast = block_makespan(&block, n, &costs);
                    assert!(
                        (fast - sim.makespan).abs() < 1e-9,
                        "{o:?} n={n}: {fast} vs {}",
                        sim.makespan
                    );
                    assert!(order_peak(&s, &costs) <= steady_peak(&block, &costs) + EPS);
                }
                // Once full, the steady-state figure is the peak itself.
                let s = block.repeat("t", 4 * d + 12).expect("repeat");
                assert!(
                    (order_peak(&s, &costs) - steady_peak(&block, &costs)).abs() < 1e-9,
                    "{o:?}"
                );
            }
        }
    }

    #[test]
    fn memory_estimate_bounds_the_repeated_peak() {
        let costs =
            |d: u32| Costs::uniform(&Placement::V { workers: d }, Times::UNIT).expect("costs");
        for d in [2u32, 4, 6] {
            let c = costs(d);
            for o in split_candidates(d).iter().step_by(97) {
                let s = o.block(d).repeat("t", 3 * d + 6).expect("repeat");
                let peak = order_peak(&s, &c);
                let est = steady_peak(&o.block(d), &c);
                assert!(peak <= est + EPS, "{o:?}: peak {peak} > estimate {est}");
            }
        }
    }
}
