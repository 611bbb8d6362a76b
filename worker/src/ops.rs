//! The math of every layer: forward, input gradient (`B`) and weight gradient (`W`), written
//! by hand with candle-core tensor ops.
//!
//! Activations are 2-D `[N, features]` with `N = b·t` tokens (attention reads Q, K, V from
//! the `[N, 3h]` QKV output; only its candle path splits heads into `[b, heads, t, hd]`).
//! Linear weights are stored `[in, out]` (`y = x·W + b`).
//! Every reduction is over a fixed axis in a fixed order, so results are deterministic.
//!
//! Linear layers, attention, LayerNorm, GELU, cross-entropy and token sums of f32 CPU
//! tensors run the kernels of [`crate::kernels`]; the `*_candle` functions and the candle-op
//! branches serve every other dtype and device (CUDA included), and are the reference the
//! kernels are tested against.

use candle_core::{D, DType, Device, Tensor};

use crate::error::Result;
use crate::kernels::attention::Shape;
use crate::kernels::cpu::all_f32_cpu;
use crate::kernels::{self, matmul};
use crate::param::Param;

/// LayerNorm epsilon (GPT-2's).
pub(crate) const LN_EPS: f64 = 1e-5;
/// `sqrt(2/π)`, the tanh-GELU constant.
const GELU_K: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of tanh-GELU.
const GELU_C: f64 = 0.044_715;

/// Bytes a tensor holds (its elements times the element size).
pub(crate) fn bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

// === Linear ===

/// `x·W + b` for `x: [N, in]`, `w: [in, out]`, `b: [out]`.
pub(crate) fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    linear_residual(x, w, b, None)
}

/// `x·W + b + r`: a linear layer and the residual it feeds (`r: [N, out]`), one GEMM on the
/// CPU (the bias and residual are the product's starting value).
pub(crate) fn linear_residual(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    r: Option<&Tensor>,
) -> Result<Tensor> {
    let (x, b, r) = (
        x.contiguous()?,
        b.map(Tensor::contiguous).transpose()?,
        r.map(Tensor::contiguous).transpose()?,
    );
    let (b, r) = (b.as_ref(), r.as_ref());
    if all_f32_cpu(&[&x, w])
        && b.is_none_or(|b| all_f32_cpu(&[b]))
        && r.is_none_or(|r| all_f32_cpu(&[r]))
    {
        return matmul::linear(&x, w, b, r);
    }
    let y = x.matmul(w)?;
    let y = match b {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    Ok(match r {
        Some(r) => (y + r)?,
        None => y,
    })
}

/// `B` of a linear layer: `dx = dy·Wᵀ`.
pub(crate) fn linear_grad_input(dy: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dy = dy.contiguous()?;
    if all_f32_cpu(&[&dy, w]) {
        return matmul::linear_grad_input(&dy, w);
    }
    Ok(dy.matmul(&w.t()?)?)
}

/// `W` of a linear layer: `dW = xᵀ·dy`.
pub(crate) fn linear_grad_weight(x: &Tensor, dy: &Tensor) -> Result<Tensor> {
    Ok(x.t()?.matmul(dy)?)
}

/// `W` of a linear layer added to the weight's gradient: on the CPU in f32, the GEMM's
/// product is added into the (f64) gradient in place.
pub(crate) fn accumulate_linear_grad_weight(p: &mut Param, x: &Tensor, dy: &Tensor) -> Result<()> {
    let (x, dy) = (x.contiguous()?, dy.contiguous()?);
    let wide = p.grad.dtype() == candle_core::DType::F64
        && p.grad.device().is_cpu()
        && p.grad.layout().contiguous_offsets().is_some();
    if wide && all_f32_cpu(&[&x, &dy]) {
        return matmul::accumulate_grad_weight(&p.grad, &x, &dy);
    }
    p.accumulate(&linear_grad_weight(&x, &dy)?)
}

/// `W` of a bias (or a LayerNorm shift): the sum of `dy` over tokens, in f32 (a bf16 sum
/// over many tokens would round small terms away).
pub(crate) fn sum_tokens(dy: &Tensor) -> Result<Tensor> {
    if all_f32_cpu(&[dy]) && dy.rank() == 2 {
        return kernels::reduce::sum_rows(dy);
    }
    Ok(dy.to_dtype(DType::F32)?.sum(0)?)
}

// === LayerNorm ===

/// What LayerNorm's forward returns: the output and what the backward needs.
pub(crate) struct LayerNormOut {
    /// `x̂·γ + β`.
    pub y: Tensor,
    /// The normalised input `x̂ = (x − μ)/σ`.
    pub xhat: Tensor,
    /// `1/σ`, `[N, 1]`.
    pub rstd: Tensor,
}

/// `t` in f32, where a bf16 or f16 model's reductions and normalisations run (as Megatron-LM's
/// fused LayerNorm and softmax kernels take and give the model dtype and compute in f32).
fn wide(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?)
}

/// LayerNorm over the last axis of `x: [N, h]`, computed in f32; every output in `x`'s
/// dtype.
pub(crate) fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<LayerNormOut> {
    if all_f32_cpu(&[x, gamma, beta]) && x.rank() == 2 && x.dim(1)? > 0 {
        let (y, xhat, rstd) = kernels::layer_norm::forward(x, gamma, beta)?;
        return Ok(LayerNormOut { y, xhat, rstd });
    }
    layer_norm_candle(x, gamma, beta)
}

/// [`layer_norm`] with candle's ops.
pub(crate) fn layer_norm_candle(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<LayerNormOut> {
    let dtype = x.dtype();
    let x = wide(x)?;
    let mean = x.mean_keepdim(1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(1)?;
    let rstd = var.affine(1.0, LN_EPS)?.sqrt()?.recip()?;
    let xhat = xc.broadcast_mul(&rstd)?;
    let y = xhat
        .broadcast_mul(&wide(gamma)?)?
        .broadcast_add(&wide(beta)?)?;
    Ok(LayerNormOut {
        y: y.to_dtype(dtype)?,
        xhat: xhat.to_dtype(dtype)?,
        rstd: rstd.to_dtype(dtype)?,
    })
}

/// `B` of LayerNorm: `dx = (1/σ)·(g − mean(g) − x̂·mean(g·x̂))` with `g = dy·γ`.
pub(crate) fn layer_norm_grad_input(
    dy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    gamma: &Tensor,
) -> Result<Tensor> {
    if all_f32_cpu(&[dy, xhat, rstd, gamma]) && dy.rank() == 2 && dy.dim(1)? > 0 {
        return kernels::layer_norm::grad_input(dy, xhat, rstd, gamma);
    }
    layer_norm_grad_input_candle(dy, xhat, rstd, gamma)
}

/// [`layer_norm_grad_input`] with candle's ops.
pub(crate) fn layer_norm_grad_input_candle(
    dy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    gamma: &Tensor,
) -> Result<Tensor> {
    let xhat = wide(xhat)?;
    let g = wide(dy)?.broadcast_mul(&wide(gamma)?)?;
    let mean_g = g.mean_keepdim(1)?;
    let mean_gx = (&g * &xhat)?.mean_keepdim(1)?;
    let inner = g
        .broadcast_sub(&mean_g)?
        .sub(&xhat.broadcast_mul(&mean_gx)?)?;
    Ok(inner.broadcast_mul(&wide(rstd)?)?.to_dtype(dy.dtype())?)
}

/// `W` of LayerNorm: `(dγ, dβ) = (Σ dy·x̂, Σ dy)` over tokens, in f32.
pub(crate) fn layer_norm_grad_weight(dy: &Tensor, xhat: &Tensor) -> Result<(Tensor, Tensor)> {
    if all_f32_cpu(&[dy, xhat]) && dy.rank() == 2 {
        return kernels::layer_norm::grad_weight(dy, xhat);
    }
    layer_norm_grad_weight_candle(dy, xhat)
}

/// [`layer_norm_grad_weight`] with candle's ops.
pub(crate) fn layer_norm_grad_weight_candle(
    dy: &Tensor,
    xhat: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (dy, xhat) = (dy.to_dtype(DType::F32)?, xhat.to_dtype(DType::F32)?);
    Ok(((&dy * xhat)?.sum(0)?, dy.sum(0)?))
}

// === GELU (tanh approximation, as GPT-2) ===

/// `0.5·u·(1 + tanh(k·(u + c·u³)))`.
pub(crate) fn gelu(u: &Tensor) -> Result<Tensor> {
    if all_f32_cpu(&[u]) {
        return kernels::gelu::forward(u);
    }
    gelu_candle(u)
}

/// [`gelu`] with candle's ops.
pub(crate) fn gelu_candle(u: &Tensor) -> Result<Tensor> {
    let th = gelu_tanh(u)?;
    Ok((u * th.affine(0.5, 0.5)?)?)
}

fn gelu_tanh(u: &Tensor) -> Result<Tensor> {
    let cube = (u.sqr()? * u)?;
    let inner = (u + cube.affine(GELU_C, 0.0)?)?.affine(GELU_K, 0.0)?;
    Ok(inner.tanh()?)
}

/// `B` of GELU: `dy · (0.5·(1 + th) + 0.5·u·(1 − th²)·k·(1 + 3c·u²))`.
pub(crate) fn gelu_grad_input(u: &Tensor, dy: &Tensor) -> Result<Tensor> {
    if all_f32_cpu(&[u, dy]) && u.dims() == dy.dims() {
        return kernels::gelu::backward(u, dy);
    }
    gelu_grad_input_candle(u, dy)
}

/// [`gelu_grad_input`] with candle's ops.
pub(crate) fn gelu_grad_input_candle(u: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let th = gelu_tanh(u)?;
    let left = th.affine(0.5, 0.5)?;
    let sech2 = th.sqr()?.affine(-1.0, 1.0)?;
    let dinner = u.sqr()?.affine(3.0 * GELU_C * GELU_K, GELU_K)?;
    let right = ((u * sech2)? * dinner)?.affine(0.5, 0.0)?;
    Ok((dy * (left + right)?)?)
}

// === Causal self-attention ===

/// The additive causal mask `[t, t]`: 0 on and below the diagonal, −∞ above.
pub(crate) fn causal_mask(t: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let mut m = vec![0f32; t * t];
    for i in 0..t {
        for j in (i + 1)..t {
            m[i * t + j] = f32::NEG_INFINITY;
        }
    }
    Ok(Tensor::from_vec(m, (t, t), device)?.to_dtype(dtype)?)
}

/// `[N, h]` columns `[offset, offset + h)` of `x` as `[b, heads, t, head_dim]`, contiguous.
pub(crate) fn split_heads(
    x: &Tensor,
    offset: usize,
    (b, t, heads, h): (usize, usize, usize, usize),
) -> Result<Tensor> {
    Ok(x.narrow(1, offset, h)?
        .reshape((b, t, heads, h / heads))?
        .transpose(1, 2)?
        .contiguous()?)
}

/// `[b, heads, t, head_dim]` back to `[N, h]`.
pub(crate) fn merge_heads(x: &Tensor) -> Result<Tensor> {
    let (b, heads, t, hd) = x.dims4()?;
    Ok(x.transpose(1, 2)?
        .contiguous()?
        .reshape((b * t, heads * hd))?)
}

/// Row softmax over the last axis, computed in f32, in `s`'s dtype (the unfused
/// attention the tests compare against).
#[cfg(test)]
pub(crate) fn softmax_last(s: &Tensor) -> Result<Tensor> {
    let w = wide(s)?;
    let max = w.max_keepdim(D::Minus1)?;
    let e = w.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&sum)?.to_dtype(s.dtype())?)
}

/// The kernel's sizes for `qkv: [N, 3h]` cut into `heads`.
fn attention_shape(qkv: &Tensor, (b, t, heads): (usize, usize, usize)) -> Result<Shape> {
    let (n, h3) = qkv.dims2()?;
    let h = h3 / 3;
    if n != b * t || h3 != 3 * h || heads == 0 || h % heads != 0 {
        return Err(candle_core::Error::Msg(format!(
            "attention: qkv [{n}, {h3}] is not [b·t, 3h] for b = {b}, t = {t}, {heads} heads"
        ))
        .into());
    }
    Ok(Shape::multi_head(b, t, heads, h / heads))
}

/// Causal self-attention from the QKV projection's output `qkv: [N, 3h]` (Q, K, V side by
/// side, heads of `h/heads` columns each): the output `y: [N, h]` (heads side by side, in
/// `qkv`'s dtype) and each query row's log-sum-exp of its scaled, masked scores,
/// `lse: [b, heads, t]` in f32 — what `attention_grad` recomputes the probabilities from.
/// f32 CPU tensors take the fused kernel (`kernels::attention`); other dtypes and devices
/// candle ops (with the additive `mask`, `[t, t]`), softmax in f32.
pub(crate) fn attention(
    qkv: &Tensor,
    dims: (usize, usize, usize),
    mask: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let sh = attention_shape(qkv, dims)?;
    if all_f32_cpu(&[qkv])
        && let Some(out) = kernels::attention::forward_tensors(qkv, sh)?
    {
        return Ok(out);
    }
    let (q, k, v) = split_qkv(qkv, sh)?;
    let scores = attention_scores(&q, &k, mask, sh)?;
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let p = e.broadcast_div(&sum)?.to_dtype(qkv.dtype())?;
    let lse = (max + sum.log()?)?.squeeze(D::Minus1)?;
    Ok((merge_heads(&p.matmul(&v)?)?, lse))
}

/// Q, K, V of `qkv` as `[b, heads, t, hd]` each (the candle path).
fn split_qkv(qkv: &Tensor, sh: Shape) -> Result<(Tensor, Tensor, Tensor)> {
    let (h, dims) = (sh.h(), (sh.b, sh.t, sh.heads, sh.h()));
    Ok((
        split_heads(qkv, 0, dims)?,
        split_heads(qkv, h, dims)?,
        split_heads(qkv, 2 * h, dims)?,
    ))
}

/// `q·kᵀ/√hd + mask` in f32 (the product in the model's dtype, as the forward computes it).
fn attention_scores(q: &Tensor, k: &Tensor, mask: &Tensor, sh: Shape) -> Result<Tensor> {
    let scale = 1.0 / (sh.hd as f64).sqrt();
    wide(&q.matmul(&k.t()?)?.affine(scale, 0.0)?.broadcast_add(mask)?)
}

/// `B` of attention: `dqkv: [N, 3h]` (dQ, dK, dV side by side, the layout of `qkv`) from
/// the forward's `qkv`, output `y` and `lse`, and the output gradient `dy: [N, h]`. The
/// probabilities are recomputed from `qkv` and `lse`, on both paths.
pub(crate) fn attention_grad(
    (qkv, y, lse): (&Tensor, &Tensor, &Tensor),
    dy: &Tensor,
    dims: (usize, usize, usize),
    mask: &Tensor,
) -> Result<Tensor> {
    let sh = attention_shape(qkv, dims)?;
    if all_f32_cpu(&[qkv, y, lse, dy])
        && let Some(dqkv) = kernels::attention_backward::backward_tensors((qkv, y, lse, dy), sh)?
    {
        return Ok(dqkv);
    }
    let dtype = qkv.dtype();
    let (q, k, v) = split_qkv(qkv, sh)?;
    let dyh = split_heads(dy, 0, (sh.b, sh.t, sh.heads, sh.h()))?;
    let scores = attention_scores(&q, &k, mask, sh)?;
    let p = scores.broadcast_sub(&lse.unsqueeze(D::Minus1)?)?.exp()?;
    let dv = p.to_dtype(dtype)?.t()?.matmul(&dyh)?;
    // The softmax's backward in f32, as its forward.
    let dp = wide(&dyh.matmul(&v.t()?)?)?;
    let row = (&dp * &p)?.sum_keepdim(D::Minus1)?;
    let ds = (p * dp.broadcast_sub(&row)?)?
        .affine(1.0 / (sh.hd as f64).sqrt(), 0.0)?
        .to_dtype(dtype)?;
    let dq = ds.matmul(&k)?;
    let dk = ds.t()?.matmul(&q)?;
    Ok(Tensor::cat(
        &[&merge_heads(&dq)?, &merge_heads(&dk)?, &merge_heads(&dv)?],
        1,
    )?)
}

// === Cross-entropy ===

/// Softmax probabilities of `logits: [N, V]` (in the logits' dtype) and the mean negative
/// log-likelihood of `targets: [N]` (u32), a rank-0 f32 tensor. Computed in f32 whatever
/// the logits' dtype, as torchtitan and Megatron-LM upcast the logits for the loss.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    if ce_fast(logits, targets)? {
        return kernels::cross_entropy::forward(logits, targets);
    }
    cross_entropy_candle(logits, targets)
}

/// Whether the cross-entropy kernels take `x: [N, V]` (f32, CPU, contiguous) and
/// `targets: [N]` (u32, CPU, contiguous).
fn ce_fast(x: &Tensor, targets: &Tensor) -> Result<bool> {
    Ok(all_f32_cpu(&[x])
        && x.rank() == 2
        && x.dim(1)? > 0
        && targets.dtype() == DType::U32
        && targets.device().is_cpu()
        && targets.rank() == 1
        && targets.dim(0)? == x.dim(0)?
        && targets.is_contiguous())
}

/// [`cross_entropy`] with candle's ops.
pub(crate) fn cross_entropy_candle(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let dtype = logits.dtype();
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(1)?;
    let shifted = logits.broadcast_sub(&max)?;
    let sum = shifted.exp()?.sum_keepdim(1)?;
    let log_probs = shifted.broadcast_sub(&sum.log()?)?;
    let picked = log_probs.gather(&targets.unsqueeze(1)?, 1)?;
    let loss = picked.mean_all()?.neg()?;
    Ok((log_probs.exp()?.to_dtype(dtype)?, loss))
}

/// `B` of the mean cross-entropy times `seed`: `(p − onehot(target))·seed/N`, computed in
/// f32 and returned in the probabilities' dtype.
pub(crate) fn cross_entropy_grad(probs: &Tensor, targets: &Tensor, seed: f64) -> Result<Tensor> {
    if ce_fast(probs, targets)? {
        return kernels::cross_entropy::grad(probs, targets, seed);
    }
    cross_entropy_grad_candle(probs, targets, seed)
}

/// [`cross_entropy_grad`] with candle's ops.
pub(crate) fn cross_entropy_grad_candle(
    probs: &Tensor,
    targets: &Tensor,
    seed: f64,
) -> Result<Tensor> {
    let (n, vocab) = probs.dims2()?;
    let classes = Tensor::arange(0u32, vocab as u32, probs.device())?;
    let onehot = targets
        .unsqueeze(1)?
        .broadcast_eq(&classes.unsqueeze(0)?)?
        .to_dtype(DType::F32)?;
    let grad = (probs.to_dtype(DType::F32)? - onehot)?.affine(seed / n as f64, 0.0)?;
    Ok(grad.to_dtype(probs.dtype())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[n, 2]` bf16 rows: one row of 1.0, then `n − 1` rows of 2⁻⁸.
    fn one_then_small(n: usize) -> Result<Tensor> {
        let mut host = vec![2f32.powi(-8); 2 * n];
        host[..2].fill(1.0);
        Ok(Tensor::from_vec(host, (n, 2), &Device::Cpu)?.to_dtype(DType::BF16)?)
    }

    /// Weight gradients summed over tokens are f32: 1 + 255 × 2⁻⁸ is 1.99609375, where a
    /// bf16 sum stays at 1.0 (each 2⁻⁸ is half of bf16's spacing there and rounds to even).
    #[test]
    fn token_sums_of_bf16_gradients_are_f32() -> Result<()> {
        let dy = one_then_small(256)?;
        let want = vec![1.0 + 255.0 * 2f32.powi(-8); 2];
        assert_eq!(dy.sum(0)?.to_dtype(DType::F32)?.to_vec1::<f32>()?[0], 1.0);
        assert_eq!(sum_tokens(&dy)?.to_vec1::<f32>()?, want);
        let ones = Tensor::ones((256, 2), DType::BF16, &Device::Cpu)?;
        let (dgamma, dbeta) = layer_norm_grad_weight(&dy, &ones)?;
        assert_eq!(dgamma.to_vec1::<f32>()?, want);
        assert_eq!(dbeta.to_vec1::<f32>()?, want);
        Ok(())
    }

    /// LayerNorm and softmax of bf16 inputs are computed in f32 and rounded once: on rows
    /// far from zero (32…48 in steps of 0.25, exact in bf16) the outputs are the f32 results
    /// of the same inputs rounded to bf16.
    #[test]
    fn bf16_layer_norm_and_softmax_round_once() -> Result<()> {
        let host: Vec<f32> = (0..4 * 64)
            .map(|i| 32.0 + ((i * 37) % 64) as f32 * 0.25)
            .collect();
        let x32 = Tensor::from_vec(host, (4, 64), &Device::Cpu)?;
        let x = x32.to_dtype(DType::BF16)?;
        let (g, b) = (
            Tensor::ones(64, DType::F32, &Device::Cpu)?,
            Tensor::zeros(64, DType::F32, &Device::Cpu)?,
        );
        let narrow = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.to_dtype(DType::BF16)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?)
        };
        let flat = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let half = layer_norm(&x, &g.to_dtype(DType::BF16)?, &b.to_dtype(DType::BF16)?)?;
        let full = layer_norm(&x32, &g, &b)?;
        assert_eq!(half.y.dtype(), DType::BF16);
        assert_eq!(flat(&half.y)?, narrow(&full.y)?);
        assert_eq!(flat(&half.rstd)?, narrow(&full.rstd)?);
        let scores = x.affine(0.5, 0.0)?;
        assert_eq!(
            flat(&softmax_last(&scores)?)?,
            narrow(&softmax_last(&scores.to_dtype(DType::F32)?)?)?
        );
        Ok(())
    }

    /// The loss of bf16 logits is computed in f32 (and equals the f32 logits' loss); the
    /// probabilities and the logits' gradient keep the logits' dtype.
    #[test]
    fn bf16_cross_entropy_is_computed_in_f32() -> Result<()> {
        let host: Vec<f32> = (0..3 * 40).map(|i| ((i * 7) % 13) as f32 * 0.37).collect();
        let logits = Tensor::from_vec(host, (3, 40), &Device::Cpu)?.to_dtype(DType::BF16)?;
        let targets = Tensor::new(&[1u32, 17, 39], &Device::Cpu)?;
        let (probs, loss) = cross_entropy(&logits, &targets)?;
        assert_eq!((probs.dtype(), loss.dtype()), (DType::BF16, DType::F32));
        let (_, wide) = cross_entropy(&logits.to_dtype(DType::F32)?, &targets)?;
        assert_eq!(loss.to_scalar::<f32>()?, wide.to_scalar::<f32>()?);
        let grad = cross_entropy_grad(&probs, &targets, 0.5)?;
        assert_eq!(grad.dtype(), DType::BF16);
        Ok(())
    }
}
