//! Llama's transformer block: `x + o(attn(rope(qkv(rms₁(x)))))`, then
//! `+ down(silu(gate(rms₂(·))) · up(rms₂(·)))`, no biases (as `transformers`'
//! `LlamaDecoderLayer`). Q, K, V are one fused projection `[h, h + 2·kv·hd]`, gate and up
//! another `[h, 2m]`.

use candle_core::{DType, Device, Tensor};
use pipewise_common::model::ModelSpec;

use super::kept::KeptAttention;
use super::norm_grads::NormGrads;
use crate::error::Result;
use crate::llama_ops::{self, Rope};
use crate::ops;
use crate::param::{Init, Param};

/// The standard deviation of the linear layers' initial values (`transformers`'
/// `initializer_range`).
const INIT_STD: f64 = 0.02;

/// The seven parameter tensors of a Llama block (weights stored `[in, out]`).
#[derive(Debug, Clone)]
pub(crate) struct Block {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f64,
    pub(crate) attn_norm: Param,
    /// `[h, h + 2·kv·hd]`: Q, K, V side by side.
    pub(crate) qkv_w: Param,
    /// `[h, h]`.
    pub(crate) o_w: Param,
    pub(crate) mlp_norm: Param,
    /// `[h, 2m]`: gate, then up.
    pub(crate) gate_up_w: Param,
    /// `[m, h]`.
    pub(crate) down_w: Param,
}

/// Held from `F` to `B` (see `ModelSpec::piece_activation_bytes`).
#[derive(Debug)]
pub(crate) struct ForwardStash {
    b: usize,
    t: usize,
    xhat1: Tensor,
    rstd1: Tensor,
    a: Tensor,
    /// The QKV projection's output with Q and K rotated, `[N, h + 2·kv·hd]`.
    qkv: Tensor,
    /// Attention's per-row log-sum-exp `[b, heads, t]`, f32.
    lse: Tensor,
    y: Tensor,
    xhat2: Tensor,
    rstd2: Tensor,
    c: Tensor,
    /// Gate and up, `[N, 2m]`.
    gu: Tensor,
    /// `silu(gate)·up`, `[N, m]` (the down projection's input).
    m: Tensor,
    mask: Tensor,
    rope: Rope,
}

/// Held from `F` to `B` under selective recomputation: a block's kept activations and its
/// rotation, from which [`Block::rebuild`] redoes the norms, linear layers and rotation but
/// not the attention core.
#[derive(Debug)]
pub(crate) struct Kept {
    attention: KeptAttention,
    rope: Rope,
}

/// Held from `B` to `W`: each linear layer's input and output gradient.
#[derive(Debug)]
pub(crate) struct WeightStash {
    a: Tensor,
    dqkv: Tensor,
    y: Tensor,
    dproj: Tensor,
    c: Tensor,
    dgu: Tensor,
    m: Tensor,
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
            &self.gu,
            &self.m,
        ]
        .into_iter()
        .map(ops::bytes)
        .sum()
    }
}

impl ForwardStash {
    /// What selective recomputation keeps of this stash of a block whose input was `x`.
    pub(crate) fn keep(self, x: &Tensor) -> Kept {
        Kept {
            attention: KeptAttention {
                b: self.b,
                t: self.t,
                x: x.clone(),
                lse: self.lse,
                y: self.y,
                mask: self.mask,
            },
            rope: self.rope,
        }
    }
}

impl Kept {
    pub(crate) fn bytes(&self) -> u64 {
        self.attention.bytes()
    }

    pub(crate) fn shared_bytes(&self) -> u64 {
        self.attention.shared_bytes()
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
            &self.dgu,
            &self.m,
            &self.dout,
        ]
        .into_iter()
        .map(ops::bytes)
        .sum()
    }
}

impl Block {
    pub(crate) fn new(
        spec: &ModelSpec,
        index: u32,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let h = spec.hidden as usize;
        let (qkv, m) = (spec.qkv_width() as usize, spec.mlp_width() as usize);
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
        let normal = Init::Normal(INIT_STD);
        Ok(Self {
            heads: spec.heads as usize,
            kv_heads: spec.kv_heads() as usize,
            head_dim: spec.head_dim() as usize,
            eps: spec.norm_eps,
            attn_norm: p("attn_norm.weight", &[h], Init::Const(1.0), false)?,
            qkv_w: p("attn.qkv.weight", &[h, qkv], normal, true)?,
            o_w: p("attn.o.weight", &[h, h], normal, true)?,
            mlp_norm: p("mlp_norm.weight", &[h], Init::Const(1.0), false)?,
            gate_up_w: p("mlp.gate_up.weight", &[h, 2 * m], normal, true)?,
            down_w: p("mlp.down.weight", &[m, h], normal, true)?,
        })
    }

    pub(crate) fn params(&self) -> Vec<&Param> {
        vec![
            &self.attn_norm,
            &self.qkv_w,
            &self.o_w,
            &self.mlp_norm,
            &self.gate_up_w,
            &self.down_w,
        ]
    }

    pub(crate) fn params_mut(&mut self) -> Vec<&mut Param> {
        vec![
            &mut self.attn_norm,
            &mut self.qkv_w,
            &mut self.o_w,
            &mut self.mlp_norm,
            &mut self.gate_up_w,
            &mut self.down_w,
        ]
    }

    /// Query heads, key/value heads and the head size.
    pub(crate) fn heads(&self) -> (usize, usize, usize) {
        (self.heads, self.kv_heads, self.head_dim)
    }

    /// RMSNorm's epsilon.
    pub(crate) fn eps(&self) -> f64 {
        self.eps
    }

    /// `x: [N, h]` with `N = b·t`; `mask` is the causal mask for `t`, `rope` the stage's
    /// rotary tables.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        (b, t): (usize, usize),
        mask: &Tensor,
        rope: &Rope,
    ) -> Result<(Tensor, ForwardStash)> {
        let n1 = llama_ops::rms_norm(x, &self.attn_norm.value, self.eps)?;
        let a = n1.y;
        let qkv = ops::linear(&a, &self.qkv_w.value, None)?;
        let qkv = rope.apply(qkv, (b, t), self.heads(), false)?;
        let (y, lse) = llama_ops::attention(&qkv, (b, t), self.heads(), mask)?;
        let x1 = ops::linear_residual(&y, &self.o_w.value, None, Some(x))?;
        let n2 = llama_ops::rms_norm(&x1, &self.mlp_norm.value, self.eps)?;
        let c = n2.y;
        let gu = ops::linear(&c, &self.gate_up_w.value, None)?;
        let m = llama_ops::swiglu(&gu)?;
        let out = ops::linear_residual(&m, &self.down_w.value, None, Some(&x1))?;
        let stash = ForwardStash {
            b,
            t,
            xhat1: n1.xhat,
            rstd1: n1.rstd,
            a,
            qkv,
            lse,
            y,
            xhat2: n2.xhat,
            rstd2: n2.rstd,
            c,
            gu,
            m,
            mask: mask.clone(),
            rope: rope.clone(),
        };
        Ok((out, stash))
    }

    /// The stash [`Block::forward`] made, from what selective recomputation kept: the same
    /// operations on the same input and parameters, so the same bits.
    pub(crate) fn rebuild(&self, kept: Kept) -> Result<ForwardStash> {
        let (k, rope) = (kept.attention, kept.rope);
        let (x, bt) = (&k.x, (k.b, k.t));
        let n1 = llama_ops::rms_norm(x, &self.attn_norm.value, self.eps)?;
        let a = n1.y;
        let qkv = ops::linear(&a, &self.qkv_w.value, None)?;
        let qkv = rope.apply(qkv, bt, self.heads(), false)?;
        let x1 = ops::linear_residual(&k.y, &self.o_w.value, None, Some(x))?;
        let n2 = llama_ops::rms_norm(&x1, &self.mlp_norm.value, self.eps)?;
        let c = n2.y;
        let gu = ops::linear(&c, &self.gate_up_w.value, None)?;
        let m = llama_ops::swiglu(&gu)?;
        Ok(ForwardStash {
            b: k.b,
            t: k.t,
            xhat1: n1.xhat,
            rstd1: n1.rstd,
            a,
            qkv,
            lse: k.lse,
            y: k.y,
            xhat2: n2.xhat,
            rstd2: n2.rstd,
            c,
            gu,
            m,
            mask: k.mask,
            rope,
        })
    }

    /// The input gradient, and the RMSNorms' weight gradients (`attn_norm`, then
    /// `mlp_norm`); every linear layer's input and output gradient go to the stash.
    pub(crate) fn backward_input(
        &self,
        f: ForwardStash,
        dout: Tensor,
    ) -> Result<(Tensor, WeightStash, NormGrads)> {
        let dm = ops::linear_grad_input(&dout, &self.down_w.value)?;
        let dgu = llama_ops::swiglu_grad_input(&f.gu, &dm)?;
        let dc = ops::linear_grad_input(&dgu, &self.gate_up_w.value)?;
        let (xhat2, rstd2, w2) = (&f.xhat2, &f.rstd2, &self.mlp_norm.value);
        let dx1 = llama_ops::rms_norm_grad_input_plus(&dout, &dc, xhat2, rstd2, w2)?;
        let dy = ops::linear_grad_input(&dx1, &self.o_w.value)?;
        let (bt, heads) = ((f.b, f.t), self.heads());
        let drot = llama_ops::attention_grad((&f.qkv, &f.y, &f.lse), &dy, bt, heads, &f.mask)?;
        let dqkv = f.rope.apply(drot, bt, heads, true)?;
        let da = ops::linear_grad_input(&dqkv, &self.qkv_w.value)?;
        let (xhat1, rstd1, w1) = (&f.xhat1, &f.rstd1, &self.attn_norm.value);
        let dx = llama_ops::rms_norm_grad_input_plus(&dx1, &da, xhat1, rstd1, w1)?;
        let dw1 = llama_ops::rms_norm_grad_weight(&da, &f.xhat1)?;
        let dw2 = llama_ops::rms_norm_grad_weight(&dc, &f.xhat2)?;
        let stash = WeightStash {
            a: f.a,
            dqkv,
            y: f.y,
            dproj: dx1,
            c: f.c,
            dgu,
            m: f.m,
            dout,
        };
        Ok((dx, stash, NormGrads(vec![dw1, dw2])))
    }

    /// The RMSNorms' parameters, in the order of the [`NormGrads`] `B` returns.
    pub(crate) fn norm_params_mut(&mut self) -> Vec<&mut Param> {
        vec![&mut self.attn_norm, &mut self.mlp_norm]
    }

    /// The linear layers' weight gradients from the stash, accumulated.
    pub(crate) fn backward_weight(&mut self, w: WeightStash) -> Result<()> {
        ops::accumulate_linear_grad_weight(&mut self.down_w, &w.m, &w.dout)?;
        ops::accumulate_linear_grad_weight(&mut self.gate_up_w, &w.c, &w.dgu)?;
        ops::accumulate_linear_grad_weight(&mut self.o_w, &w.y, &w.dproj)?;
        ops::accumulate_linear_grad_weight(&mut self.qkv_w, &w.a, &w.dqkv)
    }
}
