//! What the assignment loop's one step loop drives: [`Compute`], implemented by real compute
//! ([`RealCompute`]: candle stages, data, checkpoints and final parameters) and emulated
//! compute ([`EmulatedCompute`]: passes that sleep for their cost-model time, nothing
//! written).

use std::path::PathBuf;

use pipewise_common::job::job_of;
use pipewise_common::pass::Pass;

use super::assignment::Assignment;
use super::config::NodeConfig;
use super::memory::{fits_host_memory, read_meminfo};
use super::outputs::save_final;
use super::validation::{Validating, prepare};
use crate::Device;
use crate::confined::Confined;
use crate::data::{Corpus, Sampler};
use crate::error::{Error, Result};
use crate::job::{optimizer_of, sampler_of};
use crate::net::Delivery;
use crate::optim::ZeroStage;
use crate::runtime::{EmulatedRuntime, Replica, StepReport, StepSync, Transport, WorkerRuntime};

/// What a run's steps talk through: the run id, the transport and the collectives.
pub(crate) struct RunNet<'a> {
    pub(crate) run: u64,
    pub(crate) transport: &'a dyn Transport,
    pub(crate) sync: &'a dyn StepSync,
}

/// A worker's compute for one assignment (see the [module docs](self)).
pub(crate) trait Compute {
    /// How the transport hands received frames to this compute.
    const DELIVERY: Delivery;
    /// Whether passes are emulated (said on each step's log span).
    const EMULATED: bool;

    /// Before step `first`, the run's first: the validation loss of the model it starts
    /// from where the job evaluates one (`[validation]`, and `first` the job's first step).
    fn before_first_step(&mut self, _first: u64, _net: &RunNet<'_>) -> Result<Option<f64>> {
        Ok(None)
    }

    /// Runs step `step` of the run `net` connects.
    fn step(&mut self, step: u64, net: &RunNet<'_>) -> Result<StepReport>;

    /// Bytes held after a step: activations still stashed, and what stays for the whole
    /// run (parameters, gradients, optimizer state and what the config adds).
    fn held_bytes(&self) -> (u64, u64);

    /// Writes what is due once `done` of the assignment's steps ending at `end` are done
    /// (a checkpoint at its interval).
    fn after_step(&mut self, done: u64, end: u64) -> Result<()>;

    /// Writes what the run leaves after its last step, `done` steps in all, `to_end` when
    /// it ran every step assigned (not stopped for a move or a cancel); returns where the
    /// final parameters are (empty: nowhere).
    fn finish(&mut self, done: u64, to_end: bool) -> Result<PathBuf>;

    /// Every held stage's state (parameters and optimizer state, as a checkpoint shard),
    /// for a replica being rebuilt (none: nothing to copy).
    fn stage_states(&self) -> Result<Vec<(u32, bytes::Bytes)>> {
        Ok(Vec::new())
    }

    /// Takes stage `stage`'s state from another replica's worker (`bytes`, as
    /// [`Compute::stage_states`] gives it).
    fn load_stage_state(&mut self, _stage: u32, _bytes: &[u8]) -> Result<()> {
        Ok(())
    }

    /// The states of the stages this worker held in the run before a move (by their index
    /// there), to offer to the run's workers; taken once.
    fn take_held_states(&mut self) -> Vec<(u32, bytes::Bytes)> {
        Vec::new()
    }

    /// Builds every stage's state from `held`, states of the run before's stages (as
    /// [`Compute::take_held_states`] gives them) that together hold its pieces.
    fn load_handover(&mut self, _held: &[bytes::Bytes]) -> Result<()> {
        Ok(())
    }
}

/// Real compute: the worker's stages, its data and its outputs.
pub(crate) struct RealCompute {
    rt: WorkerRuntime,
    worker: u32,
    /// This worker's replica: it trains on microbatches `index·n .. (index+1)·n` of each
    /// step's `count·n`, and replica 0 alone writes checkpoints and final parameters.
    replica: Replica,
    microbatches: u32,
    device: Device,
    corpus: Corpus,
    sampler: Sampler,
    /// `[validation]`: what the run evaluates between steps, and when.
    validation: Option<Validating>,
    /// Parameters, gradients, master copies and AdamW moments (and what the config adds).
    static_bytes: u64,
    output: Confined,
    /// Checkpoint every this many steps (`None`: checkpoints off).
    checkpoint_interval: Option<u64>,
    /// The job, and the steps the stages' parameters and optimizer state reflect.
    job: u64,
    state_step: u64,
    end_step: u64,
    /// The states of the stages held in the run before a move, until offered.
    held_states: Vec<(u32, bytes::Bytes)>,
}

/// A run's stages kept in memory after it ended short of the job's last step, so that the
/// next run of the same job can go on from them without a checkpoint: a job that lost a
/// data-parallel replica goes on with the others ([`Assignment::resume_in_memory`]), and
/// a move between steps hands them over to the next run's workers
/// ([`Assignment::offer_held`]).
pub(crate) struct Kept {
    job: u64,
    /// Steps done: the parameters and optimizer state are those after this many.
    step: u64,
    rt: WorkerRuntime,
}

impl RealCompute {
    /// Builds the stages of `a` (from the checkpoint of its first step when that is past
    /// 0), refused when the machine's memory cannot hold them; or, when `a` goes on from
    /// memory, takes them from `kept`, refused unless they are this job's after the run's
    /// first step, on this worker's stages and pieces.
    pub(crate) fn new(
        config: &NodeConfig,
        a: &Assignment,
        program: Vec<Pass>,
        kept: &mut Option<Kept>,
    ) -> Result<Self> {
        let spec = &a.spec;
        let job = job_of(a.run);
        let held = kept.take();
        let mut held_states = Vec::new();
        let mut rt = if a.resume_in_memory {
            let mut rt = warm(held, job, a.steps.start, "resume_in_memory")?;
            rt.rebind(
                a.worker,
                &a.placement,
                a.microbatches,
                program,
                &a.partition,
            )?;
            tracing::info!(
                step = a.steps.start,
                "going on from the stages held in memory (no checkpoint loaded)"
            );
            rt
        } else {
            // Serialized, then dropped before the new stages are built: the worker holds
            // the old state once, as bytes, until the run's start barrier.
            if a.offer_held {
                held_states = states_of(&warm(held, job, a.steps.start, "offer_held")?)?;
            } else {
                drop(held);
            }
            Self::fresh(config, a, program)?
        };
        rt.set_timeout(config.timeout);
        // Paced, the slowdown stretches the logical pass times the worker reports instead.
        if config.pace.is_none() {
            rt.set_slowdown(config.slowdown);
        }
        // The plan's recomputation (`[activation_checkpoint]` of the run's spec), by stage.
        let modes = spec
            .activation_checkpoint
            .modes(a.placement.stages() as usize)?;
        rt.set_recompute(&modes);
        if a.replica.count > 1 {
            rt.set_replica(a.replica)?;
        }
        if spec.shard_degree() > 1 {
            let zero = ZeroStage::from_number(spec.parallelism.zero_stage)?;
            rt.set_sharding(spec.shard_degree(), zero)?;
        }
        // A sharded optimizer's shard is held beside the parameters' own state.
        let shard_bytes = if rt.is_sharded() {
            rt.optimizer_bytes().optimizer
        } else {
            0
        };
        let static_bytes: u64 = rt
            .params()
            .map(|p| p.state_bytes())
            .sum::<u64>()
            .saturating_add(shard_bytes)
            .saturating_add(config.unplanned_bytes);
        crate::metrics::record_parameters(&rt);
        let corpus = a.data.load(&spec.model)?.corpus;
        let (corpus, validation) = prepare(spec, &a.data, a.validation.as_ref(), corpus)?;
        Ok(RealCompute {
            rt,
            worker: a.worker,
            replica: a.replica,
            microbatches: a.microbatches,
            device: config.device.clone(),
            corpus,
            sampler: sampler_of(spec),
            validation,
            static_bytes,
            output: a.output.clone(),
            checkpoint_interval: spec
                .checkpoint
                .enable_checkpoint
                .then(|| u64::from(spec.checkpoint.interval.max(1))),
            job,
            state_step: a.steps.start,
            end_step: a.steps.end,
            held_states,
        })
    }

    /// The stages of `a` built from the seed, or loaded from the checkpoint of its first
    /// step when that is past 0.
    fn fresh(config: &NodeConfig, a: &Assignment, program: Vec<Pass>) -> Result<WorkerRuntime> {
        let spec = &a.spec;
        // Refused rather than aborted: an allocation the machine cannot make ends the process.
        if matches!(config.device, Device::Cpu) {
            let state = spec
                .model
                .state_bytes_by_worker(&a.placement, &a.partition)
                .get(a.worker as usize)
                .copied()
                .unwrap_or(0);
            fits_host_memory(state, &read_meminfo())?;
        }
        let mut rt = WorkerRuntime::from_program(
            a.worker,
            &a.placement,
            a.microbatches,
            program,
            &spec.model,
            &a.partition,
            spec.training.seed,
            &config.device,
            optimizer_of(spec),
        )?;
        // A rebuilt replica copies its state from a live one, and a move's run takes it
        // from the run before's workers, once the run is joined.
        if a.steps.start > 0 && a.copy_from.is_empty() && a.handover.is_empty() {
            rt.resume(&a.output, a.steps.start)?;
        } else if let Some(dir) = &a.model
            && a.steps.start == 0
        {
            let model =
                crate::hf::HfModel::open_confined(dir, spec.model.seq_len, spec.model.dtype)?;
            for stage in rt.stages_mut().values_mut() {
                model.load_into(stage)?;
            }
        }
        Ok(rt)
    }

    /// The stages to keep for a next run of the job that goes on from memory: none once
    /// the job's last step is done.
    pub(crate) fn keep(self) -> Option<Kept> {
        (self.state_step < self.end_step).then_some(Kept {
            job: self.job,
            step: self.state_step,
            rt: self.rt,
        })
    }
}

impl RealCompute {
    /// Whether a checkpoint is written once `done` steps are done: at its interval, and
    /// at the assignment's end.
    fn checkpoint_due(&self, done: u64) -> bool {
        self.checkpoint_interval
            .is_some_and(|i| done.is_multiple_of(i) || done == self.end_step)
    }
}

/// Refuses to hand a stage's whole state over, or take one in, while `rt`'s optimizer
/// state is sharded: it holds its shard only.
fn refuse_sharded(rt: &WorkerRuntime) -> Result<()> {
    if rt.is_sharded() {
        return Err(Error::invalid(
            "data_parallel_shard_degree",
            "a worker of a sharded optimizer holds a shard of its stages' state: it cannot \
             hand it over or take one in whole",
        ));
    }
    Ok(())
}

/// Every stage's state in `rt`, by stage, as a checkpoint shard's bytes (refused while
/// its optimizer state is sharded: the bytes would lack the other shards').
fn states_of(rt: &WorkerRuntime) -> Result<Vec<(u32, bytes::Bytes)>> {
    refuse_sharded(rt)?;
    rt.stages()
        .iter()
        .map(|(s, stage)| Ok((*s, bytes::Bytes::from(stage.checkpoint_bytes()?))))
        .collect()
}

/// The runtime `kept` holds, when it is job `job`'s after `step` steps (`field`: the
/// assignment's field that asked for it).
fn warm(kept: Option<Kept>, job: u64, step: u64, field: &'static str) -> Result<WorkerRuntime> {
    match kept {
        Some(k) if k.job == job && k.step == step => Ok(k.rt),
        Some(k) => Err(Error::invalid(
            field,
            format!(
                "asked to go on from job {job} after {step} steps, this worker holds job {} after {} steps",
                k.job, k.step
            ),
        )),
        None => Err(Error::invalid(
            field,
            format!(
                "asked to go on from job {job} after {step} steps, this worker holds no stages"
            ),
        )),
    }
}

impl Compute for RealCompute {
    const DELIVERY: Delivery = Delivery::Tensors;
    const EMULATED: bool = false;

    fn before_first_step(&mut self, first: u64, net: &RunNet<'_>) -> Result<Option<f64>> {
        match &mut self.validation {
            Some(v) => v.before_first_step(&self.rt, (net.run, first), (net.transport, net.sync)),
            None => Ok(None),
        }
    }

    fn step(&mut self, step: u64, net: &RunNet<'_>) -> Result<StepReport> {
        // The whole step's microbatches, as one pipeline would take them: this replica's
        // share of them.
        let (n, r) = (self.microbatches, self.replica.index);
        let batches = self
            .sampler
            .share(&self.corpus, step, r * n..(r + 1) * n, &self.device)?;
        let mut report = self
            .rt
            .run_step(net.run, step, &batches, net.transport, net.sync)?;
        self.state_step = step + 1;
        if self.rt.is_sharded() && self.checkpoint_due(step + 1) {
            // Every shard group's replicas take part; replica 0 then saves it whole.
            self.rt.unshard(net.sync, step)?;
        }
        if let Some(v) = &mut self.validation {
            let through = (net.transport, net.sync);
            v.after_step(&self.rt, (net.run, step), through, &mut report)?;
        }
        // Again every step: the exporter drops gauges left unset for a while.
        crate::metrics::record_parameters(&self.rt);
        Ok(report)
    }

    fn held_bytes(&self) -> (u64, u64) {
        let held = self
            .rt
            .stages()
            .values()
            .map(crate::Stage::stash_bytes)
            .sum();
        (held, self.static_bytes)
    }

    fn after_step(&mut self, done: u64, end: u64) -> Result<()> {
        match self.checkpoint_interval {
            Some(interval)
                if done.is_multiple_of(interval) && done < end && self.replica.index == 0 =>
            {
                self.rt.save_checkpoints(&self.output, done)?;
            }
            _ => {}
        }
        // A sharded optimizer gathered for the checkpoint goes on with its shard.
        if done < end {
            self.rt.reshard()?;
        }
        Ok(())
    }

    fn stage_states(&self) -> Result<Vec<(u32, bytes::Bytes)>> {
        states_of(&self.rt)
    }

    fn load_stage_state(&mut self, stage: u32, bytes: &[u8]) -> Result<()> {
        refuse_sharded(&self.rt)?;
        let Some(held) = self.rt.stages_mut().get_mut(&stage) else {
            return Err(Error::invalid(
                "copy_from",
                format!("stage {stage} is not this worker's"),
            ));
        };
        held.load_checkpoint_bytes(bytes)
    }

    fn take_held_states(&mut self) -> Vec<(u32, bytes::Bytes)> {
        std::mem::take(&mut self.held_states)
    }

    fn load_handover(&mut self, held: &[bytes::Bytes]) -> Result<()> {
        refuse_sharded(&self.rt)?;
        let held: Vec<&[u8]> = held.iter().map(|b| b.as_ref()).collect();
        for stage in self.rt.stages_mut().values_mut() {
            stage.load_checkpoint_buffers(&held)?;
        }
        Ok(())
    }

    fn finish(&mut self, done: u64, to_end: bool) -> Result<PathBuf> {
        // Every replica holds the same parameters: the first writes them.
        if self.replica.index > 0 {
            return Ok(PathBuf::new());
        }
        if self.checkpoint_interval.is_some() {
            self.rt.save_checkpoints(&self.output, done)?;
        }
        // A run stopped for a move leaves no final file: the next run's worker indices may
        // differ, and a final file of this layout left in a worker's own data directory
        // would hold pieces another file of the last run holds too.
        if !to_end {
            return Ok(PathBuf::new());
        }
        save_final(&self.rt, &self.output, self.worker)
    }
}

/// Emulated compute (`[compute] mode = "emulate"`): no parameters, data or outputs.
pub(crate) struct EmulatedCompute {
    rt: EmulatedRuntime,
    /// What the config adds to the bytes held (emulated compute holds no parameters).
    unplanned_bytes: u64,
}

impl EmulatedCompute {
    /// The emulated runtime of `a`.
    pub(crate) fn new(config: &NodeConfig, a: &Assignment, program: Vec<Pass>) -> Result<Self> {
        let spec = &a.spec;
        let mut rt = EmulatedRuntime::from_program(
            a.worker,
            &a.placement,
            a.microbatches,
            program,
            &spec.model,
            spec.parallelism.pipeline_parallel_microbatch_size,
            &a.partition,
            spec.compute.times_secs(),
        )?;
        rt.set_timeout(config.timeout);
        if a.replica.count > 1 {
            rt.set_replica(a.replica)?;
        }
        Ok(EmulatedCompute {
            rt,
            unplanned_bytes: config.unplanned_bytes,
        })
    }
}

impl Compute for EmulatedCompute {
    const DELIVERY: Delivery = Delivery::Buffers;
    const EMULATED: bool = true;

    fn step(&mut self, step: u64, net: &RunNet<'_>) -> Result<StepReport> {
        self.rt.run_step(net.run, step, net.transport, net.sync)
    }

    fn held_bytes(&self) -> (u64, u64) {
        (0, self.unplanned_bytes)
    }

    fn after_step(&mut self, _done: u64, _end: u64) -> Result<()> {
        Ok(())
    }

    fn finish(&mut self, _done: u64, _to_end: bool) -> Result<PathBuf> {
        Ok(PathBuf::new())
    }
}
