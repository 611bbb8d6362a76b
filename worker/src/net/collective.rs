//! End-of-step collectives over gRPC, peer to peer: every worker serves
//! `pipewise.v1.CollectiveService` next to its `ActivationService`. A job's worker 0 (the
//! root) takes the barrier, squared norms and losses: every worker (worker 0 included)
//! sends its contribution with one unary `AllReduce` call, and every call is answered, with
//! the same result, once all the job's workers have contributed. With replicas, each rank's
//! workers sum their stages' gradients along a chain in replica order, with no root
//! ([`super::grad_chain`], the calls in `chain`); the root sums a tied table's two copies'
//! gradients when the embedding and the head are on different workers.
//!
//! The reduction matches [`LocalSync`](crate::runtime::LocalSync): squared norms are summed
//! in value order and losses averaged in f64, so a step gives the same numbers whether its
//! workers share a process or not. The root also carries the stop signal: once
//! [`Collective::request_stop`] is called, the next completed loss round tells every worker
//! to stop after that step, so all of them stop at the same step boundary.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pipewise_proto::v1::collective_service_client::CollectiveServiceClient;
use pipewise_proto::v1::collective_service_server::CollectiveService;
use pipewise_proto::v1::{ReduceOp, ReduceReply, ReduceRequest};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::RunName;
use super::grad_chain::ChainSums;
use super::grad_sum::{GradSums, SumResult, TIED_PARTS, to_bytes};
use crate::error::{Error, Result};
use crate::runtime::{
    Replica, ReplicaPart, ShardPart, StepSync, TiedHolder, TiedPart, sum_in_window_order,
};

mod chain;
mod chunked;

/// A completed round: the value and whether to stop after this step, or why it failed.
type RoundResult = std::result::Result<(f64, bool), Status>;

/// How many steps past an op's newest completed round a contribution may be (workers meet
/// at every step's end, so the next one is the only one due).
const ROUNDS_AHEAD: u64 = 2;

#[derive(Debug)]
struct Round {
    values: Vec<Option<Vec<f64>>>,
    arrived: usize,
    done: watch::Sender<Option<RoundResult>>,
}

#[derive(Debug, Default)]
struct State {
    /// The run served ([`RunName`]).
    run: u64,
    workers: u32,
    rounds: HashMap<(u64, i32), Round>,
    /// The newest step whose round of each op completed (a later contribution to it, or to
    /// an older step, is a repeat; one far ahead of it is a stray).
    completed: HashMap<i32, u64>,
    stop: bool,
    aborted: Option<String>,
    /// This worker's links of the data-parallel replicas' chain sums.
    chain: ChainSums,
    /// Tied tables' sums of their two copies' gradients.
    tied: GradSums,
}

/// The root's side of the collectives of one job (see the module docs of `net::collective`).
#[derive(Debug, Default)]
pub struct Collective {
    state: Mutex<State>,
    timeout: Mutex<Option<Duration>>,
    /// Stages' state offered to a replica being rebuilt, by (run, stage).
    offers: Mutex<HashMap<(u64, u32), bytes::Bytes>>,
}

/// Bytes of a stage's state per `REDUCE_OP_STATE` reply (under tonic's 4 MiB limit).
const STATE_CHUNK: usize = 2 << 20;

impl Collective {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Serves run `run` with `workers` contributors (over all its replicas) from now on,
    /// and the chain sums of this worker's `replica`; pending rounds of an earlier run
    /// fail, and the stop signal is cleared.
    pub fn configure(&self, run: u64, workers: u32, replica: Replica, timeout: Duration) {
        let mut st = self.lock();
        st.chain.reset(replica, "the worker was reassigned");
        st.tied.reset(TIED_PARTS, "the worker was reassigned");
        for (_, round) in st.rounds.drain() {
            let _ = round
                .done
                .send(Some(Err(Status::aborted("the worker was reassigned"))));
        }
        st.run = run;
        st.workers = workers;
        st.completed.clear();
        st.stop = false;
        st.aborted = None;
        *self
            .timeout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(timeout);
    }

    /// If this root serves run `run`, every worker of it stops after the next step whose
    /// loss round completes (a request for another run, e.g. a late answer about an old
    /// one, is ignored).
    pub fn request_stop(&self, run: u64) {
        let mut st = self.lock();
        if st.run == run && st.workers > 0 {
            st.stop = true;
        }
    }

    /// Offers stage `stage`'s state (`bytes`, a checkpoint shard) to the workers of run
    /// `run` that rebuild a replica; earlier runs' offers are dropped.
    pub fn offer(&self, run: u64, stage: u32, bytes: bytes::Bytes) {
        let mut offers = self.offers();
        offers.retain(|(r, _), _| *r == run);
        offers.insert((run, stage), bytes);
    }

    /// Withdraws every offer (the run's workers all passed its start barrier).
    pub fn withdraw(&self) {
        self.offers().clear();
    }

    fn offers(&self) -> MutexGuard<'_, HashMap<(u64, u32), bytes::Bytes>> {
        self.offers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Chunk `req.chunk` of the offered stage `req.stage` of run `req.run`, and the chunk
    /// count.
    fn offered(&self, req: &ReduceRequest) -> std::result::Result<(bytes::Bytes, u32), Status> {
        let offers = self.offers();
        let Some(bytes) = offers.get(&(req.run, req.stage)) else {
            return Err(Status::unavailable(format!(
                "stage {} of {} is not offered (yet)",
                req.stage,
                RunName(req.run)
            )));
        };
        let chunks = bytes.len().div_ceil(STATE_CHUNK).max(1);
        let start = req.chunk as usize * STATE_CHUNK;
        if req.chunk as usize >= chunks {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.chunk: {} of {chunks} chunks",
                req.chunk
            )));
        }
        let end = (start + STATE_CHUNK).min(bytes.len());
        Ok((bytes.slice(start..end), chunks as u32))
    }

    /// The contributions waiting in rounds not yet complete (the start barrier's among
    /// them): each is a worker's call waiting for the round's answer. Shown for tests, which
    /// wait for a call to be under way before they end it.
    pub fn waiting(&self) -> usize {
        self.lock().rounds.values().map(|round| round.arrived).sum()
    }

    /// Fails every pending and later round with `reason` (until the next `configure`).
    pub fn abort(&self, reason: &str) {
        let mut st = self.lock();
        for (_, round) in st.rounds.drain() {
            let _ = round.done.send(Some(Err(Status::aborted(reason))));
        }
        st.chain.fail(reason);
        st.tied.fail(reason);
        st.aborted = Some(reason.to_string());
    }

    /// The state, once `req` is known to be for the run served and not aborted.
    fn open(&self, req: &ReduceRequest) -> std::result::Result<MutexGuard<'_, State>, Status> {
        let st = self.lock();
        // A run the root has not taken yet (retryable), before any abort of the one it has.
        if st.workers == 0 || req.run != st.run {
            return Err(Status::failed_precondition(format!(
                "ReduceRequest.run: this worker serves the collectives of {} ({} workers), \
                 not of {}",
                RunName(st.run),
                st.workers,
                RunName(req.run)
            )));
        }
        if let Some(reason) = &st.aborted {
            return Err(Status::aborted(format!("the job was aborted: {reason}")));
        }
        Ok(st)
    }

    /// Takes the replica before's partial sum of a chunk of a stage's gradients, or a tied
    /// table's copy's chunk: the receiver gets the sum.
    fn contribute_grads(
        &self,
        req: &ReduceRequest,
    ) -> std::result::Result<watch::Receiver<Option<SumResult>>, Status> {
        let mut st = self.open(req)?;
        if req.op == ReduceOp::Tied as i32 {
            return st.tied.contribute_tied(req);
        }
        st.chain.receive(req)
    }

    /// The chain links open at this worker. For tests, which wait for a partial to have
    /// come before they end a call.
    pub fn links(&self) -> usize {
        self.lock().chain.open()
    }

    fn contribute(
        &self,
        req: &ReduceRequest,
    ) -> std::result::Result<watch::Receiver<Option<RoundResult>>, Status> {
        let op = ReduceOp::try_from(req.op)
            .ok()
            .filter(|op| !matches!(op, ReduceOp::Unspecified | ReduceOp::Grads | ReduceOp::Tied))
            .ok_or_else(|| {
                Status::invalid_argument(format!("ReduceRequest.op: unknown op {}", req.op))
            })?;
        let mut st = self.open(req)?;
        if req.worker >= st.workers {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.worker: {} of a {}-worker job",
                req.worker, st.workers
            )));
        }
        if op == ReduceOp::SqNorm && req.values.len() != 1 {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.values: a squared norm is one value, got {}",
                req.values.len()
            )));
        }
        // Not negative (a diverged run's NaN or infinite norm passes on, as PyTorch's
        // clip_grad_norm_ returns it).
        if op == ReduceOp::SqNorm && req.values.iter().any(|v| *v < 0.0) {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.values: a squared norm is not negative, got {:?}",
                req.values
            )));
        }
        if op == ReduceOp::Validation && !req.values.len().is_multiple_of(2) {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.values: validation losses are (window, loss) pairs, got {} \
                 values",
                req.values.len()
            )));
        }
        if let Some(&last) = st.completed.get(&(op as i32))
            && (req.step <= last || req.step - last > ROUNDS_AHEAD)
        {
            if last == BARRIER_STEP {
                return Err(Status::invalid_argument(
                    "ReduceRequest.step: the start barrier of this run already completed",
                ));
            }
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.step: {} {op:?} is not open ({} completed; steps up to {} may \
                 be)",
                RoundName(req.step),
                RoundName(last),
                last.saturating_add(ROUNDS_AHEAD).saturating_add(1)
            )));
        }
        let workers = st.workers as usize;
        let stop = st.stop;
        let round = st
            .rounds
            .entry((req.step, op as i32))
            .or_insert_with(|| Round {
                values: vec![None; workers],
                arrived: 0,
                done: watch::channel(None).0,
            });
        let slot = &mut round.values[req.worker as usize];
        if slot.is_some() {
            return Err(Status::invalid_argument(format!(
                "ReduceRequest.worker: worker {} already contributed to step {} {op:?}",
                req.worker, req.step
            )));
        }
        *slot = Some(req.values.clone());
        round.arrived += 1;
        let rx = round.done.subscribe();
        if round.arrived == workers {
            let values: Vec<f64> = round.values.iter().flatten().flatten().copied().collect();
            let result = match op {
                ReduceOp::SqNorm => {
                    let mut v = values;
                    v.sort_by(f64::total_cmp);
                    Ok((v.iter().sum(), false))
                }
                ReduceOp::Barrier => Ok((0.0, false)),
                ReduceOp::Validation => {
                    let mut pairs: Vec<(u64, f64)> =
                        values.chunks(2).map(|p| (p[0] as u64, p[1])).collect();
                    Ok((sum_in_window_order(&mut pairs), false))
                }
                _ if values.is_empty() => Err(Status::aborted("no worker reported a loss")),
                _ => Ok((values.iter().sum::<f64>() / values.len() as f64, stop)),
            };
            let _ = round.done.send(Some(result));
            st.rounds.remove(&(req.step, op as i32));
            let last = st.completed.entry(op as i32).or_insert(req.step);
            *last = (*last).max(req.step);
        }
        Ok(rx)
    }
}

/// A round's step as people read it: the start barrier's (sent as step `u64::MAX`, before
/// any step), or a step counted from 1, as every other message says them.
struct RoundName(u64);

/// The step the start barrier's round is sent as.
const BARRIER_STEP: u64 = u64::MAX;

impl std::fmt::Display for RoundName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            BARRIER_STEP => f.write_str("the start barrier"),
            step => write!(f, "step {}", step.saturating_add(1)),
        }
    }
}

/// The gRPC face of a [`Collective`].
#[derive(Debug, Clone)]
pub(crate) struct CollectiveServer {
    pub(crate) collective: Arc<Collective>,
    /// The run's secret every contribution must carry.
    pub(crate) secret: Arc<super::secret::RunSecret>,
}

#[tonic::async_trait]
impl CollectiveService for CollectiveServer {
    async fn all_reduce(
        &self,
        request: Request<ReduceRequest>,
    ) -> std::result::Result<Response<ReduceReply>, Status> {
        let req = request.into_inner();
        if !self.secret.admits(&req.run_secret) {
            // A call for a run this worker has not taken up yet carries that run's secret,
            // which it learns with its assignment: the caller retries, as for any run not
            // taken yet. A call for the run whose secret is held must carry it.
            if !self.secret.holds(req.run) {
                return Err(Status::failed_precondition(format!(
                    "ReduceRequest.run: {} is not taken up here yet",
                    RunName(req.run)
                )));
            }
            return Err(Error::RunSecret {
                field: "ReduceRequest.run_secret",
            }
            .into());
        }
        if req.op == ReduceOp::State as i32 {
            let (chunk, chunks) = self.collective.offered(&req)?;
            return Ok(Response::new(ReduceReply {
                grads: chunk.to_vec(),
                value: f64::from(chunks),
                ..ReduceReply::default()
            }));
        }
        if req.op == ReduceOp::Grads as i32 || req.op == ReduceOp::Tied as i32 {
            let rx = self.collective.contribute_grads(&req)?;
            let sum = self.answer(req.step, rx).await?;
            return Ok(Response::new(ReduceReply {
                grads: to_bytes(&sum),
                ..ReduceReply::default()
            }));
        }
        let rx = self.collective.contribute(&req)?;
        let (value, stop) = self.answer(req.step, rx).await?;
        Ok(Response::new(ReduceReply {
            value,
            stop,
            ..ReduceReply::default()
        }))
    }
}

impl CollectiveServer {
    /// The result of the round `rx` follows; a round still open after the timeout aborts
    /// the job's collectives.
    async fn answer<T: Clone>(
        &self,
        step: u64,
        mut rx: watch::Receiver<Option<std::result::Result<T, Status>>>,
    ) -> std::result::Result<T, Status> {
        let timeout = self
            .collective
            .timeout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .unwrap_or(crate::runtime::DEFAULT_TIMEOUT);
        match tokio::time::timeout(timeout, rx.wait_for(Option::is_some)).await {
            Err(_) => {
                let timeout = Error::Timeout {
                    awaited: format!("{}: waiting for the other workers", RoundName(step)),
                    after: timeout,
                };
                self.collective.abort(&timeout.to_string());
                Err(timeout.into())
            }
            Ok(Err(_)) => Err(Status::aborted("the collective was dropped")),
            Ok(Ok(r)) => r
                .clone()
                .unwrap_or_else(|| Err(Status::internal("round finished without a result"))),
        }
    }
}

/// [`StepSync`] across processes: calls worker 0's `CollectiveService` (the replicas'
/// gradient sums: the next replica's worker of the rank, [`GradChain`]).
pub struct NetSync {
    runtime: tokio::runtime::Handle,
    client: CollectiveServiceClient<Channel>,
    /// The called worker's address.
    root: String,
    /// Who that is, in errors: "worker 0" unless [`NetSync::serving`] says otherwise.
    serves: String,
    /// The run ([`RunName`]).
    run: u64,
    worker: u32,
    timeout: Duration,
    /// The run's secret, sent with every contribution.
    run_secret: Vec<u8>,
    stop: std::sync::atomic::AtomicBool,
    /// Says why the job was abandoned, if it was: a call waiting on the root then ends.
    aborted: Option<AbortCheck>,
    /// The root's service in this process, when this worker is the root: its own
    /// contributions (with replicas, its whole gradient share every step) are handed to it
    /// directly instead of crossing loopback gRPC.
    local: Option<CollectiveServer>,
    /// The chain the stages' gradients are summed over the replicas along.
    chain: Option<GradChain>,
}

impl std::fmt::Debug for NetSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetSync")
            .field("run", &self.run)
            .field("worker", &self.worker)
            .field("timeout", &self.timeout)
            .field("stop", &self.stop)
            .field("aborted", &self.aborted.is_some())
            .field("in_process", &self.local.is_some())
            .field("chain", &self.chain)
            .finish_non_exhaustive()
    }
}

/// This worker's place in its rank's chain of gradient sums.
pub struct GradChain {
    replica: Replica,
    /// This worker's own collective service, where the replica before's partials come.
    here: CollectiveServer,
    /// The replica before's worker of the rank, in errors (none on replica 0).
    before: Option<String>,
    /// The next replica's worker of the rank (none on the last replica).
    next: Option<Arc<NetSync>>,
}

impl std::fmt::Debug for GradChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradChain")
            .field("replica", &self.replica)
            .field("before", &self.before)
            .field("next", &self.next.as_ref().map(|n| &n.root))
            .finish_non_exhaustive()
    }
}

/// Whether (and why) a job was abandoned.
pub(crate) type AbortCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Why the job was abandoned, once `aborted` says it was (checked every 50 ms); never
/// without a check.
async fn abandoned(aborted: Option<AbortCheck>) -> String {
    match aborted {
        Some(check) => loop {
            if let Some(why) = check() {
                return why;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        },
        None => std::future::pending().await,
    }
}

impl NetSync {
    /// Worker `worker` of run `run` (`member`), reducing through the root at `root`
    /// (`host:port`, mutual TLS when `tls` has a certificate and a CA); calls block (from a
    /// thread outside `runtime`'s workers) at most `timeout` plus a margin.
    pub fn new(
        runtime: tokio::runtime::Handle,
        root: &str,
        tls: &super::TlsSettings,
        (run, worker): (u64, u32),
        timeout: Duration,
    ) -> Result<Self> {
        let endpoint = super::tls::endpoint(root, tls, super::Dial::Peer, "the collective root")
            .map_err(|e| match e {
                Error::Address { .. } => {
                    Error::invalid("peers", format!("collective root address: {e}"))
                }
                other => other,
            })?;
        let channel = {
            let _guard = runtime.enter();
            endpoint
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .connect_lazy()
        };
        Ok(Self {
            runtime,
            client: CollectiveServiceClient::new(channel),
            root: root.to_string(),
            serves: "worker 0".into(),
            run,
            worker,
            timeout,
            run_secret: Vec::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
            aborted: None,
            local: None,
            chain: None,
        })
    }

    /// Calls `root`, this process's own collective service, directly (the same handler,
    /// run secret check included, without the network).
    pub(crate) fn in_process(mut self, root: CollectiveServer) -> Self {
        self.local = Some(root);
        self
    }

    /// Names the called worker `who` in errors (it is not the root).
    pub(crate) fn serving(mut self, who: String) -> Self {
        self.serves = who;
        self
    }

    /// Sums the stages' gradients over the replicas along `chain`.
    pub fn with_grad_chain(mut self, chain: GradChain) -> Self {
        self.chain = Some(chain);
        self
    }

    /// Sends the run's `secret` with every contribution (empty: none).
    pub(crate) fn with_run_secret(mut self, secret: bytes::Bytes) -> Self {
        self.run_secret = secret.to_vec();
        self
    }

    /// Ends a waiting call (the start barrier, a step's collectives) within 50 ms once
    /// `aborted` says why the job was abandoned, rather than at the timeout.
    pub(crate) fn with_abort(mut self, aborted: AbortCheck) -> Self {
        self.aborted = Some(aborted);
        self
    }

    /// Whether the root said, in the last loss round, to stop after that step.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Sends this worker's `values` for `op` of step `step` (`what` names the call in
    /// errors) and waits for the round's result.
    fn call(&self, what: &str, step: u64, op: ReduceOp, values: Vec<f64>) -> Result<ReduceReply> {
        self.send(what, self.request(step, op, values))
    }

    /// This worker's `values` for `op` of step `step`.
    fn request(&self, step: u64, op: ReduceOp, values: Vec<f64>) -> ReduceRequest {
        ReduceRequest {
            run: self.run,
            step,
            op: op as i32,
            worker: self.worker,
            values,
            run_secret: self.run_secret.clone(),
            ..ReduceRequest::default()
        }
    }

    /// Sends `req` (`what` names it in errors) and waits for the round's result.
    fn send(&self, what: &str, req: ReduceRequest) -> Result<ReduceReply> {
        self.runtime.block_on(self.answer(what.to_string(), req))
    }

    /// Sends the request `req` makes, again every 50 ms while the call fails with one of the
    /// codes `retry` (the called worker not reachable or not ready yet), up to the timeout.
    fn send_retrying(
        &self,
        what: &str,
        retry: &[tonic::Code],
        req: impl Fn() -> ReduceRequest,
    ) -> Result<ReduceReply> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            match self.send(what, req()) {
                Err(Error::Call { code, .. })
                    if retry.contains(&code) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// The root's answer to `req` (`what` names it in errors), owning all it needs, so that
    /// several calls can be in flight at once.
    fn answer(
        &self,
        what: String,
        req: ReduceRequest,
    ) -> impl std::future::Future<Output = Result<ReduceReply>> + Send + 'static {
        let mut client = self.client.clone();
        let local = self.local.clone();
        let limit = self.timeout + Duration::from_secs(10);
        let aborted = self.aborted.clone();
        let root = self.root.clone();
        let serves = self.serves.clone();
        async move {
            let call = async move {
                match local {
                    Some(server) => server.all_reduce(Request::new(req)).await,
                    None => client.all_reduce(req).await,
                }
            };
            let failed = |code: tonic::Code, message: String| Error::Call {
                call: what.clone(),
                peer: root.clone(),
                code,
                message,
            };
            tokio::select! {
                answer = tokio::time::timeout(limit, call) => match answer {
                    Err(_) => Err(Error::Timeout {
                        awaited: format!("{what}: the answer of {serves} ({root})"),
                        after: limit,
                    }),
                    Ok(reply) => reply
                        .map(tonic::Response::into_inner)
                        .map_err(|s| failed(s.code(), s.message().to_string())),
                },
                // The run was abandoned here: the call ends as the root would end it.
                why = abandoned(aborted) => Err(failed(tonic::Code::Aborted, why)),
            }
        }
    }

    /// Chunk `chunk` of `chunks` of gradients, `values`, for the sum `op` of `part`.
    fn grads_request(
        &self,
        (op, part): (ReduceOp, ReplicaPart),
        (chunk, chunks): (u32, u32),
        values: &[f64],
    ) -> ReduceRequest {
        ReduceRequest {
            run: self.run,
            step: part.step,
            op: op as i32,
            worker: self.worker,
            stage: part.stage,
            chunk,
            chunks,
            replica: part.replica,
            grads: to_bytes(values),
            run_secret: self.run_secret.clone(),
            ..ReduceRequest::default()
        }
    }

    /// A step's collective `op` (steps counted from 1 in errors, as every other message
    /// and log says them).
    fn step_call(&self, step: u64, op: ReduceOp, values: Vec<f64>) -> Result<ReduceReply> {
        let what = format!("step {} {op:?}", step.saturating_add(1));
        self.call(&what, step, op, values)
    }

    /// Stage `stage`'s state as the worker this calls offers it (a checkpoint shard),
    /// chunk by chunk; waits (up to the timeout) until it is offered.
    pub fn fetch_stage(&self, stage: u32) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        let mut chunk = 0;
        loop {
            let req = || ReduceRequest {
                stage,
                chunk,
                ..self.request(0, ReduceOp::State, Vec::new())
            };
            // Until the first chunk comes, the state may not be offered yet.
            let not_yet: &[tonic::Code] = if chunk == 0 {
                &[tonic::Code::Unavailable, tonic::Code::FailedPrecondition]
            } else {
                &[]
            };
            let reply = self.send_retrying(&format!("stage {stage}'s state"), not_yet, req)?;
            bytes.extend_from_slice(&reply.grads);
            chunk += 1;
            if f64::from(chunk) >= reply.value {
                return Ok(bytes);
            }
        }
    }

    /// Waits until every worker of the job has joined (call once the transport is assigned
    /// to the job, before the first step). Retries while worker 0 is unreachable or has not
    /// taken the job yet.
    pub fn barrier(&self) -> Result<()> {
        let not_yet = [tonic::Code::FailedPrecondition, tonic::Code::Unavailable];
        self.send_retrying("start barrier", &not_yet, || {
            self.request(BARRIER_STEP, ReduceOp::Barrier, Vec::new())
        })
        .map(drop)
    }
}

impl StepSync for NetSync {
    fn all_reduce_replicas(&self, part: ReplicaPart, grads: &mut [f64]) -> Result<()> {
        let Some(chain) = &self.chain else {
            return Err(Error::invalid(
                "replicas",
                format!("{part}: this worker has no chain of gradient sums"),
            ));
        };
        self.sum_along(chain, part, grads)
    }

    fn sum_tied(&self, part: TiedPart, grads: &mut [f64]) -> Result<()> {
        // The root tells the copies apart by the stage: the embedding's is stage 0.
        let stage = match part.holder {
            TiedHolder::Embedding => 0,
            TiedHolder::Head => 1,
        };
        let replica_part = ReplicaPart {
            step: part.step,
            stage,
            replica: part.replica,
        };
        let what = format!("step {} {part}", part.step + 1);
        self.sum_in_chunks(&what, (ReduceOp::Tied, replica_part), grads)
    }

    fn all_gather_shards(&self, part: ShardPart, shard: &[f32]) -> Result<Vec<f32>> {
        self.gather_by_sum(part, shard)
    }

    fn all_reduce_sq_norm(&self, step: u64, local: f64) -> Result<f64> {
        Ok(self.step_call(step, ReduceOp::SqNorm, vec![local])?.value)
    }

    fn mean_loss(&self, step: u64, local: &[f32]) -> Result<f32> {
        let reply = self.step_call(
            step,
            ReduceOp::Loss,
            local.iter().map(|&l| f64::from(l)).collect(),
        )?;
        if reply.stop {
            self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(reply.value as f32)
    }

    fn validation_sum(&self, round: u64, local: &[(u64, f64)]) -> Result<f64> {
        // Window indices are below 2^53: exact as f64.
        let values = local.iter().flat_map(|&(k, v)| [k as f64, v]).collect();
        let what = format!("validation batch {} of the run", round.saturating_add(1));
        Ok(self.call(&what, round, ReduceOp::Validation, values)?.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(step: u64, worker: u32, value: f64) -> ReduceRequest {
        ReduceRequest {
            run: 1,
            step,
            op: ReduceOp::SqNorm as i32,
            worker,
            values: vec![value],
            run_secret: Vec::new(),
            ..ReduceRequest::default()
        }
    }

    /// A validation batch's `(window, loss)` pairs are summed in window order, whichever
    /// worker sent which: here the workers' order would give 1, the windows' gives 0. Half
    /// a pair is refused.
    #[test]
    fn validation_pairs_are_summed_in_window_order() {
        let c = Collective::default();
        c.configure(1, 2, Replica::default(), Duration::from_secs(1));
        let pairs = |worker: u32, values: Vec<f64>| ReduceRequest {
            op: ReduceOp::Validation as i32,
            values,
            ..req(0, worker, 0.0)
        };
        let err = c.contribute(&pairs(0, vec![1.0])).expect_err("half a pair");
        assert!(err.message().contains("pairs"), "{err:?}");
        let rx = c.contribute(&pairs(0, vec![2.0, -1e16])).expect("open");
        c.contribute(&pairs(1, vec![0.0, 1e16, 1.0, 1.0]))
            .expect("open");
        let reduced = rx.borrow().clone().map(|r| r.map_err(|s| s.code()));
        assert_eq!(reduced, Some(Ok((0.0, false))));
        assert_eq!(-1e16 + 1e16 + 1.0, 1.0, "the workers' order");
    }

    /// A contribution to a round already reduced, or far past the newest, is refused (a
    /// repeat used to open a round that never completed and then aborted the job).
    #[test]
    fn only_open_rounds_take_contributions() {
        let c = Collective::default();
        c.configure(1, 2, Replica::default(), Duration::from_secs(1));
        let rx = c.contribute(&req(0, 0, 1.0)).expect("open");
        c.contribute(&req(0, 1, 2.0)).expect("open");
        let reduced = rx.borrow().clone().map(|r| r.map_err(|s| s.code()));
        assert_eq!(reduced, Some(Ok((3.0, false))));
        for (step, why) in [(0, "repeat"), (3, "too far ahead")] {
            let err = c.contribute(&req(step, 0, 1.0)).expect_err(why);
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{why}");
            assert!(err.message().contains("is not open"), "{why}: {err:?}");
        }
        c.contribute(&req(2, 0, 1.0)).expect("two ahead is open");
        let err = c.contribute(&req(1, 0, -1.0)).expect_err("negative");
        assert!(err.message().contains("not negative"), "{err:?}");
        c.contribute(&req(1, 0, f64::NAN))
            .expect("a NaN norm passes on");
        // A new job starts afresh.
        c.configure(2, 1, Replica::default(), Duration::from_secs(1));
        let mut first = req(0, 0, 1.0);
        first.run = 2;
        c.contribute(&first).expect("a new job's first step");
    }

    /// The root's own calls go to its service in process: with nothing listening at the
    /// root's address, a one-worker job's barrier and collectives still complete (over
    /// gRPC they fail), and the run secret is still checked.
    #[test]
    fn the_roots_own_calls_need_no_network() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let collective = Arc::new(Collective::default());
        collective.configure(7, 1, Replica::default(), Duration::from_secs(2));
        let secret = Arc::new(super::super::secret::RunSecret::default());
        secret.set(7, bytes::Bytes::from_static(b"run-secret"));
        // Port 1 on loopback: nothing listens there.
        let sync = |with_secret: &'static [u8], timeout| {
            NetSync::new(
                runtime.handle().clone(),
                "127.0.0.1:1",
                &super::super::TlsSettings::default(),
                (7, 0),
                timeout,
            )
            .expect("sync")
            .with_run_secret(bytes::Bytes::from_static(with_secret))
        };
        // The barrier retries an unreachable root until its timeout.
        let over_grpc = sync(b"run-secret", Duration::from_millis(300));
        assert!(over_grpc.barrier().is_err(), "nothing listens at the root");
        let server = CollectiveServer {
            collective: Arc::clone(&collective),
            secret: Arc::clone(&secret),
        };
        let root = sync(b"run-secret", Duration::from_secs(2)).in_process(server.clone());
        root.barrier().expect("barrier in process");
        assert_eq!(root.all_reduce_sq_norm(0, 2.5).expect("norm"), 2.5);
        assert_eq!(root.mean_loss(0, &[1.0, 3.0]).expect("loss"), 2.0);
        let wrong = sync(b"another", Duration::from_secs(2)).in_process(server);
        assert!(
            wrong.all_reduce_sq_norm(1, 1.0).is_err(),
            "the secret is checked"
        );
    }

    /// A call for a run the worker has not taken up yet is answered "not yet"
    /// (`FailedPrecondition`, which the start barrier retries), whatever secret it carries:
    /// only the run's assignment tells the worker that secret. A call for the run whose
    /// secret the worker holds, with another secret, is refused (`PermissionDenied`).
    #[test]
    fn a_run_not_taken_up_yet_is_retryable_and_a_wrong_secret_is_not() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let collective = Arc::new(Collective::default());
        collective.configure(7, 2, Replica::default(), Duration::from_secs(2));
        let secret = Arc::new(super::super::secret::RunSecret::default());
        secret.set(7, bytes::Bytes::from_static(b"secret of run 7"));
        let server = CollectiveServer { collective, secret };
        let call = |run: u64, with: &'static [u8]| {
            let req = ReduceRequest {
                run,
                step: u64::MAX,
                op: ReduceOp::Barrier as i32,
                worker: 1,
                run_secret: with.to_vec(),
                ..ReduceRequest::default()
            };
            runtime
                .block_on(server.all_reduce(Request::new(req)))
                .expect_err("not answered")
                .code()
        };
        assert_eq!(call(8, b"secret of run 8"), tonic::Code::FailedPrecondition);
        assert_eq!(call(7, b"secret of run 8"), tonic::Code::PermissionDenied);
        assert_eq!(call(7, b""), tonic::Code::PermissionDenied);
    }

    /// Worker `worker`'s sync of run 7 whose calls go to `server` in process (nothing
    /// listens at the address it names).
    fn in_process_sync(
        runtime: &tokio::runtime::Runtime,
        worker: u32,
        server: &CollectiveServer,
    ) -> NetSync {
        NetSync::new(
            runtime.handle().clone(),
            "127.0.0.1:1",
            &super::super::TlsSettings::default(),
            (7, worker),
            Duration::from_secs(2),
        )
        .expect("sync")
        .in_process(server.clone())
    }

    /// A tied table's copies on different workers meet at the root: the embedding's holder
    /// and the head's both get the sum, each replica its own pair's.
    #[test]
    fn tied_copies_are_summed_at_the_root_per_replica() {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let collective = Arc::new(Collective::default());
        collective.configure(7, 4, Replica::default(), Duration::from_secs(2));
        let server = CollectiveServer {
            collective,
            secret: Arc::new(super::super::secret::RunSecret::default()),
        };
        let sync = |worker: u32| in_process_sync(&runtime, worker, &server);
        let part = |replica, holder| TiedPart {
            step: 0,
            replica,
            holder,
        };
        let heads: Vec<_> = [(1, 0, [0.5, -1.0]), (3, 1, [4.0, 8.0])]
            .into_iter()
            .map(|(worker, replica, mut grads)| {
                let head = sync(worker);
                std::thread::spawn(move || {
                    head.sum_tied(part(replica, TiedHolder::Head), &mut grads)
                        .map(|()| grads)
                })
            })
            .collect();
        let mut replica_1 = [16.0, 32.0];
        sync(2)
            .sum_tied(part(1, TiedHolder::Embedding), &mut replica_1)
            .expect("replica 1's sum");
        let mut replica_0 = [1.0, 2.0];
        sync(0)
            .sum_tied(part(0, TiedHolder::Embedding), &mut replica_0)
            .expect("replica 0's sum");
        assert_eq!((replica_0, replica_1), ([1.5, 1.0], [20.0, 40.0]));
        let theirs: Vec<[f64; 2]> = heads
            .into_iter()
            .map(|h| h.join().expect("thread").expect("the head's sum"))
            .collect();
        assert_eq!(theirs, [[1.5, 1.0], [20.0, 40.0]]);
    }
}
