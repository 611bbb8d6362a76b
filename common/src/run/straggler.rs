//! The straggler policy: which worker is slow per unit of modelled work, and the split of
//! the pieces that moves layers off it.
//!
//! After each step every worker's time in passes is divided by its modelled work: its
//! pieces' costs, from the cost model once a step has run, their FLOPs before (FLOPs make the
//! embedding nearly free and miss the head's memory-bound work, so they alone balance the
//! wrong amounts). A worker at [`STRAGGLER_RATIO`] times the median or more for
//! [`STRAGGLER_STEPS`] steps in a row, where a split weighted by the measured speeds cuts the
//! busiest worker's predicted time by the factor [`STRAGGLER_GAIN`],
//! makes every worker stop after the same step (real compute, checkpoints on); the job goes on
//! from there with the new split, on the same schedule and workers. The drift rule
//! ([`crate::run::drift`]) is checked first, and the memory bound described there applies.

use super::worker::{StepReport, Worker};
use crate::job::{JobPlan, JobSpec};
use crate::partition::{largest_worker_time, split_for_speeds_within};

/// What the runner watches a run's step times with: the stage → worker table and the split
/// in use.
#[derive(Debug, Clone, PartialEq)]
pub struct Straggle {
    worker_of: Vec<u32>,
    counts: Vec<u32>,
}

impl Straggle {
    /// Modelled work of every worker under the split in use, for `piece_costs`.
    fn work(&self, piece_costs: &[f64], workers: usize) -> Vec<f64> {
        let mut work = vec![0.0; workers];
        let mut next = 0usize;
        for (&w, &c) in self.worker_of.iter().zip(&self.counts) {
            let Some(costs) = piece_costs.get(next..next + c as usize) else {
                return vec![0.0; workers];
            };
            let cost: f64 = costs.iter().sum();
            next += c as usize;
            if let Some(x) = work.get_mut(w as usize) {
                *x += cost;
            }
        }
        work
    }
}

/// A worker whose time in passes per unit of modelled work is at least this many times
/// the median's, over [`STRAGGLER_STEPS`] steps in a row, is a straggler.
pub const STRAGGLER_RATIO: f64 = 2.0;
/// Steps in a row (after a run's first) a straggler must be slow in.
pub const STRAGGLER_STEPS: usize = 3;
/// A straggler's layers move only if the new split's predicted step shortens by this
/// factor at least.
pub const STRAGGLER_GAIN: f64 = 1.1;

/// How a run of `plan` on the split `stage_pieces` (empty: the default,
/// [`ModelSpec::balanced_split`](crate::model::ModelSpec::balanced_split)) is watched for
/// stragglers: only real-compute jobs with checkpoints (layers move through one), and
/// only with more stages than one.
pub fn straggle_of(spec: &JobSpec, plan: &JobPlan, stage_pieces: &[u32]) -> Option<Straggle> {
    if spec.compute.is_emulated() || !spec.checkpoint.enable_checkpoint {
        return None;
    }
    let placement = &plan.schedule.placement;
    let stages = placement.stages();
    if placement.workers() < 2 {
        return None;
    }
    let model = &spec.model;
    let counts = if stage_pieces.is_empty() {
        model
            .balanced_split(placement)
            .ok()?
            .iter()
            .map(|r| r.len() as u32)
            .collect()
    } else {
        stage_pieces.to_vec()
    };
    Some(Straggle {
        worker_of: (0..stages).map(|s| placement.worker_of(s)).collect(),
        counts,
    })
}

/// Said of a move the workers' memory held short of the split balanced for speed.
pub const BOUNDED: &str = " (as far as the workers' memory allows)";

/// Adds one step's reports to `history` (every worker's time in passes per unit of
/// modelled work, by `piece_costs`, one per piece in model order, over the median's) and
/// returns the reason and the new split when a worker has been a straggler for
/// [`STRAGGLER_STEPS`] steps in a row and moving layers off it is predicted to shorten the
/// step by [`STRAGGLER_GAIN`] at least (and at least two steps are left after `done`). The split is the one balanced for the workers'
/// speeds or, where that does not `fit` their memory, the move towards it that does.
pub fn straggler(
    watch: &Straggle,
    piece_costs: &[f64],
    reports: &[StepReport],
    history: &mut Vec<Vec<f64>>,
    (done, steps): (u64, u64),
    workers: &[Worker],
    fits: impl Fn(&[u32]) -> bool,
) -> Option<(String, Vec<u32>)> {
    let d = workers.len();
    let work = watch.work(piece_costs, d);
    let mut per = vec![f64::NAN; d];
    for r in reports {
        let w = r.worker_index as usize;
        if let (Some(slot), Some(&units)) = (per.get_mut(w), work.get(w))
            && units > 0.0
        {
            *slot = r.busy_secs / units;
        }
    }
    if per.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        history.clear();
        return None;
    }
    let mut sorted = per.clone();
    sorted.sort_by(f64::total_cmp);
    // The lower median: with two workers, the faster one.
    let median = sorted[(d - 1) / 2];
    history.push(per.iter().map(|x| x / median).collect());
    if history.len() > STRAGGLER_STEPS {
        history.remove(0);
    }
    if history.len() < STRAGGLER_STEPS || done + 2 > steps {
        return None;
    }
    let slowness: Vec<f64> = (0..d)
        .map(|w| history.iter().map(|h| h[w]).sum::<f64>() / STRAGGLER_STEPS as f64)
        .collect();
    let slowest = (0..d).max_by(|&a, &b| slowness[a].total_cmp(&slowness[b]))?;
    if !history.iter().all(|h| h[slowest] >= STRAGGLER_RATIO) {
        return None;
    }
    let worker_of = &watch.worker_of;
    let (counts, bounded) =
        split_for_speeds_within(piece_costs, worker_of, &slowness, &watch.counts, fits).ok()?;
    let before = largest_worker_time(piece_costs, worker_of, &slowness, &watch.counts);
    let after = largest_worker_time(piece_costs, worker_of, &slowness, &counts);
    if counts == watch.counts || before < STRAGGLER_GAIN * after {
        return None;
    }
    Some((
        format!(
            "worker {slowest} ({}) took {:.1}× the median's time per unit of work over {} \
             steps; moved layers: pieces per stage {:?} → {:?}{} (predicted {:.0}% less \
             time on the busiest worker)",
            workers[slowest].id,
            slowness[slowest],
            STRAGGLER_STEPS,
            watch.counts,
            counts,
            if bounded { BOUNDED } else { "" },
            100.0 * (1.0 - after / before)
        ),
        counts,
    ))
}
