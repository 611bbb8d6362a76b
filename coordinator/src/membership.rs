//! The membership actor: the shell of the worker [`Registry`] (`pipewise_common::run::
//! registry`), which decides who is alive, whose each worker is, and what a run's workers
//! are told. The actor holds what the registry cannot: the workers' assignment streams,
//! the run actors that follow the workers and the ones their step reports go to, and the
//! job manager, told when the pool of idle workers changes. It feeds the registry every
//! registration, heartbeat, stream, claim and report, and the time (a one-second tick, and
//! one whenever an assignment stream ends), and carries out what it asks.

use std::collections::HashMap;
use std::time::Duration;

use pipewise_common::run::StepReport;
use pipewise_common::run::registry::{self, Action, Gauges, Note, Pool, Registry};
use pipewise_common::run::supervisor::{Member, Taken};
use pipewise_proto::v1 as pb;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc;

use crate::clock::Clock;
use crate::error::{CoordinatorError, Result};
use crate::job_msg::JobMsg;
use crate::run_msg::RunMsg;

pub use registry::{MISSED_HEARTBEATS, ReportAnswer};

/// Heartbeat interval handed to workers.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(registry::HEARTBEAT_MS);

/// A worker's registration.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo {
    /// Worker id (unique per process).
    pub id: String,
    /// Address of its activation service.
    pub address: String,
    /// `cpu`, `cuda`, … (logged).
    pub device_kind: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Its start-up profile's FLOP/s (0: not measured).
    pub flops_per_second: f64,
    /// Cores it may count on (0: not known).
    pub cores: f64,
    /// Its host for the shared-memory tier (empty: not known, or the tier is off).
    pub host: String,
    /// The run it still runs, if any (0: none), until its first heartbeat.
    pub job: u64,
}

impl WorkerInfo {
    /// The worker as a run sees it (the registry numbers its incarnation).
    pub fn worker(&self) -> pipewise_common::run::Worker {
        pipewise_common::run::Worker {
            id: self.id.clone(),
            address: self.address.clone(),
            memory_bytes: self.memory_bytes,
            incarnation: 0,
            // Both checked finite and ≥ 0 at registration; `as` saturates.
            flops_per_second: self.flops_per_second as u64,
            millicores: (self.cores * 1000.0) as u32,
            host: self.host.clone(),
        }
    }
}

/// A heartbeat's content.
#[derive(Debug, Clone, PartialEq)]
pub struct Heartbeat {
    /// Worker id.
    pub id: String,
    /// Activation bytes held now.
    pub current_activation_bytes: u64,
    /// The job the worker is running (0: none).
    pub job: u64,
}

/// The membership actor.
pub struct Membership;

/// The membership actor's state.
pub struct MembershipState {
    registry: Registry,
    /// The registry's clock.
    clock: Clock,
    streams: HashMap<String, mpsc::Sender<pb::Assignment>>,
    /// run → the run actor its workers' step reports go to.
    sinks: HashMap<u64, ActorRef<RunMsg>>,
    /// job → its run actor, told of every registration, stream, heartbeat and loss.
    followers: HashMap<u64, ActorRef<RunMsg>>,
    /// The job manager, told of every change of the pool.
    scheduler: Option<ActorRef<JobMsg>>,
}

/// Messages of the membership actor.
pub enum MembershipMsg {
    /// A worker registers (again); replies with the heartbeat interval, or refuses an id a
    /// live worker at another address holds.
    Register(WorkerInfo, RpcReplyPort<Result<Duration>>),
    /// A heartbeat; replies whether the worker is known (else it must register).
    Heartbeat(Heartbeat, RpcReplyPort<HeartbeatAnswer>),
    /// The workers alive now.
    Live(RpcReplyPort<Vec<Member>>),
    /// A registered worker opens its assignment stream (replacing an older one).
    OpenStream(String, RpcReplyPort<Result<mpsc::Receiver<pb::Assignment>>>),
    /// Sends an assignment down a worker's stream.
    Assign(String, Box<pb::Assignment>, RpcReplyPort<Result<()>>),
    /// Routes the step reports of a run to its run actor.
    Attach(u64, ActorRef<RunMsg>),
    /// A job's run actor follows the workers from now on; replies the workers alive now.
    Follow(u64, ActorRef<RunMsg>, RpcReplyPort<Vec<Member>>),
    /// The job's run actor is done: its workers go back.
    Unfollow(u64),
    /// The job manager is told of every change of the pool from now on; replies the pool.
    Schedule(ActorRef<JobMsg>, RpcReplyPort<Pool>),
    /// Makes these workers the job's (and only these), unless another job holds one;
    /// replies why not.
    Claim(
        u64,
        Vec<String>,
        RpcReplyPort<std::result::Result<(), Taken>>,
    ),
    /// A worker's step report; replies what its run must do.
    Report(Box<StepReport>, RpcReplyPort<ReportAnswer>),
    /// A worker leaves (it was asked to stop), having abandoned run `u64` (0: none): it is
    /// forgotten, and the run actors are told at once. Replies when they have been.
    Leave(String, u64, RpcReplyPort<()>),
    /// Ask the job's workers to stop at the next step boundary.
    Stop(u64),
    /// Tell the job's workers to abandon it now (their reports of leaving it are still
    /// routed, until [`MembershipMsg::Detach`]: a job shedding a replica reads them).
    Abort(u64),
    /// The job is over; its reports are no longer routed.
    Detach(u64),
    /// Time passed (every second, and when an assignment stream ends).
    Tick,
}

impl MembershipState {
    /// The registry's clock: milliseconds since the coordinator started.
    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Tells the registry of the assignment streams that ended since it last heard.
    fn closed_streams(&mut self, now: u64) {
        for (id, tx) in &self.streams {
            if tx.is_closed() {
                self.registry.stream_closed(now, id);
            }
        }
    }

    /// Carries out what the registry asked.
    fn perform(&mut self) {
        for action in self.registry.actions() {
            match action {
                Action::Tell(input) => {
                    for follower in self.followers.values() {
                        let _ = follower.cast(RunMsg::Input(Box::new(input.clone())));
                    }
                }
                Action::CloseStream(id) => {
                    self.streams.remove(&id);
                }
                Action::Abandon { worker, run } => {
                    if let Some(tx) = self.streams.get(&worker) {
                        let abandon = pb::Assignment {
                            run,
                            abandon: true,
                            ..Default::default()
                        };
                        // A full or closed stream leaves it to the heartbeat reply.
                        let _ = tx.try_send(abandon);
                    }
                }
                Action::Pool(pool) => {
                    if let Some(scheduler) = &self.scheduler {
                        let _ = scheduler.cast(JobMsg::Pool(pool));
                    }
                }
                Action::Note(note) => log(note),
                Action::Memory(m) => crate::metrics::record_worker_memory(
                    m.run, m.replica, m.index, m.bytes, m.limit,
                ),
                Action::Gauges(gauges) => show(&gauges),
            }
        }
    }

    /// Carries out what the registry asked, then answers: a run actor hears of a claim's
    /// changes before the claim's answer, a leaving worker exits once the run actors were
    /// told.
    fn answer<T>(&mut self, reply: RpcReplyPort<T>, value: T) {
        self.perform();
        // A caller that went away is no one's concern.
        let _ = reply.send(value);
    }

    /// Registers a worker; the heartbeat interval, or why its id is refused.
    fn register(&mut self, now: u64, info: WorkerInfo) -> Result<Duration> {
        self.closed_streams(now);
        tracing::debug!(worker = %info.id, device = %info.device_kind, "registering");
        match self.registry.register(now, info.worker(), info.job) {
            Ok(_) => Ok(HEARTBEAT_INTERVAL),
            Err(e) => Err(CoordinatorError::InUse {
                id: info.id,
                address: e.address,
                ago_s: e.ago_ms as f64 / 1e3,
            }),
        }
    }

    /// Hands worker `id` its assignment down its stream.
    fn assign(&mut self, id: &str, assignment: pb::Assignment) -> Result<()> {
        let (run, replica, index) = (assignment.run, assignment.replica, assignment.worker_index);
        let tx = self.streams.get(id).ok_or_else(|| {
            CoordinatorError::Actor(format!("worker {id} has no open assignment stream"))
        })?;
        tx.try_send(assignment).map_err(|e| {
            CoordinatorError::Actor(format!("cannot hand worker {id} its assignment: {e}"))
        })?;
        self.registry.assigned(id, run, replica, index);
        Ok(())
    }

    /// Opens worker `id`'s assignment stream, if it is registered.
    fn open_stream(&mut self, now: u64, id: String) -> Result<mpsc::Receiver<pb::Assignment>> {
        if !self.registry.open_stream(now, &id) {
            return Err(CoordinatorError::BadRequest {
                field: "WorkerId.id",
                reason: format!("worker {id:?} is not registered; call Register first"),
            });
        }
        let (tx, rx) = mpsc::channel(16);
        self.streams.insert(id, tx);
        Ok(rx)
    }

    /// Routes a step report to its run's actor; what the run must do.
    fn report(&mut self, report: Box<StepReport>) -> ReportAnswer {
        let run = report.run;
        let answer = self.registry.report(run);
        if answer.routed
            && let Some(sink) = self.sinks.get(&run)
            && sink.cast(RunMsg::Report(report)).is_err()
        {
            self.sinks.remove(&run);
            self.registry.detach(run);
        }
        answer
    }
}

/// Logs one of the registry's notes.
fn log(note: Note) {
    match note {
        Note::Registered {
            id,
            address,
            was: None,
        } => tracing::info!(worker = %id, address = %address, "worker registered"),
        Note::Registered {
            id,
            address,
            was: Some(was),
        } => tracing::info!(
            worker = %id,
            address = %address,
            was = %was,
            "worker registered again (a new process under a known id)"
        ),
        Note::Refused {
            id,
            address,
            holder,
        } => tracing::warn!(
            worker = %id,
            address = %address,
            holder = %holder,
            "registration refused: the id is in use"
        ),
        Note::Left { id, run } => tracing::info!(worker = %id, run, "worker left"),
        Note::UnknownLeft(id) => tracing::info!(worker = %id, "an unknown worker left"),
        Note::Forgotten(id) => tracing::info!(
            worker = %id,
            "worker forgotten after {} s of silence",
            registry::FORGET_AFTER_MS / 1000
        ),
    }
}

/// Records the registry's gauges.
fn show(gauges: &Gauges) {
    crate::metrics::record_liveness(&gauges.ages, gauges.up);
    crate::metrics::record_workers(gauges.idle, gauges.busy);
    crate::metrics::refresh();
    for m in &gauges.memory {
        crate::metrics::record_worker_memory(m.run, m.replica, m.index, m.bytes, m.limit);
    }
}

impl Actor for Membership {
    type Msg = MembershipMsg;
    type State = MembershipState;
    type Arguments = Clock;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        clock: Clock,
    ) -> std::result::Result<Self::State, ActorProcessingErr> {
        // The tick that feeds the registry its time.
        myself.send_interval(Duration::from_secs(1), || MembershipMsg::Tick);
        Ok(MembershipState {
            registry: Registry::default(),
            clock,
            streams: HashMap::new(),
            sinks: HashMap::new(),
            followers: HashMap::new(),
            scheduler: None,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        let now = st.now();
        match msg {
            MembershipMsg::Register(info, reply) => {
                let answer = st.register(now, info);
                st.answer(reply, answer);
            }
            MembershipMsg::Heartbeat(beat, reply) => {
                let bytes = beat.current_activation_bytes;
                let (known, abort) = st.registry.heartbeat(now, &beat.id, beat.job, bytes);
                st.answer(reply, HeartbeatAnswer { known, abort });
            }
            MembershipMsg::Live(reply) => {
                st.closed_streams(now);
                let live = st.registry.live(now);
                st.answer(reply, live);
            }
            MembershipMsg::Follow(job, follower, reply) => {
                st.followers.insert(job, follower);
                st.closed_streams(now);
                let live = st.registry.live(now);
                st.answer(reply, live);
            }
            MembershipMsg::Unfollow(job) => {
                st.followers.remove(&job);
                st.registry.release(job);
            }
            MembershipMsg::Schedule(manager, reply) => {
                st.scheduler = Some(manager);
                st.closed_streams(now);
                let pool = st.registry.pool(now);
                st.answer(reply, pool);
            }
            MembershipMsg::Claim(job, ids, reply) => {
                let answer = st.registry.claim(job, &ids);
                st.answer(reply, answer);
            }
            MembershipMsg::OpenStream(id, reply) => {
                let opened = st.open_stream(now, id);
                st.answer(reply, opened);
            }
            MembershipMsg::Assign(id, assignment, reply) => {
                let assigned = st.assign(&id, *assignment);
                st.answer(reply, assigned);
            }
            MembershipMsg::Attach(run, sink) => {
                st.registry.attach(run);
                st.sinks.insert(run, sink);
            }
            MembershipMsg::Report(report, reply) => {
                let answer = st.report(report);
                st.answer(reply, answer);
            }
            MembershipMsg::Stop(run) => st.registry.stop(run),
            MembershipMsg::Abort(run) => st.registry.abort(run),
            MembershipMsg::Leave(id, run, reply) => {
                st.registry.leave(&id, run);
                st.answer(reply, ());
            }
            MembershipMsg::Detach(run) => {
                st.sinks.remove(&run);
                st.registry.detach(run);
            }
            MembershipMsg::Tick => {
                st.registry.tick(now);
                st.closed_streams(now);
            }
        }
        st.perform();
        Ok(())
    }
}

/// The membership's answer to a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    /// Whether the worker is registered.
    pub known: bool,
    /// The job the worker must abandon now, if any.
    pub abort: Option<u64>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn worker(id: &str) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            address: "127.0.0.1:1".into(),
            device_kind: String::new(),
            memory_bytes: 0,
            flops_per_second: 0.0,
            cores: 0.0,
            host: String::new(),
            job: 0,
        }
    }

    /// A worker registering again under its id (a process restarted in place) is not
    /// streaming until it opens its own stream: nothing is assigned down the earlier
    /// process's stream, which may not look closed yet.
    #[tokio::test]
    async fn a_registration_drops_the_earlier_stream() {
        let (m, _) = Actor::spawn(None, Membership, crate::clock::Clock::wall())
            .await
            .unwrap();
        let register = |m: &ActorRef<MembershipMsg>| {
            let m = m.clone();
            async move {
                ractor::call!(m, MembershipMsg::Register, worker("w"))
                    .unwrap()
                    .unwrap()
            }
        };
        let assign = |m: &ActorRef<MembershipMsg>| {
            let m = m.clone();
            async move {
                let a = Box::new(pb::Assignment::default());
                ractor::call!(m, MembershipMsg::Assign, "w".to_string(), a).unwrap()
            }
        };
        let live = |m: &ActorRef<MembershipMsg>| {
            let m = m.clone();
            async move { ractor::call!(m, MembershipMsg::Live).unwrap() }
        };
        register(&m).await;
        let mut first = ractor::call!(m, MembershipMsg::OpenStream, "w".to_string())
            .unwrap()
            .unwrap();
        let before = live(&m).await;
        assert!(before[0].streaming);
        register(&m).await;
        let again = live(&m).await;
        assert!(!again[0].streaming, "{again:?}");
        assert!(
            again[0].worker.incarnation > before[0].worker.incarnation,
            "{again:?}"
        );
        // Nothing goes down the earlier stream.
        assert!(assign(&m).await.is_err());
        assert!(first.try_recv().is_err());
        let mut second = ractor::call!(m, MembershipMsg::OpenStream, "w".to_string())
            .unwrap()
            .unwrap();
        assign(&m).await.unwrap();
        assert!(second.try_recv().is_ok());
        m.stop(None);
    }

    /// An aborted run is pushed down its workers' streams (they need not wait for a
    /// heartbeat), and a worker that leaves is forgotten at once.
    #[tokio::test]
    async fn aborts_are_pushed_and_a_leaving_worker_is_forgotten() {
        let (m, _) = Actor::spawn(None, Membership, crate::clock::Clock::wall())
            .await
            .unwrap();
        ractor::call!(m, MembershipMsg::Register, worker("w"))
            .unwrap()
            .unwrap();
        let mut stream = ractor::call!(m, MembershipMsg::OpenStream, "w".to_string())
            .unwrap()
            .unwrap();
        let a = Box::new(pb::Assignment {
            run: 7,
            ..Default::default()
        });
        ractor::call!(m, MembershipMsg::Assign, "w".to_string(), a)
            .unwrap()
            .unwrap();
        assert!(!stream.recv().await.unwrap().abandon);
        m.cast(MembershipMsg::Abort(7)).unwrap();
        let pushed = stream.recv().await.unwrap();
        assert!(pushed.abandon && pushed.run == 7, "{pushed:?}");
        ractor::call!(m, MembershipMsg::Leave, "w".to_string(), 7).unwrap();
        assert_eq!(ractor::call!(m, MembershipMsg::Live).unwrap(), []);
        // Its stream is gone with it.
        assert!(stream.recv().await.is_none());
        m.stop(None);
    }
}
