//! Emulated compute (`[compute] mode = "emulate"`): a worker's program of a schedule run
//! without candle, so that many workers fit on a small machine and the runtime's own
//! overhead (transport, waiting, end-of-step collectives) becomes measurable.
//!
//! [`EmulatedRuntime`] walks its program exactly as [`WorkerRuntime`](super::WorkerRuntime)
//! does — it takes a pass's input (from this worker's memory when the producing stage is
//! here, else from the [`Transport`], checking shape and dtype), runs the pass, hands the
//! output on (in memory, or sent) and ends the step with the same two [`StepSync`]
//! collectives — but a pass is a sleep for the cost model's duration of it
//! ([`Costs::uniform`] over the placement with the job's F / B / W times, so a chunk of a
//! `v`-chunk placement takes `1/v` of them), and a pass's output is a freshly allocated
//! [`Buffer`] of the true boundary size, `[microbatch size, seq_len, hidden]` in the
//! model's dtype, every byte written (within the pass's time, as real compute writes its
//! output), so the transport moves and checks real bytes; the gRPC transport sends and
//! delivers such buffers without copying them in user space.
//!
//! The sleep is deadline based: the thread sleeps until [`SPIN_MARGIN`] before the pass's
//! end, then yields in a loop until the end (a plain `sleep` overshoots by the timer slack
//! and the wake-up latency, 50–100 µs per pass on Linux). The pass time recorded is the
//! measured length of that wait, so the report's bubble is what actually happened.
//!
//! The report is the real executor's [`StepReport`]: `busy_secs` is the time in passes,
//! `wall_secs` the step from its start to the end of the collectives, `peak_stash_bytes`
//! the stash the real stages would hold (each stage's [`ModelSpec::range_activation_bytes`]
//! held from F to B, then the part W needs until W; the accounting of
//! [`JobPlan::predicted_peak_bytes`](pipewise_common::job::JobPlan::predicted_peak_bytes)),
//! `loss` is `None` (nothing is learned; the last stage contributes `ln(vocab)`, the loss of
//! a uniform guess, to the loss collective so that it has something to average) and
//! `grad_norm` is 0. A worker of a job with data-parallel replicas sums each stage's
//! gradients over them as real compute does, with zeros of the stage's true size: the
//! all-reduce's bytes and waits are real.

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use candle_core::DType;
use pipewise_common::model::{Activation, ModelSpec};
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::placement::Placement;
use pipewise_common::schedule::Schedule;
use pipewise_common::{Costs, Times};

use super::local::{LocalOptions, LocalSync};
use super::program::{WorkerProgram, check_partition, schedule_program};
use super::step::{Passes, Replica, StepReport, StepSync, run_passes};
use super::transport::{Buffer, MemoryTransport, Payload, Transport};
use crate::error::{Error, Result};
use crate::stage::candle_dtype;

/// How long before a pass's end the emulated pass stops sleeping and starts yielding.
pub const SPIN_MARGIN: Duration = Duration::from_micros(200);

/// Waits until `deadline`: sleeps until [`SPIN_MARGIN`] before it, then yields.
pub fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_MARGIN {
            std::thread::sleep(left - SPIN_MARGIN);
        } else {
            std::thread::yield_now();
        }
    }
}

/// Where a (stage, microbatch) of this worker is: which passes it has had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Forward,
    BackwardInput,
}

/// One worker of a pipeline with emulated compute (see the [module docs](self)).
#[derive(Debug)]
pub struct EmulatedRuntime {
    program: WorkerProgram,
    costs: Costs,
    /// Stash of one microbatch, by stage (only this worker's stages are used).
    stash: Vec<Activation>,
    frame_dims: [usize; 3],
    dtype: DType,
    uniform_loss: f32,
    /// This worker's data-parallel replica.
    replica: Replica,
    /// Parameters of each stage (only this worker's are used): the gradient values a
    /// replica's sum moves.
    params: Vec<u64>,
}

impl EmulatedRuntime {
    /// Worker `worker` of `schedule` over `spec` split by default
    /// ([`ModelSpec::balanced_split`]), with
    /// microbatches of `microbatch_size` sequences and one-stage-of-`1/d` pass times
    /// `times` (seconds; `comm` is not emulated, the transport's own latency is what it is).
    pub fn new(
        worker: u32,
        schedule: &Schedule,
        spec: &ModelSpec,
        microbatch_size: u32,
        times: Times,
    ) -> Result<Self> {
        let program = schedule_program(worker, schedule)?;
        let partition = spec.balanced_split(&schedule.placement)?;
        Self::from_program(
            worker,
            &schedule.placement,
            schedule.microbatches,
            program,
            spec,
            microbatch_size,
            &partition,
            times,
        )
    }

    /// Worker `worker` running `program` (its pass list of a schedule over `placement`
    /// with `microbatches` microbatches), checked as
    /// [`WorkerRuntime::from_program`](super::WorkerRuntime::from_program) checks it.
    #[allow(clippy::too_many_arguments)]
    pub fn from_program(
        worker: u32,
        placement: &Placement,
        microbatches: u32,
        program: Vec<Pass>,
        spec: &ModelSpec,
        microbatch_size: u32,
        partition: &[Range<usize>],
        times: Times,
    ) -> Result<Self> {
        let program = WorkerProgram::new(worker, placement, microbatches, program)?;
        if microbatch_size == 0 {
            return Err(Error::invalid("microbatch_size", "must be at least 1"));
        }
        spec.validate()?;
        check_partition(spec, partition, program.placement.stages())?;
        let costs = Costs::uniform(&program.placement, times)?;
        let stash = partition
            .iter()
            .map(|r| spec.range_activation_bytes(r.clone(), microbatch_size))
            .collect();
        let params = partition
            .iter()
            .map(|r| spec.range_params(r.clone()))
            .collect();
        Ok(Self {
            program,
            costs,
            stash,
            frame_dims: [
                microbatch_size as usize,
                spec.seq_len as usize,
                spec.hidden as usize,
            ],
            dtype: candle_dtype(spec.dtype),
            uniform_loss: (spec.vocab.max(1) as f32).ln(),
            replica: Replica::default(),
            params,
        })
    }

    /// Makes this worker `replica`'s: each stage's gradients (zeros, as many values as the
    /// real stage has parameters) are summed over the replicas every step, as real
    /// compute's are.
    pub fn set_replica(&mut self, replica: Replica) -> Result<()> {
        replica.check()?;
        self.replica = replica;
        Ok(())
    }

    /// Sets how long to wait for a frame.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.program.timeout = timeout;
    }

    /// This worker's index.
    pub fn worker(&self) -> u32 {
        self.program.worker
    }

    /// The passes this worker runs each step, in order.
    pub fn program(&self) -> &[Pass] {
        &self.program.passes
    }

    /// The emulated duration of `pass`, in seconds.
    pub fn pass_secs(&self, pass: Pass) -> f64 {
        self.costs.duration(pass.kind, pass.stage)
    }

    /// Bytes of one frame between stages (`b · t · h ·` dtype size).
    pub fn frame_bytes(&self) -> u64 {
        self.frame_dims.iter().product::<usize>() as u64 * self.dtype.size_in_bytes() as u64
    }

    /// Runs this worker's program for step `step` of job `job` with emulated passes, then
    /// the end-of-step collectives.
    pub fn run_step(
        &mut self,
        job: u64,
        step: u64,
        transport: &dyn Transport,
        sync: &dyn StepSync,
    ) -> Result<StepReport> {
        let started = Instant::now();
        let mut passes = EmulatedPasses {
            rt: self,
            progress: HashMap::new(),
            stash: 0,
        };
        let step = (job, step);
        run_passes(&mut passes, &self.program, step, transport, sync, started)
    }
}

/// The passes of an [`EmulatedRuntime`] for one step, with what a real stage would hold.
struct EmulatedPasses<'a> {
    rt: &'a EmulatedRuntime,
    /// Which passes each (stage, microbatch) has had.
    progress: HashMap<(u32, u32), Progress>,
    /// Bytes the real stages would stash now.
    stash: i128,
}

impl Passes for EmulatedPasses<'_> {
    type Value = Payload;
    const LEARNS: bool = false;

    fn check_order(&mut self, pass: Pass) -> Result<()> {
        self.rt.advance(&mut self.progress, pass)
    }

    fn expected(&self, _pass: Pass) -> Result<([usize; 3], DType)> {
        Ok((self.rt.frame_dims, self.rt.dtype))
    }

    fn input_from(&self, _pass: Pass, payload: Payload) -> Result<Payload> {
        Ok(payload)
    }

    fn run(&mut self, pass: Pass, input: Option<Payload>) -> Result<Option<Payload>> {
        drop(input);
        let started = Instant::now();
        let rt = self.rt;
        let (s, last) = (pass.stage, rt.program.placement.stages() - 1);
        let output = match pass.kind {
            PassKind::F => s < last,
            PassKind::B | PassKind::BW => s > 0,
            PassKind::W => false,
        };
        // The output buffer is written within the pass's time, as a real pass writes its
        // output while it computes.
        let buffer = output.then(|| Payload::Buffer(Buffer::filled(rt.dtype, &rt.frame_dims, 1)));
        sleep_until(started + Duration::from_secs_f64(rt.pass_secs(pass)));
        let a = rt.stash[s as usize];
        let (f, bw) = (
            i128::from(a.after_forward),
            i128::from(a.after_backward_input),
        );
        self.stash += match pass.kind {
            PassKind::F => f,
            PassKind::B => bw - f,
            PassKind::W => -bw,
            PassKind::BW => -f,
        };
        Ok(buffer)
    }

    fn loss(&self, _pass: Pass, _output: Option<Payload>) -> Result<f32> {
        Ok(self.rt.uniform_loss)
    }

    fn into_payload(value: Payload) -> Payload {
        value
    }

    fn stash_bytes(&self) -> u64 {
        u64::try_from(self.stash).unwrap_or(0)
    }

    fn replica(&self) -> Replica {
        self.rt.replica
    }

    fn stages(&self) -> Vec<u32> {
        let rt = self.rt;
        rt.program.placement.stages_of(rt.program.worker)
    }

    fn stage_grads(&mut self, stage: u32) -> Result<Vec<f64>> {
        let params = self.rt.params.get(stage as usize).copied().unwrap_or(0);
        Ok(vec![0.0; params as usize])
    }

    fn grad_sq_norm(&self) -> Result<f64> {
        Ok(0.0)
    }

    fn optimizer_step(&mut self, _global_sq: f64, _sync: &dyn StepSync, _step: u64) -> Result<()> {
        Ok(())
    }
}

impl EmulatedRuntime {
    /// Checks that `pass` comes in an order a real stage would accept (F, then B, then W;
    /// or F then BW) and records it.
    fn advance(&self, progress: &mut HashMap<(u32, u32), Progress>, pass: Pass) -> Result<()> {
        let key = (pass.stage, pass.mb);
        let had = progress.get(&key).copied();
        let next = match (pass.kind, had) {
            (PassKind::F, None) => Some(Progress::Forward),
            (PassKind::B, Some(Progress::Forward)) => Some(Progress::BackwardInput),
            (PassKind::W, Some(Progress::BackwardInput))
            | (PassKind::BW, Some(Progress::Forward)) => None,
            _ => {
                return Err(Error::PassOrder {
                    stage: format!("stage {}", pass.stage),
                    pass: match pass.kind {
                        PassKind::F => "F",
                        PassKind::B => "B",
                        PassKind::W => "W",
                        PassKind::BW => "BW",
                    },
                    mb: pass.mb,
                    reason: format!(
                        "worker {}: out of order after {}",
                        self.program.worker,
                        match had {
                            None => "nothing",
                            Some(Progress::Forward) => "F",
                            Some(Progress::BackwardInput) => "B",
                        }
                    ),
                });
            }
        };
        match next {
            Some(p) => progress.insert(key, p),
            None => progress.remove(&key),
        };
        Ok(())
    }
}

/// Runs `steps` emulated steps of every worker of `schedule` on its own thread, with
/// [`MemoryTransport`] (wrapped by `options.wrap` when given) and a [`LocalSync`] between
/// them; `options.partition` (default [`ModelSpec::balanced_split`]) sets the stash sizes. Returns
/// `reports[step][worker]`. When a worker fails, the others are stopped and the first
/// failure is returned.
pub fn run_emulated_local(
    schedule: &Schedule,
    spec: &ModelSpec,
    microbatch_size: u32,
    times: Times,
    steps: u64,
    options: LocalOptions<'_>,
) -> Result<Vec<Vec<StepReport>>> {
    pipewise_common::validate(schedule)?;
    let workers = schedule.num_workers();
    let partition: Vec<Range<usize>> = match options.partition {
        Some(p) => p.to_vec(),
        None => spec.balanced_split(&schedule.placement)?,
    };
    let mut runtimes = Vec::with_capacity(workers as usize);
    for w in 0..workers {
        let mut rt = EmulatedRuntime::from_program(
            w,
            &schedule.placement,
            schedule.microbatches,
            schedule.workers[w as usize].clone(),
            spec,
            microbatch_size,
            &partition,
            times,
        )?;
        rt.set_timeout(options.timeout);
        runtimes.push(rt);
    }
    let handles = MemoryTransport::network(workers);
    let Some(network) = handles.first().cloned() else {
        return Err(Error::invalid("schedule", "no workers"));
    };
    let sync = LocalSync::new(workers, options.timeout);
    let first_failed = std::sync::Mutex::new(None::<Error>);
    let outcomes: Vec<Option<Vec<StepReport>>> = std::thread::scope(|scope| {
        let threads: Vec<_> = runtimes
            .into_iter()
            .zip(handles)
            .map(|(mut rt, handle)| {
                let (network, sync, first_failed) = (&network, &sync, &first_failed);
                scope.spawn(move || {
                    let transport: Box<dyn Transport> = match options.wrap {
                        Some(wrap) => wrap(rt.worker(), handle),
                        None => Box::new(handle),
                    };
                    let mut reports = Vec::with_capacity(steps as usize);
                    for step in 0..steps {
                        match rt.run_step(options.job, step, transport.as_ref(), sync) {
                            Ok(r) => reports.push(r),
                            Err(e) => {
                                let reason = format!("worker {} stopped: {e}", rt.worker());
                                let mut first = first_failed
                                    .lock()
                                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                                if first.is_none() {
                                    *first = Some(e);
                                }
                                drop(first);
                                network.abort(&reason);
                                sync.abort(&reason);
                                return None;
                            }
                        }
                    }
                    Some(reports)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().ok().flatten())
            .collect()
    });
    if let Some(e) = first_failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        return Err(e);
    }
    let mut reports: Vec<Vec<StepReport>> = (0..steps).map(|_| Vec::new()).collect();
    for (w, outcome) in outcomes.into_iter().enumerate() {
        let worker_reports =
            outcome.ok_or_else(|| Error::invalid("worker", format!("worker {w} panicked")))?;
        for (step, r) in worker_reports.into_iter().enumerate() {
            reports[step].push(r);
        }
    }
    Ok(reports)
}
