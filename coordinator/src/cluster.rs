//! [`ClusterRunner`]: runs jobs on registered worker processes (`pipewise worker`).
//!
//! For a job on `d` workers it waits until `d` live workers have their assignment stream
//! open, takes the first `d` by id (worker index = rank in that order), and sends each its
//! assignment: the placement, its program, the peers' addresses, the job spec and the
//! output directory. From then on the workers talk only to each other; each sends a
//! `StepReport` after every step (without waiting for an answer), and the runner turns a
//! complete set of reports into a step event.
//!
//! Ends: every worker reports `done` → success. A worker reports an error while all of the
//! job's workers still heartbeat → the job fails and the others are told (in their
//! heartbeat reply) to abandon it. A cancel → the workers are asked (in their step acks) to
//! stop; worker 0 spreads that through the step's collective, so all stop after the same
//! step.
//!
//! **Re-planning after a lost worker.** A worker of the job that stops heartbeating (or
//! whose peers fail because it vanished: an error report is held for
//! [`LOST_GRACE`] to see whether a worker goes silent) ends the *run*, not the job:
//!
//! 1. the run is abandoned and the runner waits until the survivors have left it;
//! 2. the resume step `K` is the last checkpoint every stage of the run wrote completely
//!    (`step-K/stage-S.safetensors` for every stage, written under a temporary name and
//!    renamed), else the step the run started from (0: the seeded initial model, so a job
//!    without checkpoints starts over); later step directories and `final/` are removed;
//! 3. the spec is planned again for `d'` = min(live workers, the spec's degree) workers
//!    (the memory limit, in units of `1/d` of the model, is scaled by `d' / d`); a spec
//!    that does not plan on `d'` workers fails the job with the planner's reason;
//! 4. a new run starts at step `K` on those workers; each loads its stages from `step-K`
//!    by tensor name, whatever partition wrote it, so training continues exactly as it
//!    would have. Its first step event carries the reason and the new schedule; the
//!    counter `pipewise_replans_total{reason="worker_lost"}` counts it. At most
//!    [`MAX_REPLANS`] re-plans per job.
//!
//! **Moving layers off a straggler.** A run of a real-compute job with checkpoints is
//! watched: after each step every worker's time in passes is divided by its modelled work
//! (the FLOPs of the pieces it holds, the embedding counted as 5 % of a block). A worker at
//! [`STRAGGLER_RATIO`] times the median or more for [`STRAGGLER_STEPS`] steps in a row is
//! a straggler: if a split of the pieces weighted by the measured slowness
//! ([`pipewise_common::rebalance::split_for_speeds`]) cuts the busiest worker's predicted
//! time by [`STRAGGLER_GAIN`] or more, every worker is asked to stop after the same step
//! (they save it), and the next run starts there with the new split (the assignment's
//! `stage_pieces`; the schedule and the worker count stay). The event carries the reason,
//! `pipewise_replans_total{reason="straggler"}` counts it. `pipewise worker --slowdown F`
//! (hidden) makes a worker's passes F times longer, to try it.
//!
//! **Memory pressure.** A worker started with `--memory-bytes B` registers `B`. When a
//! run's plan is predicted to make a worker hold more (checked before the run starts), or
//! a step's report shows it holding more (its peak activations plus its training state:
//! parameters, gradients, AdamW moments and master copies, `static_bytes`; every worker is then asked to stop after
//! the same step), the job goes on with the fastest plan of [`FITTING_KINDS`] (simulated
//! under the job's planning times; the adaptive kinds, when their default limit does not
//! fit, at a limit bisected to the bytes there are) whose predicted bytes fit every worker
//! that registered a size and are lower on the overflowing one (`pipewise_replans_total{reason=
//! "memory_pressure"}`). Predictions are [`JobPlan::predicted_peak_bytes`] plus the
//! training state of the job's layer split ([`JobPlan::predicted_state_bytes_over`]); later losses and
//! growths re-plan the schedule the move chose.
//!
//! **Growing back.** A run on fewer workers than the job's degree (after a loss) of a job
//! with checkpoints is checked once a second: when more streaming workers are live than
//! the run has, every worker is asked to stop after the same step (they save it) and the
//! job goes on from there planned on min(live, degree) workers
//! (`pipewise_replans_total{reason="worker_joined"}`). A plan that fails is logged and not
//! tried again until the live count changes.
//!
//! A run's id, which the workers see as the assignment's `job` (and which keys its frames,
//! collectives, reports and aborts), is the job id for the first run and
//! `job + k · 2^48` for its `k`-th run ([`run_id`]): each re-plan starts another, and a
//! coordinator restart jumps past every number the earlier coordinator could have given
//! ([`MAX_REPLANS`] + 1 per restart), so nothing of an abandoned run can reach the next one.
//! Events and metrics carry the job id.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pipewise_common::job::{
    JobPlan, JobSpec, checkpoint_dir, checkpoint_file, checkpoint_step, job_of, run_id,
};
use pipewise_common::rebalance::{largest_worker_time, split_for_speeds};
use pipewise_common::render::report::fmt_bytes;
use pipewise_common::{Costs, Schedule, simulate};
use pipewise_proto::convert::program_to_proto;
use pipewise_proto::v1 as pb;
use ractor::ActorRef;

use crate::driver::{JobRunner, Report, Start, StepEventData};
use crate::membership::{HEARTBEAT_INTERVAL, MISSED_HEARTBEATS, MembershipMsg, WorkerInfo};

/// How long a cancelled job's workers get to stop before they are told to abandon it.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// How long an error report is held to see whether one of the run's workers stopped
/// heartbeating (then the run is re-planned instead of the job failing): a little more
/// than the time after which a silent worker counts as dead.
pub const LOST_GRACE: Duration =
    Duration::from_millis(HEARTBEAT_INTERVAL.as_millis() as u64 * (MISSED_HEARTBEATS as u64 + 2));

/// How long survivors get to leave an abandoned run before the next run is handed out
/// anyway (their queued assignment then waits until they have).
const LEAVE_GRACE: Duration = Duration::from_secs(30);

/// Re-plans per job at most; one more lost worker fails it.
pub const MAX_REPLANS: u64 = 8;

/// The planned bubble of a job's plan (what `StepEvent.planned_bubble` reports): its
/// schedule simulated under [`JobSpec::planning_times`], unit pass times for real compute
/// and the `[compute]` times for an emulated job.
pub fn planned_bubble(plan: &JobPlan, spec: &JobSpec) -> f64 {
    Costs::uniform(&plan.schedule.placement, spec.planning_times())
        .and_then(|c| simulate(&plan.schedule, &c))
        .map(|s| s.bubble)
        .unwrap_or(f64::NAN)
}

/// Runs jobs on the cluster's worker processes (see the [module docs](self)).
pub struct ClusterRunner {
    /// The membership actor.
    pub membership: ActorRef<MembershipMsg>,
    /// The coordinator's runtime (the runner blocks on it from the driver's thread).
    pub runtime: tokio::runtime::Handle,
    /// The coordinator's data directory (relative checkpoint folders are under it).
    pub data_dir: PathBuf,
}

impl ClusterRunner {
    fn live(&self) -> Result<Vec<WorkerInfo>, String> {
        self.runtime
            .block_on(async { ractor::call!(self.membership, MembershipMsg::Live) })
            .map_err(|e| format!("membership: {e}"))
    }

    /// Waits for `d` live, streaming workers; `None` if cancelled first. While it waits, the
    /// job's status says so (`report`), and the log every 10 s.
    fn wait_for_workers(
        &self,
        job: u64,
        d: u32,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
    ) -> Result<Option<Vec<WorkerInfo>>, String> {
        let started = Instant::now();
        let mut told = Duration::ZERO;
        let mut shown: Option<usize> = None;
        loop {
            let mut ready: Vec<WorkerInfo> =
                self.live()?.into_iter().filter(|w| w.streaming).collect();
            if ready.len() >= d as usize {
                if shown.is_some() {
                    report(Report::Waiting(String::new()));
                }
                ready.sort_by(|a, b| a.id.cmp(&b.id));
                ready.truncate(d as usize);
                return Ok(Some(ready));
            }
            if cancelled.load(Ordering::SeqCst) {
                return Ok(None);
            }
            if shown != Some(ready.len()) {
                shown = Some(ready.len());
                report(Report::Waiting(format!(
                    "workers: {} of {d} ready",
                    ready.len()
                )));
            }
            if started.elapsed() >= told {
                tracing::info!(job, "waiting for workers: {} of {d} ready", ready.len());
                told += Duration::from_secs(10);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn output_dir(&self, job: u64, spec: &JobSpec) -> PathBuf {
        let folder = PathBuf::from(&spec.checkpoint.folder);
        let base = if folder.is_absolute() {
            folder
        } else {
            self.data_dir.join(folder)
        };
        base.join(format!("job-{job}"))
    }
}

/// One run of a job handed to its workers.
#[derive(Clone, Copy)]
struct Assigned<'a> {
    job: u64,
    run: u64,
    first_step: u64,
    steps: u64,
    planned: f64,
    workers: &'a [WorkerInfo],
    reports: &'a std::sync::mpsc::Receiver<pb::StepReport>,
    /// Pieces per stage of this run (empty: the even split).
    stage_pieces: &'a [u32],
    /// What straggler detection needs; `None`: the run is not watched for stragglers.
    watch: Option<&'a Straggle>,
    /// Each worker's predicted peak activation bytes under this run's plan and split (empty
    /// when they cannot be predicted).
    predicted_peaks: &'a [u64],
    /// Where the job's checkpoints and final parameters go.
    output: &'a std::path::Path,
    /// The job's spec and the run's plan (memory pressure re-plans from them).
    spec: &'a JobSpec,
    plan: &'a JobPlan,
    /// Whether the run may stop to move layers or change the plan (fewer than
    /// [`MAX_REPLANS`] re-plans so far).
    may_move: bool,
}

/// What the runner watches a run's step times with: the cost of every piece (FLOPs, with
/// a floor), the stage → worker table and the split in use.
struct Straggle {
    piece_costs: Vec<f64>,
    worker_of: Vec<u32>,
    counts: Vec<u32>,
}

impl Straggle {
    /// Modelled work of every worker under the split in use.
    fn work(&self, workers: usize) -> Vec<f64> {
        let mut work = vec![0.0; workers];
        let mut next = 0usize;
        for (&w, &c) in self.worker_of.iter().zip(&self.counts) {
            let cost: f64 = self.piece_costs[next..next + c as usize].iter().sum();
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

/// How a run ended other than by finishing the job.
enum Ended {
    /// The job fails with this reason.
    Failed(String),
    /// A worker of the run is gone (the reason); every step before `through` completed.
    Lost { reason: String, through: u64 },
    /// The run stopped after step `through` (the reason) to go on with `to`.
    Move {
        reason: String,
        through: u64,
        to: Move,
    },
}

/// What a run that stopped between steps goes on with.
enum Move {
    /// A straggler's layers moved: the same plan on this split (pieces per stage).
    Split(Vec<u32>),
    /// Memory pressure: a plan predicted to fit, with the spec it was planned from (later
    /// re-plans keep its schedule and memory limit).
    Plan(Box<Fitting>),
    /// Workers joined a job that runs on fewer than its degree: the plan on more of them.
    Grow(Box<JobPlan>),
}

impl Move {
    /// The `pipewise_replans_total` reason.
    fn metric(&self) -> &'static str {
        match self {
            Move::Split(_) => "straggler",
            Move::Plan(..) => "memory_pressure",
            Move::Grow(_) => "worker_joined",
        }
    }
}

/// The step reports of a run, gathered per step. Each worker reports its steps in order
/// (though one worker's reports may run steps behind another's on the way), so a report of
/// a step before its worker's next one is a repeat (e.g. a retry of a report that did
/// arrive), and one past the run a stray: both are ignored rather than counted twice or
/// kept forever.
#[derive(Debug)]
struct StepReports {
    /// The step each worker's next report may be of.
    next: Vec<u64>,
    end: u64,
    /// The reports of steps not yet reported by every worker, by worker index.
    pending: BTreeMap<u64, Vec<Option<pb::StepReport>>>,
}

/// What became of a report given to [`StepReports::take`].
#[derive(Debug)]
enum Taken {
    /// Out of order, past the run, or from no worker of it (the report, given back).
    Ignored(Box<pb::StepReport>),
    /// Kept until every worker has reported its step.
    Pending,
    /// The last report of its step: every worker's, in worker order.
    Complete(Vec<pb::StepReport>),
}

impl StepReports {
    fn new(workers: usize, first_step: u64, end: u64) -> Self {
        StepReports {
            next: vec![first_step; workers],
            end,
            pending: BTreeMap::new(),
        }
    }

    /// Takes worker `w`'s report `r`.
    fn take(&mut self, w: usize, r: pb::StepReport) -> Taken {
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

impl JobRunner for ClusterRunner {
    fn run(
        &self,
        job: u64,
        spec: &JobSpec,
        plan: &JobPlan,
        start: Start,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
    ) -> Result<(), String> {
        let _span = tracing::info_span!("job", job).entered();
        let output = self.output_dir(job, spec);
        std::fs::create_dir_all(&output)
            .map_err(|e| format!("cannot create {}: {e}", output.display()))?;
        let mut plan = plan.clone();
        // The spec the runs follow: the job's, with the schedule a memory-pressure move
        // chose (a later loss or growth re-plans that schedule, not the one that overflowed).
        let mut current = spec.clone();
        let mut first_step = start.step;
        let mut stage_pieces = spec_split(&current, &plan);
        let mut replanned: Option<(String, std::sync::Arc<Schedule>)> = None;
        for replans in 0.. {
            let d = plan.schedule.num_workers();
            let Some(workers) = self.wait_for_workers(job, d, report, cancelled)? else {
                return Ok(());
            };
            if replans == 0 && start.restarts > 0 {
                // Workers may still run (and write checkpoints of) the earlier
                // coordinator's run until it tells them to abandon it.
                self.wait_until_left(None, job, &workers);
                let stages = plan.schedule.placement.stages();
                first_step = restart_step(&output, &current, start, stages);
                remove_after(&output, first_step)?;
                let reason = format!(
                    "the coordinator restarted; resuming from {}",
                    resumed_from(first_step)
                );
                tracing::warn!(job, "{reason}");
                tell(&mut replanned, reason, &plan);
            }
            // A plan predicted not to fit a worker's registered memory is moved before it
            // starts: a device would fail to allocate rather than report the overflow.
            if let Some((reason, fits)) = pressure(&current, &plan, &stage_pieces, None, &workers) {
                let reason = format!("{reason}; before step {}", first_step + 1);
                tracing::warn!(job, "{reason}");
                crate::metrics::record_replan("memory_pressure");
                plan = fits.adopt_into(&mut current);
                stage_pieces = spec_split(&current, &plan);
                tell(&mut replanned, reason, &plan);
            }
            // Run ids past any an earlier coordinator gave this job.
            let run = run_id(job, start.restarts * (MAX_REPLANS + 1) + replans);
            let (tx, rx) = std::sync::mpsc::channel::<pb::StepReport>();
            self.membership
                .cast(MembershipMsg::Attach(run, tx))
                .map_err(|e| format!("membership: {e}"))?;
            let straggle = straggle_of(spec, &plan, &stage_pieces);
            let predicted_peaks = predicted_peaks(&current, &plan, &stage_pieces);
            let assigned = Assigned {
                job,
                run,
                first_step,
                steps: u64::from(spec.training.steps),
                planned: planned_bubble(&plan, spec),
                predicted_peaks: &predicted_peaks,
                output: &output,
                workers: &workers,
                reports: &rx,
                stage_pieces: &stage_pieces,
                watch: straggle.as_ref(),
                spec: &current,
                plan: &plan,
                may_move: replans < MAX_REPLANS,
            };
            let outcome = self
                .assign(&assigned, spec, &plan, &output)
                .and_then(|()| self.follow(&assigned, report, cancelled, &mut replanned));
            let _ = self.membership.cast(MembershipMsg::Detach(run));
            let (lost, through) = match outcome {
                Ok(()) => return Ok(()),
                Err(Ended::Failed(reason)) => return Err(reason),
                Err(Ended::Lost { reason, through }) => (reason, through),
                Err(Ended::Move {
                    reason,
                    through,
                    to,
                }) => {
                    // The workers stopped after `through` steps and saved it when
                    // checkpoints are on (always, when stragglers are watched).
                    if cancelled.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    let stages = plan.schedule.placement.stages();
                    let resume = if complete(&output, through, stages) {
                        through
                    } else {
                        last_checkpoint(&output, spec, first_step, through, stages)
                    };
                    self.wait_until_left(Some(run), job, &workers);
                    remove_after(&output, resume)?;
                    let reason = format!("{reason}; resuming from {}", resumed_from(resume));
                    tracing::warn!(job, "{reason}");
                    crate::metrics::record_replan(to.metric());
                    match to {
                        Move::Split(counts) => stage_pieces = counts,
                        Move::Plan(fits) => {
                            plan = fits.adopt_into(&mut current);
                            stage_pieces = spec_split(&current, &plan);
                        }
                        Move::Grow(new_plan) => {
                            plan = *new_plan;
                            stage_pieces = spec_split(&current, &plan);
                        }
                    }
                    tell(&mut replanned, reason, &plan);
                    first_step = resume;
                    continue;
                }
            };
            let _ = self.abort(run, String::new());
            if cancelled.load(Ordering::SeqCst) {
                return Ok(());
            }
            if replans >= MAX_REPLANS {
                return Err(format!(
                    "{lost}; not re-planned: the job was re-planned {MAX_REPLANS} times already"
                ));
            }
            self.wait_until_left(Some(run), job, &workers);
            let stages = plan.schedule.placement.stages();
            let resume = last_checkpoint(&output, spec, first_step, through, stages);
            remove_after(&output, resume)?;
            let survivors = self.live()?.iter().filter(|w| w.streaming).count() as u32;
            let d2 = survivors.min(spec.parallelism.pipeline_parallel_degree);
            if d2 == 0 {
                return Err(format!("{lost}; no worker is left to re-plan onto"));
            }
            (current, plan) = replan_after_loss(current, spec, d2)
                .map_err(|e| format!("{lost}; re-planning onto {d2} workers failed: {e}"))?;
            let reason = format!(
                "{lost}; re-planned onto {d2} workers ({}, {} stages), resuming from {}",
                plan.kind.name(),
                plan.schedule.placement.stages(),
                resumed_from(resume)
            );
            tracing::warn!(job, "{reason}");
            crate::metrics::record_replan("worker_lost");
            tell(&mut replanned, reason, &plan);
            stage_pieces = spec_split(&current, &plan);
            first_step = resume;
        }
        Err("re-plans exhausted".into())
    }
}

/// The job's own layer split for `plan`'s stages (torchtitan's first / last stage less
/// layers; empty: the even split of the pieces), as [`replan`] checked it for a plan on
/// another worker count.
fn spec_split(spec: &JobSpec, plan: &JobPlan) -> Vec<u32> {
    let d = plan.schedule.num_workers();
    let respecced;
    let spec = if d == spec.parallelism.pipeline_parallel_degree {
        spec
    } else {
        respecced = respec(spec, d);
        &respecced
    };
    let p = &spec.parallelism;
    match p.stage_pieces(spec.model.layers, plan.schedule.placement.stages()) {
        Ok(split) => split.unwrap_or_default(),
        Err(e) => {
            // Every plan here came from a spec validated with the same split.
            tracing::warn!("the job's layer split does not apply, split evenly: {e}");
            Vec::new()
        }
    }
}

/// Makes `current` (the spec the runs follow) plan `schedule` at `limit` from now on, as a
/// memory-pressure move chose them on `d` workers: the limit, in units of `1/d` of the
/// model, is kept in units of `1/degree` as the spec's are; no blocks per stage pin the
/// stage count.
fn adopt(current: &mut JobSpec, schedule: String, limit: Option<f64>, d: u32) {
    let p = &mut current.parallelism;
    p.memory_limit = limit.map(|l| l * f64::from(p.pipeline_parallel_degree) / f64::from(d.max(1)));
    p.pipeline_parallel_schedule = schedule;
    unpin_stages(p);
}

/// Records a re-plan to `plan` for the next step event: after any earlier one no event has
/// carried yet (a run lost before its first step), so neither reason is lost.
fn tell(
    replanned: &mut Option<(String, std::sync::Arc<Schedule>)>,
    reason: String,
    plan: &JobPlan,
) {
    let reason = match replanned.take() {
        Some((earlier, _)) => format!("{earlier}; then {reason}"),
        None => reason,
    };
    *replanned = Some((reason, std::sync::Arc::new(plan.schedule.clone())));
}

/// Where a re-planned job resumes, in words.
fn resumed_from(step: u64) -> String {
    if step == 0 {
        "the start (no checkpoint)".into()
    } else {
        format!("the checkpoint of step {step}")
    }
}

/// After a loss: `current` (the spec the runs follow) planned for `d` workers, with the spec
/// it was planned from. When a memory-pressure move chose `current`'s schedule and limit
/// and the limit cannot be met on `d` workers, that schedule at its default limit, else
/// the job's own spec (the check before the run moves it again if it does not fit).
fn replan_after_loss(
    current: JobSpec,
    spec: &JobSpec,
    d: u32,
) -> pipewise_common::Result<(JobSpec, JobPlan)> {
    let first = match replan(&current, d) {
        Ok(plan) => return Ok((current, plan)),
        Err(e) if current == *spec => return Err(e),
        Err(e) => e,
    };
    let mut unlimited = current.clone();
    unlimited.parallelism.memory_limit = None;
    if let Ok(plan) = replan(&unlimited, d) {
        return Ok((unlimited, plan));
    }
    replan(spec, d)
        .map(|plan| (spec.clone(), plan))
        .map_err(|_| first)
}

/// `spec` planned for `d` workers (see [`respec`]).
fn replan(spec: &JobSpec, d: u32) -> pipewise_common::Result<JobPlan> {
    respec(spec, d).validate()
}

/// `spec` for `d` workers: its degree set to `d`, its memory limit (in units of
/// `1/degree` of the model) scaled to the same bytes, and no blocks per stage (that pins
/// the stage count, which changes with the workers).
fn respec(spec: &JobSpec, d: u32) -> JobSpec {
    let mut spec = spec.clone();
    let p = &mut spec.parallelism;
    p.memory_limit = p
        .memory_limit
        .map(|l| l * f64::from(d) / f64::from(p.pipeline_parallel_degree.max(1)));
    p.pipeline_parallel_degree = d;
    unpin_stages(p);
    spec
}

/// Drops blocks per stage (it pins the stage count) but keeps splitting the torchtitan way.
fn unpin_stages(p: &mut pipewise_common::job::Parallelism) {
    if p.pipeline_parallel_layers_per_stage.take().is_some() {
        p.torchtitan_split = true;
    }
}

/// The step a run that started at `first_step` and completed every step before `through`
/// resumes from: the last checkpoint step after `first_step` (every `checkpoint.interval`
/// steps, when checkpoints are on) whose directory holds all `stages` stage files, else
/// `first_step`.
fn last_checkpoint(
    output: &std::path::Path,
    spec: &JobSpec,
    first_step: u64,
    through: u64,
    stages: u32,
) -> u64 {
    if !spec.checkpoint.enable_checkpoint {
        return first_step;
    }
    let interval = u64::from(spec.checkpoint.interval.max(1));
    (first_step + 1..=through)
        .rev()
        .filter(|k| k % interval == 0)
        .find(|&k| complete(output, k, stages))
        .unwrap_or(first_step)
}

/// The job's latest complete checkpoint (0: none) once every worker has reported step
/// `reported` (1-based): a worker saves a step's checkpoint after reporting the step and
/// before reporting the next, so those of steps before `reported` are complete. With
/// `keep_latest_k` > 0 (at least 2: the store may still name the one before the latest),
/// removes those older than the latest K, on another thread. A failure to remove is logged,
/// not fatal.
fn settle_checkpoints(output: &std::path::Path, spec: &JobSpec, reported: u64) -> u64 {
    if !spec.checkpoint.enable_checkpoint {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(output) else {
        return 0;
    };
    let mut complete: Vec<(u64, std::path::PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let k = checkpoint_step(&e.file_name().to_string_lossy())?;
            (k < reported).then(|| (k, e.path()))
        })
        .collect();
    complete.sort_by_key(|c| std::cmp::Reverse(c.0));
    let latest = complete.first().map_or(0, |(k, _)| *k);
    let keep = spec.checkpoint.keep_latest_k as usize;
    let old: Vec<(u64, std::path::PathBuf)> = match keep {
        0 => Vec::new(),
        _ => complete.into_iter().skip(keep).collect(),
    };
    if !old.is_empty() {
        // Beside the run: a slow file system does not hold up its step reports.
        std::thread::spawn(move || {
            for (k, path) in old {
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!(
                        "cannot remove the checkpoint of step {k} ({}): {e}",
                        path.display()
                    );
                }
            }
        });
    }
    latest
}

/// Where a job resumed after a coordinator restart starts: the checkpoint the store named
/// (`start.step`) if its folder is there, else (a store from before it was kept, or a
/// folder changed by hand) the latest complete one on `stages` stages at most the steps the
/// store counted (`start.through`), else 0.
fn restart_step(output: &std::path::Path, spec: &JobSpec, start: Start, stages: u32) -> u64 {
    if start.step > 0 && checkpoint_dir(output, start.step).is_dir() {
        start.step
    } else {
        last_checkpoint(output, spec, 0, start.through, stages)
    }
}

/// Whether `step-K/` holds all `stages` stage files.
fn complete(output: &std::path::Path, k: u64, stages: u32) -> bool {
    (0..stages).all(|s| checkpoint_file(output, k, s).is_file())
}

/// How a run of `plan` on the split `stage_pieces` (empty: even) is watched for
/// stragglers: only real-compute jobs with checkpoints (layers move through one), and
/// only with more stages than one.
fn straggle_of(spec: &JobSpec, plan: &JobPlan, stage_pieces: &[u32]) -> Option<Straggle> {
    if spec.compute.is_emulated() || !spec.checkpoint.enable_checkpoint {
        return None;
    }
    let placement = &plan.schedule.placement;
    let stages = placement.stages();
    if placement.workers() < 2 {
        return None;
    }
    let model = &spec.model;
    let mbs = spec.parallelism.pipeline_parallel_microbatch_size;
    let block = model.piece_flops(pipewise_common::model::Piece::Block(0), mbs);
    // The embedding's FLOPs are next to nothing but its pass is not free.
    let piece_costs: Vec<f64> = model
        .pieces()
        .into_iter()
        .map(|p| model.piece_flops(p, mbs).max(0.05 * block))
        .collect();
    let counts = if stage_pieces.is_empty() {
        model
            .even_split(stages as usize)
            .ok()?
            .iter()
            .map(|r| r.len() as u32)
            .collect()
    } else {
        stage_pieces.to_vec()
    };
    Some(Straggle {
        piece_costs,
        worker_of: (0..stages).map(|s| placement.worker_of(s)).collect(),
        counts,
    })
}

/// Removes what an abandoned run wrote after step `resume`: later step directories and
/// `final/`.
fn remove_after(output: &std::path::Path, resume: u64) -> Result<(), String> {
    let entries = match std::fs::read_dir(output) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", output.display())),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let stale = name == "final" || checkpoint_step(&name).is_some_and(|k| k > resume);
        if stale {
            let path = entry.path();
            std::fs::remove_dir_all(&path)
                .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

impl ClusterRunner {
    /// Fails the job: its workers abandon it. Returns `reason` for the caller to return.
    fn abort(&self, job: u64, reason: String) -> String {
        let _ = self.membership.cast(MembershipMsg::Abort(job));
        reason
    }

    /// Sends every worker of the run its assignment.
    fn assign(
        &self,
        run: &Assigned<'_>,
        spec: &JobSpec,
        plan: &JobPlan,
        output: &std::path::Path,
    ) -> Result<(), Ended> {
        let schedule = &plan.schedule;
        let toml = spec.to_toml().map_err(|e| Ended::Failed(e.to_string()))?;
        let peers: HashMap<u32, String> = run
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (i as u32, w.address.clone()))
            .collect();
        for (i, w) in run.workers.iter().enumerate() {
            let assignment = pb::Assignment {
                job: run.run,
                first_step: run.first_step,
                end_step: run.steps,
                worker_index: i as u32,
                stages: schedule.placement.stages_of(i as u32),
                placement: Some((&schedule.placement).into()),
                model: Some((&spec.model).into()),
                program: program_to_proto(&schedule.workers[i]),
                peers: peers.clone(),
                microbatches: plan.microbatches,
                seed: spec.training.seed,
                microbatch_size: spec.parallelism.pipeline_parallel_microbatch_size,
                job_toml: toml.clone(),
                output_dir: output.display().to_string(),
                stage_count: schedule.placement.stages(),
                stage_pieces: run.stage_pieces.to_vec(),
            };
            let sent = self.runtime.block_on(async {
                ractor::call!(
                    self.membership,
                    MembershipMsg::Assign,
                    w.id.clone(),
                    Box::new(assignment)
                )
            });
            match sent {
                Ok(Ok(())) => {}
                // E.g. it registered again (a new process) since it was picked: as lost.
                Ok(Err(e)) => {
                    return Err(Ended::Lost {
                        reason: format!("worker {i} ({}) could not take its assignment: {e}", w.id),
                        through: run.first_step,
                    });
                }
                Err(e) => {
                    return Err(Ended::Failed(
                        self.abort(run.run, format!("membership: {e}")),
                    ));
                }
            }
        }
        tracing::info!(
            job = run.job,
            run = run.run,
            first_step = run.first_step,
            workers = ?run.workers.iter().map(|w| &w.id).collect::<Vec<_>>(),
            "assigned"
        );
        Ok(())
    }

    /// Waits (up to [`LEAVE_GRACE`]) until none of `workers` still says in its heartbeat
    /// that it runs the abandoned `run` (`None`: no live worker runs any run of `job`, an
    /// earlier coordinator's; a worker says which when it registers again).
    fn wait_until_left(&self, run: Option<u64>, job: u64, workers: &[WorkerInfo]) {
        let started = Instant::now();
        // `run`, or (None) any run of `job`.
        let running = |l: &WorkerInfo| match run {
            Some(run) => l.job == run,
            None => l.job != 0 && job_of(l.job) == job,
        };
        while started.elapsed() < LEAVE_GRACE {
            let Ok(live) = self.live() else { return };
            // An earlier coordinator's run may hold workers this run does not.
            let staying = live
                .iter()
                .any(|l| running(l) && (run.is_none() || workers.iter().any(|w| w.id == l.id)));
            if !staying {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        tracing::warn!(
            job,
            ?run,
            "survivors still run the abandoned run; handing out the next"
        );
    }

    /// The first worker of the run (by index) that is no longer live, as a reason.
    fn first_lost(&self, workers: &[WorkerInfo], done: &[bool]) -> Result<Option<String>, Ended> {
        let live = self.live().map_err(Ended::Failed)?;
        Ok(workers.iter().enumerate().find_map(|(i, w)| {
            if done[i] {
                return None;
            }
            match live.iter().find(|l| l.id == w.id) {
                None => Some(format!("worker {i} ({}) stopped heartbeating", w.id)),
                // A new process under its id (a restarted pod) holds none of the run.
                Some(l) if l.incarnation != w.incarnation => Some(format!(
                    "worker {i} ({}) restarted (registered again from {})",
                    w.id, l.address
                )),
                Some(_) => None,
            }
        }))
    }

    /// When more streaming workers are live than the `d` of the run (and the live count
    /// differs from `tried`), the plan of `spec` (the schedule the job follows) on
    /// min(live, degree) of them and why.
    fn grow(&self, spec: &JobSpec, d: usize, tried: &mut usize) -> Option<(String, JobPlan)> {
        let live = self.live().ok()?.iter().filter(|w| w.streaming).count();
        if live <= d || live == *tried {
            return None;
        }
        *tried = live;
        let d2 = (live as u32).min(spec.parallelism.pipeline_parallel_degree);
        match replan(spec, d2) {
            Ok(plan) => Some((
                format!(
                    "workers joined ({live} live); grew from {d} onto {d2} workers ({}, {} stages)",
                    plan.kind.name(),
                    plan.schedule.placement.stages()
                ),
                plan,
            )),
            Err(e) => {
                tracing::warn!("not growing onto {d2} workers: {e}");
                None
            }
        }
    }

    /// Collects the workers' reports until all are done, one fails or dies, or a cancel
    /// has run its course. `replanned` (why, and the new schedule) goes with the first event
    /// (it stays for the next run if none came).
    fn follow(
        &self,
        run: &Assigned<'_>,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
        replanned: &mut Option<(String, std::sync::Arc<Schedule>)>,
    ) -> Result<(), Ended> {
        let Assigned {
            job,
            run: run_id,
            first_step,
            steps,
            planned,
            predicted_peaks,
            output,
            workers,
            reports: rx,
            watch,
            spec,
            plan,
            may_move,
            stage_pieces,
            ..
        } = *run;
        let d = workers.len();
        let mut steps_in = StepReports::new(d, first_step, steps);
        let mut done = vec![false; d];
        let mut stop_asked: Option<Instant> = None;
        let mut last_check = Instant::now();
        let mut completed = 0u64;
        let lost = |reason: String, completed: u64| Ended::Lost {
            reason,
            through: first_step + completed,
        };
        // Relative slowness of every worker in the last steps, and a pending move.
        let mut history: Vec<Vec<f64>> = Vec::new();
        let mut moving: Option<(String, Move)> = None;
        // Memory pressure is answered once per run: when nothing fits, planning the
        // candidates again every step would not change that.
        let mut pressure_tried = false;
        // Its search for a plan that fits (up to a few dozen plans), beside the reports.
        let mut searching: Option<std::thread::JoinHandle<Option<(String, Fitting)>>> = None;
        // The live worker count a growth was last tried for (a plan that fails is not
        // tried again until the count changes).
        let mut grow_tried = d;
        while done.iter().any(|x| !x) {
            if searching.as_ref().is_some_and(|h| h.is_finished())
                && let Some((reason, fits)) = searching.take().and_then(|h| h.join().ok()).flatten()
                && moving.is_none()
                && stop_asked.is_none()
                && first_step + completed < steps
            {
                let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                moving = Some((reason, Move::Plan(Box::new(fits))));
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(r) => {
                    let i = r.worker_index as usize;
                    if i >= d || workers[i].id != r.worker_id {
                        tracing::warn!(job, worker = %r.worker_id, "report from a worker not in the job");
                        continue;
                    }
                    if !r.error.is_empty() {
                        let failure = format!(
                            "worker {i} ({}) failed at step {}: {}",
                            r.worker_id,
                            r.step.saturating_add(1),
                            r.error
                        );
                        // A vanished peer shows first as a failed send or receive: give
                        // its missing heartbeats the time to tell.
                        let started = Instant::now();
                        while started.elapsed() < LOST_GRACE {
                            if let Some(gone) = self.first_lost(workers, &done)? {
                                return Err(lost(format!("{gone} ({failure})"), completed));
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        return Err(Ended::Failed(self.abort(run_id, failure)));
                    }
                    if r.done {
                        done[i] = true;
                        continue;
                    }
                    // Each worker reports its steps in order: a repeat (e.g. a retry of a
                    // report that did arrive) or a step past the run is ignored (it would be
                    // counted twice or kept forever).
                    let step = r.step;
                    let reports = match steps_in.take(i, r) {
                        Taken::Ignored(r) => {
                            tracing::warn!(
                                job,
                                worker = %r.worker_id,
                                step,
                                "report of step {} ignored: out of order or past the run's {} \
                                 steps",
                                step.saturating_add(1),
                                steps
                            );
                            continue;
                        }
                        Taken::Pending => None,
                        Taken::Complete(reports) => Some(reports),
                    };
                    if let Some(reports) = reports {
                        let mut e = event(job, step, planned, predicted_peaks, &reports);
                        if let Some((reason, schedule)) = replanned.take() {
                            e.replan_reason = reason;
                            e.replanned = Some(schedule);
                        }
                        e.checkpoint = settle_checkpoints(output, spec, e.step);
                        report(Report::Step(Box::new(e)));
                        completed += 1;
                        let overflow = reports.iter().any(|r| {
                            workers.get(r.worker_index as usize).is_some_and(|w| {
                                w.memory_bytes > 0
                                    && r.peak_activation_bytes.saturating_add(r.static_bytes)
                                        > w.memory_bytes
                            })
                        });
                        if overflow
                            && may_move
                            && !pressure_tried
                            && moving.is_none()
                            && stop_asked.is_none()
                            && first_step + completed < steps
                        {
                            pressure_tried = true;
                            let (spec, plan) = (spec.clone(), plan.clone());
                            let (pieces, workers) = (stage_pieces.to_vec(), workers.to_vec());
                            let measured = reports.clone();
                            searching = Some(std::thread::spawn(move || {
                                pressure(&spec, &plan, &pieces, Some(&measured), &workers)
                            }));
                        }
                        if let Some(watch) = watch
                            && may_move
                            && moving.is_none()
                            && stop_asked.is_none()
                            && completed > 1
                            && let Some(found) = straggler(
                                watch,
                                &reports,
                                &mut history,
                                first_step + completed,
                                steps,
                                workers,
                            )
                        {
                            // Stop every worker after the same step (they save it), then
                            // the runner starts the next run on the new split.
                            let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                            moving = Some((found.0, Move::Split(found.1)));
                        }
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Ended::Failed(
                        self.abort(run_id, "the report channel closed".into()),
                    ));
                }
            }
            if cancelled.load(Ordering::SeqCst) {
                match stop_asked {
                    None => {
                        let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                        stop_asked = Some(Instant::now());
                    }
                    Some(at) if at.elapsed() > STOP_GRACE => {
                        let _ = self.abort(run_id, "cancelled".into());
                        return Ok(());
                    }
                    Some(_) => {}
                }
            }
            if last_check.elapsed() >= Duration::from_secs(1) {
                last_check = Instant::now();
                if let Some(gone) = self.first_lost(workers, &done)? {
                    return Err(lost(gone, completed));
                }
                // A job running on fewer workers than its degree (after a loss) grows back
                // when workers join: only with checkpoints (the stop saves the step the
                // next run starts from) and with steps left after the next one.
                if may_move
                    && moving.is_none()
                    && stop_asked.is_none()
                    && spec.checkpoint.enable_checkpoint
                    && completed > 0
                    && first_step + completed + 1 < steps
                    && (d as u32) < spec.parallelism.pipeline_parallel_degree
                    && let Some(found) = self.grow(spec, d, &mut grow_tried)
                {
                    let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                    moving = Some((found.0, Move::Grow(Box::new(found.1))));
                }
            }
        }
        if let Some((reason, to)) = moving
            && stop_asked.is_none()
            && first_step + completed < steps
        {
            return Err(Ended::Move {
                reason,
                through: first_step + completed,
                to,
            });
        }
        let expected = steps.saturating_sub(first_step);
        if completed < expected && stop_asked.is_none() {
            return Err(Ended::Failed(format!(
                "the workers stopped after {} of {steps} steps without being asked to",
                first_step + completed
            )));
        }
        Ok(())
    }
}

/// Adds one step's reports to `history` (every worker's time in passes per unit of
/// modelled work, over the median's) and returns the reason and the new split when a
/// worker has been a straggler for [`STRAGGLER_STEPS`] steps in a row and moving layers
/// off it is predicted to shorten the step by [`STRAGGLER_GAIN`] at least (and at least
/// two steps are left after `done`).
fn straggler(
    watch: &Straggle,
    reports: &[pb::StepReport],
    history: &mut Vec<Vec<f64>>,
    done: u64,
    steps: u64,
    workers: &[WorkerInfo],
) -> Option<(String, Vec<u32>)> {
    let d = workers.len();
    let work = watch.work(d);
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
    let counts = split_for_speeds(&watch.piece_costs, &watch.worker_of, &slowness).ok()?;
    let before = largest_worker_time(
        &watch.piece_costs,
        &watch.worker_of,
        &slowness,
        &watch.counts,
    );
    let after = largest_worker_time(&watch.piece_costs, &watch.worker_of, &slowness, &counts);
    if before < STRAGGLER_GAIN * after {
        return None;
    }
    Some((
        format!(
            "worker {slowest} ({}) took {:.1}× the median's time per unit of work over {} \
             steps; moved layers: pieces per stage {:?} → {:?} (predicted {:.0}% less time \
             on the busiest worker)",
            workers[slowest].id,
            slowness[slowest],
            STRAGGLER_STEPS,
            watch.counts,
            counts,
            100.0 * (1.0 - after / before)
        ),
        counts,
    ))
}

/// Schedules a job under memory pressure may move to (with the job's worker count).
pub const FITTING_KINDS: [&str; 9] = [
    "1f1b",
    "zb-h1",
    "zb-h2",
    "interleaved-1f1b",
    "v-min",
    "v-half",
    "v-zb",
    "adaptive-zb",
    "adaptive-v",
];

/// The job as planned for the run's worker count (after a loss it may be fewer than the
/// degree, without a stage count pinned by blocks per stage), and its layer ranges on the
/// split in use (`in_use`: pieces per stage, empty for the job's own split).
fn in_use_ranges(
    spec: &JobSpec,
    plan: &JobPlan,
    in_use: &[u32],
) -> Option<(JobSpec, Vec<std::ops::Range<usize>>)> {
    let spec = respec(spec, plan.schedule.num_workers());
    let ranges = if in_use.is_empty() {
        spec.stage_ranges(plan.schedule.placement.stages())
    } else {
        spec.model.split_by_counts(in_use)
    };
    let ranges = ranges.ok()?;
    Some((spec, ranges))
}

/// Every worker's predicted peak activation bytes under `plan` on the split in use (empty
/// when they cannot be predicted).
fn predicted_peaks(spec: &JobSpec, plan: &JobPlan, in_use: &[u32]) -> Vec<u64> {
    in_use_ranges(spec, plan, in_use)
        .and_then(|(spec, ranges)| plan.predicted_peak_bytes_over(&spec, &ranges).ok())
        .unwrap_or_default()
}

/// When a worker with a registered memory size held more than it (its step's peak
/// activations plus its parameters, gradients and optimizer state, in `measured`; without
/// reports: is predicted to hold more, before a run starts), the reason and the fastest
/// plan (simulated under the job's planning times) predicted to fit every worker
/// that registered one, holding less on the overflowing worker than the plan in use;
/// `None` if nothing overflowed or nothing fits.
fn pressure(
    spec: &JobSpec,
    plan: &JobPlan,
    in_use: &[u32],
    measured: Option<&[pb::StepReport]>,
    workers: &[WorkerInfo],
) -> Option<(String, Fitting)> {
    // The plan in use on the split in use (a straggler move's), the candidates on the
    // job's split (a move goes back to it).
    let (spec, ranges) = in_use_ranges(spec, plan, in_use)?;
    let spec = &spec;
    let predicted = |p: &JobPlan| p.predicted_bytes(spec).ok();
    let now = plan.predicted_bytes_over(spec, &ranges).ok()?;
    let over_budget = |w: usize, need: u64| {
        workers
            .get(w)
            .is_some_and(|w| w.memory_bytes > 0 && need > w.memory_bytes)
    };
    let (over, need, held) = match measured {
        Some(reports) => reports.iter().find_map(|r| {
            let need = r.peak_activation_bytes.saturating_add(r.static_bytes);
            let w = r.worker_index as usize;
            over_budget(w, need).then_some((w, need, "held"))
        })?,
        None => (0..now.len())
            .find_map(|w| over_budget(w, now[w]).then_some((w, now[w], "is predicted to hold")))?,
    };
    // A candidate spec's plan, when it fits every worker that registered a size and holds
    // less on the overflowing one.
    let assess = |candidate: &JobSpec| -> Assessed {
        let Ok(p) = candidate.validate() else {
            return Assessed::Unplannable;
        };
        let Some(bytes) = predicted(&p) else {
            return Assessed::Unplannable;
        };
        let fits = bytes
            .iter()
            .zip(workers)
            .all(|(b, w)| w.memory_bytes == 0 || *b <= w.memory_bytes);
        if !fits || bytes[over] >= now[over] {
            return Assessed::TooBig;
        }
        match Costs::uniform(&p.schedule.placement, candidate.planning_times())
            .and_then(|c| simulate(&p.schedule, &c))
        {
            Ok(sim) => Assessed::Fits(Box::new(Fitting {
                makespan: sim.makespan,
                spec: candidate.clone(),
                plan: p,
                bytes,
            })),
            Err(_) => Assessed::Unplannable,
        }
    };
    let mut best: Option<Fitting> = None;
    for kind in FITTING_KINDS {
        let mut candidate = spec.clone();
        candidate.parallelism.pipeline_parallel_schedule = kind.into();
        candidate.parallelism.memory_limit = None;
        let found = match assess(&candidate) {
            Assessed::Fits(found) => Some(*found),
            // An adaptive schedule planned to a limit that fits the bytes left.
            Assessed::TooBig if kind.starts_with("adaptive") => fit_limit(&candidate, &assess),
            Assessed::TooBig | Assessed::Unplannable => None,
        };
        if let Some(found) = found
            && best.as_ref().is_none_or(|b| found.makespan < b.makespan)
        {
            best = Some(found);
        }
    }
    let best = best?;
    let limit = best
        .spec
        .parallelism
        .memory_limit
        .map(|l| format!(" at a limit of {l:.2} units"))
        .unwrap_or_default();
    Some((
        format!(
            "worker {over} ({}) {held} {} of its {} ({} planned); moved to {}{limit}, \
             predicted {} there",
            workers[over].id,
            fmt_bytes(need as f64),
            fmt_bytes(workers[over].memory_bytes as f64),
            plan.kind.name(),
            best.plan.kind.name(),
            fmt_bytes(best.bytes[over] as f64)
        ),
        best,
    ))
}

/// A plan memory pressure may move to.
struct Fitting {
    /// Simulated under the job's planning times.
    makespan: f64,
    /// The spec it was planned from (its schedule and memory limit).
    spec: JobSpec,
    plan: JobPlan,
    /// Predicted bytes per worker (activations and training state).
    bytes: Vec<u64>,
}

impl Fitting {
    /// Makes `current` (the spec the runs follow) plan this schedule and memory limit from
    /// now on ([`adopt`]); the plan.
    fn adopt_into(self, current: &mut JobSpec) -> JobPlan {
        let p = self.spec.parallelism;
        let d = self.plan.schedule.num_workers();
        adopt(current, p.pipeline_parallel_schedule, p.memory_limit, d);
        self.plan
    }
}

/// What a candidate spec of a memory-pressure move comes to.
enum Assessed {
    /// It plans, fits every worker and holds less on the overflowing one.
    Fits(Box<Fitting>),
    /// Its plan holds too much somewhere.
    TooBig,
    /// It does not plan: e.g. an adaptive limit below the smallest feasible one.
    Unplannable,
}

/// Plans of an adaptive schedule at its default limit (1F1B's peak) do not fit: the
/// fastest plan that does among [`FIT_STEPS`] limits bisected below it (a limit the
/// planner cannot meet moves up, one whose plan does not fit moves down).
fn fit_limit(candidate: &JobSpec, assess: &dyn Fn(&JobSpec) -> Assessed) -> Option<Fitting> {
    let (mut lo, mut hi) = (
        0.0,
        f64::from(candidate.parallelism.pipeline_parallel_degree),
    );
    let mut best: Option<Fitting> = None;
    for _ in 0..FIT_STEPS {
        let mid = 0.5 * (lo + hi);
        let mut c = candidate.clone();
        c.parallelism.memory_limit = Some(mid);
        match assess(&c) {
            Assessed::Fits(found) => {
                lo = mid;
                if best.as_ref().is_none_or(|b| found.makespan < b.makespan) {
                    best = Some(*found);
                }
            }
            Assessed::Unplannable => lo = mid,
            Assessed::TooBig => hi = mid,
        }
    }
    best
}

/// How many limits [`fit_limit`] tries (the last step is 1/64 of 1F1B's peak).
const FIT_STEPS: usize = 6;

/// One step's event from every worker's report.
fn event(
    job: u64,
    step: u64,
    planned: f64,
    predicted_peaks: &[u64],
    reports: &[pb::StepReport],
) -> StepEventData {
    let wall = reports.iter().map(|r| r.wall_secs).fold(0.0, f64::max);
    let busy: f64 = reports.iter().map(|r| r.busy_secs).sum();
    let loss = reports
        .iter()
        .map(|r| r.loss)
        .find(|l| !l.is_nan())
        .unwrap_or(f64::NAN);
    StepEventData {
        job,
        step: step + 1,
        loss,
        step_time_ms: wall * 1e3,
        planned_bubble: planned,
        measured_bubble: if wall > 0.0 {
            1.0 - busy / (reports.len() as f64 * wall)
        } else {
            0.0
        },
        peaks: reports
            .iter()
            .map(|r| (r.worker_index, r.peak_activation_bytes))
            .collect(),
        worker_bubbles: reports
            .iter()
            .map(|r| {
                (
                    r.worker_index,
                    1.0 - r.busy_secs / wall.max(f64::MIN_POSITIVE),
                )
            })
            .collect(),
        predicted_peaks: predicted_peaks.to_vec(),
        checkpoint: 0,
        replan_reason: String::new(),
        replanned: None,
        trace: step_trace(job, step, reports),
    }
}

/// The step's executed timeline from every worker's spans (`None`, with a warning, when a
/// report carries none or a malformed one).
fn step_trace(
    job: u64,
    step: u64,
    reports: &[pb::StepReport],
) -> Option<std::sync::Arc<pipewise_common::trace::StepTrace>> {
    let mut workers = vec![Vec::new(); reports.len()];
    for r in reports {
        let slot = workers.get_mut(r.worker_index as usize)?;
        if r.spans.is_empty() {
            return None;
        }
        for span in &r.spans {
            match pipewise_common::trace::Span::try_from(*span) {
                Ok(s) => slot.push(s),
                Err(e) => {
                    tracing::warn!(job, step, worker = r.worker_index, "bad trace span: {e}");
                    return None;
                }
            }
        }
    }
    Some(std::sync::Arc::new(pipewise_common::trace::StepTrace {
        job,
        step: step + 1,
        workers,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pipewise_common::job::example;

    /// Live workers that registered these memory sizes.
    fn registered(memory: impl Iterator<Item = u64>) -> Vec<WorkerInfo> {
        memory
            .enumerate()
            .map(|(i, memory_bytes)| WorkerInfo {
                id: format!("w{i}"),
                address: String::new(),
                device_kind: "cpu".into(),
                memory_bytes,
                last_seen: tokio::time::Instant::now(),
                current_activation_bytes: 0,
                peak_activation_bytes: 0,
                step: 0,
                streaming: true,
                job: 0,
                incarnation: i as u64 + 1,
            })
            .collect()
    }

    /// A step's reports in which worker 0 held `peak` bytes of activations.
    fn overflow_on_worker_0(peak: u64) -> Vec<pb::StepReport> {
        vec![pb::StepReport {
            worker_index: 0,
            peak_activation_bytes: peak,
            ..Default::default()
        }]
    }

    fn touch(path: &std::path::Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    /// The resume step is the last checkpoint with every stage's file; later directories
    /// and `final/` go.
    #[test]
    fn resumes_from_the_last_complete_checkpoint() {
        let out = std::env::temp_dir().join(format!("pipewise-resume-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut spec = example(2, "1f1b");
        spec.checkpoint.enable_checkpoint = true;
        spec.checkpoint.interval = 2;
        for k in [2, 4, 6] {
            for s in 0..4 {
                // Step 6 lost stage 3's file (the run died while writing it).
                if (k, s) != (6, 3) {
                    touch(&out.join(format!("step-{k}/stage-{s}.safetensors")));
                }
            }
        }
        touch(&out.join("final/worker-0.safetensors"));
        // Steps before 7 completed: 6 is incomplete, so 4.
        assert_eq!(last_checkpoint(&out, &spec, 0, 7, 4), 4);
        // Only steps before 3 completed: 4 is not trusted even though its files exist.
        assert_eq!(last_checkpoint(&out, &spec, 0, 3, 4), 2);
        // Nothing after the run's own start: it starts there again.
        assert_eq!(last_checkpoint(&out, &spec, 4, 5, 4), 4);
        // More stages than the files: none complete.
        assert_eq!(last_checkpoint(&out, &spec, 0, 7, 5), 0);
        spec.checkpoint.enable_checkpoint = false;
        assert_eq!(last_checkpoint(&out, &spec, 0, 7, 4), 0);
        remove_after(&out, 4).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(left, ["step-2", "step-4"]);
        std::fs::remove_dir_all(&out).unwrap();
    }

    /// After a coordinator restart: the checkpoint the store names if it is there, else the
    /// latest complete one up to the steps the store counted (a store from before names
    /// none), else the start.
    #[test]
    fn a_restart_resumes_from_the_named_or_the_latest_complete_checkpoint() {
        let out = std::env::temp_dir().join(format!("pipewise-restart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut spec = example(2, "1f1b");
        spec.checkpoint.enable_checkpoint = true;
        spec.checkpoint.interval = 3;
        for k in [3, 6, 9] {
            // Step 9 lost stage 1's file.
            for s in 0..if k == 9 { 1 } else { 2 } {
                touch(&out.join(format!("step-{k}/stage-{s}.safetensors")));
            }
        }
        let at = |step, through| Start {
            step,
            restarts: 1,
            through,
        };
        assert_eq!(restart_step(&out, &spec, at(3, 10), 2), 3);
        assert_eq!(restart_step(&out, &spec, at(0, 10), 2), 6);
        assert_eq!(restart_step(&out, &spec, at(12, 10), 2), 6);
        assert_eq!(restart_step(&out, &spec, at(0, 5), 2), 3);
        assert_eq!(restart_step(&out, &spec, at(0, 2), 2), 0);
        std::fs::remove_dir_all(&out).unwrap();
    }

    /// Once step `reported` is reported, the checkpoints before it are complete: the latest
    /// is named, and with `keep_latest_k` only the latest K of them stay (a newer one being
    /// written is left alone); 0 keeps them all.
    #[test]
    fn settling_keeps_the_latest_k_complete_checkpoints() {
        let out = std::env::temp_dir().join(format!("pipewise-keep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let mut spec = example(2, "1f1b");
        spec.checkpoint.enable_checkpoint = true;
        spec.checkpoint.interval = 3;
        // The steps left: `expected` once the removals (beside the caller) are done, or
        // whatever is there after 5 s.
        let steps = |out: &std::path::Path, expected: &[u64]| -> Vec<u64> {
            let started = std::time::Instant::now();
            loop {
                let mut k: Vec<u64> = std::fs::read_dir(out)
                    .unwrap()
                    .filter_map(|e| checkpoint_step(&e.unwrap().file_name().to_string_lossy()))
                    .collect();
                k.sort_unstable();
                if k == expected || started.elapsed() > Duration::from_secs(5) {
                    return k;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        for k in [3, 6, 9, 12] {
            touch(&out.join(format!("step-{k}/stage-0.safetensors")));
        }
        spec.checkpoint.keep_latest_k = 0;
        assert_eq!(settle_checkpoints(&out, &spec, 10), 9);
        assert_eq!(steps(&out, &[3, 6, 9, 12]), [3, 6, 9, 12]);
        spec.checkpoint.keep_latest_k = 2;
        // Step 12 may still be written when step 10 is reported.
        assert_eq!(settle_checkpoints(&out, &spec, 10), 9);
        assert_eq!(steps(&out, &[6, 9, 12]), [6, 9, 12]);
        assert_eq!(settle_checkpoints(&out, &spec, 13), 12);
        assert_eq!(steps(&out, &[9, 12]), [9, 12]);
        spec.checkpoint.enable_checkpoint = false;
        assert_eq!(settle_checkpoints(&out, &spec, 13), 0);
        std::fs::remove_dir_all(&out).unwrap();
    }

    /// Re-planning keeps the memory limit's bytes: units of `1/d` of the model scale by
    /// `d' / d`.
    #[test]
    fn replanning_scales_the_memory_limit() {
        let mut spec = example(4, "adaptive-v");
        spec.parallelism.memory_limit = Some(3.0);
        let plan = replan(&spec, 2).unwrap();
        assert_eq!(plan.schedule.num_workers(), 2);
        let on_two = |limit: f64| {
            let mut two = spec.clone();
            two.parallelism.pipeline_parallel_degree = 2;
            two.parallelism.memory_limit = Some(limit);
            two.validate().unwrap().schedule
        };
        assert_eq!(plan.schedule, on_two(1.5));
        // Not vacuous: the unscaled limit plans another schedule.
        assert_ne!(plan.schedule, on_two(3.0));
    }

    #[test]
    fn reports_are_taken_in_order_per_worker() {
        let r = |step: u64| pb::StepReport {
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

    /// Memory pressure predicts with the job's layer split and may move to a schedule with
    /// another stage count even when blocks per stage pinned the first one.
    #[test]
    fn pressure_follows_the_layer_split() {
        let mut spec = example(4, "gpipe");
        spec.model.layers = 10;
        spec.parallelism.pipeline_parallel_first_stage_less_layers = 2;
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(3);
        let plan = spec.validate().unwrap();
        let mut even = spec.clone();
        even.parallelism.pipeline_parallel_first_stage_less_layers = 0;
        even.parallelism.pipeline_parallel_layers_per_stage = None;
        // Worker 0 holds one block and the embedding, not three pieces.
        let state = |s: &JobSpec| {
            plan.predicted_state_bytes_over(s, &s.stage_ranges(4).unwrap())
                .unwrap()
        };
        let split = state(&spec);
        assert!(split[0] < state(&even)[0], "{split:?}");
        let need = |kind: &str| -> Vec<u64> {
            let mut c = respec(&spec, 4);
            c.parallelism.pipeline_parallel_schedule = kind.into();
            c.validate().unwrap().predicted_bytes(&c).unwrap()
        };
        let (gpipe, v_half, one_f_one_b) = (need("gpipe"), need("v-half"), need("1f1b"));
        // Every worker has exactly V-Half's need: 1F1B does not fit worker 0, GPipe
        // overflowed it.
        assert!(gpipe[0] > v_half[0] && one_f_one_b[0] > v_half[0]);
        let workers = registered(v_half.iter().copied());
        let reports = overflow_on_worker_0(gpipe[0]);
        let (reason, fits) = pressure(&spec, &plan, &[], Some(&reports), &workers).unwrap();
        assert!(reason.contains("worker 0 (w0) held"), "{reason}");
        // Before a run, from the plan's prediction alone: the same move.
        let (ahead, same) = pressure(&spec, &plan, &[], None, &workers).unwrap();
        assert!(
            ahead.contains("worker 0 (w0) is predicted to hold"),
            "{ahead}"
        );
        assert_eq!(same.plan.schedule, fits.plan.schedule);
        // A plan predicted to fit is left alone.
        assert!(pressure(&spec, &fits.plan, &[], None, &workers).is_none());
        // V-Half's class: two stages per worker, not the four stages the spec pinned.
        assert_eq!(fits.plan.schedule.placement.stages(), 8, "{reason}");
        let moved = &fits.spec;
        assert_eq!(moved.validate().unwrap().schedule, fits.plan.schedule);
        let bytes = fits.plan.predicted_bytes(moved).unwrap();
        for (w, worker) in workers.iter().enumerate() {
            assert!(bytes[w] <= worker.memory_bytes, "{reason}");
        }
    }

    /// Memory pressure plans the adaptive schedules to the bytes the workers have: with
    /// worker 0 between V-Half's need and adaptive-v's at its default limit (1F1B's peak),
    /// adaptive-v at a limit between the two is faster than V-Half.
    #[test]
    fn pressure_plans_adaptive_schedules_to_the_bytes_left() {
        let mut spec = example(4, "gpipe");
        spec.model.layers = 14;
        spec.training.global_batch_size = 16;
        let plan = spec.validate().unwrap();
        let planned = |kind: &str| -> (Vec<u64>, f64) {
            let mut c = spec.clone();
            c.parallelism.pipeline_parallel_schedule = kind.into();
            let p = c.validate().unwrap();
            let sim = simulate(
                &p.schedule,
                &Costs::uniform(&p.schedule.placement, c.planning_times()).unwrap(),
            )
            .unwrap();
            (p.predicted_bytes(&c).unwrap(), sim.makespan)
        };
        let (gpipe, _) = planned("gpipe");
        let (v_half, v_half_makespan) = planned("v-half");
        let (one_f_one_b, _) = planned("1f1b");
        let (adaptive, _) = planned("adaptive-v");
        // Worker 0 between V-Half's need and adaptive-v's at its default limit; the
        // others hold any of them.
        let workers = registered((0..4).map(|i| {
            if i == 0 {
                (v_half[0] + adaptive[0]) / 2
            } else {
                v_half[i].max(adaptive[i]).max(one_f_one_b[i])
            }
        }));
        // Neither 1F1B nor adaptive-v at its default limit fits worker 0.
        assert!(adaptive[0] > workers[0].memory_bytes);
        assert!(one_f_one_b[0] > workers[0].memory_bytes);
        let reports = overflow_on_worker_0(gpipe[0]);
        let (reason, fits) = pressure(&spec, &plan, &[], Some(&reports), &workers).unwrap();
        println!(
            "{reason}; makespan {} against v-half's {v_half_makespan}",
            fits.makespan
        );
        assert_eq!(fits.plan.kind.name(), "adaptive-v", "{reason}");
        let limit = fits.spec.parallelism.memory_limit.unwrap();
        // Below the default of 4 units, which does not fit.
        assert!(limit < 4.0, "{reason}");
        assert!(fits.makespan < v_half_makespan, "{reason}");
        for (b, w) in fits.bytes.iter().zip(&workers) {
            assert!(*b <= w.memory_bytes, "{reason}");
        }
    }

    /// The plan in use is judged on the split in use: layers a straggler move put on
    /// worker 0 can overflow it where the job's split would not.
    #[test]
    fn pressure_judges_the_split_in_use() {
        let mut spec = example(2, "1f1b");
        spec.training.global_batch_size = 16;
        let plan = spec.validate().unwrap();
        let total = |ranges: &[std::ops::Range<usize>]| -> u64 {
            plan.predicted_bytes_over(&spec, ranges).unwrap()[0]
        };
        let moved = [8u32, 2];
        let even = total(&spec.stage_ranges(2).unwrap());
        let heavy = total(&spec.model.split_by_counts(&moved).unwrap());
        assert!(heavy > even, "{heavy} {even}");
        let workers = registered([(even + heavy) / 2, u64::MAX / 4].into_iter());
        assert!(pressure(&spec, &plan, &[], None, &workers).is_none());
        let (reason, fits) = pressure(&spec, &plan, &moved, None, &workers).unwrap();
        assert!(reason.contains("is predicted to hold"), "{reason}");
        assert!(fits.bytes[0] <= workers[0].memory_bytes, "{reason}");
        // One range for two stages.
        let whole = spec.model.split_by_counts(&[10]).unwrap();
        assert!(plan.predicted_peak_bytes_over(&spec, &whole).is_err());
    }

    /// The peaks a run's steps report as predicted (and the metrics show) are those of its
    /// plan on its split: a straggler move's split, or a re-plan's fewer workers.
    #[test]
    fn predicted_peaks_follow_the_run() {
        let mut spec = example(2, "1f1b");
        spec.training.global_batch_size = 16;
        let plan = spec.validate().unwrap();
        let even = predicted_peaks(&spec, &plan, &[]);
        assert_eq!(even, plan.predicted_peak_bytes(&spec).unwrap());
        let moved = predicted_peaks(&spec, &plan, &[8, 2]);
        assert_eq!(moved.len(), 2);
        assert!(moved[0] > even[0], "{moved:?} {even:?}");
        let (on_one, one) = replan_after_loss(spec.clone(), &spec, 1).unwrap();
        let alone = predicted_peaks(&on_one, &one, &[]);
        assert_eq!(alone.len(), 1);
        assert!(alone[0] > even[0], "{alone:?} {even:?}");
        // One range for two stages cannot be predicted.
        assert!(predicted_peaks(&spec, &plan, &[10]).is_empty());
    }

    /// torchtitan's first / last stage less layers survive a re-plan onto other workers,
    /// blocks per stage (which pins the stage count) included in the spec or not.
    #[test]
    fn the_layer_split_survives_a_replan() {
        let mut spec = example(4, "1f1b");
        spec.model.layers = 10;
        spec.parallelism.pipeline_parallel_first_stage_less_layers = 2;
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(3);
        let plan = spec.validate().unwrap();
        // 10 blocks + 2 slots, 3 per stage: the first holds 1 block and the embedding.
        assert_eq!(spec_split(&spec, &plan), vec![2, 3, 3, 4]);
        let on_two = replan(&spec, 2).unwrap();
        // 12 slots, 6 per stage.
        assert_eq!(spec_split(&spec, &on_two), vec![5, 7]);
    }

    /// Blocks per stage alone asks for torchtitan's split (blocks evenly, the embedding and
    /// the head added to the end stages), which differs from the even split of the pieces;
    /// a re-planned or pressure-checked spec keeps it.
    #[test]
    fn blocks_per_stage_alone_keeps_the_torchtitan_split() {
        let mut spec = example(4, "1f1b");
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(2);
        let plan = spec.validate().unwrap();
        assert_eq!(spec_split(&spec, &plan), vec![3, 2, 2, 3]);
        assert_eq!(
            spec.model.even_split(4).unwrap(),
            vec![0..3, 3..6, 6..8, 8..10]
        );
        let same = respec(&spec, 4);
        assert_eq!(same.parallelism.pipeline_parallel_layers_per_stage, None);
        assert_eq!(same.stage_ranges(4).unwrap(), spec.stage_ranges(4).unwrap());
        assert_eq!(spec_split(&same, &plan), vec![3, 2, 2, 3]);
        let mut moved = spec.clone();
        adopt(&mut moved, "v-half".into(), None, 4);
        let v_half = moved.validate().unwrap();
        // 8 blocks in 8 stages, the embedding and the head at the ends.
        assert_eq!(spec_split(&moved, &v_half), vec![2, 1, 1, 1, 1, 1, 1, 2]);
    }

    /// A loss after a memory-pressure move to an adaptive limit that cannot be met on the
    /// survivors re-plans that schedule at its default limit; the job's own limit is not
    /// dropped that way.
    #[test]
    fn a_loss_after_a_pressure_move_falls_back_to_a_plannable_limit() {
        let spec = example(4, "1f1b");
        let at = |limit: f64| {
            let mut c = spec.clone();
            adopt(&mut c, "adaptive-v".into(), Some(limit), 4);
            c
        };
        let limit = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
            .into_iter()
            .find(|&l| replan(&at(l), 4).is_ok() && replan(&at(l), 2).is_err())
            .expect("a limit met on 4 workers, not on 2");
        let (used, plan) = replan_after_loss(at(limit), &spec, 2).unwrap();
        assert_eq!(plan.kind.name(), "adaptive-v");
        assert_eq!(used.parallelism.memory_limit, None);
        assert_eq!(plan.schedule.num_workers(), 2);
        // The job's own limit: the loss fails the job as before.
        let own = at(limit);
        assert!(replan_after_loss(own.clone(), &own, 2).is_err());
    }
}
