//! The default split: the pieces cut into a placement's stages so that every worker (the
//! sum over the stages it holds) gets the same compute, not every stage the same piece
//! count. Under a V placement worker `w` holds stages `w` and `2d − 1 − w`, under a loop
//! placement `w, w + d, …`; balancing stages one by one leaves the worker holding both
//! heavy ends (or three blocks where the others hold two) the slowest.
//!
//! [`balance_placed`] minimises, in this order:
//!
//! 1. the largest worker cost (what bounds the step);
//! 2. the largest stage cost (passes of a worker's chunks alternate, so a heavy chunk
//!    delays the next worker even when the worker's total is balanced);
//! 3. the largest worker activation estimate: a stage's stash per microbatch weighted by
//!    the stages from it to the end of the pipeline (its stash waits for their passes, as
//!    in 1F1B, where stage `s` of `S` holds `S − s` microbatches);
//! 4. the sum of squared stage costs.
//!
//! The search is a depth-first branch and bound over the stages' end pieces, stage by
//! stage, pruned by the best split found so far (a worker or stage over the bound, or
//! remaining pieces that cannot fit under it). It starts from the split that balances the
//! stages alone ([`balance`](super::balance)), so the bounds prune from the first node;
//! the first phase (the worker cost) ends as soon as a worker cost reaches the lower bound
//! (the total over the workers, or the largest piece), and with one stage per worker the
//! start is already optimal. Each phase (the worker cost, then the rest under it) visits
//! at most [`SEARCH_NODES`] nodes: within the cap the result is exact (the small models
//! and every test case finish there); past it the best split found is kept, never worse
//! than the start (with many interleaved stages of equal blocks, within one piece of the
//! lower bound in the tests).

use std::ops::Range;

use super::balance;
use crate::error::{Error, Result};
use crate::placement::Placement;

/// Search nodes each phase of [`balance_placed`] may visit (a node is one stage's end
/// tried); past it the best split found so far is returned.
pub const SEARCH_NODES: u64 = 1_000_000;

/// Relative tolerance when comparing costs (sums in another order differ in the last bits).
const REL_EPS: f64 = 1e-9;

/// What a split is judged by, compared in this order (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score {
    worker: f64,
    stage: f64,
    memory: f64,
    spread: f64,
}

/// `a < b` beyond the tolerance.
fn less(a: f64, b: f64) -> bool {
    a < b - REL_EPS * b.abs().max(a.abs())
}

impl Score {
    /// Better than `other` on the keys after the worker cost (phase 2's order).
    fn better_rest(&self, other: &Score) -> bool {
        for (a, b) in [
            (self.stage, other.stage),
            (self.memory, other.memory),
            (self.spread, other.spread),
        ] {
            if less(a, b) {
                return true;
            }
            if less(b, a) {
                return false;
            }
        }
        false
    }
}

/// The problem as the search sees it.
struct Problem<'a> {
    prefix: Vec<f64>,
    activation: Vec<f64>,
    worker_of: Vec<usize>,
    workers: usize,
    /// `after[s]`: workers holding a stage `≥ s`, for the fit bound.
    after: Vec<Vec<usize>>,
    /// Stash weight of stage `s`: `S − s`.
    weight: Vec<f64>,
    costs: &'a [f64],
}

impl Problem<'_> {
    fn pieces(&self) -> usize {
        self.costs.len()
    }

    fn stages(&self) -> usize {
        self.worker_of.len()
    }

    fn cost(&self, r: &Range<usize>) -> f64 {
        self.prefix[r.end] - self.prefix[r.start]
    }

    fn score(&self, ends: &[usize]) -> Score {
        let mut worker = vec![0.0; self.workers];
        let mut memory = vec![0.0; self.workers];
        let (mut stage, mut spread, mut start) = (0.0f64, 0.0, 0);
        for (s, &end) in ends.iter().enumerate() {
            let c = self.cost(&(start..end));
            let w = self.worker_of[s];
            worker[w] += c;
            memory[w] += self.weight[s] * (self.activation[end] - self.activation[start]);
            stage = stage.max(c);
            spread += c * c;
            start = end;
        }
        let max = |v: Vec<f64>| v.into_iter().fold(0.0, f64::max);
        Score {
            worker: max(worker),
            stage,
            memory: max(memory),
            spread,
        }
    }
}

/// Bounds of one search phase and its best leaf so far.
struct Search<'p, 'a> {
    problem: &'p Problem<'a>,
    /// Phase 1: minimise the worker cost; phase 2: the rest under `worker_cap`.
    phase_one: bool,
    worker_cap: f64,
    stage_cap: f64,
    best: (Score, Vec<usize>),
    nodes: u64,
    node_cap: u64,
    /// Phase 1 ends when the worker cost reaches this lower bound.
    lower_bound: f64,
    ends: Vec<usize>,
    load: Vec<f64>,
}

impl Search<'_, '_> {
    /// Tries every end of stage `s` (which starts at piece `start`) within the bounds.
    fn descend(&mut self, s: usize, start: usize) {
        let p = self.problem;
        let (pieces, stages) = (p.pieces(), p.stages());
        let remaining = p.prefix[pieces] - p.prefix[start];
        // Every worker holding a later stage can take up to the bound; the rest must fit.
        let room: f64 = p.after[s]
            .iter()
            .map(|&w| (self.worker_cap - self.load[w]).max(0.0))
            .sum();
        let stage_room = self.stage_cap * (stages - s) as f64;
        if remaining > room * (1.0 + REL_EPS) || remaining > stage_room * (1.0 + REL_EPS) {
            return;
        }
        let w = p.worker_of[s];
        let last = pieces - (stages - s - 1);
        let ends: Vec<usize> = if s + 1 == stages {
            vec![pieces]
        } else {
            // The longest stage within the bounds first: it leaves the least for the rest.
            let fits = |end: usize| {
                let c = p.prefix[end] - p.prefix[start];
                c <= self.stage_cap * (1.0 + REL_EPS)
                    && self.load[w] + c <= self.worker_cap * (1.0 + REL_EPS)
            };
            let mut end = start + 1;
            while end < last && fits(end + 1) {
                end += 1;
            }
            (start + 1..=end).rev().collect()
        };
        for end in ends {
            if self.nodes >= self.node_cap {
                return;
            }
            self.nodes += 1;
            let c = p.prefix[end] - p.prefix[start];
            if c > self.stage_cap * (1.0 + REL_EPS)
                || self.load[w] + c > self.worker_cap * (1.0 + REL_EPS)
            {
                continue;
            }
            self.ends.push(end);
            self.load[w] += c;
            if s + 1 == stages {
                self.leaf();
            } else {
                self.descend(s + 1, end);
            }
            self.load[w] -= c;
            self.ends.pop();
        }
    }

    fn leaf(&mut self) {
        let score = self.problem.score(&self.ends);
        if self.phase_one {
            if less(score.worker, self.best.0.worker) {
                self.best = (score, self.ends.clone());
                // Only a strictly smaller worker cost is worth finding now.
                self.worker_cap = score.worker * (1.0 - REL_EPS);
                if !less(self.lower_bound, score.worker) {
                    self.nodes = self.node_cap;
                }
            }
        } else if score.better_rest(&self.best.0) {
            self.best = (score, self.ends.clone());
            self.stage_cap = score.stage;
        }
    }
}

/// Splits pieces with compute costs `costs` (any unit: FLOPs or measured seconds, one
/// microbatch's F + B + W) and stash sizes `activation` (bytes one microbatch keeps after
/// `F`) into `placement`'s stages, contiguous and non-empty, in model order, balancing
/// the cost per worker first (see `partition::placed`'s module docs for the order of the
/// objectives and the search).
///
/// Errors name the argument: `stages` when the placement has no stage or more stages than
/// pieces, `costs` or `activation` for a negative or non-finite entry, `activation` when
/// its length is not the pieces', and the placement's own check.
pub fn balance_placed(
    costs: &[f64],
    activation: &[f64],
    placement: &Placement,
) -> Result<Vec<Range<usize>>> {
    search(costs, activation, placement, SEARCH_NODES)
}

fn search(
    costs: &[f64],
    activation: &[f64],
    placement: &Placement,
    node_cap: u64,
) -> Result<Vec<Range<usize>>> {
    placement.check()?;
    let stages = placement.stages() as usize;
    let pieces = costs.len();
    if stages == 0 || stages > pieces {
        return Err(Error::invalid(
            "stages",
            format!("{stages} stages for a model of {pieces} pieces"),
        ));
    }
    for (field, values) in [("costs", costs), ("activation", activation)] {
        if let Some(i) = values.iter().position(|c| !(c.is_finite() && *c >= 0.0)) {
            return Err(Error::invalid(
                field,
                format!("piece {i}: {} is not a finite cost ≥ 0", values[i]),
            ));
        }
    }
    if activation.len() != pieces {
        return Err(Error::invalid(
            "activation",
            format!("{} entries for {pieces} pieces", activation.len()),
        ));
    }
    let prefix_of = |v: &[f64]| {
        let mut p = vec![0.0; v.len() + 1];
        for (i, x) in v.iter().enumerate() {
            p[i + 1] = p[i] + x;
        }
        p
    };
    let worker_of: Vec<usize> = placement.table().into_iter().map(|w| w as usize).collect();
    let after = (0..stages)
        .map(|s| {
            let mut ws: Vec<usize> = worker_of[s..].to_vec();
            ws.sort_unstable();
            ws.dedup();
            ws
        })
        .collect();
    let problem = Problem {
        prefix: prefix_of(costs),
        activation: prefix_of(activation),
        worker_of,
        workers: placement.workers() as usize,
        after,
        weight: (0..stages).map(|s| (stages - s) as f64).collect(),
        costs,
    };
    // The start: stages balanced one by one.
    let start = balance(costs, &vec![0; pieces], stages)
        .ok_or_else(|| Error::invalid("stages", format!("{stages} stages for {pieces} pieces")))?;
    let start_ends: Vec<usize> = start.iter().map(|r| r.end).collect();
    let start_score = problem.score(&start_ends);
    let mut search = Search {
        problem: &problem,
        phase_one: true,
        worker_cap: start_score.worker * (1.0 - REL_EPS),
        stage_cap: f64::INFINITY,
        best: (start_score, start_ends),
        // No worker costs less than its share of the whole, nor less than a piece.
        lower_bound: (problem.prefix[pieces] / f64::from(placement.workers()))
            .max(costs.iter().copied().fold(0.0, f64::max)),
        // One stage per worker: the start, balancing the stages, is already optimal.
        nodes: if matches!(placement, Placement::OnePerWorker { .. }) {
            node_cap
        } else {
            0
        },
        node_cap,
        ends: Vec::with_capacity(stages),
        load: vec![0.0; problem.workers],
    };
    if less(search.lower_bound, start_score.worker) {
        search.descend(0, 0);
    }
    // Phase 2: the worker cost found, the rest minimised under it.
    search.phase_one = false;
    search.worker_cap = search.best.0.worker;
    search.stage_cap = search.best.0.stage;
    search.nodes = 0;
    search.descend(0, 0);
    let mut begin = 0;
    Ok(search
        .best
        .1
        .iter()
        .map(|&end| {
            let r = begin..end;
            begin = end;
            r
        })
        .collect())
}

#[cfg(test)]
mod tests;
