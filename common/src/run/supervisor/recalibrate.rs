//! The drift rule applied to a run: steps that ran over their prediction recalibrate the
//! costs from those steps alone, and the run moves to the split balanced for them when
//! that is predicted enough faster ([`crate::run::drift`]).

use super::super::drift::{DRIFT_STEPS, worth_replanning};
use super::super::pressure::predicted_overflow;
use super::io::{Action, Move};
use super::tracked_run::Run;
use super::{Supervisor, tightest};
use crate::auto::slowest_per_rank;
use crate::calibration::PieceCost;
use crate::model::Piece;
use crate::partition::split_for_speeds_within;
use crate::run::straggler::BOUNDED;
use crate::run::worker::{StepReport, Worker};

impl Supervisor {
    /// Takes step `step` of `run` (its reports; predicted and measured seconds) to the
    /// drift rule; whether the run is to stop and move. Only runs the straggler rule
    /// watches may move (real compute, checkpoints, two workers or more), only against
    /// predictions from measured costs, and only with two steps left after this one.
    pub(super) fn drifted(
        &mut self,
        run: &mut Run,
        step: u64,
        (predicted, measured): (f64, f64),
        reports: &[StepReport],
    ) -> bool {
        run.recent.push(reports.to_vec());
        if run.recent.len() > DRIFT_STEPS {
            run.recent.remove(0);
        }
        let calibrated = self.costs.calibrated();
        if !(run.drift.observe(step, predicted, measured) && calibrated) {
            return false;
        }
        if run.out.watch.is_none()
            || !run.may_stop()
            || run.out.first_step + run.completed + 2 > run.out.steps
        {
            return false;
        }
        // The steps before the drift describe a machine that is gone.
        let (schedule, out) = (&self.plan.schedule, &run.out);
        self.costs
            .recalibrate(schedule, &out.ranges, &out.workers, &run.recent);
        self.plan_next(run);
        let Some(to) = self.rebalanced(run) else {
            run.drift.reset();
            return false;
        };
        if !worth_replanning(to.current, to.candidate) {
            run.drift.reset();
            return false;
        }
        let before: Vec<usize> = run.out.ranges.iter().map(|r| r.len()).collect();
        let counts = to.counts;
        let reason = format!(
            "{}: pieces per stage {before:?} → {counts:?}{}",
            run.drift.reason(to.current, to.candidate),
            if to.bounded { BOUNDED } else { "" }
        );
        self.out.push(Action::Stop(run.out.id));
        run.moving = Some((reason, Move::Recalibrate(counts)));
        true
    }

    /// Whether `counts` (pieces per stage) is predicted to fit the memory every worker of a
    /// run registered (`tight`: with replicas, each rank's tightest, [`tightest`]): a split
    /// balanced for speed alone may pile layers onto a worker without the memory for them,
    /// and the run would then be moved again, by memory pressure, before it starts.
    pub(super) fn fits(&self, tight: &[Worker], counts: &[u32]) -> bool {
        predicted_overflow(&self.current, &self.plan, counts, tight).is_none()
    }

    /// Every piece's cost on the costs as they stand (F + B + W, seconds at the mean
    /// worker's speed), in the model's piece order.
    pub(super) fn piece_totals(&self) -> Vec<f64> {
        let [embedding, block, head] = self.costs.piece_costs();
        let total = |c: PieceCost| c.f + c.b + c.w;
        self.current
            .model
            .pieces()
            .into_iter()
            .map(|p| match p {
                Piece::Embedding => total(embedding),
                Piece::Block(_) => total(block),
                Piece::Head => total(head),
            })
            .collect()
    }

    /// What the straggler rule weighs the pieces by: the costs as they stand once a step
    /// has been measured, so that a move balances what the passes take; before, their
    /// FLOPs ([`ModelSpec::piece_costs`](crate::model::ModelSpec::piece_costs)).
    pub(super) fn straggler_costs(&self) -> Vec<f64> {
        let measured = self.piece_totals();
        if self.costs.calibrated() && measured.iter().all(|c| c.is_finite() && *c > 0.0) {
            return measured;
        }
        let mbs = self.current.parallelism.pipeline_parallel_microbatch_size;
        self.current.model.piece_costs(mbs)
    }

    /// The split of the pieces that balances the workers for the costs as they stand
    /// (per-piece costs, per-worker factors), or where that would not fit a worker's memory
    /// the move towards it that does; with the predicted step times of the run's split and
    /// of that one. `None` when it is the run's split or cannot be predicted.
    fn rebalanced(&mut self, run: &Run) -> Option<Rebalanced> {
        let placement = &self.plan.schedule.placement;
        let model = &self.current.model;
        let piece_costs = self.piece_totals();
        let worker_of: Vec<u32> = (0..placement.stages())
            .map(|s| placement.worker_of(s))
            .collect();
        // Every replica runs the split: each rank at its slowest replica's speed.
        let workers = &run.out.all_workers();
        let factors: Vec<f64> = workers
            .iter()
            .map(|w| self.costs.factor(&w.id).unwrap_or(1.0))
            .collect();
        let slowness = slowest_per_rank(&factors, run.out.workers.len());
        let tight = tightest(&run.out.workers, &run.out.others);
        let start: Vec<u32> = run.out.ranges.iter().map(|r| r.len() as u32).collect();
        let fits = |c: &[u32]| self.fits(&tight, c);
        let (counts, bounded) =
            split_for_speeds_within(&piece_costs, &worker_of, &slowness, &start, fits).ok()?;
        let ranges = model.split_by_counts(&counts).ok()?;
        if ranges == run.out.ranges {
            return None;
        }
        let schedule = &self.plan.schedule;
        let replicas = self.current.replicas();
        let current = self
            .costs
            .predict(schedule, &run.out.ranges, workers, replicas)?;
        let candidate = self.costs.predict(schedule, &ranges, workers, replicas)?;
        Some(Rebalanced {
            current: current.step_secs,
            counts,
            candidate: candidate.step_secs,
            bounded,
        })
    }
}

/// A move [`Supervisor::rebalanced`] found.
struct Rebalanced {
    /// The run's split's predicted step time (seconds).
    current: f64,
    /// The new split: pieces per stage.
    counts: Vec<u32>,
    /// Its predicted step time (seconds).
    candidate: f64,
    /// Whether the workers' memory held it short of the split balanced for speed.
    bounded: bool,
}
