//! The worker process (`pipewise worker`): joins a coordinator, takes assignments and runs
//! them, talking to its peers directly.
//!
//! - [`config`]: [`NodeConfig`], how a worker starts.
//! - `connection`: [`Connection`] (a ractor actor) registers with the coordinator's
//!   `ClusterService` (retrying until it answers), heartbeats on the interval the
//!   coordinator gives (current and peak activation bytes, measured pass times per stage,
//!   the step), keeps the `Assignments` stream open (reopening it after a failure) and
//!   hands each assignment to the assignment loop. A heartbeat answered with `cancel` for the
//!   running job aborts it at once, as does an `abandon` message down the stream; when the
//!   assignment loop ends a run, the next heartbeat goes at once.
//! - [`WorkerNode::drain`] (SIGTERM / SIGINT): the worker abandons its run and leaves the
//!   cluster (`ClusterService.Leave`), so the coordinator re-plans without waiting for
//!   missed heartbeats.
//! - `reporter`: sends the assignment loop's step reports in order, so the coordinator is never
//!   waited on within a step.
//! - `assignment_loop`: one dedicated thread (candle compute stays off the async runtime) that
//!   runs assignments one after another: each decoded once (`assignment`), run by one step
//!   loop over real or emulated compute (`compute`).
//! - [`pace`]: an in-process test harness's pace and clock ([`NodeConfig::pace`]).
//! - `outputs`: checkpoints and final parameters; [`memory`]: the host's available memory;
//!   `validation`: a run's `[validation]` windows, evaluated between steps.
//! - The activation service: the [`GrpcTransport`] started with the node, whose address is
//!   the one registered. Worker 0 of a job also serves the job's end-of-step collectives
//!   ([`crate::net::Collective`]); a cancel reaches the workers through it, so all of them
//!   stop at the same step.
//!
//! Checkpoints (`[checkpoint] enable_checkpoint`) and the final parameters are written to
//! `job-N` under the job's `checkpoint.folder` in the worker's data directory
//! ([`NodeConfig::data_dir`]; `data.path` is read there too, and a path or symlink that
//! leads outside it fails the assignment, naming the field). The coordinator reads the
//! same folder under its own data directory, so both must see the same files (one machine,
//! or a shared volume): `step-K/stage-S.safetensors` (parameters and optimizer state of stage
//! `S` after `K` steps; an assignment starting at step `K` > 0 resumes from them, whatever
//! partition wrote them) and
//! `final/worker-W.safetensors` (the worker's parameters under their whole-model names).

mod assignment;
mod assignment_loop;
mod compute;
pub mod config;
mod connection;
pub mod memory;
mod outputs;
pub mod pace;
mod profile;
mod reporter;
mod shared;
mod validation;

use std::sync::Arc;

use pipewise_proto::v1 as pb;
use pipewise_proto::v1::cluster_service_client::ClusterServiceClient;
use ractor::{Actor, ActorRef};
use tokio::sync::mpsc;

pub use assignment::check_assignment;
pub use config::NodeConfig;
pub use connection::{ConnArgs, ConnMsg, ConnState, Connection};
pub use memory::{available_memory, host_available_memory};
pub use pace::Pace;

use crate::Device;
use crate::error::{Error, Result};
use crate::net::{GrpcConfig, GrpcTransport};
use shared::Shared;

/// A running worker process (see the [module docs](self)).
pub struct WorkerNode {
    /// The worker's id.
    pub id: String,
    /// The address registered for its activation service.
    pub address: String,
    connection: ActorRef<ConnMsg>,
    connection_handle: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
    assignment_loop: Option<std::thread::JoinHandle<()>>,
    assignments: Option<std::sync::mpsc::Sender<pb::Assignment>>,
    client: connection::CoordinatorClient,
}

impl WorkerNode {
    /// Starts the activation service, registers with the coordinator and begins taking
    /// assignments. Call from within a multi-threaded tokio runtime.
    pub async fn start(config: NodeConfig) -> Result<WorkerNode> {
        if config.id.trim().is_empty() {
            return Err(Error::invalid("id", "must not be empty"));
        }
        let runtime = tokio::runtime::Handle::current();
        let mut net = GrpcConfig::new(0, std::iter::empty());
        net.listen = config.listen;
        net.device = config.device.clone();
        net.tls = config.tls.clone();
        let transport = Arc::new(GrpcTransport::start_on(runtime.clone(), net)?);
        let address = config
            .advertise
            .clone()
            .unwrap_or_else(|| transport.local_addr().to_string());
        // Peers dial this address: one they could not use would fail every job later.
        crate::net::grpc_uri(&address, config.tls.mutual())
            .map_err(|e| Error::invalid("advertise", e.to_string()))?;
        if let Some(why) = pipewise_common::address::undialable(&address) {
            let from = if config.advertise.is_some() {
                "--advertise"
            } else {
                "the --listen address (no --advertise given)"
            };
            return Err(Error::invalid(
                "advertise",
                format!(
                    "peers cannot dial {address} ({from}): {why}; give --advertise HOST:PORT, \
                     the address other workers reach this one at"
                ),
            ));
        }
        let shared = Arc::new(Shared::new(transport));
        // A few tens of milliseconds; a failed profile only leaves the planner's default.
        // A worker slowed by `--slowdown` from its first step profiles that much slower (one
        // slowed from a later step only shows it in its pass times).
        let flops_per_second = match &config.pace {
            Some(pace) => pace.flops_per_second() / config.slowdown.at(0),
            None => profile::linear_flops(&config.device).unwrap_or(0.0) / config.slowdown.at(0),
        };
        let channel =
            connection::connect(&config.coordinator, &config.tls, config.connect_for).await?;
        // An assignment carries the worker's whole program (up to millions of passes).
        let client = ClusterServiceClient::with_interceptor(channel, config.token.clone())
            .max_decoding_message_size(ASSIGNMENT_LIMIT)
            .max_encoding_message_size(ASSIGNMENT_LIMIT);
        let (report_tx, report_rx) = mpsc::unbounded_channel::<pipewise_common::run::StepReport>();
        tokio::spawn(reporter::reporter(
            client.clone(),
            report_rx,
            Arc::clone(&shared),
        ));
        let (assign_tx, assign_rx) = std::sync::mpsc::channel::<pb::Assignment>();
        let assignment_loop = {
            let shared = Arc::clone(&shared);
            let config = config.clone();
            std::thread::Builder::new()
                .name(format!("pipewise-exec-{}", config.id))
                .spawn(move || {
                    assignment_loop::run_assignments(&config, &shared, &assign_rx, &report_tx)
                })
                .map_err(|source| Error::Start {
                    what: "the assignment loop thread",
                    source,
                })?
        };
        let (connection, connection_handle) = Actor::spawn(
            None,
            Connection,
            ConnArgs {
                client: client.clone(),
                id: config.id.clone(),
                address: address.clone(),
                device_kind: device_kind(&config.device).into(),
                memory_bytes: config.memory_bytes,
                flops_per_second,
                cores: config.cores,
                host: config.host.clone(),
                shared: Arc::clone(&shared),
                assignments: assign_tx.clone(),
                pace: config.pace.clone(),
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
            assignment_loop: Some(assignment_loop),
            assignments: Some(assign_tx),
            client,
        })
    }

    /// Leaves the cluster (on SIGTERM / SIGINT): stops taking assignments, abandons the
    /// running run (its current step ends at the next pass or transfer), waits up to
    /// [`DRAIN_WAIT`] for the assignment loop to be out of it, so nothing more is written for it,
    /// and tells the coordinator, which re-plans the run's job at once. Returns the run
    /// abandoned (0: none).
    pub async fn drain(mut self) -> u64 {
        self.shared.start_draining();
        self.connection.stop(None);
        let _ = (&mut self.connection_handle).await;
        let run = self.shared.current().job.unwrap_or(0);
        self.shared.transport.abort("the worker is leaving");
        drop(self.assignments.take());
        let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
        while self
            .assignment_loop
            .as_ref()
            .is_some_and(|e| !e.is_finished())
        {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    worker = %self.id,
                    "the assignment loop is still in run {run} after {} s; leaving anyway",
                    DRAIN_WAIT.as_secs()
                );
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let leave = pb::LeaveRequest {
            worker_id: self.id.clone(),
            run,
        };
        match tokio::time::timeout(LEAVE_TIMEOUT, self.client.leave(leave)).await {
            Ok(Ok(_)) => {}
            Ok(Err(status)) => {
                tracing::warn!(worker = %self.id, "the coordinator did not take the leave: {}", status.message());
            }
            Err(_) => tracing::warn!(worker = %self.id, "the coordinator did not answer the leave"),
        }
        run
    }

    /// Stops as a killed process would (a test harness's kill, [`pace`]): nothing more
    /// reaches the coordinator (no heartbeat, step report or leave); the running run is
    /// aborted and the assignment loop waited for.
    pub async fn kill(self) {
        self.shared.silence();
        self.shutdown().await;
    }

    /// Stops taking assignments, aborts the running one and waits for the assignment loop.
    pub async fn shutdown(mut self) {
        self.connection.stop(None);
        let _ = (&mut self.connection_handle).await;
        self.shared.transport.abort("the worker is shutting down");
        drop(self.assignments.take());
        if let Some(assignment_loop) = self.assignment_loop.take() {
            let _ = tokio::task::spawn_blocking(move || assignment_loop.join()).await;
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

/// How long [`WorkerNode::drain`] waits for the assignment loop to leave its run (a pass or a
/// checkpoint write in progress finishes first); with [`LEAVE_TIMEOUT`], well within a
/// pod's termination grace period.
pub const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// How long [`WorkerNode::drain`] waits for the coordinator to take the leave.
pub const LEAVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The largest message on the coordinator connection: an assignment of the largest plan
/// `JobSpec::validate` accepts (2M stage-microbatches, 6M passes of 6–12 bytes) fits.
const ASSIGNMENT_LIMIT: usize = 256 << 20;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// A coordinator that cannot be reached is named with the transport error's causes
    /// (the error alone says only "transport error").
    #[tokio::test]
    async fn an_unreachable_coordinator_is_reported_with_the_cause() {
        let plain = crate::net::TlsSettings::default();
        let err = super::connection::connect("127.0.0.1:1", &plain, Duration::from_millis(300))
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
        // A scheme the peers do not speak, then addresses they cannot dial: port 0, the
        // unspecified host, and the listen address itself when it is `0.0.0.0`.
        for (advertise, says) in [
            (Some("https://10.0.0.1:5000"), "https://"),
            (
                Some("10.91.0.2:0"),
                "peers cannot dial 10.91.0.2:0 (--advertise)",
            ),
            (
                Some("0.0.0.0:5000"),
                "peers cannot dial 0.0.0.0:5000 (--advertise)",
            ),
            (None, "no --advertise given"),
        ] {
            let mut config = super::NodeConfig::new("127.0.0.1:1", "w");
            config.listen = "0.0.0.0:0".parse().expect("an address");
            config.advertise = advertise.map(str::to_string);
            let err = super::WorkerNode::start(config)
                .await
                .err()
                .expect("refused")
                .to_string();
            assert!(err.contains("advertise") && err.contains(says), "{err}");
        }
    }
}
