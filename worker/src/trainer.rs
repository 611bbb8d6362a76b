//! The single-device reference trainer: the whole model as one stage, the oracle of the
//! runtime's exactness tests.

use candle_core::{Device, Tensor};
use pipewise_common::model::ModelSpec;

use crate::data::Batch;
use crate::error::{Error, Result};
use crate::lanes::lanes_for;
use crate::optim::{AdamW, clip_scale};
use crate::stage::{ForwardItem, Stage};

/// What one training step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// The step's loss: the mean over microbatches of each microbatch's mean loss.
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// Optimizer steps taken after this one.
    pub step: u64,
}

/// Trains the whole model on one device: per microbatch `F` then `BW`, then (a tied
/// table's two copies given their summed gradient) one clipped AdamW step. On a CPU with several threads, as many microbatches run side by side
/// ([`Stage`]'s side-by-side passes): the same results, one stash per thread held at once.
#[derive(Debug)]
pub struct Trainer {
    stage: Stage,
}

impl Trainer {
    /// A freshly initialised model.
    pub fn new(spec: &ModelSpec, seed: u64, device: &Device, adamw: AdamW) -> Result<Self> {
        let mut stage = Stage::whole(spec, seed, device)?;
        stage.set_optimizer(adamw);
        Ok(Self { stage })
    }

    /// Wraps a stage that holds the whole model (e.g. one loaded from a checkpoint).
    pub fn from_stage(stage: Stage) -> Result<Self> {
        if !(stage.is_first() && stage.is_last()) {
            return Err(Error::InvalidArgument {
                field: "stage",
                reason: format!("pieces {:?} are not the whole model", stage.range()),
            });
        }
        Ok(Self { stage })
    }

    /// One step over `batches` (its microbatches).
    pub fn train_step(&mut self, batches: &[Batch]) -> Result<StepStats> {
        let n = u32::try_from(batches.len()).map_err(|_| Error::InvalidArgument {
            field: "batches",
            reason: "too many microbatches".into(),
        })?;
        if n == 0 {
            return Err(Error::InvalidArgument {
                field: "batches",
                reason: "a step needs at least one microbatch".into(),
            });
        }
        self.stage.set_microbatches(n);
        let lanes = lanes_for(self.stage.device());
        let mut loss = 0.0;
        let numbered: Vec<(u32, &Batch)> = (0..n).zip(batches).collect();
        for group in numbered.chunks(lanes) {
            if let [(mb, batch)] = group {
                let l = self
                    .stage
                    .forward(*mb, &batch.tokens, Some(&batch.targets))?;
                loss += f64::from(l.to_scalar::<f32>()?);
                self.stage.backward(*mb, None)?;
                continue;
            }
            // Several microbatches side by side, one per thread: the same results.
            let items: Vec<ForwardItem<'_>> = group
                .iter()
                .map(|(mb, b)| (*mb, &b.tokens, Some(&b.targets)))
                .collect();
            for l in self.stage.forward_side_by_side(&items)? {
                loss += f64::from(l.value.to_scalar::<f32>()?);
            }
            let mbs: Vec<u32> = group.iter().map(|(mb, _)| *mb).collect();
            let seeds: Vec<(u32, Option<&Tensor>)> = mbs.iter().map(|&mb| (mb, None)).collect();
            self.stage.backward_input_side_by_side(&seeds)?;
            self.stage.backward_weight_side_by_side(&mbs, lanes)?;
        }
        // A tied table's two copies take their summed gradient before the norm counts it.
        self.stage.sum_tied_grads()?;
        let sq = self.stage.grad_sq_norm()?;
        let scale = clip_scale(sq, self.stage.optimizer().max_grad_norm);
        self.stage.optimizer_step(scale)?;
        Ok(StepStats {
            loss: loss / f64::from(n),
            grad_norm: sq.sqrt(),
            step: self.stage.step(),
        })
    }

    /// The loss of `batches` without training (forward only; stashes are dropped).
    pub fn eval_loss(&mut self, batches: &[Batch]) -> Result<f64> {
        let mut loss = 0.0;
        for (i, batch) in batches.iter().enumerate() {
            let mb = u32::MAX - i as u32;
            let l = self
                .stage
                .forward(mb, &batch.tokens, Some(&batch.targets))?;
            loss += f64::from(l.to_scalar::<f32>()?);
            self.stage.discard(mb);
        }
        Ok(loss / batches.len().max(1) as f64)
    }

    /// The model.
    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// The model, mutably (to save or load a checkpoint).
    pub fn stage_mut(&mut self) -> &mut Stage {
        &mut self.stage
    }

    /// Gives the model back.
    pub fn into_stage(self) -> Stage {
        self.stage
    }
}
