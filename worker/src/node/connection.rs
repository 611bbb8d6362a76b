//! The coordinator connection: reaching the coordinator ([`connect`]) and the
//! [`Connection`] actor, which registers (retrying until the coordinator answers),
//! heartbeats on the interval the coordinator gives, keeps the `Assignments` stream open
//! (reopening it after a failure) and hands each assignment to the assignment thread.

use std::sync::Arc;
use std::time::Duration;

use pipewise_common::job::{job_of, run_of};
use pipewise_proto::auth::BearerToken;
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::cluster_service_client::ClusterServiceClient;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::shared::Shared;
use crate::error::{Error, Result, with_causes};
use crate::net::with_tls_cause;

/// A failed connection's causes, the TLS one first when there is one.
fn explained(e: &tonic::transport::Error) -> String {
    with_tls_cause(e, "the coordinator", with_causes(e))
}

/// Whether a repeated warning is due: the first time, then at most once every 10 s.
#[derive(Debug, Default)]
pub(crate) struct Throttle(Option<tokio::time::Instant>);

impl Throttle {
    pub(crate) fn due(&mut self) -> bool {
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

/// The coordinator's cluster API, every call carrying the worker's token.
pub(crate) type CoordinatorClient = ClusterServiceClient<InterceptedService<Channel, BearerToken>>;

/// Connects to the coordinator (with TLS when its URL or `tls` says so), retrying until
/// `within` has passed.
pub(crate) async fn connect(
    url: &str,
    tls: &crate::net::TlsSettings,
    within: Duration,
) -> Result<Channel> {
    let endpoint = crate::net::endpoint(url, tls, crate::net::Dial::Coordinator, "the coordinator")
        .map_err(|e| match e {
            Error::Address { .. } => Error::Coordinator(e.to_string()),
            other => other,
        })?
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
                    explained(&e)
                )));
            }
            Err(e) => {
                if warning.due() {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    tracing::warn!(
                        coordinator = url,
                        error = %explained(&e),
                        left_s = left.as_secs(),
                        "cannot reach the coordinator yet; retrying"
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The connection actor (see the [module docs](self)).
pub struct Connection;

/// What the connection actor starts with.
pub struct ConnArgs {
    pub(crate) client: CoordinatorClient,
    pub(crate) id: String,
    pub(crate) address: String,
    pub(crate) device_kind: String,
    pub(crate) memory_bytes: u64,
    /// The start-up profile's FLOP/s.
    pub(crate) flops_per_second: f64,
    /// Cores the worker may count on (0: not known).
    pub(crate) cores: f64,
    /// Its host for the shared-memory tier (empty: off).
    pub(crate) host: String,
    pub(crate) shared: Arc<Shared>,
    pub(crate) assignments: std::sync::mpsc::Sender<pb::Assignment>,
    /// A test harness's pace, told of every heartbeat answered.
    pub(crate) pace: Option<Arc<dyn super::pace::Pace>>,
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
    /// Heartbeats at once when the assignment loop ends a run.
    ended: tokio::task::JoinHandle<()>,
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
                run: job,
                flops_per_second: args.flops_per_second,
                cores: args.cores,
                host: args.host.clone(),
            })
            .await
            .map_err(|s| {
                let mut what = if s.message().is_empty() {
                    s.to_string()
                } else {
                    s.message().to_string()
                };
                // A transport failure (e.g. a refused TLS handshake) says why only in its
                // causes.
                if let Some(cause) = std::error::Error::source(&s) {
                    what = format!("{what}: {}", with_causes(cause));
                }
                let what = with_tls_cause(&s, "the coordinator", what);
                match s.code() {
                    tonic::Code::AlreadyExists
                    | tonic::Code::InvalidArgument
                    | tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied => {
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
    mut client: CoordinatorClient,
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
                        Ok(Some(a)) if a.abandon => {
                            shared.abort_if(|j| j == a.run, "aborted by the coordinator");
                        }
                        Ok(Some(a)) => {
                            tracing::info!(
                                worker = %id,
                                job = job_of(a.run),
                                run = run_of(a.run),
                                index = a.worker_index,
                                "assignment"
                            );
                            // The coordinator hands out work only once a worker's last job
                            // is over for it: a job still running here is abandoned.
                            shared.abort_if(
                                |old| old != a.run,
                                &format!("superseded by job {}", a.run),
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
        let given = Self::register(&args).await?;
        let interval = args
            .pace
            .as_ref()
            .map_or(given, |pace| pace.heartbeat_interval(given));
        let stream = tokio::spawn(follow_assignments(
            args.client.clone(),
            args.id.clone(),
            args.assignments.clone(),
            Arc::clone(&args.shared),
        ));
        myself.send_interval(interval, || ConnMsg::Beat);
        let ended = {
            let (shared, me) = (Arc::clone(&args.shared), myself.clone());
            tokio::spawn(async move {
                loop {
                    shared.ended.notified().await;
                    if me.cast(ConnMsg::Beat).is_err() {
                        return;
                    }
                }
            })
        };
        Ok(ConnState {
            args,
            stream,
            ended,
            warned: Throttle::default(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> std::result::Result<(), ActorProcessingErr> {
        state.stream.abort();
        state.ended.abort();
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
                    stage_times: stats.stage_times.iter().map(pb::StageTimes::from).collect(),
                    step: stats.step,
                    run: state.args.shared.current().job.unwrap_or(0),
                };
                match state.args.client.clone().heartbeat(beat).await {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        if let Some(pace) = &state.args.pace {
                            pace.heartbeat_answered();
                        }
                        if !reply.known {
                            // The coordinator restarted or forgot us: join again.
                            if let Err(e) = Self::register(&state.args).await {
                                tracing::warn!(worker = %state.args.id, "re-register: {e}");
                            }
                        }
                        if reply.cancel {
                            let job = reply.run;
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
                                with_tls_cause(
                                    &status,
                                    "the coordinator",
                                    status.message().to_string()
                                )
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
