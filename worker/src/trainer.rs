//! The single-device reference trainer: the whole model as one stage, the oracle of the
//! runtime's exactness tests.

use candle_core::Device;
use pipewise_common::model::ModelSpec;

use crate::data::Batch;
use crate::error::{Error, Result};
use crate::optim::{AdamW, clip_scale};
use crate::stage::Stage;

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

/// Trains the whole model on one device: per microbatch `F` then `BW`, then one clipped
/// AdamW step.
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
        let mut loss = 0.0;
        for (mb, batch) in (0..n).zip(batches) {
            let l = self
                .stage
                .forward(mb, &batch.tokens, Some(&batch.targets))?;
            loss += f64::from(l.to_scalar::<f32>()?);
            self.stage.backward(mb, None)?;
        }
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
