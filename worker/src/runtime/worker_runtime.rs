//! The pipeline executor: [`WorkerRuntime`], one worker's stages running its program of a
//! schedule for one training step (the pass loop is [`run_passes`](super::step)'s, with
//! candle stages computing the passes).

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use candle_core::Device;
use pipewise_common::job::{checkpoint_file_name, checkpoint_name};
use pipewise_common::model::ModelSpec;
use pipewise_common::pass::Pass;
use pipewise_common::placement::Placement;
use pipewise_common::schedule::{Recompute, Schedule};

use super::one_worker_step::{holds_every_stage, run_side_by_side};
use super::program::{WorkerProgram, check_partition, schedule_program};
use super::real_passes::RealPasses;
use super::step::{Gathered, Replica, ShardPart, StepReport, StepSync, run_passes};
use super::transport::Transport;
use super::validate::{Evaluator, ValidationSet, evaluate};
use crate::confined::Confined;
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::lanes::lanes_for;
use crate::optim::{AdamW, ShardState, Sharding, ZeroStage};
use crate::param::Param;
use crate::stage::Stage;

/// One worker of a pipeline: the stages the schedule's placement gives it and its ordered
/// pass list ("program").
///
/// Tensors between two stages of this worker (a V shape's turn, adjacent loop chunks on one
/// worker, any stages when there is a single worker) are handed over in memory; only
/// dependencies that cross workers go through the [`Transport`].
#[derive(Debug)]
pub struct WorkerRuntime {
    program: WorkerProgram,
    stages: BTreeMap<u32, Stage>,
    optimizer: AdamW,
    hidden: usize,
    /// Passes take longer from a step on ([`WorkerRuntime::set_slowdown`]).
    slowdown: Slowdown,
    /// Which data-parallel replica of the pipeline this worker belongs to.
    replica: Replica,
    /// A sharded optimizer across the replicas ([`WorkerRuntime::set_sharding`]).
    sharding: Option<Sharding>,
    /// Each stage's shard of the optimizer state (empty without sharding).
    shards: BTreeMap<u32, ShardState>,
}

/// A worker's training-state bytes that a sharded optimizer divides, measured from what
/// it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptimizerBytes {
    /// AdamW's moments and the f32 master copies.
    pub optimizer: u64,
    /// The step's gradients summed over the replicas, as the optimizer reads them (whole
    /// in the parameters, or ZeRO-2's shard).
    pub summed_grads: u64,
}

/// A stand-in for a slower device, to exercise straggler and drift handling: every pass
/// of step `from_step` (0-based, the job's count) and later takes `factor` times as long
/// (the worker sleeps for the extra time after computing).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slowdown {
    /// How many times as long a pass takes (at least 1).
    pub factor: f64,
    /// The first step slowed.
    pub from_step: u64,
}

impl Default for Slowdown {
    fn default() -> Self {
        Slowdown {
            factor: 1.0,
            from_step: 0,
        }
    }
}

impl Slowdown {
    /// The factor for step `step` (1 before `from_step`).
    pub fn at(&self, step: u64) -> f64 {
        if step >= self.from_step {
            self.factor
        } else {
            1.0
        }
    }
}

impl std::str::FromStr for Slowdown {
    type Err = Error;

    /// `FACTOR` (from the first step) or `FACTOR@STEP`; the factor from 1 to 1000.
    fn from_str(text: &str) -> Result<Self> {
        let (factor, from) = text.split_once('@').unwrap_or((text, "0"));
        let factor = match factor.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && (1.0..=1000.0).contains(&f) => f,
            _ => {
                return Err(Error::invalid(
                    "slowdown",
                    format!("{text:?}: the factor must be a number from 1 to 1000"),
                ));
            }
        };
        let from_step = from.trim().parse::<u64>().map_err(|_| {
            Error::invalid(
                "slowdown",
                format!("{text:?}: the step after '@' must be a whole number"),
            )
        })?;
        Ok(Slowdown { factor, from_step })
    }
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
        Self::from_program(
            worker,
            &schedule.placement,
            schedule.microbatches,
            schedule_program(worker, schedule)?,
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
        let program = WorkerProgram::new(worker, placement, microbatches, program)?;
        check_partition(spec, partition, program.placement.stages())?;
        let mut stages = BTreeMap::new();
        for s in program.placement.stages_of(program.worker) {
            let mut stage = Stage::new(spec, partition[s as usize].clone(), seed, device)?;
            stage.set_optimizer(optimizer);
            stage.set_microbatches(program.microbatches);
            stages.insert(s, stage);
        }
        Ok(Self {
            program,
            stages,
            optimizer,
            hidden: spec.hidden as usize,
            slowdown: Slowdown::default(),
            replica: Replica::default(),
            sharding: None,
            shards: BTreeMap::new(),
        })
    }

    /// Points the stages this runtime holds (their parameters and optimizer state as the
    /// last step left them) at another run's program: worker `worker` of `placement` with
    /// `microbatches` microbatches, one replica. Refused, changing nothing, unless the
    /// placement gives the worker exactly the stages held, each on its piece range of
    /// `partition`.
    pub fn rebind(
        &mut self,
        worker: u32,
        placement: &Placement,
        microbatches: u32,
        program: Vec<Pass>,
        partition: &[Range<usize>],
    ) -> Result<()> {
        if self.sharding.is_some() {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                "a worker whose optimizer state is sharded keeps only its shard: it cannot \
                 go on alone in another run",
            ));
        }
        let program = WorkerProgram::new(worker, placement, microbatches, program)?;
        let wanted: Vec<(u32, Option<&Range<usize>>)> = placement
            .stages_of(worker)
            .into_iter()
            .map(|s| (s, partition.get(s as usize)))
            .collect();
        let held: Vec<(u32, Range<usize>)> =
            self.stages.iter().map(|(s, st)| (*s, st.range())).collect();
        let same = wanted.len() == held.len()
            && wanted
                .iter()
                .zip(&held)
                .all(|((s, r), (h, hr))| s == h && *r == Some(hr));
        if !same {
            return Err(Error::invalid(
                "resume_in_memory",
                format!(
                    "this worker holds stages {held:?} (stage, pieces); the run gives it {:?}",
                    wanted
                        .iter()
                        .map(|(s, r)| (*s, r.cloned().unwrap_or_default()))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        for stage in self.stages.values_mut() {
            stage.set_microbatches(program.microbatches);
        }
        self.program = WorkerProgram {
            timeout: self.program.timeout,
            ..program
        };
        self.replica = Replica::default();
        Ok(())
    }

    /// Makes this worker part of replica `replica.index` of `replica.count`: each step's
    /// loss is the mean over every replica's microbatches (each stage seeds its backward
    /// with `1 / (microbatches × count)`), and gradients are summed over the replicas
    /// before the optimizer step (through the step's [`StepSync`]).
    pub fn set_replica(&mut self, replica: Replica) -> Result<()> {
        replica.check()?;
        let microbatches = self.program.microbatches.saturating_mul(replica.count);
        for stage in self.stages.values_mut() {
            stage.set_microbatches(microbatches);
        }
        self.replica = replica;
        Ok(())
    }

    /// Shards the optimizer state over the data-parallel replicas: `degree` consecutive
    /// replicas (a shard group; [`WorkerRuntime::set_replica`] first) each keep 1/`degree`
    /// of every stage's moments and master weights, and with [`ZeroStage::Gradients`] of
    /// its summed gradients; the update runs on the shard and an all-gather returns the
    /// values. Degree 1 shards nothing. Refused, changing nothing, where the degree does
    /// not divide the replicas, the state is sharded already, or (ZeRO-2) the model ties
    /// its embeddings.
    pub fn set_sharding(&mut self, degree: u32, stage: ZeroStage) -> Result<()> {
        let replicas = self.replica.count;
        if degree == 0 || !replicas.is_multiple_of(degree) {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                format!("{degree} does not divide the {replicas} data-parallel copies"),
            ));
        }
        if self.sharding.is_some() {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                "the optimizer state is sharded already",
            ));
        }
        if stage == ZeroStage::Gradients && self.stages.values().any(Stage::is_tied) {
            return Err(Error::invalid(
                "zero_stage",
                "2 shards the summed gradients, which a tied embedding table sums whole: \
                 use zero_stage = 1 with tie_embeddings",
            ));
        }
        if degree == 1 {
            return Ok(());
        }
        self.sharding = Some(Sharding {
            index: self.replica.index % degree,
            count: degree,
            stage,
        });
        self.shard_stages()
    }

    /// Moves every stage's optimizer state into its shard.
    fn shard_stages(&mut self) -> Result<()> {
        let Some(sharding) = self.sharding else {
            return Ok(());
        };
        for (&s, stage) in &mut self.stages {
            self.shards.insert(s, stage.shard_optimizer(sharding)?);
        }
        Ok(())
    }

    /// Gathers every stage's whole optimizer state from the shard group through `sync`
    /// (as step `step`'s) and gives it back to the parameters, as without sharding: what
    /// a checkpoint saves, loadable on any layout. Every replica of the group takes part;
    /// the state stays whole until [`WorkerRuntime::reshard`].
    pub fn unshard(&mut self, sync: &dyn StepSync, step: u64) -> Result<()> {
        let Some(sharding) = self.sharding else {
            return Ok(());
        };
        let group = self.replica.index / sharding.count;
        for (&s, stage) in &mut self.stages {
            let Some(shard) = self.shards.remove(&s) else {
                continue;
            };
            let gather = |what, values: &[f32]| {
                let part = ShardPart {
                    step,
                    stage: s,
                    group,
                    shard: sharding.index,
                    shards: sharding.count,
                    total: shard.total as u64,
                    what,
                };
                sync.all_gather_shards(part, values)
            };
            let wide = gather(Gathered::Master, &shard.wide_of(stage.params())?)?;
            let m = gather(Gathered::FirstMoment, &shard.m)?;
            let v = gather(Gathered::SecondMoment, &shard.v)?;
            stage.unshard_optimizer(&wide, &m, &v)?;
        }
        Ok(())
    }

    /// Shards the whole optimizer state again after [`WorkerRuntime::unshard`].
    pub fn reshard(&mut self) -> Result<()> {
        if self.shards.is_empty() {
            self.shard_stages()?;
        }
        Ok(())
    }

    /// Whether the optimizer state is sharded now (not gathered whole).
    pub fn is_sharded(&self) -> bool {
        !self.shards.is_empty()
    }

    /// The optimizer-state and summed-gradient bytes this worker holds now.
    pub fn optimizer_bytes(&self) -> OptimizerBytes {
        if !self.shards.is_empty() {
            let zero2 = self
                .sharding
                .is_some_and(|s| s.stage == ZeroStage::Gradients);
            let grads: u64 = if zero2 {
                self.shards
                    .values()
                    .map(|s| (s.range.len() * std::mem::size_of::<f64>()) as u64)
                    .sum()
            } else {
                self.params().map(Param::grad_bytes).sum()
            };
            return OptimizerBytes {
                optimizer: self.shards.values().map(ShardState::optimizer_bytes).sum(),
                summed_grads: grads,
            };
        }
        OptimizerBytes {
            optimizer: self.params().map(Param::optimizer_bytes).sum(),
            summed_grads: self.params().map(Param::grad_bytes).sum(),
        }
    }

    /// Sets each held stage's activation recomputation ([`Stage::set_recompute`]): stage
    /// `s` gets `modes[s]`, a stage past the end of `modes` none.
    pub fn set_recompute(&mut self, modes: &[Recompute]) {
        for (&s, stage) in &mut self.stages {
            stage.set_recompute(modes.get(s as usize).copied().unwrap_or_default());
        }
    }

    /// Sets how long to wait for a frame (and, in [`run_local`], for the other workers).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.program.timeout = timeout;
    }

    /// Makes every pass from `slowdown.from_step` on take `slowdown.factor` times as long
    /// (it sleeps for the extra time after computing): a stand-in for a slower device, to
    /// exercise straggler and drift handling. Factors below 1 (or not finite) count as 1.
    pub fn set_slowdown(&mut self, slowdown: Slowdown) {
        let factor = if slowdown.factor.is_finite() {
            slowdown.factor.max(1.0)
        } else {
            1.0
        };
        self.slowdown = Slowdown { factor, ..slowdown };
    }

    /// How long a `recv` waits.
    pub fn timeout(&self) -> Duration {
        self.program.timeout
    }

    /// This worker's index.
    pub fn worker(&self) -> u32 {
        self.program.worker
    }

    /// The passes this worker runs each step, in order.
    pub fn program(&self) -> &[Pass] {
        &self.program.passes
    }

    /// The stages held, by stage index.
    pub fn stages(&self) -> &BTreeMap<u32, Stage> {
        &self.stages
    }

    /// The stages held, mutably (to save or load checkpoints).
    pub fn stages_mut(&mut self) -> &mut BTreeMap<u32, Stage> {
        &mut self.stages
    }

    /// Writes every stage's checkpoint after `step` steps under `output`
    /// (`step-K/stage-S.safetensors`), following no link below its data directory.
    pub fn save_checkpoints(&self, output: &Confined, step: u64) -> Result<()> {
        if self.is_sharded() {
            return Err(Error::invalid(
                "data_parallel_shard_degree",
                format!(
                    "step {step}: the optimizer state is sharded; a checkpoint needs it \
                     gathered whole first (WorkerRuntime::unshard)"
                ),
            ));
        }
        let dir = output.join(checkpoint_name(step))?.dir(true)?;
        for (s, stage) in &self.stages {
            stage.save_checkpoint_in(&dir, checkpoint_file_name(*s))?;
        }
        Ok(())
    }

    /// Loads every stage from the checkpoint after `step` steps under `output`. Its stage
    /// files may come from another partition (a re-planned job): tensors are found by name.
    pub fn resume(&mut self, output: &Confined, step: u64) -> Result<()> {
        let dir = output.join(checkpoint_name(step))?.dir(false)?;
        self.shards.clear();
        for stage in self.stages.values_mut() {
            stage.load_checkpoint_in(&dir)?;
        }
        self.shard_stages()
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

    /// `[validation]`: the mean token cross-entropy of `set` in job `job`, through the
    /// pipeline with a forward-only program (see [`validate`](super::validate)); frames go
    /// through `transport` as step `step`'s (one tag per evaluation), each batch's sum
    /// through `sync` as the run's validation batch `*rounds`, counted on. The stages are
    /// not changed: training goes on exactly as without it.
    pub fn validate(
        &self,
        (job, step): (u64, u64),
        set: &ValidationSet,
        transport: &dyn Transport,
        sync: &dyn StepSync,
        rounds: &mut u64,
    ) -> Result<f64> {
        let e = Evaluator {
            stages: &self.stages,
            program: &self.program,
            replica: self.replica,
        };
        evaluate(&e, (job, step), set, transport, sync, rounds)
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
        for shard in self.shards.values_mut() {
            shard.grad = None;
            shard.release_values();
        }
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
        let microbatches = self.program.microbatches;
        if batches.len() != microbatches as usize {
            return Err(Error::invalid(
                "batches",
                format!(
                    "{} microbatches for a schedule of {}",
                    batches.len(),
                    microbatches
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
        let lanes = self
            .stages
            .values()
            .next()
            .map_or(1, |s| lanes_for(s.device()));
        let mut passes = RealPasses {
            worker: self.program.worker,
            stages: &mut self.stages,
            batches,
            shapes: &shapes,
            hidden: self.hidden,
            last: self.program.placement.stages() - 1,
            slowdown: self.slowdown.at(step),
            max_grad_norm: self.optimizer.max_grad_norm,
            replica: self.replica,
            kept_whole: pipewise_common::schedule::backward_follows(&self.program.passes),
            sharding: self.sharding,
            shards: &mut self.shards,
        };
        if lanes > 1 && self.program.microbatches > 1 && holds_every_stage(&self.program) {
            return run_side_by_side(&mut passes, &self.program, step, sync, started, lanes);
        }
        let step = (job, step);
        run_passes(&mut passes, &self.program, step, transport, sync, started)
    }
}

#[cfg(test)]
mod tests {
    use super::Slowdown;
    use crate::error::Result;

    #[test]
    fn slowdowns_read_a_factor_and_an_optional_first_step() -> Result<()> {
        let s: Slowdown = "3@10".parse()?;
        assert_eq!((s.factor, s.from_step), (3.0, 10));
        assert_eq!((s.at(9), s.at(10), s.at(11)), (1.0, 3.0, 3.0));
        let s: Slowdown = "6".parse()?;
        assert_eq!((s.factor, s.from_step, s.at(0)), (6.0, 0, 6.0));
        for bad in ["0.5", "1001", "x", "3@", "3@-1", "3@x", "nan@2"] {
            let e = bad.parse::<Slowdown>().map(|_| ()).err();
            let e = e.map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("slowdown"), "{bad}: {e:?}");
        }
        Ok(())
    }
}
