//! Fast figures of a building block without building its schedule: the steady-state
//! peak memory, the repeated block's makespan, and which blocks repeat into the same orders.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::offsets::PERIOD;
use crate::cost::Costs;
use crate::generate::block::BuildingBlock;
use crate::pass::PassKind;
use crate::schedule::Schedule;

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
    let length = block.length().max(1);
    let worker: Vec<usize> = (0..stages)
        .map(|s| block.placement.worker_of(s as u32) as usize)
        .collect();
    // One row of end times per microbatch: F, B (or BW) and W of every stage, then a slot
    // that stays 0 for a missing dependency.
    let width = 3 * stages + 1;
    let none = 3 * stages;
    let row = |kind: PassKind, s: usize| -> usize {
        let k = match kind {
            PassKind::F => 0,
            PassKind::B | PassKind::BW => 1,
            PassKind::W => 2,
        };
        k * stages + s
    };
    // The block's passes in cell order (block order within a cell), each with what it
    // waits for: its worker and up to two ends in its microbatch's row, plus their hops.
    let mut steps: Vec<BlockStep> = block
        .passes
        .iter()
        .map(|p| {
            let s = p.pass.stage as usize;
            let w = worker[s];
            let hop = |dep_stage: usize| {
                if worker[dep_stage] != w {
                    costs.comm
                } else {
                    0.0
                }
            };
            let deps = match p.pass.kind {
                PassKind::F if s > 0 => [(row(PassKind::F, s - 1), hop(s - 1)), (none, 0.0)],
                PassKind::F => [(none, 0.0), (none, 0.0)],
                PassKind::B | PassKind::BW if s + 1 < stages => [
                    (row(PassKind::F, s), 0.0),
                    (row(PassKind::B, s + 1), hop(s + 1)),
                ],
                PassKind::B | PassKind::BW => [(row(PassKind::F, s), 0.0), (none, 0.0)],
                PassKind::W => [(row(PassKind::B, s), 0.0), (none, 0.0)],
            };
            BlockStep {
                cell: p.cell as usize,
                worker: w,
                own: row(p.pass.kind, s),
                deps,
                duration: costs.duration(p.pass.kind, p.pass.stage),
            }
        })
        .collect();
    steps.sort_by_key(|st| st.cell);
    // `first[c]..first[c + 1]`: the steps at cell `c`.
    let mut first = vec![0usize; length as usize + 1];
    for st in &steps {
        first[st.cell + 1] += 1;
    }
    for c in 0..length as usize {
        first[c + 1] += first[c];
    }
    let mut end = vec![0.0f64; width * n as usize];
    let mut free = vec![0.0f64; workers];
    let mut makespan = 0.0f64;
    let last_cell = length - 1 + PERIOD * (i64::from(n) - 1);
    for g in 0..=last_cell {
        let lo = ((g - length + 1).max(0) + PERIOD - 1) / PERIOD;
        let hi = (g / PERIOD).min(i64::from(n) - 1);
        for m in lo..=hi {
            let c = (g - PERIOD * m) as usize;
            let row = &mut end[m as usize * width..(m as usize + 1) * width];
            for st in &steps[first[c]..first[c + 1]] {
                let mut ready = free[st.worker];
                for (dep, hop) in st.deps {
                    ready = ready.max(row[dep] + hop);
                }
                let finish = ready + st.duration;
                row[st.own] = finish;
                free[st.worker] = finish;
                makespan = makespan.max(finish);
            }
        }
    }
    makespan
}

/// One pass of a block as [`block_makespan`] replays it for every microbatch.
struct BlockStep {
    cell: usize,
    worker: usize,
    /// Its end's slot in its microbatch's row.
    own: usize,
    /// The slots of the ends it waits for, with the hop added to each.
    deps: [(usize, f64); 2],
    duration: f64,
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
pub(super) struct Distinct {
    by_hash: HashMap<u64, Vec<usize>>,
}

impl Distinct {
    /// Records `block` as number `index` unless an equal one was recorded; `rebuild(i)`
    /// gives back block number `i`. True if `block` is new.
    pub(super) fn insert(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Times;
    use crate::generate::adaptive::offsets::split_candidates;
    use crate::generate::adaptive::search::EPS;
    use crate::placement::Placement;
    use crate::simulate::simulate;

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
