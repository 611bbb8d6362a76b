//! The pipeline executor: one worker's stages running its program of a schedule for one
//! training step, and [`run_local`], every worker of a schedule on threads of one process.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use candle_core::{Device, Tensor};
use pipewise_common::model::ModelSpec;
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::placement::Placement;
use pipewise_common::schedule::Schedule;
use pipewise_common::trace::{Activity, Span};

use super::exchange::{Input, Link, Local, invalid};
use super::transport::{FrameKind, MemoryTransport, Payload, Transport};
use crate::data::Batch;
use crate::error::Result;
use crate::optim::{AdamW, clip_scale};
use crate::param::Param;
use crate::stage::Stage;

/// How long a worker waits for a frame or for the other workers at a step's end, unless
/// [`WorkerRuntime::set_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The collective operations at the end of a step, across all workers of a job.
pub trait StepSync: Send + Sync {
    /// All-reduce: the sum over workers of their `local` squared gradient norms (for global
    /// norm clipping); every worker gets the same global sum.
    fn all_reduce_sq_norm(&self, step: u64, local: f64) -> Result<f64>;

    /// Gathers the microbatch losses of the last stage (each worker passes its own, empty
    /// if it holds no last stage) and returns the step's mean loss to every worker.
    fn mean_loss(&self, step: u64, local: &[f32]) -> Result<f32>;
}

/// What one worker reports about one step.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// The step's mean loss over its microbatches (the same on every worker after the sync).
    pub loss: Option<f32>,
    /// Compute seconds of every pass the worker ran, in program order (waiting for frames
    /// not included).
    pub pass_times: Vec<(Pass, f64)>,
    /// The sum of [`StepReport::pass_times`].
    pub busy_secs: f64,
    /// Seconds from the start of the step to its end (optimizer step and syncs included).
    pub wall_secs: f64,
    /// The largest stash (bytes for pending `B` and `W` over all the worker's stages) seen
    /// at a pass boundary during the step.
    pub peak_stash_bytes: u64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// What the worker did when, in seconds of UNIX time: every pass, every wait for a
    /// peer's frame, every hand-over to the transport and the end-of-step sync.
    pub spans: Vec<Span>,
    /// Activation and gradient bytes sent to each peer worker during the step.
    pub bytes_sent: BTreeMap<u32, u64>,
    /// Activation and gradient bytes received from each peer worker during the step.
    pub bytes_received: BTreeMap<u32, u64>,
}

/// One worker of a pipeline: the stages the schedule's placement gives it and its ordered
/// pass list ("program").
///
/// Tensors between two stages of this worker (a V shape's turn, adjacent loop chunks on one
/// worker, any stages when there is a single worker) are handed over in memory; only
/// dependencies that cross workers go through the [`Transport`].
#[derive(Debug)]
pub struct WorkerRuntime {
    worker: u32,
    placement: Placement,
    stage_count: u32,
    microbatches: u32,
    stages: BTreeMap<u32, Stage>,
    program: Vec<Pass>,
    optimizer: AdamW,
    hidden: usize,
    timeout: Duration,
    /// Every pass takes this many times as long ([`WorkerRuntime::set_slowdown`]).
    slowdown: f64,
}

impl WorkerRuntime {
    /// Worker `worker` of `schedule`: builds its stages (stage `s` holds the pieces
    /// `partition[s]`, initialised from `seed` exactly as the whole model would be) with the
    /// AdamW hyper-parameters `optimizer`, and takes its program.
    ///
    /// The schedule is validated (every pass present once, dependencies acyclic);
    /// `partition` must cover the model's pieces contiguously, one range per stage (e.g.
    /// [`Stage::even_split`]).
    pub fn new(
        worker: u32,
        schedule: &Schedule,
        spec: &ModelSpec,
        partition: &[Range<usize>],
        seed: u64,
        device: &Device,
        optimizer: AdamW,
    ) -> Result<Self> {
        pipewise_common::validate(schedule)?;
        if worker >= schedule.num_workers() {
            return Err(invalid(
                "worker",
                format!(
                    "worker {worker} of a {}-worker schedule",
                    schedule.num_workers()
                ),
            ));
        }
        Self::from_program(
            worker,
            &schedule.placement,
            schedule.microbatches,
            schedule.workers[worker as usize].clone(),
            spec,
            partition,
            seed,
            device,
            optimizer,
        )
    }

    /// Worker `worker` running `program` (its pass list of a schedule over `placement`
    /// with `microbatches` microbatches), as a remote worker gets it in an assignment.
    ///
    /// Only this worker's part is checked: every pass is on a stage the placement gives
    /// the worker, for a microbatch below `microbatches`, and appears once; and every
    /// (stage, microbatch) gets its forward and its full backward (`B` and `W`, or `BW`).
    /// The schedule as a whole is the planner's to validate.
    #[allow(clippy::too_many_arguments)]
    pub fn from_program(
        worker: u32,
        placement: &Placement,
        microbatches: u32,
        program: Vec<Pass>,
        spec: &ModelSpec,
        partition: &[Range<usize>],
        seed: u64,
        device: &Device,
        optimizer: AdamW,
    ) -> Result<Self> {
        if worker >= placement.workers() {
            return Err(invalid(
                "worker",
                format!(
                    "worker {worker} of a {}-worker placement",
                    placement.workers()
                ),
            ));
        }
        check_program(worker, placement, microbatches, &program)?;
        let stage_count = placement.stages();
        check_partition(spec, partition, stage_count)?;
        let mut stages = BTreeMap::new();
        for s in placement.stages_of(worker) {
            let mut stage = Stage::new(spec, partition[s as usize].clone(), seed, device)?;
            stage.set_optimizer(optimizer);
            stage.set_microbatches(microbatches);
            stages.insert(s, stage);
        }
        Ok(Self {
            worker,
            placement: placement.clone(),
            stage_count,
            microbatches,
            stages,
            program,
            optimizer,
            hidden: spec.hidden as usize,
            timeout: DEFAULT_TIMEOUT,
            slowdown: 1.0,
        })
    }

    /// Sets how long to wait for a frame (and, in [`run_local`], for the other workers).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Makes every pass take `factor` times as long (it sleeps for the extra time after
    /// computing): a stand-in for a slower device, to exercise straggler handling.
    /// Factors below 1 count as 1.
    pub fn set_slowdown(&mut self, factor: f64) {
        self.slowdown = if factor.is_finite() {
            factor.max(1.0)
        } else {
            1.0
        };
    }

    /// Sleeps for the slowdown's share of a pass that started at `t0`.
    fn stretch(&self, t0: Instant) {
        if self.slowdown > 1.0 {
            std::thread::sleep(t0.elapsed().mul_f64(self.slowdown - 1.0));
        }
    }

    /// How long a `recv` waits.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// This worker's index.
    pub fn worker(&self) -> u32 {
        self.worker
    }

    /// The passes this worker runs each step, in order.
    pub fn program(&self) -> &[Pass] {
        &self.program
    }

    /// The stages held, by stage index.
    pub fn stages(&self) -> &BTreeMap<u32, Stage> {
        &self.stages
    }

    /// The stages held, mutably (to save or load checkpoints).
    pub fn stages_mut(&mut self) -> &mut BTreeMap<u32, Stage> {
        &mut self.stages
    }

    /// Every parameter of the worker's stages, in stage then model order.
    pub fn params(&self) -> impl Iterator<Item = &Param> {
        self.stages.values().flat_map(Stage::params)
    }

    /// Runs this worker's program for step `step` of job `job`, then the global-norm clipped
    /// optimizer step of its stages.
    ///
    /// `batches` are all `n` microbatches of the step (stage 0 reads their tokens, the last
    /// stage their targets, every stage their shape to check incoming frames). Frames for
    /// other workers go through `transport`; `sync` all-reduces the squared gradient norms
    /// and the losses. On an error the step's pending microbatches and gradients are dropped,
    /// so the step can be run again.
    pub fn run_step(
        &mut self,
        job: u64,
        step: u64,
        batches: &[Batch],
        transport: &dyn Transport,
        sync: &dyn StepSync,
    ) -> Result<StepReport> {
        let result = self.run_step_inner(job, step, batches, transport, sync);
        if result.is_err() {
            self.drop_step();
        }
        result
    }

    fn drop_step(&mut self) {
        for stage in self.stages.values_mut() {
            let (b, w) = stage.pending();
            for mb in b.into_iter().chain(w) {
                stage.discard(mb);
            }
            // Zeroing only fails on a broken device; the next step then fails loudly too.
            let _ = stage.zero_grad();
        }
    }

    fn stash_now(&self) -> u64 {
        self.stages.values().map(Stage::stash_bytes).sum()
    }

    fn stage_mut(&mut self, s: u32) -> Result<&mut Stage> {
        let worker = self.worker;
        self.stages.get_mut(&s).ok_or_else(|| {
            invalid(
                "schedule",
                format!("worker {worker} runs a pass of stage {s}, which it does not hold"),
            )
        })
    }

    fn run_step_inner(
        &mut self,
        job: u64,
        step: u64,
        batches: &[Batch],
        transport: &dyn Transport,
        sync: &dyn StepSync,
    ) -> Result<StepReport> {
        let started = Instant::now();
        if batches.len() != self.microbatches as usize {
            return Err(invalid(
                "batches",
                format!(
                    "{} microbatches for a schedule of {}",
                    batches.len(),
                    self.microbatches
                ),
            ));
        }
        let shapes = batches
            .iter()
            .map(|b| Ok(b.tokens.dims2()?))
            .collect::<Result<Vec<(usize, usize)>>>()?;
        for stage in self.stages.values_mut() {
            stage.reset_peak();
        }
        let mut peak = self.stash_now();
        let last = self.stage_count - 1;
        // The stages are borrowed mutably while the link is alive: it keeps its own copy of
        // the (small) placement.
        let placement = self.placement.clone();
        let mut ctx = StepCtx {
            link: Link {
                worker: self.worker,
                placement: &placement,
                transport,
                job,
                step,
                timeout: self.timeout,
            },
            shapes: &shapes,
            local: HashMap::new(),
            rec: Recorder::start(started, 2 * self.program.len() + 1),
        };
        let mut losses: Vec<(u32, f32)> = Vec::new();
        let mut pass_times = Vec::with_capacity(self.program.len());
        for i in 0..self.program.len() {
            let pass = self.program[i];
            let (s, mb) = (pass.stage, pass.mb);
            let batch = batches
                .get(mb as usize)
                .ok_or_else(|| invalid("schedule", format!("pass {pass}: no microbatch {mb}")))?;
            let secs = match pass.kind {
                PassKind::F => {
                    let input = if s == 0 {
                        batch.tokens.clone()
                    } else {
                        self.take(&mut ctx, pass, FrameKind::Activation)?
                    };
                    let targets = (s == last).then_some(&batch.targets);
                    let t0 = Instant::now();
                    let out = self.stage_mut(s)?.forward(mb, &input, targets)?;
                    let secs = {
                        self.stretch(t0);
                        ctx.rec.span(Activity::Pass(pass), t0)
                    };
                    if s == last {
                        losses.push((mb, out.to_scalar::<f32>()?));
                    } else {
                        self.deliver(&mut ctx, pass, s + 1, FrameKind::Activation, out)?;
                    }
                    secs
                }
                PassKind::B | PassKind::BW => {
                    let grad = if s == last {
                        None
                    } else {
                        Some(self.take(&mut ctx, pass, FrameKind::Gradient)?)
                    };
                    let t0 = Instant::now();
                    let stage = self.stage_mut(s)?;
                    let dx = if pass.kind == PassKind::B {
                        stage.backward_input(mb, grad.as_ref())?
                    } else {
                        stage.backward(mb, grad.as_ref())?
                    };
                    let secs = {
                        self.stretch(t0);
                        ctx.rec.span(Activity::Pass(pass), t0)
                    };
                    if s > 0 {
                        let dx = dx.ok_or_else(|| {
                            invalid("stage", format!("pass {pass} gave no input gradient"))
                        })?;
                        self.deliver(&mut ctx, pass, s - 1, FrameKind::Gradient, dx)?;
                    }
                    secs
                }
                PassKind::W => {
                    let t0 = Instant::now();
                    self.stage_mut(s)?.backward_weight(mb)?;
                    {
                        self.stretch(t0);
                        ctx.rec.span(Activity::Pass(pass), t0)
                    }
                }
            };
            pass_times.push((pass, secs));
            peak = peak.max(self.stash_now());
        }
        if let Some(&(s, mb, kind)) = ctx.local.keys().next() {
            return Err(invalid(
                "schedule",
                format!(
                    "worker {}: the {kind} for stage {s} microbatch {mb} was never consumed",
                    self.worker
                ),
            ));
        }

        // Global-norm clipping: every stage of every worker scales by the same factor.
        let sync_started = Instant::now();
        let mut local_sq = 0.0;
        for stage in self.stages.values() {
            local_sq += stage.grad_sq_norm()?;
        }
        let global_sq = sync.all_reduce_sq_norm(step, local_sq)?;
        let scale = clip_scale(global_sq, self.optimizer.max_grad_norm);
        for stage in self.stages.values_mut() {
            stage.optimizer_step(scale)?;
        }
        losses.sort_by_key(|&(mb, _)| mb);
        let local_losses: Vec<f32> = losses.into_iter().map(|(_, l)| l).collect();
        let loss = sync.mean_loss(step, &local_losses)?;
        let busy_secs = pass_times.iter().map(|&(_, s)| s).sum();
        ctx.rec.span(Activity::Sync, sync_started);
        Ok(StepReport {
            loss: Some(loss),
            pass_times,
            busy_secs,
            wall_secs: started.elapsed().as_secs_f64(),
            peak_stash_bytes: peak,
            grad_norm: global_sq.sqrt(),
            spans: ctx.rec.spans,
            bytes_sent: ctx.rec.sent,
            bytes_received: ctx.rec.received,
        })
    }

    /// The input of `pass`: from this worker's memory when the producing stage is here, else
    /// from the transport (with its shape checked).
    fn take(&self, ctx: &mut StepCtx<'_>, pass: Pass, kind: FrameKind) -> Result<Tensor> {
        let payload = match ctx.link.take(&mut ctx.local, &mut ctx.rec, pass, kind)? {
            Input::Local(tensor) => return Ok(tensor),
            Input::Received(payload) => payload,
        };
        let (stage, mb) = (pass.stage, pass.mb);
        let (b, t) = ctx.shapes[mb as usize];
        let expected = [b, t, self.hidden];
        let stage_ref = self
            .stages
            .get(&stage)
            .ok_or_else(|| invalid("schedule", format!("stage {stage} is not held here")))?;
        if payload.dims() != expected || payload.dtype() != stage_ref.dtype() {
            return Err(ctx
                .link
                .bad_frame(pass, kind, &payload, (&expected, stage_ref.dtype())));
        }
        let device = stage_ref.device();
        Ok(payload.into_tensor(device)?.to_device(device)?)
    }

    /// Hands `tensor` to stage `stage`: in memory when it is on this worker, else sent.
    fn deliver(
        &self,
        ctx: &mut StepCtx<'_>,
        pass: Pass,
        stage: u32,
        kind: FrameKind,
        tensor: Tensor,
    ) -> Result<()> {
        ctx.link.deliver(
            &mut ctx.local,
            &mut ctx.rec,
            pass,
            stage,
            kind,
            tensor,
            Payload::Tensor,
        )
    }
}

/// Per-step state of [`WorkerRuntime::run_step`].
struct StepCtx<'a> {
    /// Where inputs come from and outputs go.
    link: Link<'a>,
    shapes: &'a [(usize, usize)],
    /// Tensors handed between stages of this worker, keyed by consumer.
    local: Local<Tensor>,
    /// What happened when, and bytes per peer.
    rec: Recorder,
}

/// Records what a worker does during a step: [`StepReport::spans`] (in seconds of UNIX
/// time, from one reading of the system clock at the step's start plus monotonic offsets)
/// and bytes sent to / received from each peer.
#[derive(Debug)]
pub(crate) struct Recorder {
    started: Instant,
    epoch: f64,
    pub(crate) spans: Vec<Span>,
    pub(crate) sent: BTreeMap<u32, u64>,
    pub(crate) received: BTreeMap<u32, u64>,
}

impl Recorder {
    /// A recorder for a step that started at `started`.
    pub(crate) fn start(started: Instant, capacity: usize) -> Recorder {
        let epoch = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
            - started.elapsed().as_secs_f64();
        Recorder {
            started,
            epoch,
            spans: Vec::with_capacity(capacity),
            sent: BTreeMap::new(),
            received: BTreeMap::new(),
        }
    }

    /// Records `activity` from `since` until now; returns its seconds.
    pub(crate) fn span(&mut self, activity: Activity, since: Instant) -> f64 {
        let now = Instant::now();
        let at = |i: Instant| self.epoch + i.saturating_duration_since(self.started).as_secs_f64();
        self.spans.push(Span {
            activity,
            start: at(since),
            end: at(now),
        });
        now.saturating_duration_since(since).as_secs_f64()
    }
}

/// One worker's program: its own stages, microbatches in range, each pass once, and a
/// complete forward and backward for every (stage, microbatch) it holds.
pub(crate) fn check_program(
    worker: u32,
    placement: &Placement,
    microbatches: u32,
    program: &[Pass],
) -> Result<()> {
    let mine = placement.stages_of(worker);
    let mut seen: HashMap<(PassKind, u32, u32), usize> = HashMap::new();
    for (i, p) in program.iter().enumerate() {
        if !mine.contains(&p.stage) {
            return Err(invalid(
                "program",
                format!(
                    "pass {i} ({p}) is on stage {} that worker {worker} does not hold",
                    p.stage
                ),
            ));
        }
        if p.mb >= microbatches {
            return Err(invalid(
                "program",
                format!(
                    "pass {i} ({p}) is for microbatch {} of {microbatches}",
                    p.mb
                ),
            ));
        }
        if let Some(first) = seen.insert((p.kind, p.stage, p.mb), i) {
            return Err(invalid(
                "program",
                format!("pass {i} ({p}) repeats pass {first}"),
            ));
        }
    }
    for &s in &mine {
        for mb in 0..microbatches {
            let has = |k: PassKind| seen.contains_key(&(k, s, mb));
            let backward = has(PassKind::BW) || (has(PassKind::B) && has(PassKind::W));
            if !has(PassKind::F) || !backward {
                return Err(invalid(
                    "program",
                    format!(
                        "stage {s} microbatch {mb} lacks its forward or a complete backward \
                         (B and W, or BW)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn check_partition(
    spec: &ModelSpec,
    partition: &[Range<usize>],
    stages: u32,
) -> Result<()> {
    let total = spec.layers as usize + 2;
    if partition.len() != stages as usize {
        return Err(invalid(
            "partition",
            format!("{} piece ranges for {stages} stages", partition.len()),
        ));
    }
    let mut next = 0;
    for (s, r) in partition.iter().enumerate() {
        if r.start != next || r.end <= r.start {
            return Err(invalid(
                "partition",
                format!(
                    "stage {s} holds pieces {}..{}, expected a non-empty range from {next}",
                    r.start, r.end
                ),
            ));
        }
        next = r.end;
    }
    if next != total {
        return Err(invalid(
            "partition",
            format!("the ranges end at piece {next}, the model has {total}"),
        ));
    }
    Ok(())
}

/// The operation a [`LocalSync`] round is collecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    SqNorm,
    Loss,
}

#[derive(Debug)]
struct SyncState {
    generation: u64,
    round: Option<(Op, u64)>,
    arrived: usize,
    sq: Vec<f64>,
    losses: Vec<f32>,
    result: std::result::Result<f64, String>,
    aborted: Option<String>,
}

/// [`StepSync`] for `N` workers on threads of one process: a reusable barrier (mutex and
/// condition variable) that sums the contributions; waits time out, and
/// [`LocalSync::abort`] releases every waiter with an error.
#[derive(Debug)]
pub struct LocalSync {
    workers: usize,
    timeout: Duration,
    state: Mutex<SyncState>,
    done: Condvar,
}

impl LocalSync {
    /// A sync point for `workers` workers; a worker waits at most `timeout` for the others.
    pub fn new(workers: u32, timeout: Duration) -> Self {
        Self {
            workers: workers.max(1) as usize,
            timeout,
            state: Mutex::new(SyncState {
                generation: 0,
                round: None,
                arrived: 0,
                sq: Vec::new(),
                losses: Vec::new(),
                result: Ok(0.0),
                aborted: None,
            }),
            done: Condvar::new(),
        }
    }

    /// Fails every current and later collective with `reason`.
    pub fn abort(&self, reason: &str) {
        let mut st = self.lock();
        if st.aborted.is_none() {
            st.aborted = Some(reason.to_string());
        }
        self.done.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, SyncState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn collective(
        &self,
        op: Op,
        step: u64,
        contribute: impl FnOnce(&mut SyncState),
        finish: impl FnOnce(&mut SyncState) -> std::result::Result<f64, String>,
    ) -> Result<f64> {
        let fail = |reason: String| invalid("sync", format!("step {step} {op:?}: {reason}"));
        let mut st = self.lock();
        if let Some(reason) = &st.aborted {
            return Err(fail(format!("aborted ({reason})")));
        }
        match st.round {
            None => st.round = Some((op, step)),
            Some(round) if round == (op, step) => {}
            Some((other, other_step)) => {
                let reason = format!(
                    "another worker is at step {other_step} {other:?}; the workers diverged"
                );
                st.aborted = Some(reason.clone());
                self.done.notify_all();
                return Err(fail(reason));
            }
        }
        contribute(&mut st);
        st.arrived += 1;
        if st.arrived == self.workers {
            st.result = finish(&mut st);
            st.sq.clear();
            st.losses.clear();
            st.arrived = 0;
            st.round = None;
            st.generation += 1;
            self.done.notify_all();
            return st.result.clone().map_err(fail);
        }
        let generation = st.generation;
        let deadline = Instant::now() + self.timeout;
        loop {
            if st.generation != generation {
                return st.result.clone().map_err(fail);
            }
            if let Some(reason) = &st.aborted {
                return Err(fail(format!("aborted ({reason})")));
            }
            let now = Instant::now();
            if now >= deadline {
                let reason = format!(
                    "timed out after {:.3} s waiting for the other workers",
                    self.timeout.as_secs_f64()
                );
                st.aborted = Some(reason.clone());
                self.done.notify_all();
                return Err(fail(reason));
            }
            st = self
                .done
                .wait_timeout(st, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }
}

impl StepSync for LocalSync {
    fn all_reduce_sq_norm(&self, step: u64, local: f64) -> Result<f64> {
        self.collective(
            Op::SqNorm,
            step,
            |st| st.sq.push(local),
            |st| {
                // Summed in value order: the same global sum whatever the arrival order.
                st.sq.sort_by(f64::total_cmp);
                Ok(st.sq.iter().sum())
            },
        )
    }

    fn mean_loss(&self, step: u64, local: &[f32]) -> Result<f32> {
        let mean = self.collective(
            Op::Loss,
            step,
            |st| st.losses.extend_from_slice(local),
            |st| {
                if st.losses.is_empty() {
                    return Err("no worker reported a loss".into());
                }
                let sum: f64 = st.losses.iter().map(|&l| f64::from(l)).sum();
                Ok(sum / st.losses.len() as f64)
            },
        )?;
        Ok(mean as f32)
    }
}

/// Wraps worker `w`'s in-memory transport handle (e.g. to count or corrupt frames in tests).
pub type WrapTransport = dyn Fn(u32, MemoryTransport) -> Box<dyn Transport> + Sync;

/// Options of [`run_local_with`].
#[derive(Clone, Copy)]
pub struct LocalOptions<'a> {
    /// Piece ranges per stage; `None`: [`Stage::even_split`] over the placement's stages.
    pub partition: Option<&'a [Range<usize>]>,
    /// How long a worker waits for a frame or for the others.
    pub timeout: Duration,
    /// The job id written into frames.
    pub job: u64,
    /// Wraps each worker's transport handle.
    pub wrap: Option<&'a WrapTransport>,
}

impl Default for LocalOptions<'_> {
    fn default() -> Self {
        Self {
            partition: None,
            timeout: DEFAULT_TIMEOUT,
            job: 0,
            wrap: None,
        }
    }
}

impl std::fmt::Debug for LocalOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalOptions")
            .field("partition", &self.partition)
            .field("timeout", &self.timeout)
            .field("job", &self.job)
            .field("wrap", &self.wrap.map(|_| "…"))
            .finish()
    }
}

/// What [`run_local`] returns.
#[derive(Debug, Clone)]
pub struct LocalRun {
    /// The mean loss of every step.
    pub losses: Vec<f32>,
    /// Every parameter of the model after training, by name (`"{piece}.{local}"`).
    pub params: BTreeMap<String, Tensor>,
    /// `reports[step][worker]`.
    pub reports: Vec<Vec<StepReport>>,
}

/// Trains `steps.len()` steps (`steps[i]` holds step `i`'s `n` microbatches) with every
/// worker of `schedule` on its own thread, [`MemoryTransport`] between them and a
/// [`LocalSync`]; the model is split by [`Stage::even_split`].
pub fn run_local(
    schedule: &Schedule,
    spec: &ModelSpec,
    seed: u64,
    optimizer: AdamW,
    device: &Device,
    steps: &[Vec<Batch>],
) -> Result<LocalRun> {
    run_local_with(
        schedule,
        spec,
        seed,
        optimizer,
        device,
        steps,
        LocalOptions::default(),
    )
}

/// Aborts the network and the sync when a worker thread ends early (error or panic).
struct AbortGuard<'a> {
    worker: u32,
    network: &'a MemoryTransport,
    sync: &'a LocalSync,
    armed: bool,
}

impl Drop for AbortGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let reason = format!("worker {} stopped", self.worker);
            self.network.abort(&reason);
            self.sync.abort(&reason);
        }
    }
}

type WorkerOutcome = (Vec<StepReport>, Vec<(String, Tensor)>);

/// [`run_local`] with a partition, timeout, job id and transport wrapper. When a worker
/// fails, the others are stopped and the first failure is returned.
pub fn run_local_with(
    schedule: &Schedule,
    spec: &ModelSpec,
    seed: u64,
    optimizer: AdamW,
    device: &Device,
    steps: &[Vec<Batch>],
    options: LocalOptions<'_>,
) -> Result<LocalRun> {
    let workers = schedule.num_workers();
    let partition: Vec<Range<usize>> = match options.partition {
        Some(p) => p.to_vec(),
        None => Stage::even_split(spec, schedule.placement.stages() as usize)?,
    };
    let handles = MemoryTransport::network(workers);
    let Some(network) = handles.first().cloned() else {
        return Err(invalid("schedule", "no workers".into()));
    };
    let sync = LocalSync::new(workers, options.timeout);
    let first_failed = AtomicU32::new(u32::MAX);
    let outcomes: Vec<Result<WorkerOutcome>> = std::thread::scope(|scope| {
        let threads: Vec<_> = handles
            .into_iter()
            .enumerate()
            .map(|(w, handle)| {
                let w = w as u32;
                let (partition, network, sync, first_failed) =
                    (&partition, &network, &sync, &first_failed);
                scope.spawn(move || {
                    let mut guard = AbortGuard {
                        worker: w,
                        network,
                        sync,
                        armed: true,
                    };
                    let run = || -> Result<WorkerOutcome> {
                        let mut rt = WorkerRuntime::new(
                            w, schedule, spec, partition, seed, device, optimizer,
                        )?;
                        rt.set_timeout(options.timeout);
                        let transport: Box<dyn Transport> = match options.wrap {
                            Some(wrap) => wrap(w, handle),
                            None => Box::new(handle),
                        };
                        let mut reports = Vec::with_capacity(steps.len());
                        for (step, batches) in steps.iter().enumerate() {
                            reports.push(rt.run_step(
                                options.job,
                                step as u64,
                                batches,
                                transport.as_ref(),
                                sync,
                            )?);
                        }
                        let params = rt
                            .params()
                            .map(|p| (p.name.clone(), p.value.clone()))
                            .collect();
                        Ok((reports, params))
                    };
                    let result = run();
                    if result.is_err() {
                        let _ = first_failed.compare_exchange(
                            u32::MAX,
                            w,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                    } else {
                        guard.armed = false;
                    }
                    drop(guard);
                    result
                })
            })
            .collect();
        threads
            .into_iter()
            .enumerate()
            .map(|(w, t)| {
                t.join().unwrap_or_else(|_| {
                    let _ = first_failed.compare_exchange(
                        u32::MAX,
                        w as u32,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    );
                    Err(invalid("worker", format!("worker {w} panicked")))
                })
            })
            .collect()
    });
    let first = first_failed.load(Ordering::SeqCst);
    let mut per_worker = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::new();
    for (w, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(o) => per_worker.push(o),
            Err(e) => errors.push((w as u32, e)),
        }
    }
    // The worker that failed first caused the others to stop: report its error.
    if let Some(at) = errors.iter().position(|(w, _)| *w == first) {
        return Err(errors.swap_remove(at).1);
    }
    if let Some((_, e)) = errors.into_iter().next() {
        return Err(e);
    }
    let mut reports: Vec<Vec<StepReport>> = (0..steps.len()).map(|_| Vec::new()).collect();
    let mut params = BTreeMap::new();
    for (worker_reports, worker_params) in per_worker {
        for (step, r) in worker_reports.into_iter().enumerate() {
            reports[step].push(r);
        }
        params.extend(worker_params);
    }
    let losses = reports
        .iter()
        .map(|r| r.first().and_then(|r| r.loss).unwrap_or(f32::NAN))
        .collect();
    Ok(LocalRun {
        losses,
        params,
        reports,
    })
}
