//! What goes into the supervisor and what comes out of it.

use std::sync::Arc;

use super::super::checkpoints::Checkpoints;
use super::super::id::RunId;
use super::super::pressure::{Fitting, pressure};
use super::super::worker::{StepReport, Worker};
use crate::Schedule;
use crate::auto::Measured;
use crate::auto::job::{JobChoice, Overheads, PlanOption, choose_for_job};
use crate::cost::Costs;
use crate::job::{JobPlan, JobSpec};

/// The supervisor's timing and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How long a worker's error report is held to see whether one of the run's workers
    /// went silent (then the run is re-planned instead of the job failing).
    pub lost_grace_ms: u64,
    /// How long the workers of an abandoned run get to leave it before the next run is
    /// handed out anyway.
    pub leave_grace_ms: u64,
    /// How long a cancelled run's workers get to stop before it is aborted.
    pub stop_grace_ms: u64,
    /// How often a run on fewer workers than the job's degree checks for workers to grow
    /// back onto.
    pub check_every_ms: u64,
    /// How often a job waiting for workers says so in the log.
    pub remind_every_ms: u64,
    /// Re-plans per job at most; one more lost worker fails it.
    pub max_replans: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            lost_grace_ms: 3_000,
            leave_grace_ms: 30_000,
            stop_grace_ms: 30_000,
            check_every_ms: 1_000,
            remind_every_ms: 10_000,
            max_replans: 8,
        }
    }
}

/// A live worker as the supervisor tracks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The worker.
    pub worker: Worker,
    /// Whether its assignment stream is open.
    pub streaming: bool,
    /// The run it said it runs in its last heartbeat (0: none).
    pub running: u64,
    /// The job whose workers it is (0: none): a job runs on workers no other job holds.
    pub claimed: u64,
}

impl Member {
    /// Whether job `job` may run on this worker: no job's, or `job`'s.
    pub fn usable_by(&self, job: u64) -> bool {
        self.claimed == 0 || self.claimed == job
    }
}

/// What happens to a job's runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A worker registered (again: a new process under a known id is a new incarnation).
    Registered(Worker),
    /// A registered worker opened its assignment stream.
    StreamOpened(String),
    /// A worker's assignment stream closed.
    StreamClosed(String),
    /// A worker's heartbeat: the run it runs (0: none).
    Heartbeat {
        /// The worker id.
        id: String,
        /// The run it says it runs.
        run: u64,
    },
    /// A worker stopped heartbeating.
    Lost(String),
    /// A worker said it leaves (it was asked to stop); it holds no run any more, so a run
    /// holding it has lost it at once.
    Left(String),
    /// A worker of the current run reported a step, an error or its end.
    Report(Box<StepReport>),
    /// Worker `worker` of the current run did not take its assignment.
    Refused {
        /// Its index in the run.
        worker: usize,
        /// Why.
        reason: String,
    },
    /// The job's checkpoint folders, read after [`Action::ReadCheckpoints`].
    Checkpoints(Checkpoints),
    /// What an [`Action::Search`] found.
    Searched(Option<Box<(String, Fitting)>>),
    /// What an [`Action::Choose`] chose ([`Choose::answer`]); `ask` tells a stale answer
    /// from the one awaited.
    Chosen {
        /// The search's number.
        ask: u64,
        /// Its choice.
        choice: Box<crate::Result<JobChoice>>,
    },
    /// A worker became job `job`'s (0: no job's).
    Claimed {
        /// The worker id.
        id: String,
        /// The job holding it now (0: none).
        job: u64,
    },
    /// The answer to [`Action::Claim`]: the workers are the job's, or which of them another
    /// job took first.
    ClaimAnswer(Result<(), Taken>),
    /// The job is cancelled.
    Cancel,
    /// Time passed.
    Tick,
}

/// Why a claim was refused: each worker another job holds, with that job's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken(pub Vec<(String, u64)>);

impl std::fmt::Display for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (id, job)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}worker {id} is job {job}'s")?;
        }
        Ok(())
    }
}

/// What the supervisor asks of the run actor.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The job waits for this before its next step (empty: no longer).
    Waiting(String),
    /// A line for the log.
    Info(String),
    /// A warning for the log.
    Warn(String),
    /// Make these workers the job's (and only these): no other job's run may be handed
    /// them until the job ends. The answer comes back as [`Input::ClaimAnswer`].
    Claim(Vec<String>),
    /// Route the run's step reports to the supervisor, and mark the run as this
    /// coordinator's.
    Attach(RunId),
    /// Hand every worker of a run its assignment, in index order; a refusal comes back as
    /// [`Input::Refused`].
    Assign(Box<Assignment>),
    /// Ask the run's workers to stop after the step in progress.
    Stop(RunId),
    /// Tell the run's workers to abandon it now.
    Abort(RunId),
    /// The run is over: stop routing its reports.
    Detach(RunId),
    /// Every worker reported a step.
    Step(Box<StepDone>),
    /// The job was re-planned (counted by reason).
    Replanned(Reason),
    /// Read the job's checkpoint folders and feed them back ([`Input::Checkpoints`]).
    ReadCheckpoints,
    /// Remove what runs wrote after this step: later checkpoint folders and the final
    /// parameters.
    ClearAfter(u64),
    /// Search for a plan that fits the workers' memory beside the run (it plans a few dozen
    /// schedules) and feed back what it finds ([`Input::Searched`]).
    Search(Box<Search>),
    /// Run `schedule = "auto"`'s search for the next run beside the supervisor (seconds at
    /// eight workers and more) and feed back its choice ([`Input::Chosen`]).
    Choose(Box<Choose>),
    /// The job is over: succeeded or cancelled (`Ok`), or failed.
    Finish(Result<(), Failure>),
}

/// One run as handed to its workers.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The run.
    pub run: RunId,
    /// The step it starts at (its workers load that checkpoint; 0: the seeded model).
    pub first_step: u64,
    /// The job's step count.
    pub end_step: u64,
    /// Its workers, by index.
    pub workers: Vec<Worker>,
    /// The plan.
    pub plan: JobPlan,
    /// Pieces per stage (empty: the default split, `ModelSpec::balanced_split`).
    pub stage_pieces: Vec<u32>,
    /// Its workers go on from the stages they hold in memory after `first_step` steps (the
    /// replicas that survived a lost one), not from a checkpoint.
    pub resume_in_memory: bool,
    /// The last this many replicas are rebuilt: their workers copy their stages' state
    /// from replica 0's worker of the same rank, peer to peer.
    pub rebuilt_replicas: u32,
    /// A move from memory (empty: none): the stages of the run before, held by its
    /// workers (all of them in this run), from which this run's workers take their stages'
    /// state after `first_step` steps, peer to peer, instead of from a checkpoint.
    pub handover: Vec<HeldStage>,
}

/// A stage of the run before a move, held in its worker's memory after the run stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldStage {
    /// Its index in the run before.
    pub stage: u32,
    /// Its pieces (embedding, blocks, head in model order).
    pub pieces: std::ops::Range<usize>,
    /// The worker holding it (replica 0's worker of its rank).
    pub holder: Worker,
}

/// A step every worker of the run reported.
#[derive(Debug, Clone, PartialEq)]
pub struct StepDone {
    /// The step (0-based).
    pub step: u64,
    /// Every worker's report, by index.
    pub reports: Vec<StepReport>,
    /// The step's plan as shown: from the costs known before it started.
    pub planned: Shown,
    /// What the next step is planned at, from the costs known after this one.
    pub next: Shown,
    /// Every worker's predicted peak activation bytes under the run's plan and split
    /// (empty when they cannot be predicted).
    pub predicted_peaks: Vec<u64>,
    /// Why the job was re-planned before this step and the schedule it runs now, on the
    /// first step after a re-plan.
    pub replanned: Option<(String, Arc<Schedule>)>,
    /// What `schedule = "auto"` chose and why, on the first step of a run it chose.
    pub plan_choice: Option<String>,
}

/// The plan a step is shown with: its planned bubble and predicted step time.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Shown {
    /// Planned bubble (waits and the end-of-step sync count as idle for real compute).
    pub bubble: f64,
    /// Predicted step time (ms; 0 when it cannot be predicted).
    pub step_ms: f64,
    /// The per-stage costs (seconds) the plan was simulated on, for the step's trace
    /// (`None` when it was not).
    pub costs: Option<Arc<Costs>>,
}

/// A memory-pressure search to run beside the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    pub(super) spec: JobSpec,
    pub(super) plan: JobPlan,
    pub(super) pieces: Vec<u32>,
    pub(super) measured: Vec<StepReport>,
    pub(super) workers: Vec<Worker>,
}

impl Search {
    /// Runs the search (seconds for large models): the reason and the plan to move to.
    pub fn run(&self) -> Option<Box<(String, Fitting)>> {
        pressure(
            &self.spec,
            &self.plan,
            &self.pieces,
            Some(&self.measured),
            &self.workers,
        )
        .map(Box::new)
    }
}

/// An auto job's search for the plan of its next run.
#[derive(Debug, Clone, PartialEq)]
pub struct Choose {
    /// The supervisor's number for this search.
    pub(super) ask: u64,
    pub(super) spec: JobSpec,
    pub(super) workers: u32,
    pub(super) memory_per_worker: u64,
    pub(super) measured: Measured,
    pub(super) overheads: Overheads,
}

impl Choose {
    /// Runs the search.
    pub fn run(&self) -> crate::Result<JobChoice> {
        choose_for_job(
            &self.spec,
            self.workers,
            self.memory_per_worker,
            self.measured.clone(),
            self.overheads,
        )
    }

    /// Runs the search: its answer for the supervisor.
    pub fn answer(&self) -> Input {
        Input::Chosen {
            ask: self.ask,
            choice: Box::new(self.run()),
        }
    }
}

/// Why a job was re-planned (the label of `pipewise_replans_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A worker of the run was lost.
    WorkerLost,
    /// A worker of the run left (drained: it was asked to stop and said so).
    WorkerLeft,
    /// Layers moved off a straggler.
    Straggler,
    /// A plan that fits the workers' memory.
    MemoryPressure,
    /// Workers joined a job running on fewer than its degree.
    WorkerJoined,
    /// Steps ran over the plan's prediction: layers moved for the recalibrated costs.
    Calibration,
    /// `schedule = "auto"` measuring the plans its prediction cannot tell apart.
    AutoTrial,
}

impl Reason {
    /// Every reason, in the order of the variants.
    pub const ALL: [Reason; 7] = [
        Reason::WorkerLost,
        Reason::WorkerLeft,
        Reason::Straggler,
        Reason::MemoryPressure,
        Reason::WorkerJoined,
        Reason::Calibration,
        Reason::AutoTrial,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::WorkerLost => "worker_lost",
            Reason::WorkerLeft => "worker_left",
            Reason::Straggler => "straggler",
            Reason::MemoryPressure => "memory_pressure",
            Reason::WorkerJoined => "worker_joined",
            Reason::Calibration => "calibration",
            Reason::AutoTrial => "auto_trial",
        }
    }
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    /// A worker gave up on the run while all of the run's workers still heartbeat.
    #[error("worker {index} ({id}) failed {}: {error}", when(*.starting, *.step))]
    Worker {
        /// Its index.
        index: usize,
        /// Its id.
        id: String,
        /// The step (1-based) it ran, or was to run first.
        step: u64,
        /// It failed before running `step`, while starting the run.
        starting: bool,
        /// What it said.
        error: String,
    },
    /// A worker was lost after the last re-plan allowed.
    #[error("{lost}; not re-planned: the job was re-planned {max} times already")]
    Replans {
        /// Which worker was lost, and how.
        lost: String,
        /// Re-plans allowed.
        max: u64,
    },
    /// A worker was lost and none is left.
    #[error("{lost}; no worker is left to re-plan onto")]
    NoSurvivors {
        /// Which worker was lost, and how.
        lost: String,
    },
    /// A worker was lost and the job does not plan on the survivors.
    #[error("{lost}; re-planning onto {workers} workers failed: {error}")]
    Replan {
        /// Which worker was lost, and how.
        lost: String,
        /// The survivors.
        workers: u32,
        /// The planner's reason.
        error: crate::Error,
    },
    /// `schedule = "auto"` found no plan for the run's workers.
    #[error("auto found no plan for {workers} workers: {error}")]
    Auto {
        /// The run's workers.
        workers: u32,
        /// The auto-planner's reason.
        error: crate::Error,
    },
    /// Every worker ended the run before its last step, unasked.
    #[error("the workers stopped after {through} of {steps} steps without being asked to")]
    StoppedEarly {
        /// Steps done.
        through: u64,
        /// The job's steps.
        steps: u64,
    },
}

/// When a worker failed: at step `step`, or before it, `starting` the run.
fn when(starting: bool, step: u64) -> String {
    if starting {
        format!("starting the run, before step {step}")
    } else {
        format!("at step {step}")
    }
}

impl Failure {
    /// Worker `index`'s error report as the job's failure.
    pub fn of_report(index: usize, r: StepReport) -> Failure {
        Failure::Worker {
            index,
            id: r.worker_id,
            step: r.step.saturating_add(1),
            starting: r.starting,
            error: r.error,
        }
    }
}

/// What a run that stopped between steps goes on with.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Move {
    /// A straggler's layers moved: the same plan on this split (pieces per stage).
    Split(Vec<u32>),
    /// Steps drifted from the prediction: the same plan on the split balanced for the
    /// recalibrated costs.
    Recalibrate(Vec<u32>),
    /// Memory pressure: a plan predicted to fit, with the spec it was planned from.
    Plan(Box<Fitting>),
    /// Workers joined a job that runs on fewer than its degree: the plan on more of them.
    Grow(Box<JobPlan>),
    /// An auto job's trial: the next plan to measure, or the fastest measured.
    Trial(Box<PlanOption>),
    /// Workers joined a job that shed replicas: this many replicas again, the new ones
    /// copying their state from a live one.
    Rebuild(u32),
}

impl Move {
    pub(super) fn reason(&self) -> Reason {
        match self {
            Move::Split(_) => Reason::Straggler,
            Move::Recalibrate(_) => Reason::Calibration,
            Move::Plan(_) => Reason::MemoryPressure,
            Move::Grow(_) => Reason::WorkerJoined,
            Move::Trial(_) => Reason::AutoTrial,
            Move::Rebuild(_) => Reason::WorkerJoined,
        }
    }
}

/// How a run ended other than by ending the job.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Ended {
    /// A worker of the run is gone (the reason, and how: lost or left); every step before
    /// `through` completed.
    Lost {
        reason: String,
        through: u64,
        how: Reason,
    },
    /// The run stopped after step `through` (the reason) to go on with `to`, from the
    /// stages its workers hold (`held`; empty: from the checkpoints).
    Move {
        reason: String,
        through: u64,
        to: Move,
        held: Vec<HeldStage>,
    },
}
