//! The [`Supervisor`] of one job's runs, in raft-rs's shape: [`Input`]s in, [`Action`]s
//! out, time given as milliseconds (`now`) with every input. It holds no clock, thread,
//! channel or file: the coordinator's run actor feeds it and performs what it asks.
//!
//! A job's life, run by run:
//!
//! 1. **Waiting** for `d` live workers with their assignment stream open (the first `d` by
//!    id; worker index = rank in that order). The job's status says how many are ready.
//! 2. After a coordinator restart (first run only): waiting until no live worker runs one
//!    of the earlier coordinator's runs of the job, then resuming from the checkpoint the
//!    store named (or the latest complete one).
//! 3. Before a run starts, a plan predicted not to fit a worker's registered memory moves
//!    to one that does ([`super::pressure`]).
//! 4. **Running**: every worker gets its assignment; complete sets of step reports become
//!    step events. The run ends when every worker is done (the job succeeds), one fails
//!    (held for [`Config::lost_grace_ms`] to see whether a worker went silent), a worker is
//!    lost, or a move between steps (a straggler, memory pressure, workers joining) stopped
//!    every worker after the same step.
//! 5. **Re-planning** after a loss or a move: once the run's workers left it, the job
//!    resumes from the last complete checkpoint on the survivors' plan or the move's, in a
//!    new run with its own [`RunId`]. At most [`Config::max_replans`] re-plans.
//!
//! A cancel stops a running run after the step in progress (aborting it after
//! [`Config::stop_grace_ms`]); while the job waits or re-plans, it ends the job at once.

mod follow;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::RunId;
use super::checkpoints::{Checkpoints, Start};
use super::pressure::{Fitting, predicted_peaks, pressure};
use super::respec::{replan_after_loss, spec_split};
use super::straggler::{Straggle, straggle_of};
use super::worker::{StepReport, Worker};
use crate::job::{JobPlan, JobSpec};
use crate::{Costs, Schedule, simulate};

use follow::Run;

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
    /// The job is cancelled.
    Cancel,
    /// Time passed.
    Tick,
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
    /// Pieces per stage (empty: the job's even split).
    pub stage_pieces: Vec<u32>,
}

/// A step every worker of the run reported.
#[derive(Debug, Clone, PartialEq)]
pub struct StepDone {
    /// The step (0-based).
    pub step: u64,
    /// Every worker's report, by index.
    pub reports: Vec<StepReport>,
    /// The run's planned bubble.
    pub planned_bubble: f64,
    /// Every worker's predicted peak activation bytes under the run's plan and split
    /// (empty when they cannot be predicted).
    pub predicted_peaks: Vec<u64>,
    /// Why the job was re-planned before this step and the schedule it runs now, on the
    /// first step after a re-plan.
    pub replanned: Option<(String, Arc<Schedule>)>,
}

/// A memory-pressure search to run beside the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    spec: JobSpec,
    plan: JobPlan,
    pieces: Vec<u32>,
    measured: Vec<StepReport>,
    workers: Vec<Worker>,
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

/// Why a job was re-planned (the label of `pipewise_replans_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A worker of the run was lost.
    WorkerLost,
    /// Layers moved off a straggler.
    Straggler,
    /// A plan that fits the workers' memory.
    MemoryPressure,
    /// Workers joined a job running on fewer than its degree.
    WorkerJoined,
}

impl Reason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::WorkerLost => "worker_lost",
            Reason::Straggler => "straggler",
            Reason::MemoryPressure => "memory_pressure",
            Reason::WorkerJoined => "worker_joined",
        }
    }
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    /// A worker gave up on the run while all of the run's workers still heartbeat.
    #[error("worker {index} ({id}) failed at step {step}: {error}")]
    Worker {
        /// Its index.
        index: usize,
        /// Its id.
        id: String,
        /// The step (1-based).
        step: u64,
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
    /// Every worker ended the run before its last step, unasked.
    #[error("the workers stopped after {through} of {steps} steps without being asked to")]
    StoppedEarly {
        /// Steps done.
        through: u64,
        /// The job's steps.
        steps: u64,
    },
}

/// What a run that stopped between steps goes on with.
#[derive(Debug, Clone, PartialEq)]
enum Move {
    /// A straggler's layers moved: the same plan on this split (pieces per stage).
    Split(Vec<u32>),
    /// Memory pressure: a plan predicted to fit, with the spec it was planned from.
    Plan(Box<Fitting>),
    /// Workers joined a job that runs on fewer than its degree: the plan on more of them.
    Grow(Box<JobPlan>),
}

impl Move {
    fn reason(&self) -> Reason {
        match self {
            Move::Split(_) => Reason::Straggler,
            Move::Plan(_) => Reason::MemoryPressure,
            Move::Grow(_) => Reason::WorkerJoined,
        }
    }
}

/// How a run ended other than by ending the job.
#[derive(Debug, Clone, PartialEq)]
enum Ended {
    /// A worker of the run is gone (the reason); every step before `through` completed.
    Lost { reason: String, through: u64 },
    /// The run stopped after step `through` (the reason) to go on with `to`.
    Move {
        reason: String,
        through: u64,
        to: Move,
    },
}

/// Where the job's runs are.
#[derive(Debug)]
enum Phase {
    /// Waiting for enough streaming workers.
    Waiting {
        shown: Option<usize>,
        next_note: u64,
    },
    /// After a coordinator restart: until no live worker runs an earlier run of the job.
    Rejoining { workers: Vec<Worker>, until: u64 },
    /// After a coordinator restart: for the checkpoint listing.
    Resuming { workers: Vec<Worker> },
    /// A run is out.
    Running(Box<Run>),
    /// Until the workers of an abandoned run have left it.
    Leaving {
        run: RunId,
        workers: Vec<Worker>,
        until: u64,
        then: Ended,
    },
    /// For the checkpoint listing, to re-plan.
    Reading { then: Ended },
    /// The job is over.
    Finished,
}

/// The supervisor of one job's runs (see the [module docs](self)).
#[derive(Debug)]
pub struct Supervisor {
    job: u64,
    /// The job's spec as submitted.
    spec: JobSpec,
    /// The spec the runs follow: the job's, with the schedule a memory-pressure move chose.
    current: JobSpec,
    plan: JobPlan,
    start: Start,
    cfg: Config,
    pool: BTreeMap<String, Member>,
    first_step: u64,
    stage_pieces: Vec<u32>,
    /// Runs started (each re-plan starts another).
    replans: u64,
    /// Why the job was last re-planned and onto what, until a step event carries it.
    replanned: Option<(String, Arc<Schedule>)>,
    cancelled: bool,
    now: u64,
    phase: Phase,
    out: Vec<Action>,
}

impl Supervisor {
    /// The supervisor of `job` planned as `plan`, starting at `start`, with the workers
    /// live now.
    pub fn new(
        job: u64,
        spec: JobSpec,
        plan: JobPlan,
        start: Start,
        cfg: Config,
        live: Vec<Member>,
    ) -> Supervisor {
        let stage_pieces = spec_split(&spec, &plan);
        Supervisor {
            job,
            current: spec.clone(),
            spec,
            plan,
            start,
            cfg,
            pool: live.into_iter().map(|m| (m.worker.id.clone(), m)).collect(),
            first_step: start.step,
            stage_pieces,
            replans: 0,
            replanned: None,
            cancelled: false,
            now: 0,
            phase: Phase::Waiting {
                shown: None,
                next_note: 0,
            },
            out: Vec::new(),
        }
    }

    /// Takes `input` at time `now` (milliseconds, never going back) and returns what to do,
    /// in order.
    pub fn handle(&mut self, now: u64, input: Input) -> Vec<Action> {
        self.now = self.now.max(now);
        if matches!(self.phase, Phase::Finished) {
            return Vec::new();
        }
        self.track(&input);
        if input == Input::Cancel {
            self.cancelled = true;
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Finished);
        self.phase = match phase {
            Phase::Running(run) => self.follow(*run, input),
            _ if self.cancelled => self.finish(Ok(())),
            Phase::Waiting { shown, next_note } => self.wait(shown, next_note),
            Phase::Rejoining { workers, until } => self.rejoin(workers, until),
            Phase::Resuming { workers } => match input {
                Input::Checkpoints(listing) => self.resume(workers, &listing),
                _ => Phase::Resuming { workers },
            },
            Phase::Leaving {
                run,
                workers,
                until,
                then,
            } => self.leave(run, workers, until, then),
            Phase::Reading { then } => match input {
                Input::Checkpoints(listing) => self.replan(then, &listing),
                _ => Phase::Reading { then },
            },
            Phase::Finished => Phase::Finished,
        };
        std::mem::take(&mut self.out)
    }

    /// Whether the job is over.
    pub fn finished(&self) -> bool {
        matches!(self.phase, Phase::Finished)
    }

    /// Keeps the live workers up to date.
    fn track(&mut self, input: &Input) {
        match input {
            Input::Registered(w) => {
                self.pool.insert(
                    w.id.clone(),
                    Member {
                        worker: w.clone(),
                        streaming: false,
                        running: 0,
                    },
                );
            }
            Input::StreamOpened(id) | Input::StreamClosed(id) => {
                if let Some(m) = self.pool.get_mut(id) {
                    m.streaming = matches!(input, Input::StreamOpened(_));
                }
            }
            Input::Heartbeat { id, run } => {
                if let Some(m) = self.pool.get_mut(id) {
                    m.running = *run;
                }
            }
            Input::Lost(id) => {
                self.pool.remove(id);
            }
            _ => {}
        }
    }

    fn streaming(&self) -> Vec<Worker> {
        self.pool
            .values()
            .filter(|m| m.streaming)
            .map(|m| m.worker.clone())
            .collect()
    }

    fn finish(&mut self, outcome: Result<(), Failure>) -> Phase {
        self.out.push(Action::Finish(outcome));
        Phase::Finished
    }

    fn waiting(&mut self) -> Phase {
        self.wait(None, self.now)
    }

    /// Waits for `d` streaming workers.
    fn wait(&mut self, shown: Option<usize>, next_note: u64) -> Phase {
        let d = self.plan.schedule.num_workers() as usize;
        let mut ready = self.streaming();
        if ready.len() >= d {
            if shown.is_some() {
                self.out.push(Action::Waiting(String::new()));
            }
            ready.truncate(d);
            if self.replans == 0 && self.start.restarts > 0 {
                // Workers may still run (and write checkpoints of) the earlier
                // coordinator's run until it tells them to abandon it.
                let until = self.now + self.cfg.leave_grace_ms;
                return self.rejoin(ready, until);
            }
            return self.launch(ready);
        }
        let n = ready.len();
        if shown != Some(n) {
            self.out
                .push(Action::Waiting(format!("workers: {n} of {d} ready")));
        }
        let mut next_note = next_note;
        if self.now >= next_note {
            self.out.push(Action::Info(format!(
                "waiting for workers: {n} of {d} ready"
            )));
            next_note = self.now + self.cfg.remind_every_ms;
        }
        Phase::Waiting {
            shown: Some(n),
            next_note,
        }
    }

    /// After a restart: until no live worker runs an earlier run of the job.
    fn rejoin(&mut self, workers: Vec<Worker>, until: u64) -> Phase {
        let job = self.job;
        let staying = self
            .pool
            .values()
            .any(|m| m.running != 0 && RunId::from_raw(m.running).job() == job);
        if staying && self.now < until {
            return Phase::Rejoining { workers, until };
        }
        if staying {
            self.out.push(Action::Warn(
                "workers still run the earlier coordinator's run; handing out the next".into(),
            ));
        }
        self.out.push(Action::ReadCheckpoints);
        Phase::Resuming { workers }
    }

    /// After a restart: resumes from the checkpoint the store named, or the latest
    /// complete one.
    fn resume(&mut self, workers: Vec<Worker>, listing: &Checkpoints) -> Phase {
        let stages = self.plan.schedule.placement.stages();
        self.first_step = listing.restart_step(&self.current, self.start, stages);
        self.out.push(Action::ClearAfter(self.first_step));
        let reason = format!(
            "the coordinator restarted; resuming from {}",
            resumed_from(self.first_step)
        );
        self.out.push(Action::Warn(reason.clone()));
        self.tell(reason);
        self.launch(workers)
    }

    /// Starts a run on `workers`.
    fn launch(&mut self, workers: Vec<Worker>) -> Phase {
        // A plan predicted not to fit a worker's registered memory is moved before it
        // starts: a device would fail to allocate rather than report the overflow.
        if let Some((reason, fits)) = pressure(
            &self.current,
            &self.plan,
            &self.stage_pieces,
            None,
            &workers,
        ) {
            let reason = format!("{reason}; before step {}", self.first_step + 1);
            self.out.push(Action::Warn(reason.clone()));
            self.out.push(Action::Replanned(Reason::MemoryPressure));
            self.plan = fits.adopt_into(&mut self.current);
            self.stage_pieces = spec_split(&self.current, &self.plan);
            self.tell(reason);
        }
        // Run ids past any an earlier coordinator gave this job.
        let number = self.start.restarts * (self.cfg.max_replans + 1) + self.replans;
        let id = RunId::new(self.job, number);
        let steps = u64::from(self.spec.training.steps);
        self.out.push(Action::Attach(id));
        self.out.push(Action::Assign(Box::new(Assignment {
            run: id,
            first_step: self.first_step,
            end_step: steps,
            workers: workers.clone(),
            plan: self.plan.clone(),
            stage_pieces: self.stage_pieces.clone(),
        })));
        let watch: Option<Straggle> = straggle_of(&self.spec, &self.plan, &self.stage_pieces);
        let run = Run::new(
            id,
            workers,
            self.first_step,
            steps,
            planned_bubble(&self.plan, &self.spec),
            predicted_peaks(&self.current, &self.plan, &self.stage_pieces),
            watch,
            self.replans < self.cfg.max_replans,
            self.now,
        );
        Phase::Running(Box::new(run))
    }

    /// After a run ended for a re-plan: until its workers left it.
    fn leave(&mut self, run: RunId, workers: Vec<Worker>, until: u64, then: Ended) -> Phase {
        let staying = self
            .pool
            .values()
            .any(|m| m.running == run.raw() && workers.iter().any(|w| w.id == m.worker.id));
        if staying && self.now < until {
            return Phase::Leaving {
                run,
                workers,
                until,
                then,
            };
        }
        if staying {
            self.out.push(Action::Warn(
                "survivors still run the abandoned run; handing out the next".into(),
            ));
        }
        self.out.push(Action::ReadCheckpoints);
        Phase::Reading { then }
    }

    /// Re-plans after a run ended (`then`), from the checkpoints on disk.
    fn replan(&mut self, then: Ended, listing: &Checkpoints) -> Phase {
        self.replans += 1;
        let stages = self.plan.schedule.placement.stages();
        match then {
            Ended::Lost { reason, through } => {
                let resume = listing.last_complete(&self.spec, self.first_step, through, stages);
                self.out.push(Action::ClearAfter(resume));
                let survivors = self.streaming().len() as u32;
                let d = survivors.min(self.spec.parallelism.pipeline_parallel_degree);
                if d == 0 {
                    return self.finish(Err(Failure::NoSurvivors { lost: reason }));
                }
                match replan_after_loss(self.current.clone(), &self.spec, d) {
                    Ok((current, plan)) => (self.current, self.plan) = (current, plan),
                    Err(error) => {
                        return self.finish(Err(Failure::Replan {
                            lost: reason,
                            workers: d,
                            error,
                        }));
                    }
                }
                let reason = format!(
                    "{reason}; re-planned onto {d} workers ({}, {} stages), resuming from {}",
                    self.plan.kind.name(),
                    self.plan.schedule.placement.stages(),
                    resumed_from(resume)
                );
                self.out.push(Action::Warn(reason.clone()));
                self.out.push(Action::Replanned(Reason::WorkerLost));
                self.tell(reason);
                self.stage_pieces = spec_split(&self.current, &self.plan);
                self.first_step = resume;
            }
            Ended::Move {
                reason,
                through,
                to,
            } => {
                // The workers stopped after `through` steps and saved it when checkpoints
                // are on (always, when a move is possible).
                let resume = if listing.complete(through, stages) {
                    through
                } else {
                    listing.last_complete(&self.spec, self.first_step, through, stages)
                };
                self.out.push(Action::ClearAfter(resume));
                let reason = format!("{reason}; resuming from {}", resumed_from(resume));
                self.out.push(Action::Warn(reason.clone()));
                self.out.push(Action::Replanned(to.reason()));
                match to {
                    Move::Split(counts) => self.stage_pieces = counts,
                    Move::Plan(fits) => {
                        self.plan = fits.adopt_into(&mut self.current);
                        self.stage_pieces = spec_split(&self.current, &self.plan);
                    }
                    Move::Grow(plan) => {
                        self.plan = *plan;
                        self.stage_pieces = spec_split(&self.current, &self.plan);
                    }
                }
                self.tell(reason);
                self.first_step = resume;
            }
        }
        self.waiting()
    }

    /// Records a re-plan for the next step event: after any earlier one no event has
    /// carried yet (a run lost before its first step), so neither reason is lost.
    fn tell(&mut self, reason: String) {
        let reason = match self.replanned.take() {
            Some((earlier, _)) => format!("{earlier}; then {reason}"),
            None => reason,
        };
        self.replanned = Some((reason, Arc::new(self.plan.schedule.clone())));
    }
}

/// The planned bubble of a job's plan (what a step event reports): its schedule simulated
/// under [`JobSpec::planning_times`], unit pass times for real compute and the `[compute]`
/// times for an emulated job.
pub fn planned_bubble(plan: &JobPlan, spec: &JobSpec) -> f64 {
    Costs::uniform(&plan.schedule.placement, spec.planning_times())
        .and_then(|c| simulate(&plan.schedule, &c))
        .map(|s| s.bubble)
        .unwrap_or(f64::NAN)
}

/// Where a re-planned job resumes, in words.
fn resumed_from(step: u64) -> String {
    if step == 0 {
        "the start (no checkpoint)".into()
    } else {
        format!("the checkpoint of step {step}")
    }
}
