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

mod checkpoints;
mod follow;
mod step_event;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pipewise_common::Schedule;
use pipewise_common::job::{JobPlan, JobSpec, run_id};
use pipewise_proto::v1 as pb;
use ractor::ActorRef;

use crate::driver::JobRunner;
use crate::error::{CoordinatorError, Result};
use crate::events::{Report, Start};
use crate::membership::{HEARTBEAT_INTERVAL, MISSED_HEARTBEATS, MembershipMsg, WorkerInfo};
use checkpoints::{read, remove_after};
use pipewise_common::run::pressure::{Fitting, predicted_peaks, pressure};
use pipewise_common::run::respec::{replan_after_loss, spec_split};
use pipewise_common::run::straggler::{Straggle, straggle_of};
use pipewise_common::run::{Failure, Worker};

pub use pipewise_common::run::pressure::FITTING_KINDS;
pub use pipewise_common::run::straggler::{STRAGGLER_GAIN, STRAGGLER_RATIO, STRAGGLER_STEPS};
pub use step_event::planned_bubble;

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
    fn live(&self) -> Result<Vec<WorkerInfo>> {
        self.runtime
            .block_on(async { ractor::call!(self.membership, MembershipMsg::Live) })
            .map_err(CoordinatorError::from)
    }

    /// Waits for `d` live, streaming workers; `None` if cancelled first. While it waits, the
    /// job's status says so (`report`), and the log every 10 s.
    fn wait_for_workers(
        &self,
        job: u64,
        d: u32,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
    ) -> Result<Option<Vec<WorkerInfo>>> {
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
    /// The same workers as the policies see them.
    members: &'a [Worker],
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

/// How a run ended other than by finishing the job.
enum Ended {
    /// The job fails.
    Failed(CoordinatorError),
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

impl JobRunner for ClusterRunner {
    fn run(
        &self,
        job: u64,
        spec: &JobSpec,
        plan: &JobPlan,
        start: Start,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
    ) -> Result<()> {
        let _span = tracing::info_span!("job", job).entered();
        let output = self.output_dir(job, spec);
        std::fs::create_dir_all(&output).map_err(|source| CoordinatorError::Checkpoints {
            action: "create",
            path: output.clone(),
            source,
        })?;
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
                first_step = read(&output)?.restart_step(&current, start, stages);
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
            let members: Vec<Worker> = workers.iter().map(WorkerInfo::worker).collect();
            if let Some((reason, fits)) = pressure(&current, &plan, &stage_pieces, None, &members) {
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
                .map_err(CoordinatorError::from)?;
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
                members: &members,
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
                Err(Ended::Failed(e)) => return Err(e),
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
                    let saved = read(&output)?;
                    let resume = if saved.complete(through, stages) {
                        through
                    } else {
                        saved.last_complete(spec, first_step, through, stages)
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
            self.abort(run, ());
            if cancelled.load(Ordering::SeqCst) {
                return Ok(());
            }
            if replans >= MAX_REPLANS {
                return Err(Failure::Replans {
                    lost,
                    max: MAX_REPLANS,
                }
                .into());
            }
            self.wait_until_left(Some(run), job, &workers);
            let stages = plan.schedule.placement.stages();
            let resume = read(&output)?.last_complete(spec, first_step, through, stages);
            remove_after(&output, resume)?;
            let survivors = self.live()?.iter().filter(|w| w.streaming).count() as u32;
            let d2 = survivors.min(spec.parallelism.pipeline_parallel_degree);
            if d2 == 0 {
                return Err(Failure::NoSurvivors { lost }.into());
            }
            (current, plan) = match replan_after_loss(current, spec, d2) {
                Ok(planned) => planned,
                Err(error) => {
                    return Err(Failure::Replan {
                        lost,
                        workers: d2,
                        error,
                    }
                    .into());
                }
            };
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
        unreachable!("every run ends the job or starts another")
    }
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
