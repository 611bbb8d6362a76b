//! The job scheduler, without I/O: which planned jobs start when, on logical time
//! (milliseconds, given with every input). Jobs run side by side on disjoint workers,
//! started in queue order, all of a job's workers or none, with EASY backfill on predicted
//! run times ([`queue::admit`]). [`Input`]s in (a job planned, the pool of workers changed,
//! a run holds its workers, a step, a cancel, a job's end), [`Action`]s out (start a job,
//! note what a queued one waits for, store a job's progress, stop a run, drop a queued
//! job); the coordinator's job manager feeds it and carries them out.
//!
//! A job gets its place in the queue when its plan is ready. After a coordinator restart
//! the jobs it had queued or running are planned again and queued in id order: none after
//! the first still planning starts before it is queued ([`Input::Replanning`]).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::checkpoints::Start;
use super::queue::{self, Verdict};
use super::registry::Pool;
use crate::job::{JobPlan, JobSpec};

/// How often a running job's progress is stored at most (a checkpoint, and every change of
/// state, at once): a restart resumes from the last checkpoint, so a step stored a second
/// late loses nothing, and a synced write per step would hold the job manager back on a
/// slow disk while the steps queue up in its mailbox.
pub const PROGRESS_SAVE_MS: u64 = 1_000;

/// A planned job, ready to queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// Its id.
    pub job: u64,
    /// Its spec.
    pub spec: JobSpec,
    /// Its plan.
    pub plan: JobPlan,
    /// Where it starts.
    pub start: Start,
}

/// A running job's step, as the scheduler reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// The job.
    pub job: u64,
    /// The step (1-based).
    pub step: u64,
    /// Its wall time, milliseconds.
    pub step_ms: f64,
    /// The time predicted for the next steps, milliseconds (0: none).
    pub predicted_ms: f64,
    /// The step changed the checkpoint a restart resumes from.
    pub checkpoint: bool,
}

/// What happens to the jobs.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A job was planned: it queues at the back.
    Planned(Box<Planned>),
    /// A job the coordinator had before a restart is planned again: the jobs after it in
    /// id order wait for it.
    Replanning(u64),
    /// A job planned again after a restart: it queues in id order, before the jobs
    /// submitted since (`None`: it has no plan, or was cancelled meanwhile).
    Resumed(u64, Option<Box<Planned>>),
    /// The workers jobs may start on.
    Workers(Pool),
    /// A started job's run holds its workers (its claim came through).
    Holding(u64),
    /// A running job waits for something before its next step (`true`), or no longer.
    Stalled(u64, bool),
    /// A job's step.
    Progress(Progress),
    /// Cancel a job.
    Cancel(u64),
    /// A started job ended.
    Finished(u64),
}

/// A job to start.
#[derive(Debug, Clone, PartialEq)]
pub struct Starting {
    /// The job.
    pub job: u64,
    /// Its spec.
    pub spec: JobSpec,
    /// Its plan.
    pub plan: JobPlan,
    /// Where it starts.
    pub start: Start,
}

/// What the scheduler asks of the job manager.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Start the job's run.
    Start(Box<Starting>),
    /// What a queued job waits for (shown, not stored: it changes as the predictions do,
    /// and a restart plans the queue again).
    Note(u64, String),
    /// Store the job's progress now.
    Save(u64),
    /// Ask the job's run to stop (it was cancelled while it runs).
    Stop(u64),
    /// The job left the queue before it started (it was cancelled).
    Dropped(u64),
}

/// A queued job.
#[derive(Debug, Clone)]
struct Waiting {
    planned: Planned,
    /// Its predicted run time in seconds ([`queue::predicted_secs`], once, on the first
    /// workers it could start on); `None` until then.
    predicted: Option<Option<f64>>,
    /// What it was last noted to wait for.
    note: String,
}

/// A started job.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Started {
    /// Workers it needs.
    need: usize,
    /// Its steps.
    steps: u64,
    /// Its run holds its workers.
    holding: bool,
    /// Its predicted seconds left.
    left: Option<f64>,
    /// It waits for something (workers after a loss): no end to predict.
    stalled: bool,
}

/// The job scheduler (see the [module docs](self)).
#[derive(Debug, Default)]
pub struct Scheduler {
    queue: VecDeque<Waiting>,
    running: BTreeMap<u64, Started>,
    /// Jobs planned again after a restart whose plans are not ready yet.
    replanning: BTreeSet<u64>,
    pool: Pool,
    /// How far the started jobs' steps ran from their first predictions.
    misses: queue::Misses,
    /// When a job's progress was last stored.
    saved: Option<u64>,
    now: u64,
    out: Vec<Action>,
}

impl Scheduler {
    /// Takes `input` at `now` (milliseconds, never going back) and returns what to do, in
    /// order.
    pub fn handle(&mut self, now: u64, input: Input) -> Vec<Action> {
        self.now = self.now.max(now);
        match input {
            Input::Planned(planned) => self.queue.push_back(waiting(*planned)),
            Input::Replanning(job) => {
                self.replanning.insert(job);
            }
            Input::Resumed(job, planned) => {
                self.replanning.remove(&job);
                if let Some(planned) = planned {
                    let at = self.queue.partition_point(|q| q.planned.job < job);
                    self.queue.insert(at, waiting(*planned));
                }
            }
            Input::Workers(pool) => self.pool = pool,
            Input::Holding(job) => self.with_running(job, |s| s.holding = true),
            Input::Stalled(job, stalled) => self.with_running(job, |s| s.stalled = stalled),
            Input::Progress(p) => self.progress(p),
            Input::Cancel(job) => self.cancel(job),
            Input::Finished(job) => {
                self.running.remove(&job);
            }
        }
        self.admit();
        std::mem::take(&mut self.out)
    }

    fn with_running(&mut self, job: u64, f: impl FnOnce(&mut Started)) {
        if let Some(started) = self.running.get_mut(&job) {
            f(started);
        }
    }

    /// A job's step: the time its run is predicted to take from here (the backfill rule
    /// reads it), how far its steps ran from the first prediction, and whether to store it
    /// now (a checkpoint moved, or [`PROGRESS_SAVE_MS`] passed since the last store).
    fn progress(&mut self, p: Progress) {
        if let Some(started) = self.running.get_mut(&p.job) {
            let step_ms = match p.predicted_ms {
                ms if ms > 0.0 => ms,
                _ => p.step_ms,
            };
            let steps_left = started.steps.saturating_sub(p.step) as f64;
            started.left = Some(steps_left * step_ms / 1e3);
            started.stalled = false;
            self.misses.step(p.job, p.step, p.step_ms / 1e3);
        }
        let due = self
            .saved
            .is_none_or(|at| self.now.saturating_sub(at) >= PROGRESS_SAVE_MS);
        if p.checkpoint || due {
            self.saved = Some(self.now);
            self.out.push(Action::Save(p.job));
        }
    }

    /// A running job's run is asked to stop; a queued one leaves the queue.
    fn cancel(&mut self, job: u64) {
        if self.running.contains_key(&job) {
            self.out.push(Action::Stop(job));
            return;
        }
        self.queue.retain(|q| q.planned.job != job);
        self.out.push(Action::Dropped(job));
    }

    /// Starts the queued jobs the workers allow, in queue order (a job resumed after a
    /// restart waits for the plans of the ones before it in id order). A job starts when
    /// enough workers are idle for all of it (its `d × R`), after the workers the started
    /// jobs that do not hold theirs yet will claim; with nothing running, the head of the
    /// queue starts and waits for its workers inside; a job behind one that must wait
    /// starts by the backfill rule ([`queue::admit`]: it cannot delay that job, by the
    /// jobs' predicted times).
    fn admit(&mut self) {
        let streaming = self.pool.streaming;
        let reserved: usize = self
            .running
            .values()
            .filter(|s| !s.holding && s.need <= streaming)
            .map(|s| s.need)
            .sum();
        let queued = self.candidates();
        // A running job that waits for workers (after a loss) has no end to predict.
        let running: Vec<queue::Started> = self
            .running
            .values()
            .map(|s| queue::Started {
                need: s.need,
                left: s.left.filter(|_| !s.stalled),
            })
            .collect();
        let free = self.pool.idle.len().saturating_sub(reserved);
        let verdicts = queue::admit(&queued, free, streaming, &running);
        for (job, (id, verdict)) in queued.iter().zip(verdicts) {
            if verdict == Verdict::Start {
                self.start(id, job.secs);
                continue;
            }
            let note = verdict.waiting(job.need, job.secs, streaming);
            if let Some(q) = self.queue.iter_mut().find(|q| q.planned.job == id)
                && q.note != note
            {
                q.note.clone_from(&note);
                self.out.push(Action::Note(id, note));
            }
        }
    }

    /// The queued jobs as the backfill rule sees them, in queue order, up to the first job
    /// after one still planning again (jobs resumed after a restart run in id order).
    fn candidates(&mut self) -> Vec<queue::Queued> {
        let planning = self.replanning.first().copied();
        let idle = &self.pool.idle;
        let misses = &self.misses;
        let mut queued = Vec::new();
        for q in &mut self.queue {
            let (spec, plan) = (&q.planned.spec, &q.planned.plan);
            if planning.is_some_and(|first| first < q.planned.job) {
                break;
            }
            let need = spec.workers_needed() as usize;
            // Predicted on the workers it would start on, once there are enough of them.
            let secs = match (q.predicted, idle.get(..need)) {
                (Some(secs), _) => secs,
                (None, Some(workers)) => *q
                    .predicted
                    .insert(queue::predicted_secs(spec, plan, workers)),
                (None, None) => None,
            };
            let secs = secs.map(|s| s * misses.factor(&queue::shape(spec)));
            queued.push(queue::Queued {
                id: q.planned.job,
                need,
                secs,
            });
        }
        queued
    }

    /// Starts queued job `job`, predicted to take `secs` (scaled by the misses).
    fn start(&mut self, job: u64, secs: Option<f64>) {
        let Some(at) = self.queue.iter().position(|q| q.planned.job == job) else {
            return;
        };
        let Some(q) = self.queue.remove(at) else {
            return;
        };
        let Planned {
            job,
            spec,
            plan,
            start,
        } = q.planned;
        let steps = u64::from(spec.training.steps);
        if let Some(first) = q.predicted.flatten() {
            let step_secs = first / steps.max(1) as f64;
            self.misses.started(job, queue::shape(&spec), step_secs);
        }
        let started = Started {
            need: spec.workers_needed() as usize,
            steps,
            holding: false,
            left: secs,
            stalled: false,
        };
        self.running.insert(job, started);
        self.out.push(Action::Start(Box::new(Starting {
            job,
            spec,
            plan,
            start,
        })));
    }
}

fn waiting(planned: Planned) -> Waiting {
    Waiting {
        planned,
        predicted: None,
        note: String::new(),
    }
}
