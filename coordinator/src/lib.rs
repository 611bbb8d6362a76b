//! `pipewise-coordinator`: takes training jobs over gRPC, plans them with the pure core, and
//! drives them. Every actor is a ractor actor in its own file, behind a tonic edge.
//!
//! # Layout
//!
//! - [`job_manager`]: submit / get / list / cancel / watch; queue (in the order their
//!   plans were ready; on a cluster, jobs side by side on disjoint workers, all of a job's
//!   workers or none, with backfill: `pipewise_common::run::scheduler` decides); persistence
//!   through [`store`]; starts a run actor per running job.
//! - [`job_msg`]: the job manager's messages (the run actors, the membership actor and the
//!   gRPC edge send them).
//! - [`planner`]: validates a job spec and plans its schedule (`pipewise_common::job`),
//!   several submissions at once.
//! - [`membership`]: worker registrations and heartbeats; who is alive; which job holds
//!   which worker (a job claims its workers before each run): `pipewise_common::run::
//!   registry` decides; assignment streams and the routing of workers' step reports.
//! - [`metrics`]: the Prometheus metrics the coordinator records (bubble, memory, step
//!   time, throughput, liveness, jobs, re-plans).
//! - [`run`]: one [`run::RunActor`] per job running on registered worker processes: it
//!   feeds the job's `pipewise_common::run::Supervisor` (which re-plans between steps after
//!   a lost worker, a straggler, memory pressure or workers joining) and performs what it
//!   asks.
//! - [`run_msg`]: what a run actor is told.
//! - [`checkpoints`]: a job's checkpoint folders on disk, and where its paths lead.
//! - `checkpoints_model`: a job's Hugging Face directory read at submit (`config.json`,
//!   the weight files' headers).
//! - `checkpoints_left`: the checkpoints already in a submitted job's output directory,
//!   refused at submit when another model wrote them.
//! - `checkpoints_data`: a job's training and validation data and tokenizer checked at
//!   submit.
//! - `checkpoints_text`: the tokens of a job's text counted at submit, encoded only where
//!   it is short.
//! - [`step_event`]: a step's event from its workers' reports.
//! - [`events`]: what a running job reports (step events, where it starts) and the events
//!   kept for late watchers.
//! - [`store`]: the durable job store (redb) in the data directory.
//! - [`traces`]: the recent steps' executed timelines and their rendering next to the plan.
//! - [`security`]: TLS on the port, tokens with roles checked per service, and the
//!   per-run secrets of activation frames.
//! - [`audit`]: refused callers (tokens, client certificates, TLS handshakes) counted and
//!   logged, at most once a minute per peer and reason.
//! - `tls_accept`: the port's TLS handshakes, done here so that failed ones are seen.
//! - [`service`]: the gRPC `JobService` and `ClusterService`; the only place errors become
//!   `tonic::Status`.
//! - [`clock`]: the actors' time: the wall clock, or a test harness's logical one.
//! - [`error`]: the crate's one error type.
//! - `root`: the supervisor of the planner, the membership actor and the job manager: one
//!   that ends stops the coordinator, visibly ([`Coordinator::stopped`]).
//!
//! [`Coordinator::start_cluster`] wires them together and serves gRPC (with health and
//! reflection), with jobs run by the worker processes that register.

pub mod audit;
pub mod checkpoints;
mod checkpoints_data;
mod checkpoints_left;
mod checkpoints_model;
mod checkpoints_text;
pub mod clock;
pub mod error;
pub mod events;
pub mod job_manager;
pub mod job_msg;
pub mod membership;
pub mod metrics;
pub mod planner;
mod root;
pub mod run;
pub mod run_msg;
pub mod security;
pub mod service;
pub mod step_event;
pub mod store;
mod tls_accept;
pub mod traces;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use pipewise_proto::v1::cluster_service_server::ClusterServiceServer;
use pipewise_proto::v1::job_service_server::JobServiceServer;
use ractor::{Actor, ActorRef};
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;

pub use clock::Clock;
pub use error::{CoordinatorError, Result};
pub use events::{Start, StepEvent};

pub use job_manager::Unfinished;
use job_msg::JobMsg;
use membership::MembershipMsg;
use root::{Root, RootArgs, RootMsg};
pub use security::Security;
use security::{Role, RunSecrets};
use store::{JobRecord, JobStore};

/// How long [`Coordinator::shutdown`] waits for calls in flight once the actors stopped
/// (well within a pod's termination grace period).
pub const SERVER_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A running coordinator: its address and actors. Dropping it does not stop the server;
/// call [`Coordinator::shutdown`].
pub struct Coordinator {
    /// The address the gRPC server listens on.
    pub addr: SocketAddr,
    /// The job manager.
    pub jobs: ActorRef<JobMsg>,
    /// The membership actor.
    pub membership: ActorRef<MembershipMsg>,
    server: tokio::task::JoinHandle<()>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    /// The supervisor of the actors, and its task.
    root: Option<(ractor::ActorCell, tokio::task::JoinHandle<()>)>,
    /// Why the actors ended, once one of them did.
    ended: tokio::sync::watch::Receiver<Option<String>>,
}

impl Coordinator {
    /// Opens the store in `data_dir`, spawns the actors and serves gRPC on `listen` (port
    /// 0 picks a free one), with jobs run on the worker processes that register (a
    /// [`run::RunActor`] per job); `unfinished` says what becomes of the jobs the store
    /// holds as queued or running.
    pub async fn start_cluster(
        listen: SocketAddr,
        data_dir: &Path,
        unfinished: Unfinished,
    ) -> Result<Coordinator> {
        Self::start_secured(listen, data_dir, unfinished, &Security::default()).await
    }

    /// Like [`Coordinator::start_cluster`], with the port guarded as `security` says (TLS,
    /// tokens with roles; see [`security`]).
    pub async fn start_secured(
        listen: SocketAddr,
        data_dir: &Path,
        unfinished: Unfinished,
        security: &Security,
    ) -> Result<Coordinator> {
        Self::start_clocked(listen, data_dir, unfinished, security, Clock::wall()).await
    }

    /// Like [`Coordinator::start_secured`], with its actors' time read from `clock` (an
    /// in-process test harness's logical clock; see [`clock`]).
    pub async fn start_clocked(
        listen: SocketAddr,
        data_dir: &Path,
        unfinished: Unfinished,
        security: &Security,
        clock: Clock,
    ) -> Result<Coordinator> {
        metrics::describe();
        metrics::describe_refusals(audit::Refusal::ALL.map(audit::Refusal::label));
        let store = JobStore::open(data_dir)?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| CoordinatorError::Actor(format!("cannot listen on {listen}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| CoordinatorError::Actor(e.to_string()))?;
        let (ended_tx, ended) = tokio::sync::watch::channel(None);
        let args = RootArgs {
            store,
            data_dir: data_dir.to_path_buf(),
            unfinished,
            ended: ended_tx,
            clock,
        };
        let (root, root_handle) = Actor::spawn(None, Root, args)
            .await
            .map_err(|e| CoordinatorError::Actor(e.to_string()))?;
        let children = ractor::call!(root, RootMsg::Children)?;
        let (jobs, membership) = (children.jobs, children.membership);
        let (health_reporter, health) = pipewise_proto::health_service();
        health_reporter
            .set_serving::<JobServiceServer<service::Jobs>>()
            .await;
        health_reporter
            .set_serving::<ClusterServiceServer<service::Cluster>>()
            .await;
        let reflection = pipewise_proto::reflection_service()
            .map_err(|e| CoordinatorError::Actor(format!("reflection: {e}")))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tls = security
            .tls
            .as_ref()
            .map(tls_accept::server_config)
            .transpose()?;
        let audit = Arc::new(audit::Audit::default());
        // With tokens, frames among a run's workers carry a secret of the run, so a process
        // that reaches a worker's port but holds no assignment cannot inject any.
        let run_secrets = match security.tokens.worker {
            Some(_) => Some(Arc::new(RunSecrets::new()?)),
            None => None,
        };
        let cluster = ClusterServiceServer::new(service::Cluster {
            membership: membership.clone(),
            run_secrets,
        })
        // Step reports carry every span of a worker's step (see `traces`).
        .max_decoding_message_size(64 << 20);
        let router = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(reflection)
            .add_service(InterceptedService::new(
                JobServiceServer::new(service::Jobs {
                    manager: jobs.clone(),
                }),
                security.guard(Role::Submitter, &audit),
            ))
            .add_service(InterceptedService::new(
                cluster,
                security.guard(Role::Worker, &audit),
            ));
        let mut root_ended = ended.clone();
        let server = tokio::spawn(async move {
            // A shutdown, or the actors' end (one of them failed), stops the server.
            let stop = async {
                tokio::select! {
                    _ = rx => {}
                    _ = root_ended.wait_for(Option::is_some) => {}
                }
            };
            let served = match tls {
                Some(config) => {
                    let incoming = tls_accept::incoming(listener, config, audit);
                    router.serve_with_incoming_shutdown(incoming, stop).await
                }
                None => {
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    router.serve_with_incoming_shutdown(incoming, stop).await
                }
            };
            if let Err(e) = served {
                tracing::error!("coordinator server: {e}");
            }
        });
        Ok(Coordinator {
            addr,
            jobs,
            membership,
            server,
            shutdown: Some(tx),
            root: Some((root.get_cell(), root_handle)),
            ended,
        })
    }

    /// Submits a job this process has read already (`pipewise local`'s, in the same
    /// process): checked, planned, stored and queued as a `SubmitJob` call's, without the
    /// job's TOML written out and parsed again at the gRPC edge.
    pub async fn submit(&self, spec: pipewise_common::job::JobSpec) -> Result<JobRecord> {
        ractor::call!(self.jobs, JobMsg::Submit, Box::new(spec))?
    }

    /// Waits until the coordinator's actors end by themselves (one of them failed or
    /// stopped; the gRPC server stops with them), and returns why. A coordinator that is
    /// [shut down](Coordinator::shutdown) never gets here.
    pub async fn stopped(&mut self) -> String {
        match self.ended.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            // The root is gone without a word: only a shutdown drops it.
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops taking requests, stops the actors and waits for them (the store is closed on
    /// return: every record was durable when written), then for the server, at most
    /// [`SERVER_DRAIN`]. Streams that never end by themselves (workers' assignments, jobs
    /// watched) end with the actors that feed them.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some((root, handle)) = self.root.take() {
            root.stop(None);
            let _ = handle.await;
        }
        if tokio::time::timeout(SERVER_DRAIN, &mut self.server)
            .await
            .is_err()
        {
            tracing::warn!(
                "calls still open {} s after the shutdown began; ending them",
                SERVER_DRAIN.as_secs()
            );
            self.server.abort();
        }
    }
}
