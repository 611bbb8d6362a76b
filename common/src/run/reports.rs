//! Gathering a run's step reports per step.

use std::collections::BTreeMap;

use super::worker::StepReport;

/// The step reports of a run, gathered per step. Each worker reports its steps in order
/// (though one worker's reports may run steps behind another's on the way), so a report of
/// a step before its worker's next one is a repeat (e.g. a retry of a report that did
/// arrive), and one past the run a stray: both are ignored rather than counted twice or
/// kept forever.
#[derive(Debug)]
pub struct StepReports {
    /// The step each worker's next report may be of.
    next: Vec<u64>,
    end: u64,
    /// The reports of steps not yet reported by every worker, by worker index.
    pending: BTreeMap<u64, Vec<Option<StepReport>>>,
}

/// What became of a report given to [`StepReports::take`].
#[derive(Debug)]
pub enum Taken {
    /// Out of order, past the run, or from no worker of it (the report, given back).
    Ignored(Box<StepReport>),
    /// Kept until every worker has reported its step.
    Pending,
    /// The last report of its step: every worker's, in worker order.
    Complete(Vec<StepReport>),
}

impl StepReports {
    /// The reports of a run on `workers` workers of steps `first_step..end`.
    pub fn new(workers: usize, first_step: u64, end: u64) -> Self {
        StepReports {
            next: vec![first_step; workers],
            end,
            pending: BTreeMap::new(),
        }
    }

    /// Takes worker `w`'s report `r`.
    pub fn take(&mut self, w: usize, r: StepReport) -> Taken {
        let step = r.step;
        match self.next.get_mut(w) {
            Some(next) if *next <= step && step < self.end => *next = step + 1,
            _ => return Taken::Ignored(Box::new(r)),
        }
        // A step some worker skipped (its report lost on the way) never completes: its
        // reports go once every worker is past it (this report's step stays: this report
        // may be the one that completes it).
        let oldest = self.next.iter().copied().min().unwrap_or(self.end);
        self.pending.retain(|&s, _| s >= oldest || s == step);
        let workers = self.next.len();
        let slot = self
            .pending
            .entry(step)
            .or_insert_with(|| vec![None; workers]);
        slot[w] = Some(r);
        if slot.iter().all(Option::is_some) {
            let reports = self.pending.remove(&step).unwrap_or_default();
            Taken::Complete(reports.into_iter().flatten().collect())
        } else {
            Taken::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn reports_are_taken_in_order_per_worker() {
        let r = |step: u64| StepReport {
            step,
            ..Default::default()
        };
        let complete = |t: Taken| match t {
            Taken::Complete(reports) => reports.iter().map(|r| r.step).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        // Steps 3..10 of a run on two workers.
        let mut steps = StepReports::new(2, 3, 10);
        assert!(
            matches!(steps.take(0, r(2)), Taken::Ignored(_)),
            "before the run"
        );
        assert!(matches!(steps.take(0, r(3)), Taken::Pending));
        assert!(matches!(steps.take(0, r(3)), Taken::Ignored(_)), "a repeat");
        // One worker's reports may run many steps ahead of the other's.
        for step in 4..9 {
            assert!(matches!(steps.take(0, r(step)), Taken::Pending));
        }
        // The last report of a step completes it, though it moves its worker past every
        // other one's next step (it used to drop the step's other reports then).
        assert_eq!(complete(steps.take(1, r(3))), [3, 3]);
        // A lost report: worker 1 skips step 4, which is dropped once both are past it.
        assert_eq!(complete(steps.take(1, r(5))), [5, 5]);
        assert!(!steps.pending.contains_key(&4));
        assert!(matches!(steps.take(1, r(4)), Taken::Ignored(_)));
        assert_eq!(complete(steps.take(1, r(6))), [6, 6]);
        assert!(
            matches!(steps.take(1, r(10)), Taken::Ignored(_)),
            "past the run"
        );
        assert!(matches!(steps.take(1, r(u64::MAX)), Taken::Ignored(_)));
        assert!(
            matches!(steps.take(2, r(7)), Taken::Ignored(_)),
            "no such worker"
        );
    }
}
