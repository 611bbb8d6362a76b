//! The head piece: final norm (GPT's LayerNorm, Llama's RMSNorm), LM head (no bias) and
//! cross-entropy loss.

use candle_core::{DType, Device, Tensor};
use pipewise_common::model::{Family, ModelSpec};

use super::norm_grads::NormGrads;
use crate::error::Result;
use crate::llama_ops;
use crate::ops;
use crate::param::{Init, Param};

/// A tied head's `[h, V]` table: the embedding's `[V, h]` one, drawn from the embedding's
/// own stream and transposed, so that the two copies (the embedding's and this) start
/// equal however the model is cut.
fn tied_table(spec: &ModelSpec, seed: u64, dtype: DType, device: &Device) -> Result<Param> {
    let (vocab, hidden) = (spec.vocab as usize, spec.hidden as usize);
    let table = super::embedding::Embedding::new(vocab, hidden, None, seed, dtype, device)?.wte;
    let mut lm = Param::new(
        "head.lm_head.weight".into(),
        &[hidden, vocab],
        Init::Const(0.0),
        table.decay,
        seed,
        dtype,
        device,
    )?;
    lm.value = table.value.t()?.contiguous()?;
    lm.master = table.master.map(|m| m.t()?.contiguous()).transpose()?;
    Ok(lm)
}

/// Final norm and LM head.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) ln_w: Param,
    /// The LayerNorm's shift; none for Llama's RMSNorm.
    pub(crate) ln_b: Option<Param>,
    /// RMSNorm's epsilon (Llama).
    rms_eps: f64,
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
    pub(crate) fn new(spec: &ModelSpec, seed: u64, dtype: DType, device: &Device) -> Result<Self> {
        let (vocab, hidden) = (spec.vocab as usize, spec.hidden as usize);
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
        let llama = spec.family == Family::Llama;
        Ok(Self {
            ln_w: p("ln_f.weight", &[hidden], Init::Const(1.0), false)?,
            ln_b: if llama {
                None
            } else {
                Some(p("ln_f.bias", &[hidden], Init::Const(0.0), false)?)
            },
            rms_eps: spec.norm_eps,
            lm: if spec.tie_embeddings {
                tied_table(spec, seed, dtype, device)?
            } else {
                p("lm_head.weight", &[hidden, vocab], Init::Normal(0.02), true)?
            },
        })
    }

    pub(crate) fn params(&self) -> Vec<&Param> {
        let mut params = vec![&self.ln_w];
        params.extend(&self.ln_b);
        params.push(&self.lm);
        params
    }

    pub(crate) fn params_mut(&mut self) -> Vec<&mut Param> {
        let mut params = vec![&mut self.ln_w];
        params.extend(&mut self.ln_b);
        params.push(&mut self.lm);
        params
    }

    /// The final norm of `x`: its output, `x̂` and `1/σ`.
    fn norm(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        Ok(match &self.ln_b {
            Some(b) => {
                let ln = ops::layer_norm(x, &self.ln_w.value, &b.value)?;
                (ln.y, ln.xhat, ln.rstd)
            }
            None => {
                let n = llama_ops::rms_norm(x, &self.ln_w.value, self.rms_eps)?;
                (n.y, n.xhat, n.rstd)
            }
        })
    }

    /// The logits `[N, V]` of `x: [N, h]` (no loss: generation and evaluation read them).
    pub(crate) fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let (z, _, _) = self.norm(x)?;
        ops::linear(&z, &self.lm.value, None)
    }

    /// `x: [N, h]`, `targets: [b, t]` (u32) → the microbatch's mean loss (rank 0).
    pub(crate) fn forward(&self, x: &Tensor, targets: &Tensor) -> Result<(Tensor, ForwardStash)> {
        let (z, xhat, rstd) = self.norm(x)?;
        let logits = ops::linear(&z, &self.lm.value, None)?;
        let targets = targets.flatten_all()?;
        let (probs, loss) = ops::cross_entropy(&logits, &targets)?;
        Ok((
            loss,
            ForwardStash {
                xhat,
                rstd,
                z,
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
        let w = &self.ln_w.value;
        let (dx, norm) = if self.ln_b.is_some() {
            let dx = ops::layer_norm_grad_input(&dz, &f.xhat, &f.rstd, w)?;
            let (dg, db) = ops::layer_norm_grad_weight(&dz, &f.xhat)?;
            (dx, vec![dg, db])
        } else {
            let dx = llama_ops::rms_norm_grad_input(&dz, &f.xhat, &f.rstd, w)?;
            (dx, vec![llama_ops::rms_norm_grad_weight(&dz, &f.xhat)?])
        };
        Ok((dx, WeightStash { z: f.z, dlogits }, NormGrads(norm)))
    }

    /// The final LayerNorm's parameters, in the order of the [`NormGrads`] `B` returns.
    pub(crate) fn norm_params_mut(&mut self) -> Vec<&mut Param> {
        let mut params = vec![&mut self.ln_w];
        params.extend(&mut self.ln_b);
        params
    }

    /// The LM head's weight gradient from the stash, accumulated.
    pub(crate) fn backward_weight(&mut self, w: WeightStash) -> Result<()> {
        ops::accumulate_linear_grad_weight(&mut self.lm, &w.z, &w.dlogits)
    }
}
