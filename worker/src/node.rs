//! The worker process (`pipewise worker`): joins a coordinator, takes assignments and runs
//! them, talking to its peers directly.
//!
//! - [`Connection`] (a ractor actor): registers with the coordinator's `ClusterService`
//!   (retrying until it answers), heartbeats on the interval the coordinator gives (current
//!   and peak activation bytes, measured pass times per stage, the step), keeps the
//!   `Assignments` stream open (reopening it after a failure) and hands each assignment to
//!   the executor. A heartbeat answered with `cancel` for the running job aborts it at once.
//! - The executor: one dedicated thread (candle compute stays off the async runtime) that
//!   runs assignments one after another. For each it builds the worker's stages from the
//!   assignment's job spec and program ([`WorkerRuntime::from_program`]), points the
//!   worker's [`GrpcTransport`] at the job and its peers, joins the start barrier, and runs
//!   the steps. After every step it queues a `StepReport` for the coordinator; a reporter
//!   task sends them in order, so the coordinator is never waited on within a step.
//! - The activation service: the [`GrpcTransport`] started with the node, whose address is
//!   the one registered. Worker 0 of a job also serves the job's end-of-step collectives
//!   ([`crate::net::Collective`]); a cancel reaches the workers through it, so all of them
//!   stop at the same step.
//!
//! Checkpoints (`[checkpoint] enable_checkpoint`) and the final parameters are written to
//! the assignment's `output_dir`, which every worker must be able to write (one machine, or
//! a shared volume): `step-K/stage-S.safetensors` (parameters and optimizer state of stage
//! `S` after `K` steps; an assignment starting at step `K` > 0 resumes from them, whatever
//! partition wrote them) and
//! `final/worker-W.safetensors` (the worker's parameters under their whole-model names).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pipewise_common::job::{JobSpec, checkpoint_dir, checkpoint_file};
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::placement::Placement;
use pipewise_proto::convert::program_from_proto;
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::cluster_service_client::ClusterServiceClient;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::error::{Error, Result, with_causes};
use crate::job::{corpus_of, optimizer_of, partition_of, sampler_of};
use crate::net::{Delivery, GrpcConfig, GrpcTransport, NetSync};
use crate::runtime::{EmulatedRuntime, StepReport, WorkerRuntime};
use crate::{Device, Tensor};
use pipewise_common::job::{job_of, run_of};
use tracing::Instrument as _;

/// How a worker process starts.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The coordinator's URL (`http://host:port`).
    pub coordinator: String,
    /// Where this worker's activation service listens.
    pub listen: SocketAddr,
    /// The address peers and the coordinator reach it at (default: the bound address).
    pub advertise: Option<String>,
    /// The worker's stable name (unique in the cluster).
    pub id: String,
    /// Where stages run.
    pub device: Device,
    /// How long to wait for a peer's frame or for the other workers at a step's end.
    pub timeout: Duration,
    /// How long to keep trying to reach the coordinator at start.
    pub connect_for: Duration,
    /// Every real pass takes this many times as long (a stand-in for a slower device, to
    /// exercise straggler handling; 1: none).
    pub slowdown: f64,
    /// Device memory this worker may use, registered with the coordinator, which moves a
    /// job that overflows it to a schedule that fits (0: not said, not watched).
    pub memory_bytes: u64,
    /// Bytes the worker reports holding beyond what it computes: a stand-in for memory no
    /// plan predicts (allocator slack, other processes), to exercise the coordinator's
    /// after-a-step memory check (0: none).
    pub unplanned_bytes: u64,
}

impl NodeConfig {
    /// Defaults: listen on `127.0.0.1:0`, CPU, 120 s timeouts, 60 s to reach the coordinator.
    pub fn new(coordinator: impl Into<String>, id: impl Into<String>) -> Self {
        NodeConfig {
            coordinator: coordinator.into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise: None,
            id: id.into(),
            device: Device::Cpu,
            timeout: crate::runtime::DEFAULT_TIMEOUT,
            connect_for: Duration::from_secs(60),
            slowdown: 1.0,
            memory_bytes: 0,
            unplanned_bytes: 0,
        }
    }
}

/// Whether a repeated warning is due: the first time, then at most once every 10 s.
#[derive(Debug, Default)]
struct Throttle(Option<tokio::time::Instant>);

impl Throttle {
    fn due(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let due = self
            .0
            .is_none_or(|last| now.duration_since(last) >= Duration::from_secs(10));
        if due {
            self.0 = Some(now);
        }
        due
    }
}

fn node_error(field: &'static str, reason: String) -> Error {
    Error::InvalidArgument { field, reason }
}

/// What the heartbeat reports.
#[derive(Debug, Default, Clone)]
struct NodeStats {
    step: u64,
    current_activation_bytes: u64,
    peak_activation_bytes: u64,
    stage_times: Vec<pb::StageTimes>,
}

/// The job being run and its abort flag.
#[derive(Debug, Default)]
struct Current {
    job: Option<u64>,
}

/// Shared between the connection actor, the reporter and the executor thread.
#[derive(Debug)]
struct Shared {
    transport: Arc<GrpcTransport>,
    stats: Mutex<NodeStats>,
    current: Mutex<Current>,
}

impl Shared {
    fn stats(&self) -> std::sync::MutexGuard<'_, NodeStats> {
        self.stats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Aborts the running job if `which` picks it. The check and the abort happen under
    /// the lock the executor takes to start a job, so a job started since is never hit.
    fn abort_if(&self, which: impl Fn(u64) -> bool, why: &str) {
        let current = self.current();
        if let Some(job) = current.job.filter(|j| which(*j)) {
            tracing::warn!(
                job = job_of(job),
                run = run_of(job),
                "abandoning the job: {why}"
            );
            self.transport.abort(&format!("job {job} was {why}"));
        }
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A running worker process (see the [module docs](self)).
pub struct WorkerNode {
    /// The worker's id.
    pub id: String,
    /// The address registered for its activation service.
    pub address: String,
    connection: ActorRef<ConnMsg>,
    connection_handle: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
    executor: Option<std::thread::JoinHandle<()>>,
    assignments: Option<std::sync::mpsc::Sender<pb::Assignment>>,
}

impl WorkerNode {
    /// Starts the activation service, registers with the coordinator and begins taking
    /// assignments. Call from within a multi-threaded tokio runtime.
    pub async fn start(config: NodeConfig) -> Result<WorkerNode> {
        if config.id.trim().is_empty() {
            return Err(node_error("id", "must not be empty".into()));
        }
        let runtime = tokio::runtime::Handle::current();
        let mut net = GrpcConfig::new(0, std::iter::empty());
        net.listen = config.listen;
        net.device = config.device.clone();
        let transport = Arc::new(GrpcTransport::start_on(runtime.clone(), net)?);
        let address = config
            .advertise
            .clone()
            .unwrap_or_else(|| transport.local_addr().to_string());
        // Peers dial this address: one they could not use would fail every job later.
        crate::net::http_uri(&address).map_err(|e| node_error("advertise", e))?;
        let shared = Arc::new(Shared {
            transport,
            stats: Mutex::new(NodeStats::default()),
            current: Mutex::new(Current::default()),
        });
        let channel = connect(&config.coordinator, config.connect_for).await?;
        // An assignment carries the worker's whole program (up to millions of passes).
        let client = ClusterServiceClient::new(channel)
            .max_decoding_message_size(ASSIGNMENT_LIMIT)
            .max_encoding_message_size(ASSIGNMENT_LIMIT);
        let (report_tx, report_rx) = mpsc::unbounded_channel::<pb::StepReport>();
        tokio::spawn(reporter(client.clone(), report_rx, Arc::clone(&shared)));
        let (assign_tx, assign_rx) = std::sync::mpsc::channel::<pb::Assignment>();
        let executor = {
            let shared = Arc::clone(&shared);
            let config = config.clone();
            std::thread::Builder::new()
                .name(format!("pipewise-exec-{}", config.id))
                .spawn(move || executor_loop(&config, &shared, &assign_rx, &report_tx))
                .map_err(|e| node_error("executor", format!("cannot start its thread: {e}")))?
        };
        let (connection, connection_handle) = Actor::spawn(
            None,
            Connection,
            ConnArgs {
                client,
                id: config.id.clone(),
                address: address.clone(),
                device_kind: device_kind(&config.device).into(),
                memory_bytes: config.memory_bytes,
                shared: Arc::clone(&shared),
                assignments: assign_tx.clone(),
            },
        )
        .await
        .map_err(|e| match e {
            // Registration failed: the coordinator's reason, not the actor's wrapping.
            ractor::SpawnErr::StartupFailed(why) => Error::Coordinator(why.to_string()),
            other => Error::Coordinator(other.to_string()),
        })?;
        Ok(WorkerNode {
            id: config.id,
            address,
            connection,
            connection_handle,
            shared,
            executor: Some(executor),
            assignments: Some(assign_tx),
        })
    }

    /// Stops taking assignments, aborts the running one and waits for the executor.
    pub async fn shutdown(mut self) {
        self.connection.stop(None);
        let _ = (&mut self.connection_handle).await;
        self.shared.transport.abort("the worker is shutting down");
        drop(self.assignments.take());
        if let Some(executor) = self.executor.take() {
            let _ = tokio::task::spawn_blocking(move || executor.join()).await;
        }
    }
}

fn device_kind(device: &Device) -> &'static str {
    match device {
        Device::Cpu => "cpu",
        Device::Cuda(_) => "cuda",
        Device::Metal(_) => "metal",
    }
}

/// Connects to the coordinator, retrying until `within` has passed.
async fn connect(url: &str, within: Duration) -> Result<Channel> {
    let uri = crate::net::http_uri(url).map_err(Error::Coordinator)?;
    let endpoint = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| node_error("coordinator", format!("{url:?}: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let deadline = tokio::time::Instant::now() + within;
    // Said on the first failure and then every 10 s, so a wrong address is seen at once.
    let mut warning = Throttle::default();
    loop {
        match endpoint.connect().await {
            Ok(channel) => return Ok(channel),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(Error::Coordinator(format!(
                    "cannot reach {url} within {:.0} s: {}",
                    within.as_secs_f64(),
                    with_causes(&e)
                )));
            }
            Err(e) => {
                if warning.due() {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    tracing::warn!(
                        coordinator = url,
                        error = %with_causes(&e),
                        left_s = left.as_secs(),
                        "cannot reach the coordinator yet; retrying"
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Sends step reports in order; a `cancel` answer asks the job's collectives to stop.
async fn reporter(
    mut client: ClusterServiceClient<Channel>,
    mut reports: mpsc::UnboundedReceiver<pb::StepReport>,
    shared: Arc<Shared>,
) {
    while let Some(report) = reports.recv().await {
        // Its log lines carry the job, the re-plan and the step, as the executor's do.
        let span = tracing::info_span!(
            "report",
            job = job_of(report.job),
            run = run_of(report.job),
            step = report.step
        );
        deliver(&mut client, report, &shared).instrument(span).await;
    }
}

/// Sends one step report. A report lost on the way leaves its step incomplete on the
/// coordinator (it would count the job as stopped early): a failure the next try may not
/// meet is retried, the later reports waiting behind it so they stay in order.
async fn deliver(
    client: &mut ClusterServiceClient<Channel>,
    report: pb::StepReport,
    shared: &Shared,
) {
    let mut delay = REPORT_RETRY_DELAY;
    let mut tries = 1;
    loop {
        match client.report_step(report.clone()).await {
            Ok(ack) => {
                let ack = ack.into_inner();
                if ack.abort {
                    let job = report.job;
                    shared.abort_if(|j| j == job, "abandoned by the coordinator");
                } else if ack.cancel {
                    shared.transport.collective().request_stop(report.job);
                }
                return;
            }
            Err(status) if tries < REPORT_TRIES && transient(status.code()) => {
                tracing::debug!(tries, "step report to retry: {}", status.message());
                tokio::time::sleep(delay).await;
                delay *= 2;
                tries += 1;
            }
            Err(status) => {
                tracing::warn!(tries, "step report not delivered: {}", status.message());
                return;
            }
        }
    }
}

/// How many times a step report is sent before it is given up.
const REPORT_TRIES: u32 = 5;

/// The wait before a report's second try (doubling after each: 1.5 s of waiting in all).
const REPORT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// Whether a call that failed with `code` may succeed if made again unchanged.
fn transient(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::ResourceExhausted
            | tonic::Code::Aborted
            | tonic::Code::Unknown
    )
}

/// The connection actor (see the [module docs](self)).
pub struct Connection;

/// What the connection actor starts with.
pub struct ConnArgs {
    client: ClusterServiceClient<Channel>,
    id: String,
    address: String,
    device_kind: String,
    memory_bytes: u64,
    shared: Arc<Shared>,
    assignments: std::sync::mpsc::Sender<pb::Assignment>,
}

/// Messages of the connection actor.
pub enum ConnMsg {
    /// Time to send a heartbeat.
    Beat,
}

/// The connection actor's state.
pub struct ConnState {
    args: ConnArgs,
    stream: tokio::task::JoinHandle<()>,
    /// Failed heartbeats are warned of once per 10 s (the others at debug level, as beats
    /// come several times a second).
    warned: Throttle,
}

impl Connection {
    async fn register(args: &ConnArgs) -> std::result::Result<Duration, ActorProcessingErr> {
        let job = args.shared.current().job.unwrap_or(0);
        let reply = args
            .client
            .clone()
            .register(pb::RegisterRequest {
                worker_id: args.id.clone(),
                address: args.address.clone(),
                device_kind: args.device_kind.clone(),
                memory_bytes: args.memory_bytes,
                job,
            })
            .await
            .map_err(|s| {
                let what = if s.message().is_empty() {
                    s.to_string()
                } else {
                    s.message().to_string()
                };
                match s.code() {
                    tonic::Code::AlreadyExists | tonic::Code::InvalidArgument => {
                        format!("the coordinator refused worker {:?}: {what}", args.id)
                    }
                    code => format!("registering worker {:?}: {code:?}: {what}", args.id),
                }
            })?
            .into_inner();
        if !reply.accepted {
            return Err(format!(
                "the coordinator refused worker {}: {}",
                args.id, reply.reason
            )
            .into());
        }
        tracing::info!(worker = %args.id, address = %args.address, "registered");
        Ok(Duration::from_millis(reply.heartbeat_interval_ms.max(50)))
    }
}

/// Keeps the assignment stream open and forwards what it brings.
async fn follow_assignments(
    mut client: ClusterServiceClient<Channel>,
    id: String,
    out: std::sync::mpsc::Sender<pb::Assignment>,
    shared: Arc<Shared>,
) {
    loop {
        match client.assignments(pb::WorkerId { id: id.clone() }).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(a)) => {
                            tracing::info!(
                                worker = %id,
                                job = job_of(a.job),
                                run = run_of(a.job),
                                index = a.worker_index,
                                "assignment"
                            );
                            // The coordinator hands out work only once a worker's last job
                            // is over for it: a job still running here is abandoned.
                            shared.abort_if(
                                |old| old != a.job,
                                &format!("superseded by job {}", a.job),
                            );
                            if out.send(a).is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(status) => {
                            tracing::warn!(worker = %id, "assignment stream: {}", status.message());
                            break;
                        }
                    }
                }
            }
            Err(status) => {
                tracing::debug!(worker = %id, "cannot open the assignment stream: {}", status.message());
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

impl Actor for Connection {
    type Msg = ConnMsg;
    type State = ConnState;
    type Arguments = ConnArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ConnArgs,
    ) -> std::result::Result<Self::State, ActorProcessingErr> {
        let interval = Self::register(&args).await?;
        let stream = tokio::spawn(follow_assignments(
            args.client.clone(),
            args.id.clone(),
            args.assignments.clone(),
            Arc::clone(&args.shared),
        ));
        myself.send_interval(interval, || ConnMsg::Beat);
        Ok(ConnState {
            args,
            stream,
            warned: Throttle::default(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        state.stream.abort();
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        match msg {
            ConnMsg::Beat => {
                let stats = state.args.shared.stats().clone();
                let beat = pb::HeartbeatRequest {
                    worker_id: state.args.id.clone(),
                    current_activation_bytes: stats.current_activation_bytes,
                    peak_activation_bytes: stats.peak_activation_bytes,
                    stage_times: stats.stage_times,
                    step: stats.step,
                    job: state.args.shared.current().job.unwrap_or(0),
                };
                match state.args.client.clone().heartbeat(beat).await {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        if !reply.known {
                            // The coordinator restarted or forgot us: join again.
                            if let Err(e) = Self::register(&state.args).await {
                                tracing::warn!(worker = %state.args.id, "re-register: {e}");
                            }
                        }
                        if reply.cancel {
                            let job = reply.job;
                            state
                                .args
                                .shared
                                .abort_if(|j| j == job, "aborted by the coordinator");
                        }
                    }
                    Err(status) => {
                        if state.warned.due() {
                            tracing::warn!(
                                worker = %state.args.id,
                                "heartbeat failed (said again at most every 10 s): {}",
                                status.message()
                            );
                        } else {
                            tracing::debug!(worker = %state.args.id, "heartbeat: {}", status.message());
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Runs assignments one after another until the channel closes.
fn executor_loop(
    config: &NodeConfig,
    shared: &Shared,
    assignments: &std::sync::mpsc::Receiver<pb::Assignment>,
    reports: &mpsc::UnboundedSender<pb::StepReport>,
) {
    while let Ok(a) = assignments.recv() {
        let (job, worker) = (a.job, a.worker_index);
        // Every log line of the job carries its id and the worker (and, below, the step).
        let _job_span = tracing::info_span!(
            "job",
            job = job_of(job),
            run = run_of(job),
            worker,
            id = %config.id
        )
        .entered();
        shared.current().job = Some(job);
        let mut last_step = a.first_step;
        let outcome = run_assignment(config, shared, &a, reports, &mut last_step);
        let mut report = pb::StepReport {
            job,
            worker_id: config.id.clone(),
            worker_index: worker,
            step: last_step,
            ..Default::default()
        };
        match outcome {
            Ok(path) => {
                report.done = true;
                report.params_path = path.display().to_string();
            }
            Err(e) => {
                // The job span gives the job, the re-plan and the worker.
                tracing::error!(step = last_step, "assignment failed: {e}");
                report.error = e.to_string();
                shared
                    .transport
                    .abort(&format!("worker {worker} failed: {e}"));
            }
        }
        let _ = reports.send(report);
        shared.current().job = None;
    }
}

/// The largest message on the coordinator connection: an assignment of the largest plan
/// `JobSpec::validate` accepts (2M stage-microbatches, 6M passes of 6–12 bytes) fits.
const ASSIGNMENT_LIMIT: usize = 256 << 20;

/// The partition `stage_pieces` (pieces per stage) describes: one positive count per
/// stage, adding up to the model's pieces.
fn pieces_partition(
    spec: &JobSpec,
    stage_pieces: &[u32],
    stages: u32,
) -> Result<Vec<std::ops::Range<usize>>> {
    if stage_pieces.len() != stages as usize {
        return Err(assignment_error(format!(
            "stage_pieces {stage_pieces:?}: need {stages} counts, one per stage"
        )));
    }
    spec.model
        .split_by_counts(stage_pieces)
        .map_err(|e| assignment_error(e.to_string()))
}

fn assignment_error(reason: String) -> Error {
    node_error("assignment", reason)
}

/// The bytes of memory `/proc/meminfo` (its text, `meminfo`) says are available
/// (`MemAvailable`); `None` where that is unknown (not Linux, no such line).
pub fn available_memory(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let kib = line
            .strip_prefix("MemAvailable:")?
            .trim()
            .strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok()?.checked_mul(1024)
    })
}

/// [`available_memory`] of this machine, read from `/proc/meminfo`.
pub fn host_available_memory() -> Option<u64> {
    available_memory(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
}

/// Whether `state` bytes of parameters, gradients and optimizer state fit the memory
/// `/proc/meminfo` (its text, `meminfo`) says is available; an unknown figure passes.
fn fits_host_memory(state: u64, meminfo: &str) -> std::result::Result<(), String> {
    match available_memory(meminfo) {
        Some(bytes) if state > bytes => Err(format!(
            "this worker's stages hold {state} bytes of parameters, gradients and optimizer \
             state, more than the {bytes} bytes of memory available on this machine; use \
             more workers or a smaller model"
        )),
        _ => Ok(()),
    }
}

/// A step report carries the step's spans only up to this many (about 9 MB encoded; the
/// coordinator accepts 64 MiB reports); longer steps are reported without a trace.
const MAX_REPORTED_SPANS: usize = 200_000;

/// Runs one assignment; returns where the final parameters were written.
fn run_assignment(
    config: &NodeConfig,
    shared: &Shared,
    a: &pb::Assignment,
    reports: &mpsc::UnboundedSender<pb::StepReport>,
    last_step: &mut u64,
) -> Result<PathBuf> {
    let spec =
        JobSpec::from_toml(&a.job_toml).map_err(|e| assignment_error(format!("job_toml: {e}")))?;
    let placement = Placement::try_from(a.placement.clone().unwrap_or_default())
        .map_err(|e| assignment_error(format!("placement: {e}")))?;
    if placement.stages() != a.stage_count {
        return Err(assignment_error(format!(
            "stage_count {} but the placement has {} stages",
            a.stage_count,
            placement.stages()
        )));
    }
    let program: Vec<Pass> = program_from_proto(a.program.clone())
        .map_err(|e| assignment_error(format!("program: {e}")))?;
    if a.first_step > a.end_step {
        return Err(assignment_error(format!(
            "steps [{}, {}) are empty",
            a.first_step, a.end_step
        )));
    }
    let workers = placement.workers();
    let root = a.peers.get(&0).ok_or_else(|| {
        assignment_error("peers: no address for worker 0 (the collectives' root)".into())
    })?;
    for w in 0..workers {
        if !a.peers.contains_key(&w) {
            return Err(assignment_error(format!(
                "peers: no address for worker {w}"
            )));
        }
    }
    let partition = if a.stage_pieces.is_empty() {
        partition_of(&spec, placement.stages())?
    } else {
        pieces_partition(&spec, &a.stage_pieces, placement.stages())?
    };
    if spec.compute.is_emulated() {
        let parts = (&spec, &placement, program, &partition[..], root.as_str());
        return run_emulated_assignment(config, shared, a, reports, last_step, parts);
    }
    // Refused rather than aborted: an allocation the machine cannot make ends the process.
    if matches!(config.device, Device::Cpu) {
        let state = spec
            .model
            .state_bytes_by_worker(&placement, &partition)
            .get(a.worker_index as usize)
            .copied()
            .unwrap_or(0);
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        fits_host_memory(state, &meminfo).map_err(assignment_error)?;
    }
    let mut rt = WorkerRuntime::from_program(
        a.worker_index,
        &placement,
        a.microbatches,
        program,
        &spec.model,
        &partition,
        spec.training.seed,
        &config.device,
        optimizer_of(&spec),
    )?;
    rt.set_timeout(config.timeout);
    rt.set_slowdown(config.slowdown);
    // Parameters, gradients, master copies and AdamW moments (and what the config adds).
    let static_bytes: u64 = rt
        .params()
        .map(|p| p.state_bytes())
        .sum::<u64>()
        .saturating_add(config.unplanned_bytes);
    crate::metrics::record_parameters(&rt);
    let output = PathBuf::from(&a.output_dir);
    if a.first_step > 0 {
        // The step's stage files may come from another partition (a job re-planned onto
        // fewer workers): tensors are found by name.
        let dir = checkpoint_dir(&output, a.first_step);
        for stage in rt.stages_mut().values_mut() {
            stage.load_checkpoint_dir(&dir)?;
        }
    }
    let corpus = corpus_of(&spec)?;
    let sampler = sampler_of(&spec);
    let transport = &shared.transport;
    let sync = join_job(config, shared, a, &placement, root, Delivery::Tensors)?;
    let interval = u64::from(spec.checkpoint.interval.max(1));
    for step in a.first_step..a.end_step {
        let _step_span = tracing::debug_span!("step", step).entered();
        *last_step = step;
        let batches = sampler.step(&corpus, step, a.microbatches, &config.device)?;
        let report = rt.run_step(a.job, step, &batches, transport.as_ref(), &sync)?;
        crate::metrics::record_step(a.worker_index, &report);
        // Again every step: the exporter drops gauges left unset for a while.
        crate::metrics::record_parameters(&rt);
        let held = rt.stages().values().map(crate::Stage::stash_bytes).sum();
        publish_step(
            config,
            shared,
            a,
            reports,
            step,
            &report,
            (held, static_bytes),
        );
        let done = step + 1;
        if spec.checkpoint.enable_checkpoint && done % interval == 0 && done < a.end_step {
            save_checkpoints(&rt, &output, done)?;
        }
        if sync.stop_requested() {
            tracing::info!(
                step = done,
                "stopping: asked by the coordinator (a cancel, or a re-plan between steps)"
            );
            break;
        }
    }
    if spec.checkpoint.enable_checkpoint {
        save_checkpoints(&rt, &output, *last_step + 1)?;
    }
    save_final(&rt, &output, a.worker_index)
}

/// What [`run_assignment`] has parsed and checked: the spec, placement, program, partition
/// and worker 0's address.
type EmulatedParts<'a> = (
    &'a JobSpec,
    &'a Placement,
    Vec<Pass>,
    &'a [std::ops::Range<usize>],
    &'a str,
);

/// Runs an assignment of a `[compute] mode = "emulate"` job with an [`EmulatedRuntime`]:
/// the same transport set-up, start barrier, step reports and cancel handling as a real
/// one, but no parameters, checkpoints or data. Returns an empty path (nothing written).
fn run_emulated_assignment(
    config: &NodeConfig,
    shared: &Shared,
    a: &pb::Assignment,
    reports: &mpsc::UnboundedSender<pb::StepReport>,
    last_step: &mut u64,
    (spec, placement, program, partition, root): EmulatedParts<'_>,
) -> Result<PathBuf> {
    let mut rt = EmulatedRuntime::from_program(
        a.worker_index,
        placement,
        a.microbatches,
        program,
        &spec.model,
        spec.parallelism.pipeline_parallel_microbatch_size,
        partition,
        spec.compute.times_secs(),
    )?;
    rt.set_timeout(config.timeout);
    let transport = &shared.transport;
    let sync = join_job(config, shared, a, placement, root, Delivery::Buffers)?;
    for step in a.first_step..a.end_step {
        let _step_span = tracing::debug_span!("step", step, emulated = true).entered();
        *last_step = step;
        let report = rt.run_step(a.job, step, transport.as_ref(), &sync)?;
        crate::metrics::record_step(a.worker_index, &report);
        // Emulated compute holds no parameters; only what the config adds counts.
        let bytes = (0, config.unplanned_bytes);
        publish_step(config, shared, a, reports, step, &report, bytes);
        if sync.stop_requested() {
            tracing::info!(
                step = step + 1,
                "stopping: asked by the coordinator (a cancel, or a re-plan between steps)"
            );
            break;
        }
    }
    Ok(PathBuf::new())
}

/// Readies the transport for assignment `a` (its stages, frames delivered as `delivery`,
/// the peers' addresses, worker 0's collectives), waits at the start barrier for the job's
/// other workers and resets the activation counters. Returns the end-of-step collectives.
fn join_job(
    config: &NodeConfig,
    shared: &Shared,
    a: &pb::Assignment,
    placement: &Placement,
    root: &str,
    delivery: Delivery,
) -> Result<NetSync> {
    let transport = &shared.transport;
    transport.assign(a.job, placement.stages_of(a.worker_index), delivery);
    transport.set_peers(a.peers.iter().map(|(w, addr)| (*w, addr.as_str())))?;
    if a.worker_index == 0 {
        transport
            .collective()
            .configure(a.job, placement.workers(), config.timeout);
    }
    let sync = transport.sync_to(root, a.job, a.worker_index, config.timeout)?;
    sync.barrier()?;
    let mut stats = shared.stats();
    stats.peak_activation_bytes = 0;
    stats.current_activation_bytes = 0;
    Ok(sync)
}

/// Records step `step`'s report in the heartbeat statistics (`held`: activation bytes still
/// stashed after it) and sends it to the coordinator.
fn publish_step(
    config: &NodeConfig,
    shared: &Shared,
    a: &pb::Assignment,
    reports: &mpsc::UnboundedSender<pb::StepReport>,
    step: u64,
    report: &StepReport,
    (held, static_bytes): (u64, u64),
) {
    let stage_times = stage_times(report);
    {
        let mut stats = shared.stats();
        stats.step = step + 1;
        stats.peak_activation_bytes = stats.peak_activation_bytes.max(report.peak_stash_bytes);
        stats.current_activation_bytes = held;
        stats.stage_times = stage_times.clone();
    }
    let _ = reports.send(pb::StepReport {
        static_bytes,
        ..step_report(config, a, step, report, stage_times)
    });
}

/// The coordinator's view of one step of assignment `a` (the loss is NaN when the step
/// has none, e.g. emulated compute).
fn step_report(
    config: &NodeConfig,
    a: &pb::Assignment,
    step: u64,
    report: &StepReport,
    stage_times: Vec<pb::StageTimes>,
) -> pb::StepReport {
    pb::StepReport {
        job: a.job,
        worker_id: config.id.clone(),
        worker_index: a.worker_index,
        step,
        loss: report.loss.map_or(f64::NAN, f64::from),
        busy_secs: report.busy_secs,
        wall_secs: report.wall_secs,
        peak_activation_bytes: report.peak_stash_bytes,
        grad_norm: report.grad_norm,
        stage_times,
        spans: if report.spans.len() <= MAX_REPORTED_SPANS {
            report.spans.iter().map(pb::TraceSpan::from).collect()
        } else {
            Vec::new()
        },
        bytes_sent: report.bytes_sent.clone().into_iter().collect(),
        bytes_received: report.bytes_received.clone().into_iter().collect(),
        ..Default::default()
    }
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })
}

fn save_checkpoints(rt: &WorkerRuntime, output: &Path, step: u64) -> Result<()> {
    create_dir(&checkpoint_dir(output, step))?;
    for (s, stage) in rt.stages() {
        stage.save_checkpoint(&checkpoint_file(output, step, *s))?;
    }
    Ok(())
}

/// Writes the worker's parameters under their whole-model names.
fn save_final(rt: &WorkerRuntime, output: &Path, worker: u32) -> Result<PathBuf> {
    let dir = output.join("final");
    create_dir(&dir)?;
    let path = dir.join(format!("worker-{worker}.safetensors"));
    let tensors: HashMap<String, Tensor> = rt
        .params()
        .map(|p| p.value.to_device(&Device::Cpu).map(|t| (p.name.clone(), t)))
        .collect::<std::result::Result<_, _>>()?;
    candle_core::safetensors::save(&tensors, &path)?;
    Ok(path)
}

/// Mean F / B / W milliseconds per stage (BW counted as B).
fn stage_times(report: &StepReport) -> Vec<pb::StageTimes> {
    let mut sums: BTreeMap<u32, [(f64, u32); 3]> = BTreeMap::new();
    for (pass, secs) in &report.pass_times {
        let slot = match pass.kind {
            PassKind::F => 0,
            PassKind::B | PassKind::BW => 1,
            PassKind::W => 2,
        };
        let e = &mut sums.entry(pass.stage).or_default()[slot];
        e.0 += secs * 1e3;
        e.1 += 1;
    }
    let mean = |(sum, n): (f64, u32)| if n == 0 { 0.0 } else { sum / f64::from(n) };
    sums.into_iter()
        .map(|(stage, [f, b, w])| pb::StageTimes {
            stage,
            f_ms: mean(f),
            b_ms: mean(b),
            w_ms: mean(w),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::fits_host_memory;

    /// A coordinator that cannot be reached is named with the transport error's causes
    /// (the error alone says only "transport error").
    #[tokio::test]
    async fn an_unreachable_coordinator_is_reported_with_the_cause() {
        let err = super::connect("127.0.0.1:1", std::time::Duration::from_millis(300))
            .await
            .expect_err("nothing listens on port 1");
        let text = err.to_string();
        assert!(text.contains("cannot reach 127.0.0.1:1 within"), "{text}");
        assert!(
            text.contains("transport error: tcp connect error"),
            "{text}"
        );
        assert!(
            !text.contains("tcp connect error: tcp connect error"),
            "{text}"
        );
    }

    /// An advertised address peers could not dial is refused at start, not at every job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unusable_advertised_address_is_refused_at_start() {
        let mut config = super::NodeConfig::new("127.0.0.1:1", "w");
        config.advertise = Some("https://10.0.0.1:5000".into());
        let err = super::WorkerNode::start(config)
            .await
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("advertise") && err.contains("https://"),
            "{err}"
        );
    }

    #[test]
    fn only_transient_failures_are_retried() {
        use tonic::Code;
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Unknown] {
            assert!(super::transient(code), "{code:?}");
        }
        for code in [Code::InvalidArgument, Code::NotFound, Code::Internal] {
            assert!(!super::transient(code), "{code:?}");
        }
    }

    #[test]
    fn state_beyond_the_available_memory_is_refused() {
        let meminfo = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\n\
                       MemAvailable:    8000000 kB\n";
        let available = 8_000_000 * 1024;
        assert_eq!(fits_host_memory(available, meminfo), Ok(()));
        let err = fits_host_memory(available + 1, meminfo).expect_err("too big");
        assert!(
            err.contains(&format!("more than the {available} bytes")),
            "{err}"
        );
        // Unknown: passes.
        assert_eq!(fits_host_memory(u64::MAX, ""), Ok(()));
        assert_eq!(fits_host_memory(u64::MAX, "MemTotal: 1 kB\n"), Ok(()));
    }
}
