//! The gRPC activation transport: [`GrpcTransport`] implements
//! [`crate::runtime::Transport`] over `pipewise.v1.ActivationService`.
//!
//! - Receiving: a tonic server (bound to `127.0.0.1:0` by default) takes client streams of
//!   `TensorFrame`s (its `Send` method served below tonic's codec, see `server`), validates
//!   each frame (known dtype and kind, `shape` product × dtype size = `data` length, the
//!   worker's job, a stage the worker holds, a step from the one before the worker's to
//!   two after it, no duplicate) and decodes it into a mailbox keyed by
//!   `(step, stage, mb, kind)`, as a tensor or a byte buffer ([`Delivery`]). A bad frame
//!   ends its stream with `InvalidArgument` naming the field (`TensorFrame.data: ...`) and,
//!   when it is of the worker's job and near its step, is recorded, so `recv` for its key
//!   fails at once instead of waiting for the timeout.
//! - Sending: [`Transport::send`] queues the frame for the peer; one task per peer connects
//!   lazily and makes a long-lived client-streaming `Send` call whose body takes the frames
//!   straight from that queue (see `client`: the call is made below tonic's codec, as the
//!   server serves it), and opens a new call (the channel reconnecting) after a failure.
//!   Frames already handed to a call that fails are lost; the receiver's `recv` then times
//!   out, and [`GrpcTransport::take_errors`] reports the failure on the sending side.
//! - Chunks: a tensor larger than [`GrpcConfig::chunk_bytes`] (1 MiB) goes out as
//!   consecutive `TensorFrame` messages with growing `offset`s, which the receiver copies
//!   one by one into the tensor's storage; small messages keep the buffers reused and in
//!   cache instead of a fresh tensor-sized buffer on each side for every frame.
//! - Copies: a contiguous CPU tensor is not copied by `send`; its memory is copied straight
//!   into the gRPC message when the frame goes out (so don't overwrite a sent tensor's
//!   storage in place, e.g. with `slice_set`; variables are copied at `send`, as are other
//!   views and device tensors). On receipt the data is copied once, from the HTTP/2 DATA
//!   frame that carried it into the tensor's storage. A [`crate::runtime::Buffer`]
//!   (emulated compute's byte buffers) is copied by neither side: its bytes go to HTTP/2 as
//!   slices, and a receiver assigned [`Delivery::Buffers`] hands over the slice of the DATA
//!   frame that carried a one-chunk frame (larger ones are joined with one copy).
//! - Wire form: little-endian raw elements of f32, f16 or bf16, row-major, bit-exact.
//! - Tiers ([`Tier`]): a peer on the same host (the coordinator tells from the hosts the
//!   workers registered, [`host_identity`]) is sent to through a ring in shared memory
//!   (see `shm`) rather than over gRPC, when [`GrpcTransport::set_peers_with_tiers`] says
//!   so; its frames come into the same inbox, through the same checks.
//! - Limits: messages up to [`GrpcConfig::max_message_bytes`] (256 MiB by default), HTTP/2
//!   stream and connection windows of 64 / 128 MiB and 2 MiB HTTP/2 frames, so 64 MiB
//!   tensors stream without stalling on flow control.

mod address;
pub mod certs;
mod client;
mod codec;
mod collective;
mod grad_chain;
mod grad_sum;
mod inbox;
mod peers;
mod run_name;
mod secret;
mod server;
mod shm;
mod tier;
mod tls;
mod tls_cause;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use candle_core::Device;
use pipewise_proto::v1::collective_service_server::CollectiveServiceServer;
use tokio::sync::oneshot;

pub use address::{grpc_uri, http_uri, names_tls};
pub use codec::Delivery;
pub use collective::{Collective, GradChain, NetSync};
pub use inbox::InboxStats;
pub use run_name::RunName;
pub use shm::host_identity;
pub use tier::Tier;
pub use tls::{Dial, TlsSettings, endpoint};
pub use tls_cause::{TlsCause, tls_cause, with_tls_cause};

use crate::error::{Error, Result};
use crate::runtime::transport::{Frame, FrameKind, Payload, Transport};
use client::{ClientSettings, Peer};
use inbox::Inbox;
use peers::{PeerErrors, RunningPeers};
use secret::RunSecret;
use server::ActivationServer;

const MIB: usize = 1 << 20;

/// How long `recv` reads the shared-memory rings itself before it sleeps until their
/// threads deliver: a hop's reply usually comes within it, and is then taken without a
/// thread's wake-up in between.
const SHM_POLL: Duration = Duration::from_micros(300);

/// Settings of a [`GrpcTransport`].
#[derive(Debug, Clone)]
pub struct GrpcConfig {
    /// Where the `ActivationService` listens (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// The job whose frames are accepted.
    pub job: u64,
    /// The stages this worker holds (frames for other stages are rejected).
    pub stages: Vec<u32>,
    /// Largest encoded message, both ways, and largest tensor accepted (default 256 MiB).
    pub max_message_bytes: usize,
    /// HTTP/2 initial stream window (default 64 MiB).
    pub stream_window_bytes: u32,
    /// HTTP/2 initial connection window (default 128 MiB).
    pub connection_window_bytes: u32,
    /// HTTP/2 adaptive (BDP-probing) flow control; when on, it replaces the fixed windows
    /// (default off: on loopback the fixed large windows are faster).
    pub adaptive_window: bool,
    /// Largest HTTP/2 frame (default 2 MiB; HTTP/2 allows up to 16 MiB − 1). Above the chunk
    /// size, so a chunk's message travels in one DATA frame and is decoded without a copy.
    pub max_frame_bytes: u32,
    /// Largest `TensorFrame` chunk sent (default 1 MiB): a larger tensor goes out as
    /// consecutive chunks, so message buffers stay small, reused and in cache.
    pub chunk_bytes: usize,
    /// How long a connection attempt to a peer may take (default 5 s).
    pub connect_timeout: Duration,
    /// Where received tensors are placed (default the CPU).
    pub device: Device,
    /// What `recv` returns until the first [`GrpcTransport::assign`]: tensors (default) or,
    /// for emulated compute, byte buffers.
    pub delivery: Delivery,
    /// TLS: with a certificate and a CA, mutual TLS with every peer (default none).
    pub tls: TlsSettings,
    /// Bytes of the ring from each same-host peer ([`Tier::Shm`]; default 8 MiB, rounded up
    /// to a power of two): a larger frame streams through it in pieces.
    pub shm_ring_bytes: usize,
}

impl GrpcConfig {
    /// Defaults for `job` with `stages`, listening on `127.0.0.1:0`.
    pub fn new(job: u64, stages: impl IntoIterator<Item = u32>) -> Self {
        GrpcConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            job,
            stages: stages.into_iter().collect(),
            max_message_bytes: pipewise_common::job::MAX_FRAME_BYTES as usize,
            stream_window_bytes: 64 * MIB as u32,
            connection_window_bytes: 128 * MIB as u32,
            adaptive_window: false,
            max_frame_bytes: 2 * MIB as u32,
            chunk_bytes: MIB,
            connect_timeout: Duration::from_secs(5),
            device: Device::Cpu,
            delivery: Delivery::Tensors,
            tls: TlsSettings::default(),
            shm_ring_bytes: 8 * MIB,
        }
    }
}

/// Worker-to-worker transport over gRPC (see the [module docs](self)).
///
/// Dropping it stops its server and its peer tasks (frames still queued are dropped).
#[derive(Debug)]
pub struct GrpcTransport {
    runtime: tokio::runtime::Handle,
    /// Set when the transport made its own runtime.
    owned_runtime: Option<tokio::runtime::Runtime>,
    local_addr: SocketAddr,
    inbox: Arc<Inbox>,
    peers: RwLock<HashMap<u32, Peer>>,
    /// The rings from same-host peers, by peer.
    inbound: Mutex<HashMap<u32, Arc<shm::Receiving>>>,
    shm_ring_bytes: usize,
    settings: ClientSettings,
    errors: Arc<PeerErrors>,
    running_peers: Arc<RunningPeers>,
    collective: Arc<Collective>,
    secret: Arc<RunSecret>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl GrpcTransport {
    /// Starts a transport on its own tokio runtime (two worker threads, see [`crate::sched`]).
    pub fn start(config: GrpcConfig) -> Result<Self> {
        let runtime =
            crate::sched::async_runtime(2, "pipewise-net").map_err(|source| Error::Start {
                what: "the transport's async runtime",
                source,
            })?;
        let mut transport = Self::start_on(runtime.handle().clone(), config)?;
        transport.owned_runtime = Some(runtime);
        Ok(transport)
    }

    /// Starts a transport whose server and peer tasks run on `runtime`. `send` and `recv`
    /// block, so call them from threads outside the runtime's workers.
    pub fn start_on(runtime: tokio::runtime::Handle, config: GrpcConfig) -> Result<Self> {
        let bind_error = |source| Error::Bind {
            address: config.listen,
            source,
        };
        let listener = std::net::TcpListener::bind(config.listen).map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let inbox = Arc::new(Inbox::new(
            config.job,
            config.stages.iter().copied(),
            config.delivery,
            config.device.clone(),
            config.max_message_bytes,
        ));
        let secret = Arc::new(RunSecret::default());
        let service = ActivationServer {
            inbox: Arc::clone(&inbox),
            max_message_bytes: config.max_message_bytes,
            secret: Arc::clone(&secret),
        };
        let collective = Arc::new(Collective::default());
        let collective_service = CollectiveServiceServer::new(collective::CollectiveServer {
            collective: Arc::clone(&collective),
            secret: Arc::clone(&secret),
        });
        let (health_reporter, health) = pipewise_proto::health_service();
        let (shutdown, stop) = oneshot::channel::<()>();
        let incoming = {
            let _guard = runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener).map_err(bind_error)?;
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
        };
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = config.tls.server() {
            builder = builder.tls_config(tls).map_err(|e| Error::Tls {
                what: "the activation server".into(),
                reason: crate::error::with_causes(&e),
            })?;
        }
        let router = builder
            .initial_stream_window_size(config.stream_window_bytes)
            .initial_connection_window_size(config.connection_window_bytes)
            .http2_adaptive_window(Some(config.adaptive_window))
            .max_frame_size(config.max_frame_bytes)
            .add_service(health)
            .add_service(service)
            .add_service(collective_service);
        let serve_inbox = Arc::clone(&inbox);
        runtime.spawn(async move {
            health_reporter.set_serving::<ActivationServer>().await;
            let stopped = async {
                let _ = stop.await;
            };
            if let Err(e) = router.serve_with_incoming_shutdown(incoming, stopped).await {
                tracing::error!("activation server on {local_addr}: {e}");
                serve_inbox.close(&format!("the activation server failed: {e}"));
            }
        });
        Ok(GrpcTransport {
            runtime,
            owned_runtime: None,
            local_addr,
            inbox,
            peers: RwLock::new(HashMap::new()),
            inbound: Mutex::new(HashMap::new()),
            shm_ring_bytes: config.shm_ring_bytes,
            settings: ClientSettings {
                max_message_bytes: config.max_message_bytes,
                stream_window: config.stream_window_bytes,
                connection_window: config.connection_window_bytes,
                adaptive_window: config.adaptive_window,
                max_frame_size: config.max_frame_bytes,
                chunk_bytes: config.chunk_bytes,
                connect_timeout: config.connect_timeout,
                tls: config.tls,
            },
            errors: Arc::new(PeerErrors::default()),
            running_peers: Arc::default(),
            collective,
            secret,
            shutdown: Some(shutdown),
        })
    }

    /// The address the `ActivationService` listens on (give it to the peers).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Sets (or replaces) the address of worker `worker`'s `ActivationService`
    /// (`host:port` or `http://host:port`). Nothing connects until the first frame.
    pub fn set_peer(&self, worker: u32, address: impl Into<String>) -> Result<()> {
        self.put_peer(worker, 0, address.into(), None, self.network_tier())
    }

    /// Sets the peers of run `run` to `peers` (worker index → address), as an `Assignment`
    /// lists them: peers not listed are dropped, and their connections end (frames still
    /// queued for them are dropped too). A peer of an earlier run is replaced even at the
    /// same address: the frames it still holds (a restarted worker was unreachable) belong
    /// to an abandoned run, and the new process would refuse them.
    pub fn set_peers<'a>(
        &self,
        run: u64,
        peers: impl IntoIterator<Item = (u32, &'a str)>,
    ) -> Result<()> {
        let tier = self.network_tier();
        self.set_peers_with_tiers(run, 0, peers.into_iter().map(|(w, a)| (w, a, tier)))
    }

    /// The tier of a peer on another host: gRPC, with mutual TLS when configured.
    pub fn network_tier(&self) -> Tier {
        if self.settings.tls.mutual() {
            Tier::GrpcTls
        } else {
            Tier::Grpc
        }
    }

    /// [`GrpcTransport::set_peers`] with each peer's tier: [`Tier::Shm`] for a peer on this
    /// host, whose frames then travel both ways through rings in shared memory (the peer
    /// must be given this worker as `Tier::Shm` too); any other tier is gRPC, with TLS as
    /// configured. `me` is this worker's index: its own entry, if listed, is its address
    /// as the peers know it, and names the rings from them.
    pub fn set_peers_with_tiers<'a>(
        &self,
        run: u64,
        me: u32,
        peers: impl IntoIterator<Item = (u32, &'a str, Tier)>,
    ) -> Result<()> {
        let peers: Vec<(u32, &str, Tier)> = peers.into_iter().collect();
        let own = peers
            .iter()
            .find(|p| p.0 == me)
            .map_or_else(|| self.local_addr.to_string(), |p| p.1.to_string());
        let mut listed = std::collections::HashSet::new();
        let mut rings = HashMap::new();
        for &(worker, address, tier) in &peers {
            let tier = match tier {
                Tier::Shm if worker != me => Tier::Shm,
                _ => self.network_tier(),
            };
            self.put_peer(worker, me, address.to_string(), Some(run), tier)?;
            listed.insert(worker);
            if tier == Tier::Shm {
                rings.insert(worker, shm::ring_path(run, worker, me, &own));
            }
        }
        self.peers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|worker, _| listed.contains(worker));
        let mut inbound = self
            .inbound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inbound.retain(|worker, r| rings.get(worker) == Some(&r.path));
        for (worker, path) in rings {
            if inbound.contains_key(&worker) {
                continue;
            }
            let receiving = shm::spawn_receiver(
                run,
                worker,
                path,
                self.shm_ring_bytes,
                Arc::clone(&self.inbox),
                Arc::clone(&self.secret),
            )?;
            inbound.insert(worker, Arc::new(receiving));
        }
        Ok(())
    }

    /// How frames travel to worker `worker`, if it is a peer.
    pub fn tier_of(&self, worker: u32) -> Option<Tier> {
        self.peers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&worker)
            .map(|p| p.tier)
    }

    /// Keeps worker `worker`'s peer task if it sends to `address` for `run` over `tier`;
    /// starts a new one otherwise (the old one ends, dropping what it still holds).
    fn put_peer(
        &self,
        worker: u32,
        me: u32,
        address: String,
        run: Option<u64>,
        tier: Tier,
    ) -> Result<()> {
        let mut peers = self
            .peers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if peers
            .get(&worker)
            .is_some_and(|p| p.address == address && p.run == run && p.tier == tier)
        {
            return Ok(());
        }
        let mut peer = if tier == Tier::Shm {
            let (queue, frames) = tokio::sync::mpsc::unbounded_channel();
            let path = shm::ring_path(run.unwrap_or(0), me, worker, &address);
            let sending = shm::spawn_sender(
                worker,
                path,
                frames,
                self.settings.connect_timeout,
                Arc::clone(&self.errors),
                &self.running_peers,
            )?;
            Peer {
                address,
                run,
                queue,
                tier,
                shm: Some(Arc::new(sending)),
            }
        } else {
            client::spawn_peer(
                &self.runtime,
                worker,
                address,
                &self.settings,
                Arc::clone(&self.errors),
                &self.running_peers,
            )?
        };
        peer.run = run;
        peers.insert(worker, peer);
        Ok(())
    }

    /// Sets run `run`'s secret (the assignment's `run_secret`; empty: none): every frame and
    /// collective call sent carries it, and only those that carry it are taken.
    pub fn set_run_secret(&self, run: u64, secret: bytes::Bytes) {
        self.secret.set(run, secret);
    }

    /// Switches to another job and set of held stages, whose received frames `recv` returns
    /// as `delivery` says; queued frames and records are dropped.
    pub fn assign(&self, job: u64, stages: impl IntoIterator<Item = u32>, delivery: Delivery) {
        self.inbox.assign(job, stages, delivery);
    }

    /// The end-of-step collectives this worker serves when it is a job's worker 0.
    pub fn collective(&self) -> &Arc<Collective> {
        &self.collective
    }

    /// A [`NetSync`] for worker `worker` of `job` whose calls go to this transport's own
    /// collective service, in process ([`NetSync::in_process`]): worker 0 of a job, the
    /// root itself, or a worker that serves its stages' gradient sums; `at` (its own
    /// address) names it in errors.
    pub fn sync_at(&self, at: &str, job: u64, worker: u32, timeout: Duration) -> Result<NetSync> {
        Ok(self
            .sync_to(at, job, worker, timeout)?
            .in_process(collective::CollectiveServer {
                collective: Arc::clone(&self.collective),
                secret: Arc::clone(&self.secret),
            }))
    }

    /// Worker `worker` of `job` (its contributor index) as `replica`'s link of its rank's
    /// chain of gradient sums along `addresses` (its rank's worker in every replica, in
    /// replica order): partials come to this transport's collective service, and go on
    /// to the next replica's worker.
    pub fn grad_chain(
        &self,
        replica: crate::runtime::Replica,
        addresses: &[String],
        job: u64,
        worker: u32,
        timeout: Duration,
    ) -> Result<collective::GradChain> {
        let next = match addresses.get(replica.index as usize + 1) {
            Some(at) => Some(
                self.sync_to(at, job, worker, timeout)?
                    .serving(format!("replica {}'s worker", replica.index + 1)),
            ),
            None => None,
        };
        let here = collective::CollectiveServer {
            collective: Arc::clone(&self.collective),
            secret: Arc::clone(&self.secret),
        };
        collective::GradChain::new(replica, addresses, here, next)
    }

    /// A [`NetSync`] for worker `worker` of `job` whose collectives go to the root
    /// (worker 0) at `root`, over this transport's runtime.
    pub fn sync_to(&self, root: &str, job: u64, worker: u32, timeout: Duration) -> Result<NetSync> {
        let inbox = Arc::clone(&self.inbox);
        Ok(NetSync::new(
            self.runtime.clone(),
            root,
            &self.settings.tls,
            (job, worker),
            timeout,
        )?
        .with_run_secret(self.secret.get())
        .with_abort(Arc::new(move || inbox.closed_reason())))
    }

    /// Counts of accepted, rejected and queued frames on the receiving side.
    pub fn stats(&self) -> InboxStats {
        self.inbox.stats()
    }

    /// The sending side's peer tasks still running: one per peer set, and a dropped peer's
    /// until its back-off or call under way is over. For tests: a dropped peer's task has
    /// ended once this counts only the peers set since, and it sends nothing more.
    pub fn peer_tasks(&self) -> usize {
        self.running_peers.count()
    }

    /// Failures of the sending side since the last call (a peer rejected a frame, a
    /// connection failed), oldest first.
    pub fn take_errors(&self) -> Vec<String> {
        self.errors.take()
    }

    /// Fails every pending and later `recv` with `reason` (e.g. when the job is aborted).
    pub fn abort(&self, reason: &str) {
        self.inbox.close(reason);
        self.collective.abort(reason);
    }
}

impl Transport for GrpcTransport {
    fn send(&self, to_worker: u32, frame: Frame) -> Result<()> {
        let peers = self
            .peers
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let peer = peers.get(&to_worker).ok_or_else(|| {
            Error::invalid(
                "to_worker",
                format!("worker {to_worker} has no known address"),
            )
        })?;
        let message = codec::encode(&frame)?.with_run_secret(self.secret.get());
        let sent = match &peer.shm {
            Some(shm) => shm.send(message, &peer.queue),
            None => peer.queue.send(message).map_err(|_| shm::QueueClosed),
        };
        sent.map_err(|_| Error::Closed {
            awaited: format!("send to worker {to_worker}"),
            reason: "its sender task has stopped".into(),
        })
    }

    fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: FrameKind,
        timeout: Duration,
    ) -> Result<Payload> {
        let rings: Vec<Arc<shm::Receiving>> = self
            .inbound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        if rings.is_empty() {
            return self.inbox.recv(job, step, stage, mb, kind, timeout);
        }
        // A frame from a same-host peer that comes within `SHM_POLL` is read from its ring
        // here, without waking a thread; later ones are delivered by the rings' threads.
        let started = std::time::Instant::now();
        loop {
            if let Some(payload) = self.inbox.take_ready(job, step, stage, mb, kind)? {
                return Ok(payload);
            }
            if started.elapsed() >= SHM_POLL.min(timeout) {
                break;
            }
            for ring in &rings {
                ring.poll();
            }
        }
        let _sleeping: Vec<_> = rings.iter().map(|r| r.sleeping()).collect();
        let left = timeout.saturating_sub(started.elapsed());
        self.inbox.recv(job, step, stage, mb, kind, left)
    }
}

impl Drop for GrpcTransport {
    fn drop(&mut self) {
        self.inbox.close("the transport was dropped");
        if let Some(stop) = self.shutdown.take() {
            let _ = stop.send(());
        }
        if let Ok(mut peers) = self.peers.write() {
            peers.clear();
        }
        if let Ok(mut inbound) = self.inbound.lock() {
            inbound.clear();
        }
        if let Some(runtime) = self.owned_runtime.take() {
            runtime.shutdown_background();
        }
    }
}
