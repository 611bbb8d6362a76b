//! `pipewise-harness` (dev-only): an in-process cluster for scenario tests, as raft-rs's
//! harness is to raft. The real coordinator ([`Coordinator::start_cluster`], every actor)
//! and real [`WorkerNode`]s (connection actor, reporter, assignment thread, real stages)
//! talk over loopback gRPC in one process, as `pipewise local`'s do; the test drives them
//! with switches: kill and restart a worker ([`Cluster::kill`], [`Cluster::restart`]), slow
//! a worker's passes ([`Builder::slow`]), hold every worker before a step
//! ([`Cluster::hold_before`]).
//!
//! # Time: why a scenario is deterministic on a loaded machine
//!
//! What the coordinator decides from (re-plans, moves, their step) must not depend on how
//! fast the machine runs. Tokio's paused time does not give that: the workers compute on
//! std threads and talk over sockets, and a paused clock jumps whenever the runtime is idle
//! (while a pass computes), so timers would fire at random. Instead every worker is given a
//! [`Pace`] (the one seam, `NodeConfig::pace`; processes run without one):
//!
//! - **Logical pass times.** A worker reports, for each pass, the harness's logical time
//!   (F/B/W milliseconds per piece of its stage, × its slowdown) instead of what it
//!   measured; its step's busy and wall times are their sum (and it sends no spans). The
//!   coordinator's cost fits,
//!   the straggler and drift rules and the re-plans they make are then functions of the
//!   job alone. A slowed worker sleeps no more: it only reports slower passes.
//! - **Lockstep steps.** Before step `k`, a worker waits until the coordinator answered its
//!   earlier step reports, then until the harness has seen the job's event for step `k − 1`
//!   since the run started (the run actor casts a stop it decides on that step's reports
//!   right after the event).
//!   A stop decided after step `k` thus reaches worker 0 with step `k + 1`'s report answer,
//!   before step `k + 2` starts: every worker stops after step `k + 2`, whatever the load.
//! - **Replicas' reports in order.** A worker of a replica other than the first reports a
//!   step once the first replica's reports made its event (module `order`).
//! - **Its speed.** The profile a worker registers is the pace's fixed FLOP/s.
//! - **The coordinator's clock** is logical ([`Coordinator::start_clocked`], the second
//!   seam): the registry's heartbeat expiry, the scheduler's and the supervisors' graces read
//!   it, and it stands still unless the scenario moves it ([`Cluster::advance`]), which it
//!   does in steps shorter than the heartbeat deadline, each after every running worker's
//!   next heartbeat was answered: no live worker ever expires, a killed one expires exactly
//!   when the scenario says. (The actors' timers still fire on the wall clock; they read the
//!   logical time.)
//!
//! Reports carry no spans (they are measured, and the cost model fits sync, hop and
//! gradient-sum costs from them): a harness step has no trace.
//!
//! # Writing a scenario
//!
//! ```text
//! let mut cluster = Cluster::builder("name").workers(3).slow(2, 6.0, 0).start().await;
//! let job = cluster.submit(spec).await;
//! let status = cluster.wait(job).await;            // polls with a deadline
//! let replans = cluster.replans(job);              // (step, reason) in order
//! assert_eq!(replans, [(5, "… pieces per stage [5, 6, 5] → [6, 7, 3] …".into())]);
//! cluster.shutdown().await;
//! ```
//!
//! Assert the exact sequence: the pace makes it the same on every run. Hold the workers
//! before a step ([`Cluster::hold_before`], [`Cluster::wait_held`]) to kill or restart one
//! at a known step; where the re-plan must wait for the survivors to leave their run, wait
//! too until the coordinator has heard them running it ([`Cluster::wait_running`]). Use a multi-threaded tokio runtime (`#[tokio::test(flavor =
//! "multi_thread")]`): the nodes block in places.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use pipewise_common::job::{JobSpec, layout};
use pipewise_common::pass::PassKind;
use pipewise_common::run::supervisor::Member;
use pipewise_coordinator::membership::{HEARTBEAT_INTERVAL, MISSED_HEARTBEATS, MembershipMsg};
use pipewise_coordinator::{Clock, Coordinator, Security, Unfinished};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use pipewise_worker::node::{NodeConfig, Pace, WorkerNode};
use pipewise_worker::runtime::Slowdown;
use tokio_stream::StreamExt as _;

mod grow;
mod jobs;
pub mod logs;
mod memory;
mod order;
pub mod reference;
mod status;

/// How long a scenario waits for anything (a job's end, workers at the gate) before it
/// fails: far beyond what a step of the test models takes on a loaded machine.
pub const LIMIT: Duration = Duration::from_secs(120);

/// Logical F, B and W milliseconds of one piece (a fused BW: B + W).
pub const PIECE_MS: [f64; 3] = [1.0, 2.0, 1.0];

/// The speed every worker registers (FLOP/s).
pub const FLOPS: f64 = 1e10;

/// What the gate knows.
#[derive(Debug, Default)]
struct GateState {
    /// Per job, the steps (1-based) of its events seen, in order (a step run again after
    /// a re-plan shows again).
    seen: HashMap<u64, Vec<u64>>,
    /// Per run, its first step and how many of its job's events came before it started:
    /// its later steps wait for its own events, not for those of the run before.
    runs: HashMap<u64, (u64, usize)>,
    /// No step from this one (0-based) starts.
    hold: Option<u64>,
    /// Workers waiting at the gate, and before which step.
    waiting: HashMap<String, u64>,
}

/// Where the workers wait before each step.
#[derive(Debug, Default)]
struct Gate {
    st: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.st.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut GateState)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }
}

/// One worker's pace (see the [crate docs](crate)).
#[derive(Debug)]
struct WorkerPace {
    id: String,
    gate: Arc<Gate>,
    /// Killed: its assignment thread waits for nothing more.
    killed: AtomicBool,
    /// Its heartbeats answered.
    beats: AtomicU64,
}

impl Pace for WorkerPace {
    fn before_step(&self, run: u64, step: u64) {
        let job = layout::job_of(run);
        let deadline = Instant::now() + LIMIT;
        let mut st = self.gate.lock();
        st.waiting.insert(self.id.clone(), step);
        self.gate.changed.notify_all();
        loop {
            let before = st.seen.get(&job).map_or(0, Vec::len);
            let (first, since) = *st.runs.entry(run).or_insert((step, before));
            let seen = step == first
                || st
                    .seen
                    .get(&job)
                    .is_some_and(|steps| steps[since..].contains(&step));
            let held = st.hold.is_some_and(|h| step >= h);
            if (seen && !held) || self.killed.load(Ordering::SeqCst) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                eprintln!("harness: {} went on to step {step} unreleased", self.id);
                break;
            }
            st = self
                .gate
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        st.waiting.remove(&self.id);
        self.gate.changed.notify_all();
    }

    fn before_report(&self, run: u64, step: u64, replica: u32) {
        order::after_the_first_replica(self, run, step, replica);
    }

    fn pass_secs(&self, kind: PassKind, pieces: usize, slowdown: f64) -> f64 {
        let [f, b, w] = PIECE_MS;
        let ms = match kind {
            PassKind::F => f,
            PassKind::B => b,
            PassKind::W => w,
            PassKind::BW => b + w,
        };
        ms * pieces as f64 * slowdown / 1e3
    }

    fn flops_per_second(&self) -> f64 {
        FLOPS
    }

    fn heartbeat_answered(&self) {
        self.beats.fetch_add(1, Ordering::SeqCst);
    }

    fn heartbeat_interval(&self, _given: Duration) -> Duration {
        BEAT_EVERY
    }
}

/// How a [`Cluster`] starts.
#[derive(Debug)]
pub struct Builder {
    name: String,
    workers: usize,
    own_data_dirs: bool,
    slow: Vec<(usize, Slowdown)>,
    memory: Vec<(usize, memory::Memory)>,
}

impl Builder {
    /// `n` workers (`w0`, `w1`, …; default 2).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n;
        self
    }

    /// Every worker gets its own data directory (none shared with the coordinator or
    /// another worker, as on separate hosts): the coordinator sees no checkpoint.
    pub fn own_data_dirs(mut self) -> Self {
        self.own_data_dirs = true;
        self
    }

    /// Worker `w`'s passes take `factor` times as long from step `from_step` on.
    pub fn slow(mut self, w: usize, factor: f64, from_step: u64) -> Self {
        self.slow.push((w, Slowdown { factor, from_step }));
        self
    }

    /// Starts the coordinator and the workers.
    pub async fn start(self) -> Cluster {
        let dir = std::env::temp_dir().join(format!(
            "pipewise-harness-{}-{}",
            self.name,
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let data = dir.join("coordinator");
        std::fs::create_dir_all(&data).expect("the harness's directory");
        let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let clock = Clock::logical();
        let security = Security::default();
        let coordinator =
            Coordinator::start_clocked(loopback, &data, Unfinished::Fail, &security, clock.clone())
                .await
                .expect("the coordinator starts");
        let url = format!("http://{}", coordinator.addr);
        let channel = tonic::transport::Endpoint::from_shared(url.clone())
            .expect("the coordinator's URL")
            .connect()
            .await
            .expect("the coordinator answers");
        let gate = Arc::new(Gate::default());
        let mut cluster = Cluster {
            coordinator: Some(coordinator),
            client: JobServiceClient::new(channel),
            clock,
            dir,
            gate,
            workers: Vec::new(),
            events: Arc::new(Mutex::new(HashMap::new())),
            watches: HashMap::new(),
        };
        for w in 0..self.workers {
            let id = format!("w{w}");
            let mut config = NodeConfig::new(url.clone(), id.clone());
            config.data_dir = if self.own_data_dirs {
                cluster.dir.join(&id)
            } else {
                data.clone()
            };
            std::fs::create_dir_all(&config.data_dir).expect("a worker's directory");
            config.cores = 1.0;
            config.connect_for = LIMIT;
            config.timeout = LIMIT;
            if let Some((_, slowdown)) = self.slow.iter().find(|(i, _)| *i == w) {
                config.slowdown = *slowdown;
            }
            if let Some((_, memory)) = self.memory.iter().find(|(i, _)| *i == w) {
                memory.apply(&mut config);
            }
            let pace = Arc::new(WorkerPace {
                id,
                gate: Arc::clone(&cluster.gate),
                killed: AtomicBool::new(false),
                beats: AtomicU64::new(0),
            });
            config.pace = Some(Arc::clone(&pace) as Arc<dyn Pace>);
            let node = WorkerNode::start(config.clone())
                .await
                .expect("a worker starts");
            cluster.workers.push(Slot {
                config,
                pace,
                node: Some(node),
            });
        }
        cluster
    }
}

/// A worker of the cluster: how it starts, and its node while it runs.
struct Slot {
    config: NodeConfig,
    pace: Arc<WorkerPace>,
    node: Option<WorkerNode>,
}

/// The step events of every job watched, by job.
type Events = Arc<Mutex<HashMap<u64, Vec<pb::StepEvent>>>>;

/// A coordinator and its workers in this process (see the [crate docs](crate)).
pub struct Cluster {
    coordinator: Option<Coordinator>,
    client: JobServiceClient<tonic::transport::Channel>,
    clock: Clock,
    dir: PathBuf,
    gate: Arc<Gate>,
    workers: Vec<Slot>,
    events: Events,
    /// The watches of the jobs submitted, until they end.
    watches: HashMap<u64, tokio::task::JoinHandle<()>>,
}

impl Cluster {
    /// A cluster named `name` (its directory's name), to be started.
    pub fn builder(name: &str) -> Builder {
        Builder {
            name: name.into(),
            workers: 2,
            own_data_dirs: false,
            slow: Vec::new(),
            memory: Vec::new(),
        }
    }

    /// The cluster's directory (the coordinator's data under `coordinator/`, the workers'
    /// own under `w0/`, … where they have their own).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directories, the coordinator's first.
    pub fn data_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.dir.join("coordinator")];
        for slot in &self.workers {
            if !dirs.contains(&slot.config.data_dir) {
                dirs.push(slot.config.data_dir.clone());
            }
        }
        dirs
    }

    fn coordinator(&self) -> &Coordinator {
        self.coordinator.as_ref().expect("the coordinator runs")
    }

    /// Submits `spec` and watches its steps (which the workers' steps wait for); its id.
    pub async fn submit(&mut self, spec: JobSpec) -> u64 {
        let id = self
            .coordinator()
            .submit(spec)
            .await
            .expect("the job is taken")
            .id;
        let mut stream = self
            .client
            .watch_job(pb::JobId { id })
            .await
            .expect("the job is watched")
            .into_inner();
        let (events, gate) = (Arc::clone(&self.events), Arc::clone(&self.gate));
        let watch = tokio::spawn(async move {
            while let Some(Ok(e)) = stream.next().await {
                let (job, step) = (e.job, e.step);
                lock(&events).entry(job).or_default().push(e);
                gate.update(|st| {
                    st.seen.entry(job).or_default().push(step);
                });
            }
        });
        self.watches.insert(id, watch);
        id
    }

    /// Waits until `job` ended and its watch saw every event; its status.
    pub async fn wait(&mut self, job: u64) -> pb::JobStatus {
        let deadline = Instant::now() + LIMIT;
        if let Some(watch) = self.watches.remove(&job) {
            let ended = tokio::time::timeout(LIMIT, watch).await;
            assert!(ended.is_ok(), "job {job}'s events never ended");
        }
        loop {
            let status = self
                .client
                .get_job(pb::JobId { id: job })
                .await
                .expect("the job's status")
                .into_inner();
            let ended = [
                pb::JobState::Succeeded,
                pb::JobState::Failed,
                pb::JobState::Cancelled,
            ]
            .iter()
            .any(|s| *s as i32 == status.state);
            if ended {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "job {job} still runs: {status:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// The step events of `job` seen so far, in order.
    pub fn events(&self, job: u64) -> Vec<pb::StepEvent> {
        lock(&self.events).get(&job).cloned().unwrap_or_default()
    }

    /// The re-plans of `job` so far: the step (1-based) of the event that first ran on the
    /// new plan, and why.
    pub fn replans(&self, job: u64) -> Vec<(u64, String)> {
        self.events(job)
            .into_iter()
            .filter(|e| !e.replan_reason.is_empty())
            .map(|e| (e.step, e.replan_reason))
            .collect()
    }

    /// The losses of `job`'s steps, by step (1-based; a step run twice shows twice).
    pub fn losses(&self, job: u64) -> Vec<(u64, f64)> {
        self.events(job)
            .into_iter()
            .map(|e| (e.step, e.loss))
            .collect()
    }

    /// The coordinator's logical time (milliseconds).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Moves the coordinator's logical clock `ms` on, in steps of half the heartbeat
    /// deadline at most, each followed by two heartbeats answered of every running worker
    /// (the first may have left before the step): running workers stay live, a killed one
    /// is lost once its silence passes [`HEARTBEAT_INTERVAL`] × [`MISSED_HEARTBEATS`].
    pub async fn advance(&self, ms: u64) {
        let most = HEARTBEAT_INTERVAL.as_millis() as u64 * u64::from(MISSED_HEARTBEATS) / 2;
        let mut left = ms;
        while left > 0 {
            let step = left.min(most);
            self.clock.advance(step);
            left -= step;
            let running: Vec<(&WorkerPace, u64)> = self
                .workers
                .iter()
                .filter(|slot| slot.node.is_some())
                .map(|slot| (&*slot.pace, slot.pace.beats.load(Ordering::SeqCst)))
                .collect();
            let deadline = Instant::now() + LIMIT;
            while running
                .iter()
                .any(|(pace, at)| pace.beats.load(Ordering::SeqCst) < at + 2)
            {
                assert!(Instant::now() < deadline, "no heartbeats answered");
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// Moves the coordinator's clock past the heartbeat deadline: a worker killed before
    /// is lost.
    pub async fn expire(&self) {
        let deadline = HEARTBEAT_INTERVAL.as_millis() as u64 * u64::from(MISSED_HEARTBEATS);
        self.advance(deadline + 1).await;
    }

    /// No worker starts step `step` (0-based) or later until [`Cluster::release`].
    pub fn hold_before(&self, step: u64) {
        self.gate.update(|st| st.hold = Some(step));
    }

    /// Lets the workers held by [`Cluster::hold_before`] go on.
    pub fn release(&self) {
        self.gate.update(|st| st.hold = None);
    }

    /// Waits until the workers `ids` all wait before step `step` (0-based).
    pub async fn wait_held(&self, ids: &[&str], step: u64) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let held = {
                let st = self.gate.lock();
                ids.iter().all(|id| st.waiting.get(*id) == Some(&step))
            };
            if held {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "workers {ids:?} not held before step {step}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills worker `w`: it stops heartbeating and reporting, its run is aborted (its
    /// peers' transfers fail), without leaving the cluster; returns once the coordinator saw
    /// its assignment stream close. The coordinator loses it once its clock passes the
    /// heartbeat deadline ([`Cluster::expire`]).
    pub async fn kill(&mut self, w: usize) {
        let slot = &mut self.workers[w];
        slot.pace.killed.store(true, Ordering::SeqCst);
        let id = slot.config.id.clone();
        self.gate.update(|_| {});
        if let Some(node) = slot.node.take() {
            node.kill().await;
        }
        self.wait_members(&format!("{id}'s stream to close"), |live| {
            !live.iter().any(|m| m.worker.id == id && m.streaming)
        })
        .await;
    }

    /// Waits until the coordinator's live workers pass `check`.
    async fn wait_members(&self, what: &str, check: impl Fn(&[Member]) -> bool) {
        let deadline = Instant::now() + LIMIT;
        let membership = &self.coordinator().membership;
        loop {
            let live = ractor::call!(membership, MembershipMsg::Live).expect("the live workers");
            if check(&live) {
                return;
            }
            assert!(Instant::now() < deadline, "waited in vain for {what}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the coordinator has seen each of the workers `ids` running `job` (a
    /// heartbeat naming its run). Heartbeats go out on the wall clock, so a run younger than
    /// an interval may still look idle to the coordinator; a loss decided then would not
    /// wait for the survivors to leave the run, and what the re-plan finds would hang on
    /// the machine's speed.
    pub async fn wait_running(&self, ids: &[&str], job: u64) {
        self.wait_members(&format!("{ids:?} seen running job {job}"), |live| {
            ids.iter().all(|id| {
                live.iter().any(|m| {
                    m.worker.id == *id && m.running != 0 && layout::job_of(m.running) == job
                })
            })
        })
        .await;
    }

    /// The address worker `w` registered (its activation service), while it runs.
    pub fn address(&self, w: usize) -> Option<String> {
        self.workers[w]
            .node
            .as_ref()
            .map(|node| node.address.clone())
    }

    /// Waits until the coordinator no longer counts worker `id` as live (a kill, then
    /// [`Cluster::expire`]).
    pub async fn wait_lost(&self, id: &str) {
        self.wait_members(&format!("{id}'s loss"), |live| {
            !live.iter().any(|m| m.worker.id == id)
        })
        .await;
    }

    /// Starts worker `w` again under its id (a new registration, on a new port: the killed
    /// node's server is not closed in process); returns once the coordinator has its
    /// assignment stream (so what a re-plan decides next may count on it).
    pub async fn restart(&mut self, w: usize) {
        let slot = &mut self.workers[w];
        assert!(slot.node.is_none(), "worker {w} runs");
        slot.pace.killed.store(false, Ordering::SeqCst);
        let id = slot.config.id.clone();
        let node = WorkerNode::start(slot.config.clone())
            .await
            .expect("the worker starts again");
        slot.node = Some(node);
        self.wait_members(&format!("{id}'s stream"), |live| {
            live.iter().any(|m| m.worker.id == id && m.streaming)
        })
        .await;
    }

    /// Waits for `job` to end and shuts the cluster down: what the job left.
    pub async fn finish(mut self, job: u64) -> Ended {
        let status = self.wait(job).await;
        let ended = Ended {
            status,
            replans: self.replans(job),
            losses: self.losses(job),
        };
        self.shutdown().await;
        ended
    }

    /// Stops the workers and the coordinator and removes the cluster's directory.
    pub async fn shutdown(mut self) {
        for slot in &self.workers {
            slot.pace.killed.store(true, Ordering::SeqCst);
        }
        self.gate.update(|_| {});
        for slot in &mut self.workers {
            if let Some(node) = slot.node.take() {
                node.shutdown().await;
            }
        }
        if let Some(coordinator) = self.coordinator.take() {
            coordinator.shutdown().await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How often [`Cluster::wait`] and [`Cluster::wait_held`] look again.
const POLL: Duration = Duration::from_millis(10);

/// The wall-clock cadence of the workers' heartbeats: the coordinator's clock is logical,
/// so a beat only has to be there when [`Cluster::advance`] waits for one, not every 500 ms.
const BEAT_EVERY: Duration = Duration::from_millis(20);

/// What an ended job left ([`Cluster::finish`]).
#[derive(Debug)]
pub struct Ended {
    /// Its final status.
    pub status: pb::JobStatus,
    /// Its re-plans: (step event's index, reason), in order.
    pub replans: Vec<(u64, String)>,
    /// Every step's loss in the order the steps ran (a step run again after a re-plan too).
    pub losses: Vec<(u64, f64)>,
}

impl Ended {
    /// Asserts the job succeeded, ran `steps` (1-based) in that order, and every step's loss
    /// equals the single device's (`reference`, from [`reference_losses`]) within 1e-5.
    pub fn assert_exact(&self, steps: &[u64], reference: &[f64]) {
        assert_eq!(
            self.status.state,
            pb::JobState::Succeeded as i32,
            "{:?}",
            self.status
        );
        let ran: Vec<u64> = self.losses.iter().map(|(s, _)| *s).collect();
        assert_eq!(ran, steps);
        for (step, loss) in &self.losses {
            let want = reference[*step as usize - 1];
            assert!((loss - want).abs() <= 1e-5, "step {step}: {loss} vs {want}");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The test model of the scenarios: `workers` workers on `schedule`, 14 layers (16 pieces),
/// small sizes, `steps` steps.
pub fn spec(workers: u32, schedule: &str, steps: u32) -> JobSpec {
    let mut spec = pipewise_common::job::example(workers, schedule);
    spec.job.name = format!("{schedule}-{workers}w");
    spec.model.hidden = 32;
    spec.model.heads = 2;
    spec.model.layers = 14;
    spec.model.seq_len = 16;
    spec.training.steps = steps;
    spec.optimizer.lr = 3e-3;
    spec
}

/// The losses of `spec` trained on one device (a single-stage trainer, the job's data):
/// what a pipelined run must reproduce, whatever its re-plans.
pub fn reference_losses(spec: &JobSpec) -> Vec<f64> {
    use pipewise_worker::job::{corpus_of, optimizer_of, sampler_of};
    let device = pipewise_worker::Device::Cpu;
    let mut trainer =
        pipewise_worker::Trainer::new(&spec.model, spec.training.seed, &device, optimizer_of(spec))
            .expect("the reference trainer");
    let corpus = corpus_of(spec).expect("the job's data");
    let sampler = sampler_of(spec);
    let n = spec.microbatches();
    (0..u64::from(spec.training.steps))
        .map(|step| {
            let batches = sampler
                .step(&corpus, step, n, &device)
                .expect("a step's batches");
            trainer.train_step(&batches).expect("a reference step").loss
        })
        .collect()
}
