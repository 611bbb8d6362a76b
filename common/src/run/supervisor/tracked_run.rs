//! A run that is out, as the supervisor follows it.

use std::collections::BTreeMap;

use super::super::drift::Drift;
use super::super::id::RunId;
use super::super::reports::StepReports;
use super::super::straggler::Straggle;
use super::super::worker::StepReport;
use super::super::worker::Worker;
use super::io::{Failure, Move, Shown};

/// A run as it was handed out.
#[derive(Debug)]
pub(super) struct Out {
    pub(super) id: RunId,
    /// The pipeline's workers (replica 0's), by index: what the plan and its policies see.
    pub(super) workers: Vec<Worker>,
    /// The other data-parallel replicas' workers, replica by replica (empty: one replica).
    pub(super) others: Vec<Worker>,
    pub(super) first_step: u64,
    pub(super) steps: u64,
    /// The next step's plan as shown: from the costs known when it starts.
    pub(super) planned: Shown,
    /// Pieces per stage of the run.
    pub(super) ranges: Vec<std::ops::Range<usize>>,
    /// Every worker's predicted peak under the plan and split, for every step event.
    pub(super) predicted_peaks: Vec<u64>,
    /// `None`: the run is not watched for stragglers.
    pub(super) watch: Option<Straggle>,
    /// Whether the run may stop to move layers or change the plan.
    pub(super) may_move: bool,
}

/// A run that is out, and what the supervisor gathered of it.
#[derive(Debug)]
pub(super) struct Run {
    pub(super) out: Out,
    /// Each replica's step reports, gathered per step.
    pub(super) reports: Vec<StepReports>,
    /// The replica whose complete steps make the step events (0 until it is lost).
    pub(super) events_from: usize,
    /// Steps another replica completed that the events replica has not: the events, should
    /// that replica be lost before it makes them.
    pub(super) spare: BTreeMap<u64, Vec<StepReport>>,
    pub(super) done: Vec<bool>,
    /// Steps each worker (by run index) had done when it ended the run: failed (its report
    /// names the step it was in) or done.
    pub(super) ended: BTreeMap<usize, u64>,
    pub(super) completed: u64,
    /// When a cancel asked the workers to stop.
    pub(super) stop_asked: Option<u64>,
    pub(super) last_check: u64,
    /// Relative slowness of every worker in the last steps.
    pub(super) history: Vec<Vec<f64>>,
    /// The latest steps that ran over their prediction.
    pub(super) drift: Drift,
    /// The reports of the latest steps (as many as the drift rule counts), to recalibrate
    /// from when it fires.
    pub(super) recent: Vec<Vec<StepReport>>,
    /// A move decided, waiting for the workers to stop.
    pub(super) moving: Option<(String, Move)>,
    /// Memory pressure is answered once per run: when nothing fits, planning the
    /// candidates again every step would not change that.
    pub(super) pressure_tried: bool,
    /// The live worker count a growth was last tried for (a plan that fails is not tried
    /// again until the count changes).
    pub(super) grow_tried: usize,
    /// A worker's error report, held until this time to see whether a worker went silent.
    pub(super) failing: Option<(Failure, u64)>,
    /// Every step's measured seconds (the slowest worker's wall time), while an auto
    /// trial measures the run's plan.
    pub(super) step_secs: Vec<f64>,
}

impl Out {
    /// Every worker of the run, replica 0's first: its index is `replica · d + rank`.
    pub(super) fn all(&self) -> impl Iterator<Item = &Worker> {
        self.workers.iter().chain(&self.others)
    }

    /// Every worker of the run, by index.
    pub(super) fn all_workers(&self) -> Vec<Worker> {
        self.all().cloned().collect()
    }

    /// The run index of the worker that sent `r` (replica `r`'s rank `w` is worker
    /// `r · d + w`), if it is that worker of the run.
    pub(super) fn index_of(&self, r: &StepReport) -> Option<usize> {
        let i = (r.replica as usize)
            .saturating_mul(self.workers.len())
            .saturating_add(r.worker_index as usize);
        self.all()
            .nth(i)
            .is_some_and(|w| w.id == r.worker_id)
            .then_some(i)
    }

    /// The data-parallel replicas.
    pub(super) fn replicas(&self) -> usize {
        1 + self.others.len() / self.workers.len().max(1)
    }

    /// Replica `r`'s workers.
    pub(super) fn replica(&self, r: usize) -> impl Iterator<Item = (usize, &Worker)> {
        let d = self.workers.len();
        self.all().enumerate().skip(r * d).take(d)
    }
}

impl Run {
    /// Follows `out` from `now`.
    pub(super) fn new(out: Out, now: u64) -> Run {
        let d = out.workers.len();
        let replicas = 1 + out.others.len() / d.max(1);
        Run {
            reports: (0..replicas)
                .map(|_| StepReports::new(d, out.first_step, out.steps))
                .collect(),
            events_from: 0,
            spare: BTreeMap::new(),
            done: vec![false; d + out.others.len()],
            ended: BTreeMap::new(),
            completed: 0,
            stop_asked: None,
            last_check: now,
            history: Vec::new(),
            drift: Drift::default(),
            recent: Vec::new(),
            moving: None,
            pressure_tried: false,
            grow_tried: d,
            failing: None,
            step_secs: Vec::new(),
            out,
        }
    }

    /// Notes where worker `r` ended the run, if its report says it did: failed in step
    /// `r.step` (that many steps done), or done after it.
    pub(super) fn note_end(&mut self, r: &StepReport) {
        let Some(i) = self.out.index_of(r) else {
            return;
        };
        if !r.error.is_empty() {
            self.ended.insert(i, r.step);
        } else if r.done {
            self.done[i] = true;
            self.ended.insert(i, r.step.saturating_add(1));
        }
    }

    /// Whether a move may still be decided: none is pending, no cancel, steps left.
    pub(super) fn may_stop(&self) -> bool {
        self.out.may_move
            && self.moving.is_none()
            && self.stop_asked.is_none()
            && self.out.first_step + self.completed < self.out.steps
    }
}
