//! The job manager actor: the shell of the job [`Scheduler`] (`pipewise_common::run::
//! scheduler`), which decides which queued jobs start when (in queue order, all of a job's
//! workers or none, with EASY backfill on predicted run times) and when a job's progress is
//! stored. The actor accepts, lists, cancels and watches jobs, keeps every job in the
//! durable store, plans submissions beside itself ([`crate::planner`]: a job gets its id
//! and its place in the queue when its plan is ready, so one with a quick plan can overtake
//! one submitted before it with a slow plan), starts a run actor per job the scheduler
//! starts, and fans step events out to watchers. It feeds the scheduler the plans, the
//! pool of workers the membership actor tells it of, the runs' claims, steps and ends, and
//! carries out what it asks. After a restart of the coordinator, the jobs it had queued or
//! running are planned again from their stored specs and queued in id order; a running one
//! resumes from its last complete checkpoint.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use pipewise_common::job::{JobPlan, JobSpec};
use pipewise_common::run::scheduler::{self, Action, Input, Planned, Scheduler, Starting};
use pipewise_common::run::supervisor::Input as RunInput;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::sync::broadcast;

use crate::checkpoints::create_output_dir;
use crate::error::{CoordinatorError, Result};
use crate::events::{History, StepEvent};
pub use crate::job_msg::{JobMsg, Watch};
use crate::membership::MembershipMsg;
use crate::planner::PlannerMsg;
use crate::run::{RunActor, RunArgs};
use crate::run_msg::RunMsg;
pub use crate::store::Unfinished;
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
    /// The membership actor (the workers jobs run on).
    pub membership: ActorRef<MembershipMsg>,
    /// The data directory (relative checkpoint folders are under it).
    pub data_dir: PathBuf,
    /// What becomes of the jobs the store holds as queued or running (a coordinator that
    /// stopped under them).
    pub unfinished: Unfinished,
    /// The scheduler's and the run actors' time.
    pub clock: crate::clock::Clock,
}

/// The job manager's state.
pub struct JobManagerState {
    scheduler: Scheduler,
    /// The scheduler's and the run actors' clock.
    clock: crate::clock::Clock,
    store: JobStore,
    planner: ActorRef<PlannerMsg>,
    membership: ActorRef<MembershipMsg>,
    data_dir: PathBuf,
    records: BTreeMap<u64, JobRecord>,
    /// The run actors of the started jobs.
    runs: BTreeMap<u64, ActorRef<RunMsg>>,
    watchers: HashMap<u64, broadcast::Sender<StepEvent>>,
    traces: TraceStore,
    history: History,
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

    /// Saves job `id`'s record as `edit` changes it; a store that cannot take it is only
    /// logged (a note: the next save of a step reports a store that stays broken).
    fn note(&mut self, id: u64, what: &str, edit: impl FnOnce(&mut JobRecord)) {
        if let Ok(mut record) = self.record(id)
            && !record.state.is_final()
        {
            let before = record.clone();
            edit(&mut record);
            if record == before {
                return;
            }
            if let Err(e) = self.save(record) {
                tracing::warn!(job = id, "cannot store {what}: {e}");
            }
        }
    }

    /// Feeds the scheduler `input` and carries out what it asks.
    async fn feed(&mut self, myself: &ActorRef<JobMsg>, input: Input) -> Result<()> {
        let now = self.clock.now_ms();
        for action in self.scheduler.handle(now, input) {
            match action {
                Action::Start(starting) => self.start(myself, *starting).await,
                Action::Note(job, waiting) => {
                    if let Some(record) = self.records.get_mut(&job) {
                        record.waiting = waiting;
                    }
                }
                Action::Save(job) => {
                    let record = self.record(job)?;
                    self.save(record)?;
                }
                Action::Stop(job) => {
                    if let Some(run) = self.runs.get(&job) {
                        let _ = run.cast(RunMsg::Input(Box::new(RunInput::Cancel)));
                    }
                }
                Action::Dropped(job) => {
                    let mut record = self.record(job)?;
                    record.state = JobState::Cancelled;
                    record.waiting.clear();
                    self.watchers.remove(&job);
                    self.save(record)?;
                }
            }
        }
        Ok(())
    }

    /// Starts a job's run actor, linked: one that fails ends its job
    /// (`handle_supervisor_evt`).
    async fn start(&mut self, myself: &ActorRef<JobMsg>, starting: Starting) {
        let Starting {
            job,
            spec,
            plan,
            start,
        } = starting;
        self.note(job, "the job's start", |r| {
            r.state = JobState::Running;
            r.waiting.clear();
        });
        self.traces.start(job, plan.schedule.clone());
        self.watchers
            .entry(job)
            .or_insert_with(|| broadcast::channel(1024).0);
        // Checked at submit; a job stored before paths were confined is checked here, and
        // what changed on disk since shows as the field's error.
        let spawned = match create_output_dir(&self.data_dir, job, &spec) {
            Ok(output) => {
                let args = RunArgs {
                    job,
                    output,
                    spec,
                    plan,
                    start,
                    membership: self.membership.clone(),
                    manager: myself.clone(),
                    clock: self.clock.clone(),
                };
                Actor::spawn_linked(None, RunActor, args, myself.get_cell())
                    .await
                    .map(|(run, _)| run)
                    .map_err(|e| CoordinatorError::Actor(format!("cannot start the job: {e}")))
            }
            Err(e) => Err(e),
        };
        match spawned {
            Ok(run) => {
                self.runs.insert(job, run);
            }
            Err(e) => {
                let _ = myself.cast(JobMsg::Finished {
                    job,
                    outcome: Err(e),
                    cancelled: false,
                });
            }
        }
    }

    /// Stores and queues a planned job.
    async fn enqueue(
        &mut self,
        myself: &ActorRef<JobMsg>,
        spec: JobSpec,
        plan: JobPlan,
    ) -> Result<JobRecord> {
        let id = self.records.keys().next_back().copied().unwrap_or(0) + 1;
        // Known only now, with the id: the folder the job's runs would resume from.
        crate::checkpoints_left::check_left_checkpoints(&self.data_dir, id, &spec)?;
        let record = self.save(JobRecord::queued(id, &spec)?)?;
        tracing::info!(job = id, name = %record.name, "job queued");
        let start = Default::default();
        let planned = Planned {
            job: id,
            spec,
            plan,
            start,
        };
        self.feed(myself, Input::Planned(Box::new(planned))).await?;
        Ok(record)
    }

    /// A job planned again after a restart: queued in id order, or failed without a plan.
    async fn resumed(
        &mut self,
        myself: &ActorRef<JobMsg>,
        id: u64,
        spec: JobSpec,
        planned: Result<JobPlan>,
    ) -> Result<()> {
        let queued = match (self.record(id), planned) {
            // Cancelled while it was planned: the jobs after it may start.
            (Ok(record), _) if record.state.is_final() => None,
            (Ok(mut record), Ok(plan)) => {
                record.waiting.clear();
                let start = record.resumed_start();
                self.save(record)?;
                tracing::info!(
                    job = id,
                    step = start.step,
                    "job queued again after a restart"
                );
                Some(Box::new(Planned {
                    job: id,
                    spec,
                    plan,
                    start,
                }))
            }
            (Ok(mut record), Err(e)) => {
                record.waiting.clear();
                record.state = JobState::Failed;
                record.error = format!(
                    "the coordinator restarted before the job finished, and planning it \
                     again failed: {e}"
                );
                self.save(record)?;
                None
            }
            (Err(_), _) => None,
        };
        self.feed(myself, Input::Resumed(id, queued)).await
    }

    /// Cancels a queued or running job (a running one stops after its step in progress).
    async fn cancel(&mut self, myself: &ActorRef<JobMsg>, id: u64) -> Result<JobRecord> {
        let record = self.record(id)?;
        if record.state.is_final() {
            return Ok(record);
        }
        self.feed(myself, Input::Cancel(id)).await?;
        self.record(id)
    }

    /// A step's event: kept for its trace, stored, kept for late watchers and sent to the
    /// live ones.
    async fn progress(&mut self, myself: &ActorRef<JobMsg>, mut event: StepEvent) -> Result<()> {
        if let Some(schedule) = event.replanned.take() {
            // Traces from here on follow the new schedule (the old run's are dropped: they
            // no longer match it).
            self.traces.start(event.job, (*schedule).clone());
        }
        let planned = event.planned_costs.take();
        if let Some(trace) = event.trace.take() {
            self.traces.add(trace, planned);
        }
        if let Some(record) = self.records.get_mut(&event.job) {
            let checkpoint = record.take_step(&event);
            let progress = scheduler::Progress {
                job: event.job,
                step: event.step,
                step_ms: event.step_time_ms,
                predicted_ms: event.predicted_step_time_ms,
                checkpoint,
            };
            self.feed(myself, Input::Progress(progress)).await?;
        }
        self.history.add(event.clone());
        if let Some(tx) = self.watchers.get(&event.job) {
            let _ = tx.send(event);
        }
        Ok(())
    }

    /// The events of job `id` so far and a receiver of the live ones (which ends at once
    /// for a finished job).
    fn watch(&mut self, id: u64) -> Result<Watch> {
        let record = self.record(id)?;
        let past = self.history.of(id);
        let (tx, rx) = broadcast::channel(1024);
        if record.state.is_final() {
            return Ok((past, rx)); // the sender drops here: the live part ends at once
        }
        Ok((past, self.watchers.entry(id).or_insert(tx).subscribe()))
    }

    /// A job ended with `outcome`.
    async fn finished(
        &mut self,
        myself: &ActorRef<JobMsg>,
        job: u64,
        outcome: Result<()>,
        cancelled: bool,
    ) -> Result<()> {
        match &outcome {
            Ok(()) => tracing::info!(job, cancelled, "job finished"),
            Err(e) => tracing::warn!(job, "job failed: {e}"),
        }
        if let Ok(mut record) = self.record(job) {
            record.end(&outcome, cancelled);
            self.save(record)?;
        }
        self.watchers.remove(&job);
        self.runs.remove(&job);
        self.feed(myself, Input::Finished(job)).await
    }
}

/// Why a spec is planned.
enum Asked {
    /// A submission: the submitter waits for the job's record; its data is checked first.
    Submit {
        /// The submitter.
        reply: RpcReplyPort<Result<JobRecord>>,
        /// The data directory the job's paths are in.
        data_dir: PathBuf,
    },
    /// A job the coordinator had before a restart.
    Resume(u64),
}

/// Checks a submitted job's training data and tokenizer. The data is read a block at a
/// time: off the actor, beside other plans.
async fn check_data(data_dir: PathBuf, spec: &JobSpec) -> Result<()> {
    let spec = spec.clone();
    tokio::task::spawn_blocking(move || crate::checkpoints_data::check_data(&data_dir, &spec))
        .await
        .unwrap_or_else(|e| {
            Err(CoordinatorError::Actor(format!(
                "the data check failed: {e}"
            )))
        })
}

/// Plans `spec` beside the manager (a large adaptive plan takes seconds; the manager goes
/// on answering) and sends the outcome back; a submitter that goes away first cancels the
/// plan (the call is dropped).
fn plan_beside(
    manager: &ActorRef<JobMsg>,
    planner: &ActorRef<PlannerMsg>,
    spec: Box<JobSpec>,
    asked: Asked,
) {
    let (manager, planner) = (manager.clone(), planner.clone());
    tokio::spawn(async move {
        let checked = match &asked {
            Asked::Submit { data_dir, .. } => check_data(data_dir.clone(), &spec).await,
            Asked::Resume(_) => Ok(()),
        };
        if let Err(e) = checked {
            if let Asked::Submit { reply, .. } = asked {
                let _ = reply.send(Err(e));
            }
            return;
        }
        let question = spec.clone();
        let call = async move { ractor::call!(planner, PlannerMsg::Plan, question) };
        let abandoned = async {
            match &asked {
                Asked::Submit { reply, .. } => crate::planner::closed(reply).await,
                Asked::Resume(_) => std::future::pending().await,
            }
        };
        let planned = tokio::select! {
            called = call => called.map_err(CoordinatorError::from).and_then(|r| r),
            () = abandoned => return,
        };
        let planned = Box::new(planned);
        // The manager outlives the coordinator's requests; if it is gone, so is the caller.
        let _ = manager.cast(match asked {
            Asked::Submit { reply, .. } => JobMsg::Planned(spec, planned, reply),
            Asked::Resume(id) => JobMsg::Resumed(id, spec, planned),
        });
    });
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
            scheduler: Scheduler::default(),
            clock: args.clock,
            store: args.store,
            planner: args.planner,
            membership: args.membership,
            data_dir: args.data_dir,
            records: BTreeMap::new(),
            runs: BTreeMap::new(),
            watchers: HashMap::new(),
            traces: TraceStore::default(),
            history: History::default(),
        };
        for mut record in state.store.list()? {
            let unfinished = !record.state.is_final();
            if let Some(spec) = record.after_restart(args.unfinished) {
                state.scheduler.handle(0, Input::Replanning(record.id));
                myself.cast(JobMsg::Resume(record.id, Box::new(spec)))?;
            }
            if unfinished {
                state.store.put(&record)?;
            }
            state.records.insert(record.id, record);
        }
        state.publish_counts();
        // The pool now, and every change of it from here on.
        let pool = ractor::call!(state.membership, MembershipMsg::Schedule, myself.clone())?;
        state.feed(&myself, Input::Workers(pool)).await?;
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
            && let Some(&job) = state
                .runs
                .iter()
                .find_map(|(job, run)| (run.get_id() == cell.get_id()).then_some(job))
        {
            // Its workers go back: the actor did not get to say so.
            let _ = state.membership.cast(MembershipMsg::Unfollow(job));
            myself.cast(JobMsg::Finished {
                job,
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
        let me = &myself;
        match msg {
            JobMsg::Submit(mut spec, reply) => {
                let dir = state.store.dir();
                let resolved = crate::checkpoints_model::resolve_model(dir, &mut spec);
                if let Err(e) = resolved.and_then(|()| crate::checkpoints::check_paths(dir, &spec))
                {
                    let _ = reply.send(Err(e));
                    return Ok(());
                }
                let data_dir = dir.to_path_buf();
                plan_beside(me, &state.planner, spec, Asked::Submit { reply, data_dir });
            }
            JobMsg::Planned(spec, planned, reply) => {
                planned_job(state, me, spec, *planned, reply).await?
            }
            JobMsg::Resume(id, spec) => plan_beside(me, &state.planner, spec, Asked::Resume(id)),
            JobMsg::Resumed(id, spec, planned) => state.resumed(me, id, *spec, *planned).await?,
            JobMsg::Get(id, reply) => answer(reply, state.record(id)),
            JobMsg::List(reply) => answer(reply, state.records.values().cloned().collect()),
            JobMsg::Cancel(id, reply) => answer(reply, state.cancel(me, id).await),
            JobMsg::Watch(id, reply) => answer(reply, state.watch(id)),
            JobMsg::Trace(job, step, reply) => {
                let trace = state
                    .record(job)
                    .and_then(|_| state.traces.render(job, step));
                answer(reply, trace);
            }
            JobMsg::Progress(event) => state.progress(me, *event).await?,
            JobMsg::Waiting(job, what) => {
                let stalled = !what.is_empty();
                state.note(job, "what the job waits for", |r| r.waiting = what);
                state.feed(me, Input::Stalled(job, stalled)).await?;
            }
            JobMsg::Workers(job, workers) => {
                state.note(job, "the job's workers", |r| r.workers = workers);
                state.feed(me, Input::Holding(job)).await?;
            }
            JobMsg::Pool(pool) => state.feed(me, Input::Workers(pool)).await?,
            JobMsg::Finished {
                job,
                outcome,
                cancelled,
            } => state.finished(me, job, outcome, cancelled).await?,
        }
        Ok(())
    }
}

/// Sends `value` to a caller (one that went away is no one's concern).
fn answer<T: Send + 'static>(reply: RpcReplyPort<T>, value: T) {
    let _ = reply.send(value);
}

/// A submitted job's plan: stored and queued, unless its submitter went away (it never
/// learnt the job's id, and a retry would run it twice).
async fn planned_job(
    state: &mut JobManagerState,
    myself: &ActorRef<JobMsg>,
    spec: Box<JobSpec>,
    planned: Result<JobPlan>,
    reply: RpcReplyPort<Result<JobRecord>>,
) -> Result<()> {
    if reply.is_closed() {
        tracing::info!(job = %spec.job.name, "submitter went away; not queued");
        return Ok(());
    }
    let queued = match planned {
        Ok(plan) => state.enqueue(myself, *spec, plan).await,
        Err(e) => Err(e),
    };
    let _ = reply.send(queued);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::planner::tests::{gated_planner, until_held};
    use pipewise_common::job::example;
    use pipewise_common::job::parse_count::parses_of;
    use std::time::Instant;

    /// A manager with `planner`, a cluster without workers, and a fresh store in a
    /// directory named by `tag`.
    async fn manager_with(
        planner: ActorRef<PlannerMsg>,
        tag: &str,
    ) -> (ActorRef<JobMsg>, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("pipewise-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (manager_on(planner, &dir, Unfinished::Resume).await, dir)
    }

    /// A manager with `planner`, a cluster without workers, and the store in `dir` as it is.
    async fn manager_on(
        planner: ActorRef<PlannerMsg>,
        dir: &std::path::Path,
        unfinished: Unfinished,
    ) -> ActorRef<JobMsg> {
        let (membership, _) = Actor::spawn(
            None,
            crate::membership::Membership,
            crate::clock::Clock::wall(),
        )
        .await
        .unwrap();
        let (manager, _) = Actor::spawn(
            None,
            JobManager,
            JobManagerArgs {
                store: JobStore::open(dir).unwrap(),
                planner,
                membership,
                data_dir: dir.to_path_buf(),
                unfinished,
                clock: crate::clock::Clock::wall(),
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

    /// A job the coordinator had running when it stopped is read from the store once, as
    /// the manager starts, and planned again from that reading (it was read a second time
    /// before its plan).
    #[tokio::test]
    async fn a_restarted_job_is_read_once() {
        let dir = std::env::temp_dir().join(format!("pipewise-read-once-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut spec = example(2, "1f1b");
        spec.job.name = "restarted-read-once".into();
        {
            let store = JobStore::open(&dir).unwrap();
            let mut record = JobRecord::queued(1, &spec).unwrap();
            record.state = JobState::Running;
            store.put(&record).unwrap();
        }
        let (planner, _release, _waiting) = gated_planner(1).await;
        let manager = manager_on(planner, &dir, Unfinished::Resume).await;
        // Planned again: it no longer waits for its plan.
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let record = ractor::call!(manager, JobMsg::Get, 1).unwrap().unwrap();
            if record.waiting != "its plan again (the coordinator restarted)" {
                assert!(!record.state.is_final(), "{record:?}");
                break;
            }
            assert!(Instant::now() < deadline, "not planned again: {record:?}");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(parses_of(&spec.job.name), 1);
        manager.stop(None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A job submitted over the gRPC edge is parsed there once: the manager plans, stores
    /// and queues the spec it is handed.
    #[tokio::test]
    async fn a_submission_is_parsed_once() {
        use pipewise_proto::v1 as pb;
        use pipewise_proto::v1::job_service_server::JobService;
        let (manager, dir) = planning_manager("submit-once").await;
        let mut spec = example(2, "1f1b");
        spec.job.name = "submitted-parsed-once".into();
        let jobs = crate::service::Jobs {
            manager: manager.clone(),
        };
        let request = tonic::Request::new(pb::JobSpec {
            toml: spec.to_toml().unwrap(),
            ..Default::default()
        });
        let status = jobs.submit_job(request).await.unwrap().into_inner();
        assert_eq!(status.name, spec.job.name);
        assert_eq!(parses_of(&spec.job.name), 1);
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

    /// Step events are kept in a ring of the latest `HISTORY_STEPS`: a late watcher gets
    /// those, and a long job's memory does not grow with its steps.
    #[tokio::test]
    async fn late_watchers_get_the_latest_steps() {
        let (manager, dir) = planning_manager("ring").await;
        let job = ractor::call!(manager, JobMsg::Submit, Box::new(example(2, "1f1b")))
            .unwrap()
            .unwrap()
            .id;
        let steps = crate::events::HISTORY_STEPS as u64 + 10;
        for step in 1..=steps {
            let event = StepEvent {
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
