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
use super::step::{Replica, StepReport, StepSync, run_passes};
use super::transport::Transport;
use super::validate::{Evaluator, ValidationSet, evaluate};
use crate::confined::Confined;
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::lanes::lanes_for;
use crate::optim::AdamW;
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
        for stage in self.stages.values_mut() {
            stage.load_checkpoint_in(&dir)?;
        }
        Ok(())
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
