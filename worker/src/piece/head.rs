//! The head piece: final LayerNorm, LM head (untied, no bias) and cross-entropy loss.

use candle_core::{DType, Device, Tensor};

use super::norm_grads::NormGrads;
use crate::error::Result;
use crate::ops;
use crate::param::{Init, Param};

/// Final LayerNorm and LM head.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) ln_w: Param,
    pub(crate) ln_b: Param,
    /// `[h, V]`.
    pub(crate) lm: Param,
}

/// Held from `F` to `B`.
#[derive(Debug)]
pub(crate) struct ForwardStash {
    xhat: Tensor,
    rstd: Tensor,
    z: Tensor,
    probs: Tensor,
    targets: Tensor,
}

/// Held from `B` to `W`: the LM head's input and output gradient (the final LayerNorm's
/// weight gradients are done in `B`, see [`NormGrads`]).
#[derive(Debug)]
pub(crate) struct WeightStash {
    z: Tensor,
    dlogits: Tensor,
}

impl ForwardStash {
    pub(crate) fn bytes(&self) -> u64 {
        [&self.xhat, &self.rstd, &self.z, &self.probs, &self.targets]
            .into_iter()
            .map(ops::bytes)
            .sum()
    }
}

impl WeightStash {
    pub(crate) fn bytes(&self) -> u64 {
        ops::bytes(&self.z) + ops::bytes(&self.dlogits)
    }
}

impl Head {
    pub(crate) fn new(
        vocab: usize,
        hidden: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let p = |name: &str, shape: &[usize], init: Init, decay: bool| {
            Param::new(
                format!("head.{name}"),
                shape,
                init,
                decay,
                seed,
                dtype,
                device,
            )
        };
        Ok(Self {
            ln_w: p("ln_f.weight", &[hidden], Init::Const(1.0), false)?,
            ln_b: p("ln_f.bias", &[hidden], Init::Const(0.0), false)?,
            lm: p("lm_head.weight", &[hidden, vocab], Init::Normal(0.02), true)?,
        })
    }

    pub(crate) fn params(&self) -> Vec<&Param> {
        vec![&self.ln_w, &self.ln_b, &self.lm]
    }

    pub(crate) fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.ln_w, &mut self.ln_b, &mut self.lm]
    }

    /// `x: [N, h]`, `targets: [b, t]` (u32) → the microbatch's mean loss (rank 0).
    pub(crate) fn forward(&self, x: &Tensor, targets: &Tensor) -> Result<(Tensor, ForwardStash)> {
        let ln = ops::layer_norm(x, &self.ln_w.value, &self.ln_b.value)?;
        let logits = ops::linear(&ln.y, &self.lm.value, None)?;
        let targets = targets.flatten_all()?;
        let (probs, loss) = ops::cross_entropy(&logits, &targets)?;
        Ok((
            loss,
            ForwardStash {
                xhat: ln.xhat,
                rstd: ln.rstd,
                z: ln.y,
                probs,
                targets,
            },
        ))
    }

    /// The input gradient and the final LayerNorm's weight gradients; the LM head's input
    /// and the logits' gradient go to the stash. `seed` is `∂(step loss)/∂(this
    /// microbatch's mean loss)`, `1/n` for `n` microbatches.
    pub(crate) fn backward_input(
        &self,
        f: ForwardStash,
        seed: f64,
    ) -> Result<(Tensor, WeightStash, NormGrads)> {
        let dlogits = ops::cross_entropy_grad(&f.probs, &f.targets, seed)?;
        let dz = ops::linear_grad_input(&dlogits, &self.lm.value)?;
        let dx = ops::layer_norm_grad_input(&dz, &f.xhat, &f.rstd, &self.ln_w.value)?;
        let (dg, db) = ops::layer_norm_grad_weight(&dz, &f.xhat)?;
        Ok((dx, WeightStash { z: f.z, dlogits }, NormGrads(vec![dg, db])))
    }

    /// The final LayerNorm's parameters, in the order of the [`NormGrads`] `B` returns.
    pub(crate) fn norm_params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.ln_w, &mut self.ln_b]
    }

    /// The LM head's weight gradient from the stash, accumulated.
    pub(crate) fn backward_weight(&mut self, w: WeightStash) -> Result<()> {
        ops::accumulate_linear_grad_weight(&mut self.lm, &w.z, &w.dlogits)
    }
}
