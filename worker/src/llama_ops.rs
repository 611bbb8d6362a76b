//! The Llama block's own math, forward and input gradient: RMSNorm, rotary position
//! embeddings, grouped-query attention's shared key/value heads and the SwiGLU gate.
//! Each computes as `transformers`' `LlamaForCausalLM` does (RMSNorm and the gate in f32,
//! the rotary angles in f32 from `θ^(−2i/d)`). Contiguous f32 CPU tensors take the fused
//! kernels of [`crate::kernels`] (RMSNorm and its gradients, the rotation in place, the
//! gate, attention reading shared key/value heads in place); the `*_candle` functions and
//! candle-op branches serve every other dtype and device (CUDA included), and are the
//! reference the kernels are tested against.
//!
//! Layouts follow [`crate::ops`]: activations `[N, features]`, `N = b·t` tokens in
//! sequence-major order. The fused QKV output is `[N, h + 2·kv·hd]`: Q's `heads` heads,
//! then K's and V's `kv` heads, `hd` columns each.

use candle_core::{D, DType, Device, Tensor};

use crate::error::Result;
use crate::kernels::attention::Shape;
use crate::kernels::cpu::all_f32_cpu;
use crate::kernels::{self, rope::Rotation};
use crate::ops;

/// `t` in f32 (where norms and gates compute for a bf16 or f16 model).
fn wide(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?)
}

// === RMSNorm ===

/// What RMSNorm's forward returns: the output and what the backward needs.
pub(crate) struct RmsNormOut {
    /// `x̂·w`.
    pub y: Tensor,
    /// `x̂ = x / rms(x)`.
    pub xhat: Tensor,
    /// `1 / rms(x)`, `[N, 1]`.
    pub rstd: Tensor,
}

/// RMSNorm over the last axis of `x: [N, h]`: `x̂ = x / √(mean(x²) + ε)`, `y = w·x̂`,
/// in f32 (`x̂` rounded to the model's dtype before the scale, as `transformers` does).
pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<RmsNormOut> {
    if all_f32_cpu(&[x, w]) && x.rank() == 2 && x.dim(1)? > 0 {
        let (y, xhat, rstd) = kernels::rms_norm::forward(x, w, eps)?;
        return Ok(RmsNormOut { y, xhat, rstd });
    }
    rms_norm_candle(x, w, eps)
}

/// [`rms_norm`] with candle's ops.
pub(crate) fn rms_norm_candle(x: &Tensor, w: &Tensor, eps: f64) -> Result<RmsNormOut> {
    let dtype = x.dtype();
    let xw = wide(x)?;
    let rstd = xw
        .sqr()?
        .mean_keepdim(1)?
        .affine(1.0, eps)?
        .sqrt()?
        .recip()?;
    let xhat = xw.broadcast_mul(&rstd)?.to_dtype(dtype)?;
    let y = wide(&xhat)?.broadcast_mul(&wide(w)?)?.to_dtype(dtype)?;
    Ok(RmsNormOut {
        y,
        xhat,
        rstd: rstd.to_dtype(dtype)?,
    })
}

/// `B` of RMSNorm: `dx = (1/rms)·(g − x̂·mean(g·x̂))` with `g = dy·w`.
pub(crate) fn rms_norm_grad_input(
    dy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    w: &Tensor,
) -> Result<Tensor> {
    if all_f32_cpu(&[dy, xhat, rstd, w]) && dy.rank() == 2 && dy.dim(1)? > 0 {
        return kernels::rms_norm::grad_input(dy, xhat, rstd, w, None);
    }
    rms_norm_grad_input_candle(dy, xhat, rstd, w)
}

/// `residual +` [`rms_norm_grad_input`]: the gradient of a residual stream that feeds a
/// branch through RMSNorm (one pass on the CPU).
pub(crate) fn rms_norm_grad_input_plus(
    residual: &Tensor,
    dy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    w: &Tensor,
) -> Result<Tensor> {
    if all_f32_cpu(&[residual, dy, xhat, rstd, w]) && dy.rank() == 2 && dy.dim(1)? > 0 {
        return kernels::rms_norm::grad_input(dy, xhat, rstd, w, Some(residual));
    }
    Ok((residual + rms_norm_grad_input_candle(dy, xhat, rstd, w)?)?)
}

/// [`rms_norm_grad_input`] with candle's ops.
pub(crate) fn rms_norm_grad_input_candle(
    dy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    w: &Tensor,
) -> Result<Tensor> {
    let xhat = wide(xhat)?;
    let g = wide(dy)?.broadcast_mul(&wide(w)?)?;
    let mean_gx = (&g * &xhat)?.mean_keepdim(1)?;
    let inner = g.sub(&xhat.broadcast_mul(&mean_gx)?)?;
    Ok(inner.broadcast_mul(&wide(rstd)?)?.to_dtype(dy.dtype())?)
}

/// The weight gradient of RMSNorm, `Σ dy·x̂` over tokens, in f32.
pub(crate) fn rms_norm_grad_weight(dy: &Tensor, xhat: &Tensor) -> Result<Tensor> {
    if all_f32_cpu(&[dy, xhat]) && dy.rank() == 2 {
        return kernels::rms_norm::grad_weight(dy, xhat);
    }
    rms_norm_grad_weight_candle(dy, xhat)
}

/// [`rms_norm_grad_weight`] with candle's ops.
pub(crate) fn rms_norm_grad_weight_candle(dy: &Tensor, xhat: &Tensor) -> Result<Tensor> {
    Ok((wide(dy)? * wide(xhat)?)?.sum(0)?)
}

// === Rotary position embeddings ===

/// The rotary tables of one stage: `cos` and `sin` of every position's angles,
/// `[seq_len, hd/2]` each, in f32.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    cos: Tensor,
    sin: Tensor,
}

impl Rope {
    /// Angles `p·θ^(−2i/hd)` for positions `p < seq_len` and `i < hd/2`, computed in f32 as
    /// `transformers`' default rotary embedding does.
    pub(crate) fn new(seq_len: usize, hd: usize, theta: f64, device: &Device) -> Result<Self> {
        let half = hd / 2;
        let inv: Vec<f32> = (0..half)
            .map(|i| {
                let exponent = (2 * i) as f32 / hd as f32;
                1.0 / (theta as f32).powf(exponent)
            })
            .collect();
        let mut cos = Vec::with_capacity(seq_len * half);
        let mut sin = Vec::with_capacity(seq_len * half);
        for p in 0..seq_len {
            for &f in &inv {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, (seq_len, half), device)?,
            sin: Tensor::from_vec(sin, (seq_len, half), device)?,
        })
    }

    /// The `cos` and `sin` tables, `[seq_len, hd/2]` each.
    pub(crate) fn tables(&self) -> (&Tensor, &Tensor) {
        (&self.cos, &self.sin)
    }

    /// `qkv: [N, h + 2·kv·hd]` with Q and K rotated (`transformers`' half-split rotation:
    /// the pair `(x_i, x_{i+hd/2})` turns by angle `i` of its position), V as it was.
    /// `inverse` turns the other way: the input gradient of the rotation. A contiguous f32
    /// CPU `qkv` is turned in place and returned: callers pass a tensor nothing else reads
    /// (a projection's fresh output or gradient).
    pub(crate) fn apply(
        &self,
        qkv: Tensor,
        (b, t): (usize, usize),
        heads: (usize, usize, usize),
        inverse: bool,
    ) -> Result<Tensor> {
        self.apply_from(qkv, (b, t), heads, inverse, 0)
    }

    /// [`Rope::apply`] to tokens at positions `start .. start + t` (generation's new tokens
    /// after those already cached).
    pub(crate) fn apply_from(
        &self,
        qkv: Tensor,
        (b, t): (usize, usize),
        (heads, kv, hd): (usize, usize, usize),
        inverse: bool,
        start: usize,
    ) -> Result<Tensor> {
        if all_f32_cpu(&[&qkv, &self.cos, &self.sin]) {
            let r = Rotation {
                t,
                start,
                rotated: heads + kv,
                hd,
                inverse,
            };
            if kernels::rope::rotate_in_place(&qkv, self.tables(), r)? {
                return Ok(qkv);
            }
        }
        self.apply_from_candle(&qkv, (b, t), (heads, kv, hd), inverse, start)
    }

    /// [`Rope::apply_from`] with candle's ops (a new tensor).
    pub(crate) fn apply_from_candle(
        &self,
        qkv: &Tensor,
        (b, t): (usize, usize),
        (heads, kv, hd): (usize, usize, usize),
        inverse: bool,
        start: usize,
    ) -> Result<Tensor> {
        let dtype = qkv.dtype();
        let rotated = (heads + kv) * hd;
        let width = qkv.dim(1)?;
        let qk = wide(&qkv.narrow(1, 0, rotated)?)?.reshape((b, t, heads + kv, hd))?;
        let half = hd / 2;
        let (x1, x2) = (
            qk.narrow(D::Minus1, 0, half)?,
            qk.narrow(D::Minus1, half, half)?,
        );
        let cos = self.cos.narrow(0, start, t)?.reshape((1, t, 1, half))?;
        let sin = self.sin.narrow(0, start, t)?.reshape((1, t, 1, half))?;
        let sin = if inverse { sin.neg()? } else { sin };
        let y1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
        let y2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
        let qk = Tensor::cat(&[&y1, &y2], D::Minus1)?
            .reshape((b * t, rotated))?
            .to_dtype(dtype)?;
        Ok(Tensor::cat(
            &[&qk, &qkv.narrow(1, rotated, width - rotated)?],
            1,
        )?)
    }
}

// === Grouped-query attention ===

/// `qkv: [N, h + 2·kv·hd]` as `[N, 3h]`, each key/value head repeated for the
/// `heads / kv` query heads that share it (query head `j` reads key/value head
/// `j / (heads / kv)`, as `transformers`' `repeat_kv`), the layout the attention kernels take.
pub(crate) fn repeat_kv(qkv: &Tensor, (heads, kv, hd): (usize, usize, usize)) -> Result<Tensor> {
    if heads == kv {
        return Ok(qkv.clone());
    }
    let (n, group) = (qkv.dim(0)?, heads / kv);
    let repeat = |offset: usize| -> Result<Tensor> {
        Ok(qkv
            .narrow(1, offset, kv * hd)?
            .reshape((n, kv, 1, hd))?
            .broadcast_as((n, kv, group, hd))?
            .reshape((n, heads * hd))?)
    };
    let h = heads * hd;
    Ok(Tensor::cat(
        &[&qkv.narrow(1, 0, h)?, &repeat(h)?, &repeat(h + kv * hd)?],
        1,
    )?)
}

/// The input gradient of [`repeat_kv`]: each shared key/value head's gradient is the sum of
/// its query heads' (in head order).
pub(crate) fn sum_kv(dqkv: &Tensor, (heads, kv, hd): (usize, usize, usize)) -> Result<Tensor> {
    if heads == kv {
        return Ok(dqkv.clone());
    }
    let (n, group, h) = (dqkv.dim(0)?, heads / kv, heads * hd);
    let sum = |offset: usize| -> Result<Tensor> {
        let parts = dqkv.narrow(1, offset, h)?.reshape((n, kv, group, hd))?;
        let mut acc = parts.narrow(2, 0, 1)?;
        for g in 1..group {
            acc = (acc + parts.narrow(2, g, 1)?)?;
        }
        Ok(acc.reshape((n, kv * hd))?)
    };
    Ok(Tensor::cat(
        &[&dqkv.narrow(1, 0, h)?, &sum(h)?, &sum(2 * h)?],
        1,
    )?)
}

/// Causal grouped-query attention from `qkv: [N, h + 2·kv·hd]` (`dims`: query heads,
/// key/value heads, head size): the output `[N, h]` and the log-sum-exp `[b, heads, t]`, as
/// [`ops::attention`]. The CPU kernel reads each shared key/value head in place; other
/// dtypes and devices repeat them ([`repeat_kv`]) for candle's ops.
pub(crate) fn attention(
    qkv: &Tensor,
    (b, t): (usize, usize),
    (heads, kv, hd): (usize, usize, usize),
    mask: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let sh = Shape {
        b,
        t,
        heads,
        kv_heads: kv,
        hd,
    };
    if all_f32_cpu(&[qkv])
        && let Some(out) = kernels::attention::forward_tensors(qkv, sh)?
    {
        return Ok(out);
    }
    let wide = repeat_kv(qkv, (heads, kv, hd))?;
    ops::attention(&wide, (b, t, heads), mask)
}

/// `B` of [`attention`]: `dqkv: [N, h + 2·kv·hd]`, each shared key/value head's gradient the
/// sum over the query heads that read it.
pub(crate) fn attention_grad(
    (qkv, y, lse): (&Tensor, &Tensor, &Tensor),
    dy: &Tensor,
    (b, t): (usize, usize),
    (heads, kv, hd): (usize, usize, usize),
    mask: &Tensor,
) -> Result<Tensor> {
    let sh = Shape {
        b,
        t,
        heads,
        kv_heads: kv,
        hd,
    };
    if all_f32_cpu(&[qkv, y, lse, dy])
        && let Some(dqkv) = kernels::attention_backward::backward_tensors((qkv, y, lse, dy), sh)?
    {
        return Ok(dqkv);
    }
    let dims = (heads, kv, hd);
    let wide = repeat_kv(qkv, dims)?;
    let dwide = ops::attention_grad((&wide, y, lse), dy, (b, t, heads), mask)?;
    sum_kv(&dwide, dims)
}

// === SwiGLU ===

/// `silu(g)·u` for `gu: [N, 2m]` (the gate's `m` columns, then up's), in f32.
pub(crate) fn swiglu(gu: &Tensor) -> Result<Tensor> {
    if all_f32_cpu(&[gu]) && gu.rank() == 2 {
        return kernels::swiglu::forward(gu);
    }
    swiglu_candle(gu)
}

/// [`swiglu`] with candle's ops.
pub(crate) fn swiglu_candle(gu: &Tensor) -> Result<Tensor> {
    let m = gu.dim(1)? / 2;
    let g = wide(&gu.narrow(1, 0, m)?)?;
    let u = wide(&gu.narrow(1, m, m)?)?;
    Ok((silu(&g)? * u)?.to_dtype(gu.dtype())?)
}

/// `g·σ(g)`.
fn silu(g: &Tensor) -> Result<Tensor> {
    Ok((g * sigmoid(g)?)?)
}

/// `1 / (1 + e^(−g))`.
fn sigmoid(g: &Tensor) -> Result<Tensor> {
    Ok((g.neg()?.exp()? + 1.0)?.recip()?)
}

/// `B` of [`swiglu`]: `[dg | du]` from the product's gradient `dy: [N, m]`, with
/// `dg = dy·u·σ(g)·(1 + g·(1 − σ(g)))` and `du = dy·silu(g)`.
pub(crate) fn swiglu_grad_input(gu: &Tensor, dy: &Tensor) -> Result<Tensor> {
    if all_f32_cpu(&[gu, dy]) && gu.rank() == 2 {
        return kernels::swiglu::backward(gu, dy);
    }
    swiglu_grad_input_candle(gu, dy)
}

/// [`swiglu_grad_input`] with candle's ops.
pub(crate) fn swiglu_grad_input_candle(gu: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let m = gu.dim(1)? / 2;
    let g = wide(&gu.narrow(1, 0, m)?)?;
    let u = wide(&gu.narrow(1, m, m)?)?;
    let dy = wide(dy)?;
    let s = sigmoid(&g)?;
    let dsilu = (&s * (&g * s.affine(-1.0, 1.0)?)?.affine(1.0, 1.0)?)?;
    let dg = ((&dy * u)? * dsilu)?;
    let du = (dy * (g * s)?)?;
    Ok(Tensor::cat(&[&dg, &du], 1)?.to_dtype(gu.dtype())?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn randn(shape: (usize, usize), seed: u64) -> Tensor {
        let n = shape.0 * shape.1;
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    /// `⟨dy, f(x + ε·v) − f(x − ε·v)⟩ / 2ε` ≈ `⟨dx, v⟩` for the gradient `dx` of `⟨dy, f⟩`.
    fn directional(f: &dyn Fn(&Tensor) -> Tensor, x: &Tensor, dy: &Tensor, v: &Tensor) -> f32 {
        let eps = 1e-2;
        let plus = f(&(x + v.affine(eps, 0.0).unwrap()).unwrap());
        let minus = f(&(x - v.affine(eps, 0.0).unwrap()).unwrap());
        let d = ((plus - minus).unwrap() * dy).unwrap().sum_all().unwrap();
        d.to_scalar::<f32>().unwrap() / (2.0 * eps as f32)
    }

    fn dot(a: &Tensor, b: &Tensor) -> f32 {
        (a * b)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn rms_norm_gradients_match_finite_differences() {
        let (x, w, dy, v) = (
            randn((6, 8), 1),
            randn((1, 8), 2).squeeze(0).unwrap(),
            randn((6, 8), 3),
            randn((6, 8), 4),
        );
        let out = rms_norm(&x, &w, 1e-5).unwrap();
        let dx = rms_norm_grad_input(&dy, &out.xhat, &out.rstd, &w).unwrap();
        let f = |x: &Tensor| rms_norm(x, &w, 1e-5).unwrap().y;
        let (num, ana) = (directional(&f, &x, &dy, &v), dot(&dx, &v));
        assert!((num - ana).abs() < 1e-3 * ana.abs().max(1.0), "{num} {ana}");
        let dw = rms_norm_grad_weight(&dy, &out.xhat).unwrap();
        let vw = randn((1, 8), 5).squeeze(0).unwrap();
        let fw = |w: &Tensor| rms_norm(&x, w, 1e-5).unwrap().y;
        let (num, ana) = (directional(&fw, &w, &dy, &vw), dot(&dw, &vw));
        assert!((num - ana).abs() < 1e-3 * ana.abs().max(1.0), "{num} {ana}");
    }

    /// The rotation keeps norms, its inverse undoes it, and position 0 is not turned.
    #[test]
    fn rope_rotates_q_and_k_only_and_inverts() {
        let (b, t, heads, kv, hd) = (2, 5, 4, 2, 8);
        let width = (heads + 2 * kv) * hd;
        let qkv = randn((b * t, width), 7);
        let rope = Rope::new(16, hd, 10_000.0, &Device::Cpu).unwrap();
        let dims = (heads, kv, hd);
        let r = rope
            .apply(qkv.copy().unwrap(), (b, t), dims, false)
            .unwrap();
        let back = rope.apply(r.copy().unwrap(), (b, t), dims, true).unwrap();
        assert!(max_diff(&back, &qkv) < 1e-6);
        let v = (heads + kv) * hd;
        let untouched = r.narrow(1, v, width - v).unwrap();
        assert_eq!(
            max_diff(&untouched, &qkv.narrow(1, v, width - v).unwrap()),
            0.0
        );
        assert!(max_diff(&r.narrow(0, 0, 1).unwrap(), &qkv.narrow(0, 0, 1).unwrap()) < 1e-7);
        let norm = |x: &Tensor| x.narrow(1, 0, v).unwrap().sqr().unwrap().sum_all().unwrap();
        let (a, c) = (
            norm(&qkv).to_scalar::<f32>().unwrap(),
            norm(&r).to_scalar::<f32>().unwrap(),
        );
        assert!((a - c).abs() < 1e-4 * a, "{a} {c}");
        assert!(max_diff(&r.narrow(0, 3, 1).unwrap(), &qkv.narrow(0, 3, 1).unwrap()) > 1e-3);
    }

    #[test]
    fn repeated_kv_heads_sum_their_gradients() {
        let (heads, kv, hd) = (4, 2, 3);
        let qkv = randn((5, (heads + 2 * kv) * hd), 9);
        let wide = repeat_kv(&qkv, (heads, kv, hd)).unwrap();
        assert_eq!(wide.dims(), [5, 3 * heads * hd]);
        // Query head 3 reads key head 1.
        let k1 = qkv.narrow(1, heads * hd + hd, hd).unwrap();
        let k_for_3 = wide.narrow(1, heads * hd + 3 * hd, hd).unwrap();
        assert_eq!(max_diff(&k1, &k_for_3), 0.0);
        let dy = randn((5, 3 * heads * hd), 10);
        let v = randn((5, (heads + 2 * kv) * hd), 11);
        let f = |x: &Tensor| repeat_kv(x, (heads, kv, hd)).unwrap();
        let dx = sum_kv(&dy, (heads, kv, hd)).unwrap();
        let (num, ana) = (directional(&f, &qkv, &dy, &v), dot(&dx, &v));
        assert!((num - ana).abs() < 1e-3 * ana.abs().max(1.0), "{num} {ana}");
    }

    /// Grouped-query attention's CPU kernel (shared heads read in place) and its candle path
    /// (heads repeated, taken for a non-contiguous `qkv`) agree, forward and backward.
    #[test]
    fn both_attention_paths_agree() {
        let (b, t, heads, kv, hd) = (2, 11, 4, 2, 8);
        let width = (heads + 2 * kv) * hd;
        let qkv = randn((b * t, width), 21);
        let strided = qkv.t().unwrap().contiguous().unwrap().t().unwrap();
        let dy = randn((b * t, heads * hd), 22);
        let mask = ops::causal_mask(t, DType::F32, &Device::Cpu).unwrap();
        let dims = (heads, kv, hd);
        let run = |qkv: &Tensor| {
            let (y, lse) = attention(qkv, (b, t), dims, &mask).unwrap();
            let d = attention_grad((qkv, &y, &lse), &dy, (b, t), dims, &mask).unwrap();
            (y, lse, d)
        };
        let (fast, slow) = (run(&qkv), run(&strided));
        assert!(max_diff(&fast.0, &slow.0) < 1e-5);
        assert!(max_diff(&fast.1, &slow.1) < 1e-5);
        assert_eq!(fast.2.dims(), [b * t, width]);
        assert!(max_diff(&fast.2, &slow.2) < 1e-5);
    }

    /// The in-place rotation and the candle one give the same bits.
    #[test]
    fn both_rope_paths_agree() {
        let (b, t, heads, kv, hd) = (2, 9, 4, 2, 8);
        let qkv = randn((b * t, (heads + 2 * kv) * hd), 23);
        let rope = Rope::new(16, hd, 10_000.0, &Device::Cpu).unwrap();
        for inverse in [false, true] {
            let want = rope
                .apply_from_candle(&qkv, (b, t), (heads, kv, hd), inverse, 0)
                .unwrap();
            let got = rope
                .apply(qkv.copy().unwrap(), (b, t), (heads, kv, hd), inverse)
                .unwrap();
            assert_eq!(max_diff(&got, &want), 0.0);
        }
    }

    #[test]
    fn swiglu_gradient_matches_finite_differences() {
        let gu = randn((6, 10), 12).affine(3.0, 0.0).unwrap();
        let dy = randn((6, 5), 13);
        let v = randn((6, 10), 14);
        let d = swiglu_grad_input(&gu, &dy).unwrap();
        let (num, ana) = (
            directional(&|x| swiglu(x).unwrap(), &gu, &dy, &v),
            dot(&d, &v),
        );
        assert!((num - ana).abs() < 1e-3 * ana.abs().max(1.0), "{num} {ana}");
    }
}
