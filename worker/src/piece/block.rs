//! A pre-LayerNorm transformer block: `x + attn(ln1(x))`, then `+ mlp(ln2(·))`.

use candle_core::{DType, Device, Tensor};

use super::kept::KeptAttention;
use super::norm_grads::NormGrads;
use crate::error::Result;
use crate::ops;
use crate::param::{Init, Param};

/// The twelve parameter tensors of a block.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    heads: usize,
    pub(crate) ln1_w: Param,
    pub(crate) ln1_b: Param,
    /// `[h, 3h]`: Q, K, V side by side.
    pub(crate) qkv_w: Param,
    pub(crate) qkv_b: Param,
    /// `[h, h]`.
    pub(crate) proj_w: Param,
    pub(crate) proj_b: Param,
    pub(crate) ln2_w: Param,
    pub(crate) ln2_b: Param,
    /// `[h, 4h]`.
    pub(crate) fc_w: Param,
    pub(crate) fc_b: Param,
    /// `[4h, h]`.
    pub(crate) out_w: Param,
    pub(crate) out_b: Param,
}

/// Held from `F` to `B` (see `ModelSpec::piece_activation_bytes`).
#[derive(Debug)]
pub(crate) struct ForwardStash {
    b: usize,
    t: usize,
    xhat1: Tensor,
    rstd1: Tensor,
    a: Tensor,
    /// The QKV projection's output `[N, 3h]` (Q, K, V).
    qkv: Tensor,
    /// Attention's per-row log-sum-exp `[b, heads, t]`, f32 whatever the model's dtype.
    lse: Tensor,
    /// Attention's output `[N, h]` (the projection's input).
    y: Tensor,
    xhat2: Tensor,
    rstd2: Tensor,
    c: Tensor,
    u: Tensor,
    g: Tensor,
    /// The stage's causal mask (shared, not counted): the candle path of attention's
    /// backward recomputes the probabilities with it.
    mask: Tensor,
}

/// Held from `F` to `B` under selective recomputation ([`Block::rebuild`]).
pub(crate) type Kept = KeptAttention;

/// Held from `B` to `W`: each linear layer's input and output gradient (the LayerNorms'
/// weight gradients are done in `B`, see [`NormGrads`]).
#[derive(Debug)]
pub(crate) struct WeightStash {
    a: Tensor,
    dqkv: Tensor,
    y: Tensor,
    dproj: Tensor,
    c: Tensor,
    du: Tensor,
    g: Tensor,
    dout: Tensor,
}

impl ForwardStash {
    pub(crate) fn bytes(&self) -> u64 {
        [
            &self.xhat1,
            &self.rstd1,
            &self.a,
            &self.qkv,
            &self.lse,
            &self.y,
            &self.xhat2,
            &self.rstd2,
            &self.c,
            &self.u,
            &self.g,
        ]
        .into_iter()
        .map(ops::bytes)
        .sum()
    }
}

impl ForwardStash {
    /// What selective recomputation keeps of this stash of a block whose input was `x`.
    pub(crate) fn keep(self, x: &Tensor) -> Kept {
        KeptAttention {
            b: self.b,
            t: self.t,
            x: x.clone(),
            lse: self.lse,
            y: self.y,
            mask: self.mask,
        }
    }
}

impl WeightStash {
    pub(crate) fn bytes(&self) -> u64 {
        [
            &self.a,
            &self.dqkv,
            &self.y,
            &self.dproj,
            &self.c,
            &self.du,
            &self.g,
            &self.dout,
        ]
        .into_iter()
        .map(ops::bytes)
        .sum()
    }
}

impl Block {
    pub(crate) fn new(
        index: u32,
        hidden: usize,
        heads: usize,
        layers: usize,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let h = hidden;
        // GPT-2: residual projections scaled by 1/sqrt(2·layers).
        let resid_std = 0.02 / ((2 * layers.max(1)) as f64).sqrt();
        let p = |name: &str, shape: &[usize], init: Init, decay: bool| {
            Param::new(
                format!("block{index}.{name}"),
                shape,
                init,
                decay,
                seed,
                dtype,
                device,
            )
        };
        let ones = Init::Const(1.0);
        let zeros = Init::Const(0.0);
        Ok(Self {
            heads,
            ln1_w: p("ln1.weight", &[h], ones, false)?,
            ln1_b: p("ln1.bias", &[h], zeros, false)?,
            qkv_w: p("attn.qkv.weight", &[h, 3 * h], Init::Normal(0.02), true)?,
            qkv_b: p("attn.qkv.bias", &[3 * h], zeros, false)?,
            proj_w: p("attn.proj.weight", &[h, h], Init::Normal(resid_std), true)?,
            proj_b: p("attn.proj.bias", &[h], zeros, false)?,
            ln2_w: p("ln2.weight", &[h], ones, false)?,
            ln2_b: p("ln2.bias", &[h], zeros, false)?,
            fc_w: p("mlp.fc.weight", &[h, 4 * h], Init::Normal(0.02), true)?,
            fc_b: p("mlp.fc.bias", &[4 * h], zeros, false)?,
            out_w: p(
                "mlp.proj.weight",
                &[4 * h, h],
                Init::Normal(resid_std),
                true,
            )?,
            out_b: p("mlp.proj.bias", &[h], zeros, false)?,
        })
    }

    pub(crate) fn params(&self) -> Vec<&Param> {
        vec![
            &self.ln1_w,
            &self.ln1_b,
            &self.qkv_w,
            &self.qkv_b,
            &self.proj_w,
            &self.proj_b,
            &self.ln2_w,
            &self.ln2_b,
            &self.fc_w,
            &self.fc_b,
            &self.out_w,
            &self.out_b,
        ]
    }

    pub(crate) fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![
            &mut self.ln1_w,
            &mut self.ln1_b,
            &mut self.qkv_w,
            &mut self.qkv_b,
            &mut self.proj_w,
            &mut self.proj_b,
            &mut self.ln2_w,
            &mut self.ln2_b,
            &mut self.fc_w,
            &mut self.fc_b,
            &mut self.out_w,
            &mut self.out_b,
        ]
    }

    /// `x: [N, h]` with `N = b·t`; `mask` is the causal mask for `t`.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        (b, t): (usize, usize),
        mask: &Tensor,
    ) -> Result<(Tensor, ForwardStash)> {
        let ln1 = ops::layer_norm(x, &self.ln1_w.value, &self.ln1_b.value)?;
        let a = ln1.y;
        let qkv = ops::linear(&a, &self.qkv_w.value, Some(&self.qkv_b.value))?;
        let (y, lse) = ops::attention(&qkv, (b, t, self.heads), mask)?;
        let x1 = ops::linear_residual(&y, &self.proj_w.value, Some(&self.proj_b.value), Some(x))?;
        let ln2 = ops::layer_norm(&x1, &self.ln2_w.value, &self.ln2_b.value)?;
        let c = ln2.y;
        let u = ops::linear(&c, &self.fc_w.value, Some(&self.fc_b.value))?;
        let g = ops::gelu(&u)?;
        let out = ops::linear_residual(&g, &self.out_w.value, Some(&self.out_b.value), Some(&x1))?;
        let stash = ForwardStash {
            b,
            t,
            xhat1: ln1.xhat,
            rstd1: ln1.rstd,
            a,
            qkv,
            lse,
            y,
            xhat2: ln2.xhat,
            rstd2: ln2.rstd,
            c,
            u,
            g,
            mask: mask.clone(),
        };
        Ok((out, stash))
    }

    /// The stash [`Block::forward`] made, from what selective recomputation kept: the same
    /// operations on the same input and parameters, so the same bits.
    pub(crate) fn rebuild(&self, k: Kept) -> Result<ForwardStash> {
        let x = &k.x;
        let ln1 = ops::layer_norm(x, &self.ln1_w.value, &self.ln1_b.value)?;
        let a = ln1.y;
        let qkv = ops::linear(&a, &self.qkv_w.value, Some(&self.qkv_b.value))?;
        let x1 = ops::linear_residual(&k.y, &self.proj_w.value, Some(&self.proj_b.value), Some(x))?;
        let ln2 = ops::layer_norm(&x1, &self.ln2_w.value, &self.ln2_b.value)?;
        let c = ln2.y;
        let u = ops::linear(&c, &self.fc_w.value, Some(&self.fc_b.value))?;
        let g = ops::gelu(&u)?;
        Ok(ForwardStash {
            b: k.b,
            t: k.t,
            xhat1: ln1.xhat,
            rstd1: ln1.rstd,
            a,
            qkv,
            lse: k.lse,
            y: k.y,
            xhat2: ln2.xhat,
            rstd2: ln2.rstd,
            c,
            u,
            g,
            mask: k.mask,
        })
    }

    /// The input gradient, and the LayerNorms' weight gradients (`ln1`, then `ln2`), which
    /// need only `x̂` and the output gradient at hand here; every linear layer's input and
    /// output gradient go to the stash.
    pub(crate) fn backward_input(
        &self,
        f: ForwardStash,
        dout: Tensor,
    ) -> Result<(Tensor, WeightStash, NormGrads)> {
        // MLP: out = x1 + (gelu(c·Wfc + bfc)·Wout + bout).
        let dg = ops::linear_grad_input(&dout, &self.out_w.value)?;
        let du = ops::gelu_grad_input(&f.u, &dg)?;
        let dc = ops::linear_grad_input(&du, &self.fc_w.value)?;
        let dx1 =
            (&dout + ops::layer_norm_grad_input(&dc, &f.xhat2, &f.rstd2, &self.ln2_w.value)?)?;
        // Attention: x1 = x + (attn(a)·Wproj + bproj).
        let dy = ops::linear_grad_input(&dx1, &self.proj_w.value)?;
        let dqkv =
            ops::attention_grad((&f.qkv, &f.y, &f.lse), &dy, (f.b, f.t, self.heads), &f.mask)?;
        let da = ops::linear_grad_input(&dqkv, &self.qkv_w.value)?;
        let dx = (&dx1 + ops::layer_norm_grad_input(&da, &f.xhat1, &f.rstd1, &self.ln1_w.value)?)?;
        let (dg1, db1) = ops::layer_norm_grad_weight(&da, &f.xhat1)?;
        let (dg2, db2) = ops::layer_norm_grad_weight(&dc, &f.xhat2)?;
        let stash = WeightStash {
            a: f.a,
            dqkv,
            y: f.y,
            dproj: dx1,
            c: f.c,
            du,
            g: f.g,
            dout,
        };
        Ok((dx, stash, NormGrads(vec![dg1, db1, dg2, db2])))
    }

    /// The LayerNorms' parameters, in the order of the [`NormGrads`] `B` returns.
    pub(crate) fn norm_params_mut(&mut self) -> Vec<&mut Param> {
        vec![
            &mut self.ln1_w,
            &mut self.ln1_b,
            &mut self.ln2_w,
            &mut self.ln2_b,
        ]
    }

    /// The linear layers' weight gradients from the stash, accumulated.
    pub(crate) fn backward_weight(&mut self, w: WeightStash) -> Result<()> {
        ops::accumulate_linear_grad_weight(&mut self.out_w, &w.g, &w.dout)?;
        self.out_b.accumulate(&ops::sum_tokens(&w.dout)?)?;
        ops::accumulate_linear_grad_weight(&mut self.fc_w, &w.c, &w.du)?;
        self.fc_b.accumulate(&ops::sum_tokens(&w.du)?)?;
        ops::accumulate_linear_grad_weight(&mut self.proj_w, &w.y, &w.dproj)?;
        self.proj_b.accumulate(&ops::sum_tokens(&w.dproj)?)?;
        ops::accumulate_linear_grad_weight(&mut self.qkv_w, &w.a, &w.dqkv)?;
        self.qkv_b
            .accumulate(&without_key_part(ops::sum_tokens(&w.dqkv)?)?)
    }
}

/// The QKV bias gradient (`[q | k | v]`, `3h`) with its key part set to its exact value,
/// zero: a key bias adds the same `q·b` to every score of a query's row, which softmax
/// ignores, so its gradient `Σ_j ∂L/∂k_j = Σ_i q_i Σ_j ∂L/∂s_ij / √d` vanishes (each softmax
/// row's score gradients sum to 0). Summed in floating point it is rounding noise, which
/// AdamW scales up to a step of about a tenth of the learning rate (`m / (√v + ε)` with
/// `|g| ≈ ε`): two sums of the same gradients in another order (microbatches on other
/// workers or replicas) then drifted apart by 1e-5 in 6 steps, where every other
/// parameter stayed within 1e-6.
fn without_key_part(db: Tensor) -> Result<Tensor> {
    let h = db.dim(0)? / 3;
    Ok(Tensor::cat(
        &[
            db.narrow(0, 0, h)?,
            db.narrow(0, h, h)?.zeros_like()?,
            db.narrow(0, 2 * h, h)?,
        ],
        0,
    )?)
}
