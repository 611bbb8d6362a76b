//! The membership actor: worker registrations and heartbeats, who is alive, the workers'
//! assignment streams, and the routing of their step reports to the job that runs them.
//! Run actors that follow it are told of every registration, stream, heartbeat, loss and
//! leave. A run aborted is pushed down its workers' assignment streams too, so they abandon
//! it without waiting for their next heartbeat.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use pipewise_proto::v1 as pb;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc;
use tokio::time::Instant;

use pipewise_common::run::supervisor::{Input, Taken};

use crate::error::{CoordinatorError, Result};
use crate::run_msg::RunMsg;

/// Heartbeat interval handed to workers.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// A worker silent for this many intervals is considered dead.
pub const MISSED_HEARTBEATS: u32 = 4;

/// A worker silent this long is forgotten (a lost one is noticed after
/// [`MISSED_HEARTBEATS`] intervals; this only bounds the registry).
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

/// What the coordinator knows about a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerInfo {
    /// Worker id (unique per process).
    pub id: String,
    /// Address of its activation service.
    pub address: String,
    /// `cpu`, `cuda`, …
    pub device_kind: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// Its start-up profile's FLOP/s (0: not measured).
    pub flops_per_second: f64,
    /// Cores it may count on (0: not known).
    pub cores: f64,
    /// Last sign of life.
    pub last_seen: Instant,
    /// Activation bytes held now (last heartbeat).
    pub current_activation_bytes: u64,
    /// Peak activation bytes (last heartbeat).
    pub peak_activation_bytes: u64,
    /// Last step the worker reported.
    pub step: u64,
    /// Whether its assignment stream is open.
    pub streaming: bool,
    /// The job (run) it said it was running in its last heartbeat (0: none).
    pub job: u64,
    /// Which registration this is, counted by the membership actor over every id: a process
    /// that registers under a known id (a restarted pod under its old name) is a later one,
    /// so a run holding the earlier one has lost that worker.
    pub incarnation: u64,
    /// The job whose workers it is (0: idle): jobs run on disjoint workers.
    pub claimed: u64,
}

impl WorkerInfo {
    /// The worker as a run sees it.
    pub fn worker(&self) -> pipewise_common::run::Worker {
        pipewise_common::run::Worker {
            id: self.id.clone(),
            address: self.address.clone(),
            memory_bytes: self.memory_bytes,
            incarnation: self.incarnation,
            // Both checked finite and ≥ 0 at registration; `as` saturates.
            flops_per_second: self.flops_per_second as u64,
            millicores: (self.cores * 1000.0) as u32,
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
    /// Peak activation bytes.
    pub peak_activation_bytes: u64,
    /// Last step done.
    pub step: u64,
    /// The job the worker is running (0: none).
    pub job: u64,
}

/// The membership actor.
pub struct Membership;

/// The membership actor's state.
#[derive(Default)]
pub struct MembershipState {
    workers: BTreeMap<String, WorkerInfo>,
    streams: HashMap<String, mpsc::Sender<pb::Assignment>>,
    /// worker id → the run it was last assigned, its replica and its index there.
    assigned: HashMap<String, (u64, u32, u32)>,
    /// worker id → the job holding it (from the job's claim until it ends).
    claims: HashMap<String, u64>,
    /// run → the run actor its workers' step reports go to.
    sinks: HashMap<u64, ActorRef<RunMsg>>,
    /// job → its run actor, told of every registration, stream, heartbeat and loss.
    followers: HashMap<u64, ActorRef<RunMsg>>,
    /// Workers a follower was told it lost (told again of them if they come back).
    lost: HashSet<String>,
    /// Workers whose assignment stream was open at the last tick.
    open: HashSet<String>,
    /// Jobs whose workers stop at the next step boundary (answered in `StepAck`).
    stopping: HashSet<u64>,
    /// Jobs whose workers abandon them at once (answered in heartbeats).
    aborted: HashSet<u64>,
    /// Registrations so far (the last one's [`WorkerInfo::incarnation`]).
    registrations: u64,
    /// Every run this coordinator started (attached). A worker still running another one
    /// runs it for an earlier coordinator (this one restarted since, and runs that job again
    /// under new run ids if it resumes it): heartbeats and step reports tell it to abandon
    /// that run at once, so it writes nothing more for it.
    started: HashSet<u64>,
}

impl MembershipState {
    /// Tells every run actor `input`.
    fn push(&self, input: &Input) {
        for follower in self.followers.values() {
            let _ = follower.cast(RunMsg::Input(Box::new(input.clone())));
        }
    }

    /// The workers alive at `now`.
    fn live(&self, now: Instant) -> Vec<WorkerInfo> {
        let deadline = HEARTBEAT_INTERVAL * MISSED_HEARTBEATS;
        self.workers
            .values()
            .filter(|w| now.duration_since(w.last_seen) <= deadline)
            .map(|w| WorkerInfo {
                streaming: self.streams.get(&w.id).is_some_and(|tx| !tx.is_closed()),
                claimed: self.claims.get(&w.id).copied().unwrap_or(0),
                ..w.clone()
            })
            .collect()
    }

    /// Makes `ids` job `job`'s workers, and only those (its earlier ones go back), unless
    /// another job holds one of them; every run actor hears of each change.
    fn claim(&mut self, job: u64, ids: &[String]) -> std::result::Result<(), Taken> {
        let taken: Vec<(String, u64)> = ids
            .iter()
            .filter_map(|id| match self.claims.get(id) {
                Some(&other) if other != job => Some((id.clone(), other)),
                _ => None,
            })
            .collect();
        if !taken.is_empty() {
            return Err(Taken(taken));
        }
        self.release(job, ids);
        for id in ids {
            if self.claims.insert(id.clone(), job) != Some(job) {
                self.push(&Input::Claimed {
                    id: id.clone(),
                    job,
                });
            }
        }
        Ok(())
    }

    /// Tells every run actor which job holds worker `id`, if one does (a worker that comes
    /// back is a new member of their pools, held as before).
    fn push_claim(&self, id: &str) {
        if let Some(&job) = self.claims.get(id) {
            self.push(&Input::Claimed {
                id: id.to_string(),
                job,
            });
        }
    }

    /// Job `job`'s workers other than `keep` go back (are idle again).
    fn release(&mut self, job: u64, keep: &[String]) {
        let gone: Vec<String> = self
            .claims
            .iter()
            .filter(|(id, j)| **j == job && !keep.contains(id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.claims.remove(&id);
            self.push(&Input::Claimed { id, job: 0 });
        }
    }

    /// Tells the workers assigned run `job` down their assignment streams to abandon it
    /// now (their heartbeat replies say so too, up to an interval later).
    fn push_abandon(&self, job: u64) {
        for (id, _) in self.assigned.iter().filter(|(_, (run, ..))| *run == job) {
            if let Some(tx) = self.streams.get(id) {
                let abandon = pb::Assignment {
                    run: job,
                    abandon: true,
                    ..Default::default()
                };
                // A full or closed stream leaves it to the heartbeat reply.
                let _ = tx.try_send(abandon);
            }
        }
    }

    /// Whether the workers of run `job` should abandon it now: it was aborted, or it is
    /// not one this coordinator started (0 is no run).
    fn abandon(&self, job: u64) -> bool {
        job != 0 && (self.aborted.contains(&job) || !self.started.contains(&job))
    }
}

/// Messages of the membership actor.
pub enum MembershipMsg {
    /// A worker registers (again); replies with the heartbeat interval, or refuses an id a
    /// live worker at another address holds.
    Register(WorkerInfo, RpcReplyPort<Result<Duration>>),
    /// A heartbeat; replies whether the worker is known (else it must register).
    Heartbeat(Heartbeat, RpcReplyPort<HeartbeatAnswer>),
    /// The workers alive now.
    Live(RpcReplyPort<Vec<WorkerInfo>>),
    /// A registered worker opens its assignment stream (replacing an older one).
    OpenStream(String, RpcReplyPort<Result<mpsc::Receiver<pb::Assignment>>>),
    /// Sends an assignment down a worker's stream.
    Assign(String, Box<pb::Assignment>, RpcReplyPort<Result<()>>),
    /// Routes the step reports of a run to its run actor.
    Attach(u64, ActorRef<RunMsg>),
    /// A job's run actor follows the workers from now on; replies the workers alive now.
    Follow(u64, ActorRef<RunMsg>, RpcReplyPort<Vec<WorkerInfo>>),
    /// The job's run actor is done: its workers go back.
    Unfollow(u64),
    /// Makes these workers the job's (and only these), unless another job holds one;
    /// replies why not.
    Claim(
        u64,
        Vec<String>,
        RpcReplyPort<std::result::Result<(), Taken>>,
    ),
    /// A worker's step report; replies what its run must do.
    Report(Box<pb::StepReport>, RpcReplyPort<ReportAnswer>),
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
    /// Publish liveness metrics (on an interval).
    Tick,
}

impl MembershipState {
    /// Forgets the workers silent for [`FORGET_AFTER`] at `now` (they register again if
    /// they come back), so registrations under ever new ids do not pile up.
    fn forget_silent(&mut self, now: Instant) {
        self.workers.retain(|id, w| {
            let keep = now.duration_since(w.last_seen) < FORGET_AFTER;
            if !keep {
                tracing::info!(worker = %id, "worker forgotten after {} s of silence", FORGET_AFTER.as_secs());
            }
            keep
        });
        let workers = &self.workers;
        self.assigned.retain(|id, _| workers.contains_key(id));
        self.claims.retain(|id, _| workers.contains_key(id));
        self.streams.retain(|id, _| workers.contains_key(id));
    }
}

impl Actor for Membership {
    type Msg = MembershipMsg;
    type State = MembershipState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _args: (),
    ) -> std::result::Result<Self::State, ActorProcessingErr> {
        myself.send_interval(Duration::from_secs(1), || MembershipMsg::Tick);
        Ok(MembershipState::default())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match msg {
            MembershipMsg::Register(mut info, reply) => {
                let streaming = st.streams.get(&info.id).is_some_and(|tx| !tx.is_closed());
                let deadline = HEARTBEAT_INTERVAL * MISSED_HEARTBEATS;
                let now = Instant::now();
                // Another process under a live worker's id would take its place and its
                // assignments (the coordinator's own restart, or the same worker coming back
                // at its address or after its stream closed, registers again as usual).
                if let Some(old) = st.workers.get(&info.id)
                    && old.address != info.address
                    && streaming
                    && now.duration_since(old.last_seen) <= deadline
                {
                    tracing::warn!(
                        worker = %info.id,
                        address = %info.address,
                        holder = %old.address,
                        "registration refused: the id is in use"
                    );
                    let _ = reply.send(Err(CoordinatorError::InUse {
                        id: info.id,
                        address: old.address.clone(),
                        ago_s: now.duration_since(old.last_seen).as_secs_f64(),
                    }));
                    return Ok(());
                }
                st.registrations += 1;
                info.incarnation = st.registrations;
                // A registration starts afresh: the process opens its own stream next. An
                // earlier process's stream may not look closed yet, and an assignment sent
                // down it would be lost (the run then waited for that worker until the
                // peers' frame timeout).
                st.streams.remove(&info.id);
                if let Some(old) = st.workers.get(&info.id) {
                    // The earlier process under this id is gone (or never to be heard of
                    // again): a run holding it sees a lost worker (its supervisor).
                    tracing::info!(
                        worker = %info.id,
                        address = %info.address,
                        was = %old.address,
                        "worker registered again (a new process under a known id)"
                    );
                } else {
                    tracing::info!(worker = %info.id, address = %info.address, "worker registered");
                }
                info.streaming = false;
                st.lost.remove(&info.id);
                st.open.remove(&info.id);
                st.push(&Input::Registered(info.worker()));
                st.push_claim(&info.id);
                st.workers.insert(info.id.clone(), info);
                let _ = reply.send(Ok(HEARTBEAT_INTERVAL));
            }
            MembershipMsg::Heartbeat(beat, reply) => {
                let known = match st.workers.get_mut(&beat.id) {
                    Some(w) => {
                        w.last_seen = Instant::now();
                        w.current_activation_bytes = beat.current_activation_bytes;
                        w.peak_activation_bytes = beat.peak_activation_bytes;
                        w.step = beat.step;
                        w.job = beat.job;
                        true
                    }
                    None => false,
                };
                if known {
                    if st.lost.remove(&beat.id)
                        && let Some(w) = st.workers.get(&beat.id)
                    {
                        // Back after it was reported lost: a worker again.
                        st.push(&Input::Registered(w.worker()));
                        st.push_claim(&beat.id);
                        if st.open.contains(&beat.id) {
                            st.push(&Input::StreamOpened(beat.id.clone()));
                        }
                    }
                    st.push(&Input::Heartbeat {
                        id: beat.id.clone(),
                        run: beat.job,
                    });
                }
                let abort = Some(beat.job).filter(|&job| st.abandon(job));
                let _ = reply.send(HeartbeatAnswer { known, abort });
            }
            MembershipMsg::Live(reply) => {
                let _ = reply.send(st.live(Instant::now()));
            }
            MembershipMsg::Follow(job, follower, reply) => {
                st.followers.insert(job, follower);
                let _ = reply.send(st.live(Instant::now()));
            }
            MembershipMsg::Unfollow(job) => {
                st.followers.remove(&job);
                st.release(job, &[]);
            }
            MembershipMsg::Claim(job, ids, reply) => {
                let _ = reply.send(st.claim(job, &ids));
            }
            MembershipMsg::OpenStream(id, reply) => {
                if st.workers.contains_key(&id) {
                    let (tx, rx) = mpsc::channel(16);
                    st.streams.insert(id.clone(), tx);
                    if let Some(w) = st.workers.get_mut(&id) {
                        w.streaming = true;
                    }
                    st.open.insert(id.clone());
                    st.push(&Input::StreamOpened(id));
                    let _ = reply.send(Ok(rx));
                } else {
                    let _ = reply.send(Err(CoordinatorError::BadRequest {
                        field: "WorkerId.id",
                        reason: format!("worker {id:?} is not registered; call Register first"),
                    }));
                }
            }
            MembershipMsg::Assign(id, assignment, reply) => {
                let (job, replica, index) =
                    (assignment.run, assignment.replica, assignment.worker_index);
                let outcome = match st.streams.get(&id) {
                    Some(tx) => tx.try_send(*assignment).map_err(|e| {
                        CoordinatorError::Actor(format!(
                            "cannot hand worker {id} its assignment: {e}"
                        ))
                    }),
                    None => Err(CoordinatorError::Actor(format!(
                        "worker {id} has no open assignment stream"
                    ))),
                };
                if outcome.is_ok() {
                    let limit = st.workers.get(&id).map_or(0, |w| w.memory_bytes);
                    st.assigned.insert(id, (job, replica, index));
                    // A worker starts its assignment holding no activations; heartbeats
                    // (sampled every tick) update it from there.
                    crate::metrics::record_worker_memory(job, replica, index, 0, limit);
                }
                let _ = reply.send(outcome);
            }
            MembershipMsg::Attach(job, sink) => {
                st.started.insert(job);
                st.sinks.insert(job, sink);
            }
            MembershipMsg::Report(report, reply) => {
                let job = report.run;
                // An abandoned run ends at once and writes nothing more (a graceful stop
                // would save a checkpoint and final parameters for a run nobody follows).
                let abort = st.abandon(job);
                let stop = !abort && st.stopping.contains(&job);
                if let Some(sink) = st.sinks.get(&job)
                    && sink.cast(RunMsg::Report(report)).is_err()
                {
                    st.sinks.remove(&job);
                }
                let _ = reply.send(ReportAnswer { stop, abort });
            }
            MembershipMsg::Stop(job) => {
                st.stopping.insert(job);
            }
            MembershipMsg::Abort(job) => {
                st.aborted.insert(job);
                st.push_abandon(job);
            }
            MembershipMsg::Leave(id, run, reply) => {
                if st.workers.remove(&id).is_some() {
                    tracing::info!(worker = %id, run, "worker left");
                    st.streams.remove(&id);
                    st.open.remove(&id);
                    st.assigned.remove(&id);
                    st.claims.remove(&id);
                    st.lost.remove(&id);
                    st.push(&Input::Left(id));
                } else {
                    tracing::info!(worker = %id, "an unknown worker left");
                }
                let _ = reply.send(());
            }
            MembershipMsg::Detach(job) => {
                st.sinks.remove(&job);
            }
            MembershipMsg::Tick => {
                let deadline = HEARTBEAT_INTERVAL * MISSED_HEARTBEATS;
                let now = Instant::now();
                st.forget_silent(now);
                // Losses and closed streams, told once each.
                let gone: Vec<String> = st
                    .workers
                    .values()
                    .filter(|w| {
                        now.duration_since(w.last_seen) > deadline && !st.lost.contains(&w.id)
                    })
                    .map(|w| w.id.clone())
                    .collect();
                for id in gone {
                    st.push(&Input::Lost(id.clone()));
                    st.lost.insert(id);
                }
                let closed: Vec<String> = st
                    .open
                    .iter()
                    .filter(|id| st.streams.get(*id).is_none_or(|tx| tx.is_closed()))
                    .cloned()
                    .collect();
                for id in closed {
                    st.open.remove(&id);
                    st.push(&Input::StreamClosed(id));
                }
                let ages: Vec<(String, f64)> = st
                    .workers
                    .values()
                    .map(|w| (w.id.clone(), now.duration_since(w.last_seen).as_secs_f64()))
                    .collect();
                let up = ages
                    .iter()
                    .filter(|(_, age)| *age <= deadline.as_secs_f64())
                    .count();
                crate::metrics::record_liveness(&ages, up);
                let live = st.live(now);
                let busy = live.iter().filter(|w| w.claimed != 0).count();
                crate::metrics::record_workers(live.len() - busy, busy);
                crate::metrics::refresh();
                // Only the workers of a run still followed: a finished run's indices are
                // left to the exporter's expiry.
                for w in st.workers.values() {
                    if let Some(&(run, replica, index)) = st.assigned.get(&w.id)
                        && st.sinks.contains_key(&run)
                    {
                        let (bytes, limit) = (w.current_activation_bytes, w.memory_bytes);
                        crate::metrics::record_worker_memory(run, replica, index, bytes, limit);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The membership's answer to a step report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportAnswer {
    /// Stop at the next step boundary (a cancel, or a re-plan between steps).
    pub stop: bool,
    /// Abandon the run now: it was aborted, or this coordinator did not start it.
    pub abort: bool,
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

    fn worker(id: &str, last_seen: Instant) -> WorkerInfo {
        WorkerInfo {
            id: id.into(),
            address: "127.0.0.1:1".into(),
            device_kind: String::new(),
            memory_bytes: 0,
            flops_per_second: 0.0,
            cores: 0.0,
            last_seen,
            current_activation_bytes: 0,
            peak_activation_bytes: 0,
            step: 0,
            streaming: false,
            job: 0,
            incarnation: 0,
            claimed: 0,
        }
    }

    /// A worker registering again under its id (a process restarted in place) is not
    /// streaming until it opens its own stream: nothing is assigned down the earlier
    /// process's stream, which may not look closed yet.
    #[tokio::test]
    async fn a_registration_drops_the_earlier_stream() {
        let (m, _) = Actor::spawn(None, Membership, ()).await.unwrap();
        let register = |m: &ActorRef<MembershipMsg>| {
            let info = worker("w", Instant::now());
            let m = m.clone();
            async move {
                ractor::call!(m, MembershipMsg::Register, info)
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
        assert!(again[0].incarnation > before[0].incarnation, "{again:?}");
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
        let (m, _) = Actor::spawn(None, Membership, ()).await.unwrap();
        let info = worker("w", Instant::now());
        ractor::call!(m, MembershipMsg::Register, info)
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

    #[test]
    fn silent_workers_are_forgotten() {
        let now = Instant::now() + FORGET_AFTER + Duration::from_secs(1);
        let mut st = MembershipState::default();
        let recent = now - Duration::from_secs(1);
        let silent = now - FORGET_AFTER;
        for (id, seen) in [("recent", recent), ("silent", silent)] {
            st.workers.insert(id.into(), worker(id, seen));
            st.assigned.insert(id.into(), (1, 0, 0));
        }
        st.claims.insert("silent".into(), 1);
        st.forget_silent(now);
        assert_eq!(st.workers.keys().collect::<Vec<_>>(), ["recent"]);
        assert_eq!(st.assigned.keys().collect::<Vec<_>>(), ["recent"]);
        assert!(st.claims.is_empty(), "{:?}", st.claims);
    }

    /// A worker is one job's at a time: a claim naming another job's worker is refused
    /// whole, a job's new claim replaces its old one, and a job's end gives its workers
    /// back; `live` says whose each worker is.
    #[test]
    fn a_worker_is_one_jobs_at_a_time() {
        let now = Instant::now();
        let mut st = MembershipState::default();
        for id in ["a", "b", "c"] {
            st.workers.insert(id.into(), worker(id, now));
        }
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let holders = |st: &MembershipState| {
            st.live(now)
                .iter()
                .map(|w| (w.id.clone(), w.claimed))
                .collect::<Vec<_>>()
        };
        assert_eq!(st.claim(1, &ids(&["a", "b"])), Ok(()));
        assert_eq!(
            st.claim(2, &ids(&["b", "c"])),
            Err(Taken(vec![("b".into(), 1)]))
        );
        assert_eq!(
            holders(&st),
            [("a".into(), 1), ("b".into(), 1), ("c".into(), 0)]
        );
        assert_eq!(st.claim(1, &ids(&["a"])), Ok(()));
        assert_eq!(st.claim(2, &ids(&["b", "c"])), Ok(()));
        assert_eq!(
            holders(&st),
            [("a".into(), 1), ("b".into(), 2), ("c".into(), 2)]
        );
        st.release(2, &[]);
        assert_eq!(
            holders(&st),
            [("a".into(), 1), ("b".into(), 0), ("c".into(), 0)]
        );
    }
}
