//! The job manager actor: accepts, queues, lists and cancels jobs, keeps every job in the
//! durable store, starts them, and fans step events out to watchers. On a cluster, jobs run
//! side by side on disjoint workers (each claims its own, [`crate::membership`]), started
//! in queue order, all of a job's workers or none, with EASY backfill on predicted run
//! times ([`start_next`], [`queue::admit`]); an in-process runner runs one job at a time.
//! A job gets its id and its place in the queue when its plan is ready, and plans run side
//! by side ([`crate::planner`]), so a job with a quick plan can overtake one submitted
//! before it with a slow plan. After a restart of the coordinator, the jobs it had
//! queued or running are planned again from their stored specs and queued in id order; a
//! running one resumes from its last complete checkpoint ([`Start`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use pipewise_common::job::{JobPlan, JobSpec, checkpoint_name, checkpoint_step};
use pipewise_common::run::queue;
use pipewise_common::run::registry::Pool;
use pipewise_common::run::supervisor::Input;
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::broadcast;

use crate::checkpoints::create_output_dir;
use crate::driver::{DriverArgs, JobRunner};
use crate::error::{CoordinatorError, Result};
use crate::events::{Start, StepEventData};
pub use crate::job_msg::{JobMsg, Watch};
use crate::membership::MembershipMsg;
use crate::planner::PlannerMsg;
use crate::run::{RunActor, RunArgs};
use crate::run_msg::RunMsg;
use crate::store::{JobRecord, JobState, JobStore};
use crate::traces::TraceStore;

/// The job manager.
pub struct JobManager;

/// What the job manager starts with.
pub struct JobManagerArgs {
    /// The durable store.
    pub store: JobStore,
    /// The planner.
    pub planner: ActorRef<PlannerMsg>,
    /// Who runs jobs; `None`: jobs wait in the queue (no embedded workers).
    pub runner: Option<Runner>,
    /// What becomes of the jobs the store holds as queued or running (a coordinator that
    /// stopped under them).
    pub unfinished: Unfinished,
}

/// Who runs a coordinator's jobs.
#[derive(Clone)]
pub enum Runner {
    /// A [`JobRunner`] on a blocking thread (tests' fakes; see [`crate::driver`]).
    Steps(Arc<dyn JobRunner>),
    /// The registered worker processes, through one [`RunActor`] per job.
    Cluster {
        /// The membership actor.
        membership: ActorRef<MembershipMsg>,
        /// The data directory (relative checkpoint folders are under it).
        data_dir: std::path::PathBuf,
    },
}

/// How a running job is cancelled.
enum Running {
    /// Its driver's flag.
    Flag(Arc<AtomicBool>),
    /// Its run actor.
    Run(ActorRef<RunMsg>),
}

/// What a starting coordinator does with the jobs its store holds as queued or running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unfinished {
    /// Plans them again and runs them, a running one from its last complete checkpoint.
    #[default]
    Resume,
    /// Marks them failed (`pipewise local`, which runs the one job it was given).
    Fail,
}

/// Step events kept per job for late watchers: the latest ones (a ring), so a job's
/// memory does not grow with its steps; a watcher that subscribes later than this many
/// steps into a job starts at the oldest kept (`status` has the job's step and last loss).
pub const HISTORY_STEPS: usize = 1_000;
/// Jobs whose step events are kept (the most recent ones).
pub const HISTORY_JOBS: usize = 16;
/// How often a running job's step and last loss are stored (a checkpoint, and every
/// change of state, at once): a restart resumes from the last checkpoint, so a step
/// stored a second late loses nothing.
const PROGRESS_SAVE: std::time::Duration = std::time::Duration::from_secs(1);

/// The job manager's state.
pub struct JobManagerState {
    store: JobStore,
    planner: ActorRef<PlannerMsg>,
    runner: Option<Runner>,
    records: BTreeMap<u64, JobRecord>,
    plans: HashMap<u64, (JobSpec, JobPlan)>,
    queue: VecDeque<u64>,
    /// Started jobs: how each is cancelled, and the workers it needs.
    running: BTreeMap<u64, (Running, usize)>,
    /// Started jobs that hold their workers (their run's claim came through).
    holding: std::collections::BTreeSet<u64>,
    /// Started jobs' predicted seconds left (the queue's backfill rule reads them).
    left: HashMap<u64, f64>,
    /// Queued jobs' predicted run times ([`queue::predicted_secs`], once per job).
    predicted: HashMap<u64, Option<f64>>,
    /// How far the started jobs' steps ran from their first predictions.
    misses: queue::Misses,
    watchers: HashMap<u64, broadcast::Sender<StepEventData>>,
    traces: TraceStore,
    history: BTreeMap<u64, VecDeque<StepEventData>>,
    /// Where queued jobs resumed after a coordinator restart start.
    starts: HashMap<u64, Start>,
    /// Jobs resumed after a restart whose plans are not ready yet: no job after them in
    /// id order starts before they are queued.
    replanning: std::collections::BTreeSet<u64>,
    /// When a step's progress was last stored.
    progress_saved: Option<std::time::Instant>,
    /// The workers jobs may start on (the membership actor tells of every change).
    pool: Pool,
}

impl JobManagerState {
    fn save(&mut self, record: JobRecord) -> Result<JobRecord> {
        self.store.put(&record)?;
        self.records.insert(record.id, record.clone());
        self.publish_counts();
        Ok(record)
    }

    fn publish_counts(&self) {
        let counts = crate::metrics::JOB_STATES.map(|name| {
            let n = self
                .records
                .values()
                .filter(|r| r.state.name() == name)
                .count();
            (name, n)
        });
        crate::metrics::record_jobs(&counts);
    }

    fn record(&self, id: u64) -> Result<JobRecord> {
        self.records
            .get(&id)
            .cloned()
            .ok_or(CoordinatorError::NotFound(id))
    }
}

impl Actor for JobManager {
    type Msg = JobMsg;
    type State = JobManagerState;
    type Arguments = JobManagerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: JobManagerArgs,
    ) -> std::result::Result<Self::State, ActorProcessingErr> {
        let mut state = JobManagerState {
            store: args.store,
            planner: args.planner,
            runner: args.runner,
            records: BTreeMap::new(),
            plans: HashMap::new(),
            queue: VecDeque::new(),
            running: BTreeMap::new(),
            holding: std::collections::BTreeSet::new(),
            left: HashMap::new(),
            predicted: HashMap::new(),
            misses: queue::Misses::default(),
            watchers: HashMap::new(),
            traces: TraceStore::default(),
            history: BTreeMap::new(),
            progress_saved: None,
            pool: Pool::default(),
            starts: HashMap::new(),
            replanning: std::collections::BTreeSet::new(),
        };
        for mut record in state.store.list()? {
            // A job the coordinator had queued or running when it stopped is planned again
            // from its stored spec and queued in its place; a running one resumes from its
            // last complete checkpoint (or the start).
            if record.state == JobState::Running || record.state == JobState::Queued {
                match JobSpec::from_toml(&record.spec_toml) {
                    Ok(_) if args.unfinished == Unfinished::Resume => {
                        record.state = JobState::Queued;
                        record.restarts += 1;
                        record.waiting = "its plan again (the coordinator restarted)".into();
                        state.replanning.insert(record.id);
                        myself.cast(JobMsg::Resume(record.id))?;
                    }
                    Ok(_) => {
                        record.state = JobState::Failed;
                        record.error = "the coordinator restarted before the job finished".into();
                        record.waiting.clear();
                    }
                    Err(e) => {
                        record.state = JobState::Failed;
                        record.error = format!(
                            "the coordinator restarted before the job finished, and its stored \
                             spec no longer reads: {e}"
                        );
                        record.waiting.clear();
                    }
                }
                state.store.put(&record)?;
            }
            state.records.insert(record.id, record);
        }
        state.publish_counts();
        if let Some(Runner::Cluster { membership, .. }) = &state.runner {
            state.pool = ractor::call!(membership, MembershipMsg::Schedule, myself.clone())?;
        }
        // Workers come and go: the queue is looked at again every second.
        myself.send_interval(std::time::Duration::from_secs(1), || JobMsg::Tick);
        Ok(state)
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        // A run actor that stops has told the manager how its job ended; one that fails
        // has not.
        if let SupervisionEvent::ActorFailed(cell, e) = event
            && let Some(job) = state.running.iter().find_map(|(job, (how, _))| match how {
                Running::Run(run) if run.get_id() == cell.get_id() => Some(job),
                _ => None,
            })
        {
            // Its workers go back: the actor did not get to say so.
            if let Some(Runner::Cluster { membership, .. }) = &state.runner {
                let _ = membership.cast(MembershipMsg::Unfollow(*job));
            }
            myself.cast(JobMsg::Finished {
                job: *job,
                outcome: Err(CoordinatorError::Actor(format!(
                    "the job's run actor failed: {e}"
                ))),
                cancelled: false,
            })?;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match msg {
            JobMsg::Submit(mut spec, reply) => {
                let dir = state.store.dir();
                let resolved = crate::checkpoints_model::resolve_model(dir, &mut spec);
                if let Err(e) = resolved.and_then(|()| crate::checkpoints::check_paths(dir, &spec))
                {
                    let _ = reply.send(Err(e));
                    return Ok(());
                }
                let planner = state.planner.clone();
                let manager = myself.clone();
                let data_dir = dir.to_path_buf();
                tokio::spawn(async move {
                    // The data is read a block at a time: off the actor, beside other plans.
                    let checked = {
                        let spec = spec.clone();
                        tokio::task::spawn_blocking(move || {
                            crate::checkpoints_data::check_data(&data_dir, &spec)
                        })
                        .await
                        .unwrap_or_else(|e| {
                            Err(CoordinatorError::Actor(format!(
                                "the data check failed: {e}"
                            )))
                        })
                    };
                    if let Err(e) = checked {
                        let _ = reply.send(Err(e));
                        return;
                    }
                    let asked = spec.clone();
                    let call = async move { ractor::call!(planner, PlannerMsg::Plan, asked) };
                    let planned = tokio::select! {
                        called = call => called.map_err(CoordinatorError::from).and_then(|r| r),
                        // The submitter went away: dropping the call cancels the plan.
                        () = crate::planner::closed(&reply) => return,
                    };
                    // The manager outlives the coordinator's requests; if it is gone, so
                    // is the caller.
                    let _ = manager.cast(JobMsg::Planned(spec, Box::new(planned), reply));
                });
            }
            JobMsg::Planned(spec, planned, reply) => {
                // A job whose submitter went away is not queued: it never learnt the job's
                // id, and a retry would run it twice.
                if reply.is_closed() {
                    tracing::info!(job = %spec.job.name, "submitter went away; not queued");
                    return Ok(());
                }
                let outcome = match *planned {
                    Ok(plan) => enqueue(state, *spec, plan),
                    Err(e) => Err(e),
                };
                let _ = reply.send(outcome);
                start_next(&myself, state).await;
            }
            JobMsg::Resume(id) => {
                let spec = match state.record(id).map(|r| JobSpec::from_toml(&r.spec_toml)) {
                    Ok(Ok(spec)) => Box::new(spec),
                    // Read when the manager started, so not reached; were it, the jobs
                    // behind it must not wait for it.
                    _ => {
                        state.replanning.remove(&id);
                        start_next(&myself, state).await;
                        return Ok(());
                    }
                };
                let planner = state.planner.clone();
                let manager = myself.clone();
                tokio::spawn(async move {
                    let asked = spec.clone();
                    let planned = ractor::call!(planner, PlannerMsg::Plan, asked)
                        .map_err(CoordinatorError::from)
                        .and_then(|r| r);
                    let _ = manager.cast(JobMsg::Resumed(id, spec, Box::new(planned)));
                });
            }
            JobMsg::Resumed(id, spec, planned) => {
                state.replanning.remove(&id);
                let Ok(mut record) = state.record(id) else {
                    return Ok(());
                };
                if record.state.is_final() {
                    // Cancelled while it was planned: the jobs after it may start.
                    start_next(&myself, state).await;
                    return Ok(());
                }
                record.waiting.clear();
                match *planned {
                    Ok(plan) => {
                        let step = checkpoint_step(&record.last_checkpoint).unwrap_or(0);
                        let (restarts, through) = (record.restarts, record.step);
                        state.save(record)?;
                        state.starts.insert(
                            id,
                            Start {
                                step,
                                restarts,
                                through,
                            },
                        );
                        state.plans.insert(id, (*spec, plan));
                        // In id order, before the jobs submitted since the restart.
                        let at = state.queue.partition_point(|&q| q < id);
                        state.queue.insert(at, id);
                        tracing::info!(job = id, step, "job queued again after a restart");
                        start_next(&myself, state).await;
                    }
                    Err(e) => {
                        record.state = JobState::Failed;
                        record.error = format!(
                            "the coordinator restarted before the job finished, and planning \
                             it again failed: {e}"
                        );
                        state.save(record)?;
                        start_next(&myself, state).await;
                    }
                }
            }
            JobMsg::Get(id, reply) => {
                let _ = reply.send(state.record(id));
            }
            JobMsg::List(reply) => {
                let _ = reply.send(state.records.values().cloned().collect());
            }
            JobMsg::Cancel(id, reply) => {
                let outcome = cancel(state, id);
                let _ = reply.send(outcome);
            }
            JobMsg::Watch(id, reply) => {
                let outcome = state.record(id).map(|record| {
                    let past: Vec<StepEventData> = state
                        .history
                        .get(&id)
                        .map(|h| h.iter().cloned().collect())
                        .unwrap_or_default();
                    let (tx, rx) = broadcast::channel(1024);
                    if record.state.is_final() {
                        (past, rx) // the sender drops here: the live part ends at once
                    } else {
                        (past, state.watchers.entry(id).or_insert(tx).subscribe())
                    }
                });
                let _ = reply.send(outcome);
            }
            JobMsg::Progress(mut event) => {
                if let Some(schedule) = event.replanned.take() {
                    // Traces from here on follow the new schedule (the old run's are
                    // dropped: they no longer match it).
                    state.traces.start(event.job, (*schedule).clone());
                }
                let planned = event.planned_costs.take();
                if let Some(trace) = event.trace.take() {
                    state.traces.add(trace, planned);
                }
                if let Ok(mut record) = state.record(event.job) {
                    let step_ms = match event.predicted_step_time_ms {
                        ms if ms > 0.0 => ms,
                        _ => event.step_time_ms,
                    };
                    let steps_left = record.steps.saturating_sub(event.step) as f64;
                    state.left.insert(event.job, steps_left * step_ms / 1e3);
                    let secs = event.step_time_ms / 1e3;
                    state.misses.step(event.job, event.step, secs);
                    record.step = event.step;
                    record.last_loss = Some(event.loss);
                    let checkpoint = record.last_checkpoint.clone();
                    if event.checkpoint > 0 {
                        record.last_checkpoint = checkpoint_name(event.checkpoint);
                    }
                    record.waiting.clear();
                    if !event.plan_choice.is_empty() {
                        record.plan_choice = event.plan_choice.clone();
                    }
                    // Stored at once when the checkpoint a restart resumes from changes, and
                    // otherwise at most every PROGRESS_SAVE: a synced write per step would
                    // hold the manager back on a slow disk while the steps (and their
                    // traces) queue up in its mailbox.
                    let due = state
                        .progress_saved
                        .is_none_or(|at| at.elapsed() >= PROGRESS_SAVE);
                    if record.last_checkpoint != checkpoint || due {
                        state.save(record)?;
                        state.progress_saved = Some(std::time::Instant::now());
                    } else {
                        state.records.insert(record.id, record);
                    }
                }
                let kept = state.history.entry(event.job).or_default();
                kept.push_back((*event).clone());
                while kept.len() > HISTORY_STEPS {
                    kept.pop_front();
                }
                while state.history.len() > HISTORY_JOBS {
                    state.history.pop_first();
                }
                if let Some(tx) = state.watchers.get(&event.job) {
                    let _ = tx.send(*event);
                }
            }
            JobMsg::Waiting(job, what) => {
                if let Ok(mut record) = state.record(job)
                    && !record.state.is_final()
                    && record.waiting != what
                {
                    record.waiting = what;
                    // Only a status note: a store that cannot take it does not stop the
                    // manager (the next step's save reports a store that stays broken).
                    if let Err(e) = state.save(record) {
                        tracing::warn!(job, "cannot store what the job waits for: {e}");
                    }
                }
            }
            JobMsg::Workers(job, workers) => {
                if state.running.contains_key(&job) {
                    state.holding.insert(job);
                }
                if let Ok(mut record) = state.record(job)
                    && !record.state.is_final()
                {
                    record.workers = workers;
                    if let Err(e) = state.save(record) {
                        tracing::warn!(job, "cannot store the job's workers: {e}");
                    }
                }
                start_next(&myself, state).await;
            }
            JobMsg::Tick => start_next(&myself, state).await,
            JobMsg::Pool(pool) => {
                state.pool = pool;
                start_next(&myself, state).await;
            }
            JobMsg::Trace(job, step, reply) => {
                let outcome = state
                    .record(job)
                    .and_then(|_| state.traces.render(job, step));
                let _ = reply.send(outcome);
            }
            JobMsg::Finished {
                job,
                outcome,
                cancelled,
            } => {
                match &outcome {
                    Ok(()) => tracing::info!(job, cancelled, "job finished"),
                    Err(e) => tracing::warn!(job, "job failed: {e}"),
                }
                if let Ok(mut record) = state.record(job) {
                    record.waiting.clear();
                    record.workers.clear();
                    match outcome {
                        Ok(()) if cancelled && record.step < record.steps => {
                            record.state = JobState::Cancelled
                        }
                        Ok(()) => record.state = JobState::Succeeded,
                        Err(e) => {
                            record.state = JobState::Failed;
                            record.error = e.to_string();
                        }
                    }
                    state.save(record)?;
                }
                state.watchers.remove(&job);
                state.plans.remove(&job);
                state.running.remove(&job);
                state.left.remove(&job);
                state.holding.remove(&job);
                start_next(&myself, state).await;
            }
        }
        Ok(())
    }
}

/// Stores and queues a planned job.
fn enqueue(state: &mut JobManagerState, spec: JobSpec, plan: JobPlan) -> Result<JobRecord> {
    let id = state.records.keys().next_back().copied().unwrap_or(0) + 1;
    let record = JobRecord {
        id,
        name: spec.job.name.clone(),
        spec_toml: spec.to_toml()?,
        state: JobState::Queued,
        step: 0,
        steps: u64::from(spec.training.steps),
        last_loss: None,
        error: String::new(),
        last_checkpoint: String::new(),
        restarts: 0,
        waiting: String::new(),
        plan_choice: String::new(),
        workers: Vec::new(),
    };
    let record = state.save(record)?;
    state.plans.insert(id, (spec, plan));
    state.queue.push_back(id);
    tracing::info!(job = id, name = %record.name, "job queued");
    Ok(record)
}

fn cancel(state: &mut JobManagerState, id: u64) -> Result<JobRecord> {
    let mut record = state.record(id)?;
    if record.state.is_final() {
        return Ok(record);
    }
    if let Some((how, _)) = state.running.get(&id) {
        match how {
            Running::Flag(flag) => flag.store(true, Ordering::SeqCst),
            Running::Run(run) => {
                let _ = run.cast(RunMsg::Input(Box::new(Input::Cancel)));
            }
        }
        return Ok(record);
    }
    state.queue.retain(|q| *q != id);
    state.plans.remove(&id);
    state.predicted.remove(&id);
    state.starts.remove(&id);
    state.watchers.remove(&id);
    record.state = JobState::Cancelled;
    state.save(record)
}

/// Starts the queued jobs the workers allow, in queue order (a job resumed after a
/// restart waits for the plans of the ones before it in id order). On a cluster, a job
/// starts when enough workers are idle for all of it (its `d × R`), after the workers the
/// started jobs that do not hold theirs yet will claim; with nothing running, the head of
/// the queue starts and waits for its workers inside; a job behind one that must wait
/// starts by the backfill rule ([`queue::admit`]: it cannot delay that job, by the jobs'
/// predicted times). An in-process runner runs one job at a time.
async fn start_next(myself: &ActorRef<JobMsg>, state: &mut JobManagerState) {
    let Some(runner) = state.runner.clone() else {
        return;
    };
    state.queue.retain(|id| state.plans.contains_key(id));
    let Runner::Cluster { .. } = &runner else {
        if state.running.is_empty()
            && let Some(&id) = state.queue.front()
            && state.replanning.first().is_none_or(|&first| first >= id)
            && let Some(need) = state.plans.get(&id).map(|(s, _)| s.workers_needed())
        {
            state.queue.pop_front();
            start(myself, state, &runner, id, need as usize).await;
        }
        return;
    };
    let streaming = state.pool.streaming;
    let idle = &state.pool.idle;
    let reserved: usize = state
        .running
        .iter()
        .filter(|(job, (_, need))| !state.holding.contains(job) && *need <= streaming)
        .map(|(_, (_, need))| need)
        .sum();
    // Jobs resumed after a restart run in id order: none after the first still planning.
    let planning = state.replanning.first().copied();
    let mut queued: Vec<queue::Queued> = Vec::new();
    for &id in &state.queue {
        if planning.is_some_and(|first| first < id) {
            break;
        }
        let Some((spec, plan)) = state.plans.get(&id) else {
            continue;
        };
        let need = spec.workers_needed() as usize;
        // Predicted on the workers it would start on, once there are enough of them.
        let secs = match idle.get(..need) {
            Some(workers) => *state
                .predicted
                .entry(id)
                .or_insert_with(|| queue::predicted_secs(spec, plan, workers)),
            None => None,
        };
        let secs = secs.map(|s| s * state.misses.factor(&queue::shape(spec)));
        queued.push(queue::Queued { id, need, secs });
    }
    // A running job that waits for workers (after a loss) has no end to predict.
    let stalled = |id: &u64| state.records.get(id).is_some_and(|r| !r.waiting.is_empty());
    let running: Vec<queue::Started> = state
        .running
        .iter()
        .map(|(id, (_, need))| queue::Started {
            need: *need,
            left: state.left.get(id).copied().filter(|_| !stalled(id)),
        })
        .collect();
    let free = idle.len().saturating_sub(reserved);
    let verdicts = queue::admit(&queued, free, streaming, &running);
    for (job, (id, verdict)) in queued.iter().zip(verdicts) {
        let waiting = verdict.waiting(job.need, job.secs, streaming);
        if verdict != queue::Verdict::Start {
            // What a queued job waits for: shown by `status`, not stored (it changes as
            // the predictions do, and a restart plans the queue again).
            if let Some(record) = state.records.get_mut(&id) {
                record.waiting = waiting;
            }
            continue;
        }
        state.queue.retain(|q| *q != id);
        let first = state.predicted.remove(&id).flatten();
        let mut steps = 0;
        if let Some(record) = state.records.get_mut(&id) {
            record.waiting.clear();
            steps = record.steps;
        }
        if let Some(secs) = first
            && let Some((spec, _)) = state.plans.get(&id)
        {
            let shape = queue::shape(spec);
            state.misses.started(id, shape, secs / steps.max(1) as f64);
        }
        if let Some(secs) = job.secs {
            state.left.insert(id, secs);
        }
        start(myself, state, &runner, id, job.need).await;
    }
}

/// Starts queued job `id` (it needs `need` workers) on `runner`.
async fn start(
    myself: &ActorRef<JobMsg>,
    state: &mut JobManagerState,
    runner: &Runner,
    id: u64,
    need: usize,
) {
    let Some((spec, plan)) = state.plans.remove(&id) else {
        return;
    };
    let Ok(mut record) = state.record(id) else {
        return;
    };
    record.state = JobState::Running;
    if let Err(e) = state.save(record) {
        tracing::error!(job = id, "cannot store the job: {e}");
    }
    state.traces.start(id, plan.schedule.clone());
    let start = state.starts.remove(&id).unwrap_or_default();
    state
        .watchers
        .entry(id)
        .or_insert_with(|| broadcast::channel(1024).0);
    let started = match runner {
        Runner::Steps(runner) => {
            let flag = Arc::new(AtomicBool::new(false));
            let args = DriverArgs {
                job: id,
                spec,
                plan,
                start,
                runner: runner.clone(),
                cancelled: flag.clone(),
                manager: myself.clone(),
            };
            crate::driver::spawn(args);
            Ok(Running::Flag(flag))
        }
        Runner::Cluster {
            membership,
            data_dir,
        } => {
            // Checked at submit; a job stored before paths were confined is checked
            // here, and what changed on disk since shows as the field's error.
            match create_output_dir(data_dir, id, &spec) {
                Ok(output) => {
                    let args = RunArgs {
                        job: id,
                        output,
                        spec,
                        plan,
                        start,
                        membership: membership.clone(),
                        manager: myself.clone(),
                    };
                    // Linked: a run actor that fails ends its job
                    // (`handle_supervisor_evt`).
                    Actor::spawn_linked(None, RunActor, args, myself.get_cell())
                        .await
                        .map(|(run, _)| Running::Run(run))
                        .map_err(|e| CoordinatorError::Actor(format!("cannot start the job: {e}")))
                }
                Err(e) => Err(e),
            }
        }
    };
    match started {
        Ok(how) => {
            state.running.insert(id, (how, need));
        }
        Err(e) => {
            let _ = myself.cast(JobMsg::Finished {
                job: id,
                outcome: Err(e),
                cancelled: false,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::planner::tests::{gated_planner, until_held};
    use pipewise_common::job::example;

    /// A manager with `planner`, no runner, and a fresh store in a directory named by `tag`.
    async fn manager_with(
        planner: ActorRef<PlannerMsg>,
        tag: &str,
    ) -> (ActorRef<JobMsg>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("pipewise-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (manager_on(planner, &dir, Unfinished::Resume).await, dir)
    }

    /// A manager with `planner`, no runner, and the store in `dir` as it is.
    async fn manager_on(
        planner: ActorRef<PlannerMsg>,
        dir: &std::path::Path,
        unfinished: Unfinished,
    ) -> ActorRef<JobMsg> {
        let (manager, _) = Actor::spawn(
            None,
            JobManager,
            JobManagerArgs {
                store: JobStore::open(dir).unwrap(),
                planner,
                runner: None,
                unfinished,
            },
        )
        .await
        .unwrap();
        manager
    }

    /// The jobs a coordinator stopped under: planned again and queued (`Resume`), or failed
    /// (`Fail`, as `pipewise local` asks); one whose stored spec no longer reads is failed
    /// either way. None still says what it waited for.
    #[tokio::test]
    async fn a_restart_resumes_or_fails_unfinished_jobs() {
        let spec = example(2, "1f1b").to_toml().unwrap();
        for unfinished in [Unfinished::Resume, Unfinished::Fail] {
            let dir = std::env::temp_dir().join(format!(
                "pipewise-restart-{unfinished:?}-{}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            {
                let store = JobStore::open(&dir).unwrap();
                for (id, spec_toml) in [(1, spec.clone()), (2, String::new())] {
                    store
                        .put(&JobRecord {
                            id,
                            name: "stopped".into(),
                            spec_toml,
                            state: JobState::Running,
                            step: 4,
                            steps: 8,
                            last_loss: None,
                            error: String::new(),
                            last_checkpoint: "step-3".into(),
                            restarts: 0,
                            waiting: "workers: 1 of 3 ready".into(),
                            plan_choice: String::new(),
                            workers: Vec::new(),
                        })
                        .unwrap();
                }
            }
            // The plan of a resumed job is held: it stays queued, waiting for it.
            let (planner, _release, _waiting) = gated_planner(1).await;
            let manager = manager_on(planner, &dir, unfinished).await;
            let first = ractor::call!(manager, JobMsg::Get, 1).unwrap().unwrap();
            let unreadable = ractor::call!(manager, JobMsg::Get, 2).unwrap().unwrap();
            assert_eq!(unreadable.state, JobState::Failed);
            assert!(
                unreadable.error.contains("spec no longer reads"),
                "{}",
                unreadable.error
            );
            assert!(unreadable.waiting.is_empty(), "{}", unreadable.waiting);
            match unfinished {
                Unfinished::Resume => {
                    assert_eq!(first.state, JobState::Queued);
                    assert_eq!(first.restarts, 1);
                    assert_eq!(first.waiting, "its plan again (the coordinator restarted)");
                }
                Unfinished::Fail => {
                    assert_eq!(first.state, JobState::Failed);
                    assert_eq!(
                        first.error,
                        "the coordinator restarted before the job finished"
                    );
                    assert!(first.waiting.is_empty(), "{}", first.waiting);
                }
            }
            manager.stop(None);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// A runner that records the jobs it runs, in order.
    struct Recording(std::sync::Mutex<Vec<u64>>);

    impl JobRunner for Recording {
        fn run(
            &self,
            job: u64,
            _: &JobSpec,
            _: &JobPlan,
            _: Start,
            _: &mut dyn FnMut(crate::events::Report),
            _: &AtomicBool,
        ) -> Result<()> {
            self.0.lock().unwrap().push(job);
            Ok(())
        }
    }

    /// Jobs resumed after a restart start in id order: one whose plan is ready waits for an
    /// earlier one still being planned.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn resumed_jobs_start_in_id_order() {
        let dir = std::env::temp_dir().join(format!("pipewise-order-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let store = JobStore::open(&dir).unwrap();
            for (id, name, state) in [
                (1, "held", JobState::Running),
                (2, "quick", JobState::Queued),
            ] {
                let mut spec = example(2, "1f1b");
                spec.job.name = name.into();
                store
                    .put(&JobRecord {
                        id,
                        name: name.into(),
                        spec_toml: spec.to_toml().unwrap(),
                        state,
                        step: 0,
                        steps: 3,
                        last_loss: None,
                        error: String::new(),
                        last_checkpoint: String::new(),
                        restarts: 0,
                        waiting: String::new(),
                        plan_choice: String::new(),
                        workers: Vec::new(),
                    })
                    .unwrap();
            }
        }
        let (planner, release, waiting) = gated_planner(2).await;
        let runner = Arc::new(Recording(std::sync::Mutex::new(Vec::new())));
        let (manager, _) = Actor::spawn(
            None,
            JobManager,
            JobManagerArgs {
                store: JobStore::open(&dir).unwrap(),
                planner,
                runner: Some(Runner::Steps(runner.clone())),
                unfinished: Unfinished::Resume,
            },
        )
        .await
        .unwrap();
        until_held(&waiting, 1).await;
        // Job 2's plan is in (its waiting note cleared), job 1's held: nothing starts.
        loop {
            let quick = ractor::call!(manager, JobMsg::Get, 2).unwrap().unwrap();
            if quick.waiting.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(runner.0.lock().unwrap().is_empty());
        release.send(()).unwrap();
        let started = std::time::Instant::now();
        while runner.0.lock().unwrap().len() < 2 {
            assert!(started.elapsed() < std::time::Duration::from_secs(30));
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(*runner.0.lock().unwrap(), [1, 2]);
        manager.stop(None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The manager answers while a submitted job is being planned (a slow plan used to
    /// block `GetJob` and `ListJobs` until it ended), and queues the job once it is planned.
    #[tokio::test]
    async fn answers_while_a_job_is_planned() {
        let (planner, release, waiting) = gated_planner(2).await;
        let (manager, dir) = manager_with(planner, "held").await;
        let mut spec = example(2, "1f1b");
        spec.job.name = "held".into();
        let submit = {
            let manager = manager.clone();
            let spec = spec.clone();
            tokio::spawn(async move { ractor::call!(manager, JobMsg::Submit, Box::new(spec)) })
        };
        until_held(&waiting, 1).await;
        // The plan is held: the manager still answers, and knows no job yet.
        let listed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            ractor::call!(manager, JobMsg::List)
        })
        .await
        .expect("the manager answers while a plan is held")
        .unwrap();
        assert!(listed.is_empty());
        assert!(ractor::call!(manager, JobMsg::Get, 1).unwrap().is_err());
        assert!(!submit.is_finished());
        release.send(()).unwrap();
        let record = submit.await.unwrap().unwrap().unwrap();
        assert_eq!(record.name, spec.job.name);
        assert_eq!(ractor::call!(manager, JobMsg::List).unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A job whose submitter went away before its plan ended is not queued (it used to run
    /// although the submitter never learnt its id).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_submission_is_not_queued() {
        let (planner, release, waiting) = gated_planner(1).await;
        let (manager, dir) = manager_with(planner, "gone").await;
        let mut spec = example(2, "1f1b");
        spec.job.name = "held".into();
        let submit = {
            let manager = manager.clone();
            tokio::spawn(async move { ractor::call!(manager, JobMsg::Submit, Box::new(spec)) })
        };
        until_held(&waiting, 1).await;
        submit.abort();
        let _ = submit.await;
        // Let the manager see the submitter gone, then let the plan end.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        release.send(()).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(ractor::call!(manager, JobMsg::List).unwrap().is_empty());
        // The next submission is planned and queued as usual.
        let record = ractor::call!(manager, JobMsg::Submit, Box::new(example(2, "1f1b")))
            .unwrap()
            .unwrap();
        assert_eq!(ractor::call!(manager, JobMsg::List).unwrap().len(), 1);
        assert_eq!(record.id, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A manager with the real planner and a fresh store in a directory named by `tag`.
    async fn planning_manager(tag: &str) -> (ActorRef<JobMsg>, std::path::PathBuf) {
        let (planner, _) = Actor::spawn(None, crate::planner::Planner, Default::default())
            .await
            .unwrap();
        manager_with(planner, tag).await
    }

    /// Step events are kept in a ring of the latest [`HISTORY_STEPS`]: a late watcher gets
    /// those, and a long job's memory does not grow with its steps.
    #[tokio::test]
    async fn late_watchers_get_the_latest_steps() {
        let (manager, dir) = planning_manager("ring").await;
        let job = ractor::call!(manager, JobMsg::Submit, Box::new(example(2, "1f1b")))
            .unwrap()
            .unwrap()
            .id;
        let steps = HISTORY_STEPS as u64 + 10;
        for step in 1..=steps {
            let event = StepEventData {
                job,
                step,
                ..Default::default()
            };
            manager.cast(JobMsg::Progress(Box::new(event))).unwrap();
        }
        let (past, _) = ractor::call!(manager, JobMsg::Watch, job).unwrap().unwrap();
        let kept: Vec<u64> = past.iter().map(|e| e.step).collect();
        assert_eq!(kept, (11..=steps).collect::<Vec<_>>());
        let record = ractor::call!(manager, JobMsg::Get, job).unwrap().unwrap();
        assert_eq!(record.step, steps);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A job whose `checkpoint.folder` or `data.path` leads out of the data directory, or
    /// cannot be used there, is refused at submit, naming the field, before it is planned
    /// or stored.
    #[tokio::test]
    async fn paths_outside_the_data_directory_are_refused() {
        let (manager, dir) = planning_manager("confined").await;
        let outside = dir.with_extension("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        type Edit = fn(&mut JobSpec, &std::path::Path);
        let cases: [(&str, Edit); 8] = [
            ("checkpoint.folder", |s, _| {
                s.checkpoint.folder = "../../escape_ckpt".into()
            }),
            // Inside, but unusable: the store's own file, a name the OS refuses, and the
            // data directory itself as the corpus.
            ("checkpoint.folder", |s, _| {
                s.checkpoint.folder = "jobs.redb".into()
            }),
            ("checkpoint.folder", |s, _| {
                s.checkpoint.folder = "b".repeat(300)
            }),
            ("data.path", |s, _| s.data.path = Some(".".into())),
            ("checkpoint.folder", |s, _| {
                s.checkpoint.folder = "/tmp".into()
            }),
            ("checkpoint.folder", |s, _| {
                s.checkpoint.folder = "link/ckpt".into()
            }),
            ("data.path", |s, _| {
                s.data.path = Some("link/corpus.txt".into())
            }),
            ("data.path", |s, dir| {
                s.data.path = Some(dir.join("../corpus.txt").display().to_string())
            }),
        ];
        for (field, edit) in cases {
            let mut spec = example(2, "1f1b");
            edit(&mut spec, &dir);
            match ractor::call!(manager, JobMsg::Submit, Box::new(spec)).unwrap() {
                Err(CoordinatorError::Plan(pipewise_common::Error::InvalidArgument {
                    field: named,
                    ..
                })) => assert_eq!(named, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        assert!(ractor::call!(manager, JobMsg::List).unwrap().is_empty());
        // Inside, absolute or relative, the job is queued.
        let mut spec = example(2, "1f1b");
        spec.checkpoint.folder = dir.join("runs").display().to_string();
        spec.data.path = Some("corpus/tiny.txt".into());
        assert!(
            ractor::call!(manager, JobMsg::Submit, Box::new(spec))
                .unwrap()
                .is_ok()
        );
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&outside);
    }
}
