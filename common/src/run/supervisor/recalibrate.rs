//! The drift rule applied to a run: steps that ran over their prediction recalibrate the
//! costs from those steps alone, and the run moves to the split balanced for them when
//! that is predicted enough faster ([`crate::run::drift`]).

use super::super::drift::{DRIFT_STEPS, worth_replanning};
use super::super::pressure::predicted_overflow;
use super::following::Run;
use super::io::{Action, Move};
use super::{Supervisor, tightest};
use crate::auto::slowest_per_rank;
use crate::calibration::PieceCost;
use crate::model::Piece;
use crate::partition::split_for_speeds;
use crate::run::worker::StepReport;

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
        let Some((current, counts, candidate)) = self.rebalanced(run) else {
            run.drift.reset();
            return false;
        };
        if !worth_replanning(current, candidate) {
            run.drift.reset();
            return false;
        }
        let before: Vec<usize> = run.out.ranges.iter().map(|r| r.len()).collect();
        let reason = format!(
            "{}: pieces per stage {before:?} → {counts:?}",
            run.drift.reason(current, candidate)
        );
        self.out.push(Action::Stop(run.out.id));
        run.moving = Some((reason, Move::Recalibrate(counts)));
        true
    }

    /// Whether `counts` (pieces per stage) is predicted to hold more on a worker of `run`
    /// than it registered (with replicas, each rank's tightest): a split balanced for speed
    /// alone may pile layers onto a worker without the memory for them, and the run would
    /// then be moved again, by memory pressure, before it starts.
    pub(super) fn overflows(&self, run: &Run, counts: &[u32]) -> bool {
        let workers = tightest(&run.out.workers, &run.out.others);
        predicted_overflow(&self.current, &self.plan, counts, &workers).is_some()
    }

    /// The split of the pieces that balances the workers for the costs as they stand
    /// (per-piece costs, per-worker factors), with the predicted step times of the run's
    /// split and of that one; `None` when it is the run's split, would not fit a worker's
    /// memory or cannot be predicted.
    fn rebalanced(&mut self, run: &Run) -> Option<(f64, Vec<u32>, f64)> {
        let placement = &self.plan.schedule.placement;
        let [embedding, block, head] = self.costs.piece_costs();
        let total = |c: PieceCost| c.f + c.b + c.w;
        let model = &self.current.model;
        let piece_costs: Vec<f64> = model
            .pieces()
            .into_iter()
            .map(|p| match p {
                Piece::Embedding => total(embedding),
                Piece::Block(_) => total(block),
                Piece::Head => total(head),
            })
            .collect();
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
        let counts = split_for_speeds(&piece_costs, &worker_of, &slowness).ok()?;
        let ranges = model.split_by_counts(&counts).ok()?;
        if ranges == run.out.ranges || self.overflows(run, &counts) {
            return None;
        }
        let schedule = &self.plan.schedule;
        let replicas = self.current.replicas();
        let current = self
            .costs
            .predict(schedule, &run.out.ranges, workers, replicas)?;
        let candidate = self.costs.predict(schedule, &ranges, workers, replicas)?;
        Some((current.step_secs, counts, candidate.step_secs))
    }
}
