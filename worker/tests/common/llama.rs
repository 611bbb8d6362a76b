//! The Llama oracle: one microbatch's loss written from `transformers`' `LlamaModel` with
//! candle's own ops (`repeat_kv` by copying, the rotation by `rotate_half`), for autograd.

use std::collections::HashMap;

use candle_core::{D, DType, Tensor, Var};
use pipewise_worker::Result;

use super::Oracle;

fn rms(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let var = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(var + eps)?.sqrt()?)?.broadcast_mul(w)
}

/// `[-x₂, x₁]` of the halves of the last axis.
fn rotate_half(x: &Tensor) -> candle_core::Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)
}

/// The mean token cross-entropy of one microbatch; the hidden state entering piece `i` gets
/// a zero tap `taps[(i, mb)]` whose gradient is the input gradient there.
pub(super) fn loss(
    o: &Oracle,
    (ids, targets): (&Tensor, &Tensor),
    mb: u32,
    taps: &mut HashMap<(usize, u32), Var>,
) -> Result<Tensor> {
    let s = &o.spec;
    let (h, nh, kv, v) = (
        s.hidden as usize,
        s.heads as usize,
        s.kv_heads() as usize,
        s.vocab as usize,
    );
    let (hd, m, eps) = (h / nh, s.mlp_width() as usize, s.norm_eps);
    let (b, t) = ids.dims2()?;
    let device = ids.device();
    // cos/sin of `transformers`' rotary embedding: angles repeated over both halves.
    let inv: Vec<f32> = (0..hd / 2)
        .map(|i| 1.0 / (s.rope_theta as f32).powf((2 * i) as f32 / hd as f32))
        .collect();
    let angles: Vec<f32> = (0..t)
        .flat_map(|p| {
            (0..hd)
                .map(|j| p as f32 * inv[j % (hd / 2)])
                .collect::<Vec<_>>()
        })
        .collect();
    let angles = Tensor::from_vec(angles, (1, 1, t, hd), device)?;
    let (cos, sin) = (angles.cos()?, angles.sin()?);
    let rope = |x: &Tensor| -> candle_core::Result<Tensor> {
        x.broadcast_mul(&cos)? + rotate_half(x)?.broadcast_mul(&sin)?
    };
    let tril = Tensor::tril2(t, DType::U8, device)?;
    let neg = Tensor::full(f32::NEG_INFINITY, (t, t), device)?;
    let mut x = o
        .v("embedding.wte")
        .embedding(&ids.flatten_all()?)?
        .reshape((b, t, h))?;
    for piece in 1..=s.layers as usize {
        let tap = Var::zeros((b, t, h), DType::F32, device)?;
        x = (x + tap.as_tensor())?;
        taps.insert((piece, mb), tap);
        let p = |name: &str| o.v(&format!("block{}.{name}", piece - 1)).clone();
        let a = rms(&x, &p("attn_norm.weight"), eps)?;
        let qkv = a.broadcast_matmul(&p("attn.qkv.weight"))?;
        let split = |offset: usize, heads: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, offset, heads * hd)?
                .reshape((b, t, heads, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = rope(&split(0, nh)?)?;
        let k = rope(&split(h, kv)?)?;
        let vv = split(h + kv * hd, kv)?;
        // repeat_kv: each key/value head copied for its group of query heads.
        let repeat = |x: &Tensor| -> candle_core::Result<Tensor> {
            x.unsqueeze(2)?
                .broadcast_as((b, kv, nh / kv, t, hd))?
                .contiguous()?
                .reshape((b, nh, t, hd))
        };
        let (k, vv) = (repeat(&k)?, repeat(&vv)?);
        let scores = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
        let mask = tril.broadcast_as(scores.shape())?;
        let scores = mask.where_cond(&scores, &neg.broadcast_as(scores.shape())?)?;
        let e = scores
            .broadcast_sub(&scores.max_keepdim(D::Minus1)?.detach())?
            .exp()?;
        let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let y = probs
            .matmul(&vv)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, h))?;
        x = (&x + y.broadcast_matmul(&p("attn.o.weight"))?)?;
        let c = rms(&x, &p("mlp_norm.weight"), eps)?;
        let gu = c.broadcast_matmul(&p("mlp.gate_up.weight"))?;
        let gate = gu.narrow(2, 0, m)?;
        let up = gu.narrow(2, m, m)?;
        let mlp = (gate.silu()? * up)?.broadcast_matmul(&p("mlp.down.weight"))?;
        x = (x + mlp)?;
    }
    let head_piece = s.layers as usize + 1;
    let tap = Var::zeros((b, t, h), DType::F32, device)?;
    x = (x + tap.as_tensor())?;
    taps.insert((head_piece, mb), tap);
    let z = rms(&x, o.v("head.ln_f.weight"), eps)?;
    let logits = z
        .broadcast_matmul(o.v("head.lm_head.weight"))?
        .reshape((b * t, v))?;
    let max = logits.max_keepdim(1)?.detach();
    let lse = (logits.broadcast_sub(&max)?.exp()?.sum_keepdim(1)?.log()? + &max)?;
    let picked = logits.gather(&targets.flatten_all()?.unsqueeze(1)?, 1)?;
    Ok((lse - picked)?.mean_all()?)
}
