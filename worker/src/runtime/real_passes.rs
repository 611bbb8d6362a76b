//! [`RealPasses`]: a [`WorkerRuntime`](super::WorkerRuntime)'s candle stages computing
//! the passes of one step, as the pass loop and the side-by-side step drive them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use candle_core::{DType, Tensor};
use pipewise_common::pass::{Pass, PassKind};

use super::step::{Gathered, Passes, Replica, ShardPart, StepSync};
use super::transport::Payload;
use crate::data::Batch;
use crate::error::{Error, Result};
use crate::optim::{ShardState, Sharding, ZeroStage, clip_scale};
use crate::stage::Stage;
use crate::stage::tied::TiedGrads;

/// The passes of a [`WorkerRuntime`](super::WorkerRuntime) for one step: its candle stages on the step's
/// microbatches.
pub(super) struct RealPasses<'a> {
    pub(super) worker: u32,
    pub(super) stages: &'a mut BTreeMap<u32, Stage>,
    pub(super) batches: &'a [Batch],
    /// `(b, t)` of each microbatch, to check incoming frames.
    pub(super) shapes: &'a [(usize, usize)],
    pub(super) hidden: usize,
    pub(super) last: u32,
    pub(super) slowdown: f64,
    pub(super) max_grad_norm: Option<f64>,
    /// This worker's data-parallel replica and the replica count.
    pub(super) replica: Replica,
    /// `(stage, microbatch)` whose `B` follows their `F` at once: kept whole whatever the
    /// stage's recomputation
    /// ([`backward_follows`](pipewise_common::schedule::backward_follows)).
    pub(super) kept_whole: BTreeSet<(u32, u32)>,
    /// A sharded optimizer: this worker's place in its shard group, and each stage's
    /// shard of the optimizer state (empty without sharding).
    pub(super) sharding: Option<Sharding>,
    pub(super) shards: &'a mut BTreeMap<u32, ShardState>,
}

impl RealPasses<'_> {
    fn stage(&self, s: u32) -> Result<&Stage> {
        self.stages
            .get(&s)
            .ok_or_else(|| Error::invalid("schedule", format!("stage {s} is not held here")))
    }

    pub(super) fn stage_mut(&mut self, s: u32) -> Result<&mut Stage> {
        let worker = self.worker;
        self.stages.get_mut(&s).ok_or_else(|| {
            Error::invalid(
                "schedule",
                format!("worker {worker} runs a pass of stage {s}, which it does not hold"),
            )
        })
    }

    /// Sleeps for the slowdown's share of a pass that started at `t0`.
    pub(super) fn stretch(&self, t0: Instant) {
        if self.slowdown > 1.0 {
            std::thread::sleep(t0.elapsed().mul_f64(self.slowdown - 1.0));
        }
    }
}

impl Passes for RealPasses<'_> {
    type Value = Tensor;
    const LEARNS: bool = true;

    fn expected(&self, pass: Pass) -> Result<([usize; 3], DType)> {
        let (b, t) = self.shapes[pass.mb as usize];
        Ok(([b, t, self.hidden], self.stage(pass.stage)?.dtype()))
    }

    fn input_from(&self, pass: Pass, payload: Payload) -> Result<Tensor> {
        let device = self.stage(pass.stage)?.device();
        Ok(payload.into_tensor(device)?.to_device(device)?)
    }

    fn run(&mut self, pass: Pass, input: Option<Tensor>) -> Result<Option<Tensor>> {
        let started = Instant::now();
        let (s, mb) = (pass.stage, pass.mb);
        let batches = self.batches;
        let batch = batches.get(mb as usize).ok_or_else(|| {
            Error::invalid("schedule", format!("pass {pass}: no microbatch {mb}"))
        })?;
        let output = match pass.kind {
            PassKind::F => {
                let input = input.unwrap_or_else(|| batch.tokens.clone());
                let targets = (s == self.last).then_some(&batch.targets);
                let whole = self.kept_whole.contains(&(s, mb));
                Some(
                    self.stage_mut(s)?
                        .forward_keeping(mb, &input, targets, whole)?,
                )
            }
            PassKind::B => self.stage_mut(s)?.backward_input(mb, input.as_ref())?,
            PassKind::BW => self.stage_mut(s)?.backward(mb, input.as_ref())?,
            PassKind::W => {
                self.stage_mut(s)?.backward_weight(mb)?;
                None
            }
        };
        self.stretch(started);
        Ok(output)
    }

    fn loss(&self, pass: Pass, output: Option<Tensor>) -> Result<f32> {
        let loss =
            output.ok_or_else(|| Error::invalid("stage", format!("pass {pass} gave no loss")))?;
        Ok(loss.to_scalar::<f32>()?)
    }

    fn into_payload(value: Tensor) -> Payload {
        Payload::Tensor(value)
    }

    fn stash_bytes(&self) -> u64 {
        self.stages.values().map(Stage::stash_bytes).sum()
    }

    fn take_rebuilt_bytes(&mut self) -> u64 {
        self.stages
            .values_mut()
            .map(Stage::take_rebuilt_bytes)
            .sum()
    }

    fn edge_secs(&self, pass: Pass) -> Option<f64> {
        // A slowed worker is slowed in every piece (its passes stretch by the factor).
        let stretch = self.slowdown.max(1.0);
        Some(self.stage(pass.stage).ok()?.edge_secs()? * stretch)
    }

    fn replica(&self) -> Replica {
        self.replica
    }

    fn stages(&self) -> Vec<u32> {
        self.stages.keys().copied().collect()
    }

    fn stage_grads(&mut self, stage: u32) -> Result<Vec<f64>> {
        self.stage(stage)?.flat_grads()
    }

    fn set_stage_grads(&mut self, stage: u32, grads: &[f64]) -> Result<()> {
        let zero2 = self
            .sharding
            .is_some_and(|s| s.stage == ZeroStage::Gradients);
        match self.shards.get_mut(&stage) {
            // ZeRO-2: the shard keeps its part of the sum, the parameters none.
            Some(shard) if zero2 => {
                let part = grads.get(shard.range.clone()).ok_or_else(|| {
                    Error::invalid(
                        "data_parallel_shard_degree",
                        format!(
                            "stage {stage}: {} summed gradient values for a shard {:?}",
                            grads.len(),
                            shard.range
                        ),
                    )
                })?;
                shard.grad = Some(part.to_vec());
                self.stage_mut(stage)?.zero_grad()
            }
            _ => self.stage_mut(stage)?.set_flat_grads(grads),
        }
    }

    fn tied_grads(&mut self) -> Result<TiedGrads> {
        let mut parts = TiedGrads::default();
        for stage in self.stages.values() {
            let TiedGrads { embedding, head } = stage.tied_grads()?;
            parts.embedding = parts.embedding.or(embedding);
            parts.head = parts.head.or(head);
        }
        Ok(parts)
    }

    fn set_tied_grads(&mut self, sum: &[f64]) -> Result<()> {
        for stage in self.stages.values_mut() {
            stage.set_tied_grads(sum)?;
        }
        Ok(())
    }

    fn grad_sq_norm(&self) -> Result<f64> {
        if let Some(sharding) = self.sharding
            && sharding.stage == ZeroStage::Gradients
        {
            // Each shard of the first shard group counts its part of the sum once.
            if self.replica.index >= sharding.count {
                return Ok(0.0);
            }
            let sq = |g: &Vec<f64>| g.iter().map(|x| x * x).sum::<f64>();
            return Ok(self
                .shards
                .values()
                .filter_map(|s| s.grad.as_ref())
                .map(sq)
                .sum());
        }
        if self.replica.index > 0 {
            return Ok(0.0);
        }
        let mut local_sq = 0.0;
        for stage in self.stages.values() {
            local_sq += stage.grad_sq_norm()?;
        }
        Ok(local_sq)
    }

    fn optimizer_step(&mut self, global_sq: f64, sync: &dyn StepSync, step: u64) -> Result<()> {
        let scale = clip_scale(global_sq, self.max_grad_norm);
        let Some(sharding) = self.sharding else {
            for stage in self.stages.values_mut() {
                stage.optimizer_step(scale)?;
            }
            return Ok(());
        };
        for (&s, stage) in self.stages.iter_mut() {
            let shard = self.shards.get_mut(&s).ok_or_else(|| {
                Error::invalid(
                    "data_parallel_shard_degree",
                    format!("stage {s} has no optimizer shard"),
                )
            })?;
            stage.sharded_step(shard, scale)?;
            let part = ShardPart {
                step,
                stage: s,
                group: self.replica.index / sharding.count,
                shard: sharding.index,
                shards: sharding.count,
                total: shard.total as u64,
                what: Gathered::Values,
            };
            let values = sync.all_gather_shards(part, &shard.wide)?;
            shard.release_values();
            stage.install_gathered(&values)?;
        }
        Ok(())
    }
}
