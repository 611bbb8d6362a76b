//! The [`Supervisor`] of one job's runs, in raft-rs's shape: [`Input`]s in, [`Action`]s
//! out, time given as milliseconds (`now`) with every input. It holds no clock, thread,
//! channel or file: the coordinator's run actor feeds it and performs what it asks.
//!
//! A job's life, run by run:
//!
//! 1. **Waiting** for `d` live workers with their assignment stream open (the first `d` by
//!    id; worker index = rank in that order). The job's status says how many are ready.
//!    A re-planned job that loses a worker it counted on while it waits re-plans onto the
//!    survivors.
//! 2. After a coordinator restart (first run only): waiting until no live worker runs one
//!    of the earlier coordinator's runs of the job, then resuming from the checkpoint the
//!    store named (or the latest complete one).
//! 3. Before a run starts, an auto job's search chooses its plan beside the supervisor
//!    (**Choosing**, [`Action::Choose`]), and a plan predicted not to fit a worker's registered memory moves
//!    to one that does ([`super::pressure`]).
//! 4. **Running**: every worker gets its assignment; complete sets of step reports become
//!    step events. The run ends when every worker is done (the job succeeds), one fails
//!    (held for [`Config::lost_grace_ms`] to see whether a worker went silent), a worker is
//!    lost, or a move between steps (a straggler, memory pressure, workers joining) stopped
//!    every worker after the same step.
//! 5. **Re-planning** after a loss or a move: once the run's workers left it, the job
//!    resumes in a new run with its own [`RunId`]: after a loss from the last complete
//!    checkpoint on the survivors' plan; after a move on the move's plan, after the step
//!    every worker stopped at, from the stages its workers hold in memory
//!    ([`HeldStage`]s, handed over peer to peer), or from the checkpoint should a holder
//!    be gone. At most [`Config::max_replans`] re-plans.
//!
//! A job of several data-parallel replicas that loses a worker sheds its replica instead
//! when whole replicas are left: they go on from memory (**Shedding**, [`shed`]).
//!
//! A cancel stops a running run after the step in progress (aborting it after
//! [`Config::stop_grace_ms`]); while the job waits or re-plans, it ends the job at once.

mod auto;
#[cfg(test)]
mod auto_tests;
mod auto_trial;
#[cfg(test)]
mod claim_tests;
#[cfg(test)]
mod drift_tests;
mod handover;
mod io;
mod recalibrate;
#[cfg(test)]
mod replica_tests;
mod shed;
#[cfg(test)]
mod shed_tests;
mod step_moves;
#[cfg(test)]
mod tests;
mod tracked_run;
mod trial_state;
#[cfg(test)]
mod waiting_tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::checkpoints::{Checkpoints, Start};
use super::id::RunId;
use super::pressure::{in_use_ranges, predicted_peaks, pressure};
use super::respec::{replan, replan_after_loss, respec, spec_split};
use super::straggler::{Straggle, straggle_of};
use super::worker::Worker;
use crate::calibration::CostModel;
use crate::error::Result;
use crate::job::{JobPlan, JobSpec};
use crate::schedule::RecomputeShares;
use crate::{Costs, Schedule, simulate};

use io::Ended;
pub use io::{
    Action, Assignment, Choose, Config, Failure, HeldStage, Input, Member, Reason, Search, Shown,
    StepDone, Taken,
};
use tracked_run::{Out, Run};
use trial_state::{TRIAL_PLANS, Trial};

/// Where the job's runs are.
#[derive(Debug)]
enum Phase {
    /// Waiting for enough streaming workers.
    Waiting {
        shown: Option<usize>,
        next_note: u64,
    },
    /// For the claim of `workers` (no other job may hold them).
    Claiming { workers: Vec<Worker> },
    /// After a coordinator restart: until no live worker runs an earlier run of the job.
    Rejoining { workers: Vec<Worker>, until: u64 },
    /// After a coordinator restart: for the checkpoint listing.
    Resuming { workers: Vec<Worker> },
    /// An auto job's search (the latest asked) for the plan of a run on `workers` is out.
    Choosing {
        workers: Vec<Worker>,
        source: String,
    },
    /// A run is out.
    Running(Box<Run>),
    /// A run lost a replica: until the replicas kept leave it, to go on from memory.
    Shedding(Box<shed::Shed>),
    /// Until the workers of an abandoned run have left it.
    Leaving {
        run: RunId,
        workers: Vec<Worker>,
        until: u64,
        then: Box<Ended>,
    },
    /// For the checkpoint listing, to re-plan.
    Reading { then: Box<Ended> },
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
    /// Workers that left (since they last registered): a run holding one lost it by a
    /// drain, not a crash.
    left: BTreeSet<String>,
    /// The latest worker to leave or be lost since the last run started, and how, in words.
    gone: Option<(String, Reason)>,
    first_step: u64,
    /// The step a restart from the checkpoints falls back to when none is later: the last
    /// run start that was not from memory (its checkpoint, or the seeded model).
    floor: u64,
    stage_pieces: Vec<u32>,
    /// Runs started (each re-plan starts another).
    replans: u64,
    /// Why the job was last re-planned and onto what, until a step event carries it.
    replanned: Option<(String, Arc<Schedule>)>,
    /// What `schedule = "auto"` last chose and why, until a step event carries it.
    chose: Option<String>,
    /// An auto job's trial of the plans its prediction cannot tell apart.
    trial: Trial,
    /// The plan a trial moves the next run to (the search is not asked again for it).
    next_plan: Option<crate::auto::job::PlanOption>,
    /// Re-plans that were trial moves (they do not count against [`Config::max_replans`]).
    trial_moves: u64,
    /// Auto searches asked for (the latest one's number).
    asked: u64,
    cancelled: bool,
    /// The next run goes on from the stages its workers hold in memory.
    in_memory: bool,
    /// The next run's last this many replicas copy their state from replica 0.
    rebuilt: u32,
    /// The next run goes on from these stages of the run before, held in its workers'
    /// memory (empty: from the checkpoints, or the stages each worker holds).
    handover: Vec<HeldStage>,
    /// The job's pieces' costs, refined by every complete step of every run.
    costs: CostModel,
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
        let costs = CostModel::new(
            spec.model.clone(),
            spec.parallelism.pipeline_parallel_microbatch_size,
        );
        Supervisor {
            costs,
            job,
            current: spec.clone(),
            spec,
            plan,
            start,
            cfg,
            pool: live.into_iter().map(|m| (m.worker.id.clone(), m)).collect(),
            left: BTreeSet::new(),
            gone: None,
            first_step: start.step,
            floor: start.step,
            stage_pieces,
            replans: 0,
            replanned: None,
            chose: None,
            trial: Trial::NotYet,
            next_plan: None,
            trial_moves: 0,
            asked: 0,
            cancelled: false,
            in_memory: false,
            rebuilt: 0,
            handover: Vec::new(),
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
            Phase::Shedding(shed) => self.shedding(*shed, input),
            _ if self.cancelled => self.finish(Ok(())),
            Phase::Waiting { shown, next_note } => self.wait(shown, next_note),
            Phase::Claiming { workers } => match input {
                Input::ClaimAnswer(Ok(())) => self.claimed(workers),
                Input::ClaimAnswer(Err(why)) if self.rebuilt > 0 => self.not_rebuilt(workers, &why),
                Input::ClaimAnswer(Err(why)) => {
                    self.out
                        .push(Action::Info(format!("workers taken: {why}; waiting")));
                    self.waiting()
                }
                _ => Phase::Claiming { workers },
            },
            Phase::Rejoining { workers, until } => self.rejoin(workers, until),
            Phase::Choosing { workers, source } => match input {
                Input::Chosen { ask, choice } if ask == self.asked => {
                    self.chosen(workers, &source, *choice)
                }
                _ => Phase::Choosing { workers, source },
            },
            Phase::Resuming { workers } => match input {
                Input::Checkpoints(listing) => self.resume(workers, &listing),
                _ => Phase::Resuming { workers },
            },
            Phase::Leaving {
                run,
                workers,
                until,
                then,
            } => self.leave(run, workers, until, *then),
            Phase::Reading { then } => match input {
                Input::Checkpoints(listing) => self.replan(*then, &listing),
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
                self.left.remove(&w.id);
                self.pool.insert(
                    w.id.clone(),
                    Member {
                        worker: w.clone(),
                        streaming: false,
                        running: 0,
                        claimed: self.pool.get(&w.id).map_or(0, |m| m.claimed),
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
            Input::Claimed { id, job } => {
                if let Some(m) = self.pool.get_mut(id) {
                    m.claimed = *job;
                }
            }
            Input::Lost(id) | Input::Left(id) => {
                let (what, how) = match input {
                    Input::Left(_) => {
                        self.left.insert(id.clone());
                        ("left the cluster", Reason::WorkerLeft)
                    }
                    _ => ("stopped heartbeating", Reason::WorkerLost),
                };
                if self.pool.remove(id).is_some() {
                    self.gone = Some((format!("worker {id} {what}"), how));
                }
            }
            _ => {}
        }
    }

    /// The workers this job may run on: streaming, and no other job's.
    fn streaming(&self) -> Vec<Worker> {
        self.pool
            .values()
            .filter(|m| m.streaming && m.usable_by(self.job))
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

    /// Claims `workers` for the next run.
    fn claim(&mut self, workers: Vec<Worker>) -> Phase {
        self.out.push(Action::Claim(
            workers.iter().map(|w| w.id.clone()).collect(),
        ));
        Phase::Claiming { workers }
    }

    /// The next run starts after `step` from its checkpoint (or the seeded model), so a
    /// later restart falls back no further than it.
    fn start_from_checkpoint(&mut self, step: u64) {
        self.first_step = step;
        self.floor = step;
    }

    /// Waits for `d` streaming workers.
    fn wait(&mut self, shown: Option<usize>, next_note: u64) -> Phase {
        let d = self.plan.schedule.num_workers() as usize * self.current.replicas() as usize;
        let ready = self.streaming();
        if ready.len() >= d {
            if shown.is_some() {
                self.out.push(Action::Waiting(String::new()));
            }
            let ready = self.holders_first(ready, d);
            return self.claim(ready);
        }
        // A re-planned job's plan counted workers it can no longer have (one left during a
        // move's hand-over, another job took one): no one is coming back for it, so it
        // shrinks again onto what it can have (a survivor reopening its stream is waited
        // for).
        let usable = self.pool.values().filter(|m| m.usable_by(self.job)).count();
        if self.replans > 0 && usable < d && !ready.is_empty() {
            self.end_trial();
            let (gone, how) = self
                .gone
                .clone()
                .unwrap_or_else(|| ("workers went to other jobs".into(), Reason::WorkerLost));
            let reason = format!("{gone} while the job waited");
            return match self.onto_survivors(reason, how, self.floor) {
                Ok(()) => self.wait(shown, next_note),
                Err(end) => end,
            };
        }
        let n = ready.len();
        let of = match self.current.replicas() {
            1 => String::new(),
            r => format!(" ({r} replicas × {})", d / r as usize),
        };
        if shown != Some(n) {
            self.out
                .push(Action::Waiting(format!("workers: {n} of {d} ready{of}")));
        }
        let mut next_note = next_note;
        if self.now >= next_note {
            self.out.push(Action::Info(format!(
                "waiting for workers: {n} of {d} ready{of}"
            )));
            next_note = self.now + self.cfg.remind_every_ms;
        }
        Phase::Waiting {
            shown: Some(n),
            next_note,
        }
    }

    /// The job holds `workers` now: its run starts on them.
    fn claimed(&mut self, workers: Vec<Worker>) -> Phase {
        if self.replans == 0 && self.start.restarts > 0 {
            // Workers may still run (and write checkpoints of) the earlier coordinator's
            // run until it tells them to abandon it.
            let until = self.now + self.cfg.leave_grace_ms;
            return self.rejoin(workers, until);
        }
        self.launch(workers)
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
        self.start_from_checkpoint(listing.restart_step(&self.current, self.start, stages));
        self.out.push(Action::ClearAfter(self.first_step));
        let reason = format!(
            "the coordinator restarted; resuming from {}",
            resumed_from(self.first_step)
        );
        self.out.push(Action::Warn(reason.clone()));
        self.tell(reason);
        self.launch(workers)
    }

    /// Starts a run on `workers`; an auto job's choice of plan first, unless its workers go
    /// on from the stages they hold in memory (a rebuild), which keeps the plan.
    fn launch(&mut self, workers: Vec<Worker>) -> Phase {
        if let Some(option) = self.next_plan.take() {
            self.adopt(option);
            return self.start_run(workers);
        }
        if self.spec.is_auto() && !self.in_memory {
            return self.ask_choice(workers);
        }
        self.start_run(workers)
    }

    /// Starts a run on `workers` with the plan as it stands.
    fn start_run(&mut self, mut workers: Vec<Worker>) -> Phase {
        // Departures before this run are not the reason a later wait falls short.
        self.gone = None;
        let handover = self.take_handover(&workers);
        // Replica 0's pipeline is what the plan and its policies see.
        let d = self.plan.schedule.num_workers() as usize;
        let others = workers.split_off(d.min(workers.len()));
        // Workers going on from memory keep their stages: the plan stays.
        let resume_in_memory = std::mem::take(&mut self.in_memory);
        // A plan predicted not to fit a worker's registered memory is moved before it
        // starts: a device would fail to allocate rather than report the overflow.
        if !resume_in_memory
            && let Some((reason, fits)) = pressure(
                &self.current,
                &self.plan,
                &self.stage_pieces,
                None,
                &tightest(&workers, &others),
            )
        {
            let reason = format!("{reason}; before step {}", self.first_step + 1);
            self.out.push(Action::Warn(reason.clone()));
            self.out.push(Action::Replanned(Reason::MemoryPressure));
            self.plan = fits.adopt_into(&mut self.current);
            self.stage_pieces = spec_split(&self.current, &self.plan);
            self.tell(reason);
        }
        // Run ids past any an earlier coordinator gave this job.
        let per_restart = self.cfg.max_replans + 1 + TRIAL_PLANS as u64;
        let number = self.start.restarts * per_restart + self.replans;
        let id = RunId::new(self.job, number);
        let steps = u64::from(self.spec.training.steps);
        let every: Vec<Worker> = workers.iter().chain(&others).cloned().collect();
        self.out.push(Action::Attach(id));
        self.out.push(Action::Assign(Box::new(Assignment {
            run: id,
            first_step: self.first_step,
            end_step: steps,
            workers: every.clone(),
            plan: self.plan.clone(),
            stage_pieces: self.stage_pieces.clone(),
            resume_in_memory,
            rebuilt_replicas: std::mem::take(&mut self.rebuilt),
            handover,
        })));
        let watch: Option<Straggle> = straggle_of(&self.current, &self.plan, &self.stage_pieces);
        let ranges = in_use_ranges(&self.current, &self.plan, &self.stage_pieces)
            .map(|(_, ranges)| ranges)
            .unwrap_or_default();
        self.costs.start_run();
        let planned = shown(&self.current, &self.plan, &ranges, &every, &mut self.costs);
        let run = Run::new(
            Out {
                id,
                workers,
                others,
                first_step: self.first_step,
                steps,
                planned,
                ranges,
                predicted_peaks: predicted_peaks(&self.current, &self.plan, &self.stage_pieces),
                watch,
                may_move: self.counted_replans() < self.cfg.max_replans,
            },
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
                then: Box::new(then),
            };
        }
        if staying {
            self.out.push(Action::Warn(
                "survivors still run the abandoned run; handing out the next".into(),
            ));
        }
        self.out.push(Action::ReadCheckpoints);
        Phase::Reading {
            then: Box::new(then),
        }
    }

    /// Re-plans after a run ended (`then`), from the checkpoints on disk.
    fn replan(&mut self, then: Ended, listing: &Checkpoints) -> Phase {
        self.replans += 1;
        let stages = self.plan.schedule.placement.stages();
        match then {
            Ended::Lost {
                reason,
                through,
                how,
            } => {
                self.end_trial();
                let resume = listing.last_complete(&self.spec, self.floor, through, stages);
                self.out.push(Action::ClearAfter(resume));
                if let Err(end) = self.onto_survivors(reason, how, resume) {
                    return end;
                }
            }
            Ended::Move {
                reason,
                through,
                to,
                held,
            } => self.after_move(reason, (through, to, held), listing),
        }
        self.waiting()
    }

    /// Re-plans onto the streaming workers (at most the job's degree), resuming from
    /// `resume`, after `reason` (`how`); the job's end when none is left or no plan fits.
    fn onto_survivors(&mut self, reason: String, how: Reason, resume: u64) -> Result<(), Phase> {
        let survivors = self.streaming().len() as u32;
        let (d, r) = survivor_shape(&self.spec, survivors);
        if d == 0 {
            return Err(self.finish(Err(Failure::NoSurvivors { lost: reason })));
        }
        let spec = self.spec.with_replicas(r);
        // Auto chooses again when the run starts; until then the job's own plan.
        let replanned = if spec.is_auto() {
            replan(&spec, d).map(|plan| (respec(&spec, d), plan))
        } else {
            replan_after_loss(self.current.with_replicas(r), &spec, d)
        };
        match replanned {
            Ok((current, plan)) => (self.current, self.plan) = (current, plan),
            Err(error) => {
                return Err(self.finish(Err(Failure::Replan {
                    lost: reason,
                    workers: d,
                    error,
                })));
            }
        }
        let onto = match r {
            1 => format!("{d} workers"),
            r => format!("{r} replicas of {d} workers"),
        };
        let reason = format!(
            "{reason}; re-planned onto {onto} ({}, {} stages), resuming from {}",
            self.plan.kind.name(),
            self.plan.schedule.placement.stages(),
            resumed_from(resume)
        );
        self.out.push(Action::Warn(reason.clone()));
        self.out.push(Action::Replanned(how));
        self.tell(reason);
        self.stage_pieces = spec_split(&self.current, &self.plan);
        self.start_from_checkpoint(resume);
        // From the checkpoints: nothing goes on from memory.
        self.in_memory = false;
        self.rebuilt = 0;
        self.handover.clear();
        Ok(())
    }

    /// Re-plans counted against [`Config::max_replans`]: all but an auto trial's moves.
    fn counted_replans(&self) -> u64 {
        self.replans - self.trial_moves
    }

    /// Another move or a loss ends an auto trial under way: later runs take the search's
    /// choice. One that had not started measuring rivals starts again with the next run.
    fn end_trial(&mut self) {
        self.trial = match self.trial {
            Trial::Measuring(_) | Trial::Rechoosing(..) => Trial::NotYet,
            Trial::Trying { .. } => Trial::Done,
            ref other => other.clone(),
        };
        self.next_plan = None;
    }

    /// Records a re-plan for the next step event: after any earlier one no event has
    /// carried yet (a run lost before its first step), so neither reason is lost.
    fn tell(&mut self, reason: String) {
        let reason = match self.replanned.take() {
            Some((earlier, _)) if !earlier.is_empty() => format!("{earlier}; then {reason}"),
            _ => reason,
        };
        self.replanned = Some((reason, Arc::new(self.plan.schedule.clone())));
    }
}

/// `costs` with every stage recomputing as `plan` says, each at its own shares of time and
/// stash ([`RecomputeShares::of_stage`]).
fn recomputing(
    spec: &JobSpec,
    plan: &JobPlan,
    ranges: &[std::ops::Range<usize>],
    costs: Costs,
) -> Result<Costs> {
    if !plan.recomputes() {
        return Ok(costs);
    }
    let b = spec.parallelism.pipeline_parallel_microbatch_size;
    let shares: Vec<RecomputeShares> = ranges
        .iter()
        .map(|r| RecomputeShares::of_stage(&spec.model, r.clone(), b))
        .collect();
    costs.recomputing(&plan.recompute, &shares)
}

/// The plan a step of `plan` on `ranges` (pieces per stage) by `workers` is shown with:
/// for real compute, the schedule simulated with the job's cost model as it stands (costs
/// of the steps observed so far); for emulated compute, the schedule simulated under the
/// `[compute]` times, with the hop, the replicas' gradient sums and the end-of-step sync
/// the cost model measured so far; before any prediction of real compute, the schedule under
/// [`JobSpec::planning_times`] (its bubble only). Waits, sums past the passes and the sync
/// count as idle, as they do in the measured bubble.
pub fn shown(
    spec: &JobSpec,
    plan: &JobPlan,
    ranges: &[std::ops::Range<usize>],
    workers: &[Worker],
    costs: &mut CostModel,
) -> Shown {
    let replicas = spec.replicas();
    let emulated = spec.compute.is_emulated();
    // Emulated passes, once measured, are planned as real ones are: their sleeps overshoot
    // a little on a loaded machine, and the fit finds that as it finds a slow core.
    if (!emulated || costs.calibrated())
        && let Some(p) = costs.predict(&plan.schedule, ranges, workers, replicas)
    {
        return Shown {
            bubble: p.bubble,
            step_ms: p.step_secs * 1e3,
            costs: Some(Arc::new(p.costs)),
        };
    }
    let times = spec.planning_times();
    let hop = costs.hop_secs().unwrap_or(0.0);
    let costs_of = |c: Costs| {
        if emulated {
            Costs {
                comm: hop,
                ..c.scaled(spec.compute.f_ms * 1e-3)
            }
        } else {
            c
        }
    };
    let simulated = Costs::uniform(&plan.schedule.placement, times)
        .and_then(|c| recomputing(spec, plan, ranges, c))
        .map(costs_of)
        .and_then(|c| Ok((simulate(&plan.schedule, &c)?, c)));
    match simulated {
        Ok((sim, c)) if emulated => {
            let step =
                costs.passes_and_sums(&sim, &plan.schedule, ranges, replicas) + costs.sync_secs();
            let busy: f64 = sim.busy.iter().sum();
            let idle = 1.0 - busy / (sim.busy.len().max(1) as f64 * step);
            Shown {
                bubble: if step > 0.0 { idle } else { 0.0 },
                step_ms: step * 1e3,
                costs: Some(Arc::new(c)),
            }
        }
        Ok((sim, _)) => Shown {
            bubble: sim.bubble,
            step_ms: 0.0,
            costs: None,
        },
        Err(_) => Shown::default(),
    }
}

/// The pipeline degree and replicas a job re-planned onto `survivors` workers runs on:
/// its own degree, with as many of its replicas as the survivors hold and the global batch
/// splits into; fewer survivors than the degree make one pipeline of them all.
fn survivor_shape(spec: &JobSpec, survivors: u32) -> (u32, u32) {
    let degree = spec.parallelism.pipeline_parallel_degree.max(1);
    if survivors < degree {
        return (survivors, 1);
    }
    let r = spec
        .splitting_replicas(1, spec.replicas().min(survivors / degree))
        .unwrap_or(1);
    (degree, r)
}

/// Rank by rank, the worker with the least registered memory over the replicas (replica 0's
/// `workers`, then the `others` replica by replica; 0 bytes: not registered, no limit):
/// what a plan must fit on every replica.
fn tightest(workers: &[Worker], others: &[Worker]) -> Vec<Worker> {
    let d = workers.len().max(1);
    let limit = |w: &&Worker| match w.memory_bytes {
        0 => u64::MAX,
        bytes => bytes,
    };
    workers
        .iter()
        .enumerate()
        .map(|(rank, first)| {
            let same_rank = others.iter().skip(rank).step_by(d);
            let tightest = same_rank.chain([first]).min_by_key(limit);
            tightest.unwrap_or(first).clone()
        })
        .collect()
}

/// Where a re-planned job resumes, in words.
fn resumed_from(step: u64) -> String {
    if step == 0 {
        "the start (no checkpoint)".into()
    } else {
        format!("the checkpoint of step {step}")
    }
}
