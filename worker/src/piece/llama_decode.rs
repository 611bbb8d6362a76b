//! Generation with a key/value cache: a Llama block's forward on new tokens of one sequence,
//! attending to the keys and values of every earlier position kept from the calls before,
//! so each new token costs one position's work rather than the whole context's.

use candle_core::{D, DType, Tensor};

use super::llama::Block;
use crate::error::Result;
use crate::llama_ops::{self, Rope};
use crate::ops;

/// One block's keys (rotated) and values of the positions seen so far, `[T, kv·hd]` each.
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

impl LayerCache {
    /// Positions cached.
    pub(crate) fn len(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dim(0).unwrap_or(0))
    }
}

impl Block {
    /// The block's output for `x: [n, h]`, the hidden states of one sequence's tokens at
    /// positions `cache.len() ..`, their keys and values appended to `cache`.
    pub(crate) fn decode(&self, x: &Tensor, cache: &mut LayerCache, rope: &Rope) -> Result<Tensor> {
        let (heads, kv, hd) = self.heads();
        let (n, start) = (x.dim(0)?, cache.len());
        let a = llama_ops::rms_norm(x, &self.attn_norm.value, self.eps())?.y;
        let qkv = ops::linear(&a, &self.qkv_w.value, None)?;
        let qkv = rope.apply_from(qkv, (1, n), (heads, kv, hd), false, start)?;
        let h = heads * hd;
        let append = |old: &Option<Tensor>, new: Tensor| -> Result<Tensor> {
            Ok(match old {
                Some(old) => Tensor::cat(&[old, &new], 0)?,
                None => new,
            })
        };
        cache.k = Some(append(&cache.k, qkv.narrow(1, h, kv * hd)?)?);
        cache.v = Some(append(&cache.v, qkv.narrow(1, h + kv * hd, kv * hd)?)?);
        let total = start + n;
        let dtype = x.dtype();
        let wide = |t: &Tensor| t.to_dtype(DType::F32);
        // [heads, n, hd] queries; [heads, T, hd] keys and values, each shared head repeated.
        let q = wide(
            &qkv.narrow(1, 0, h)?
                .reshape((n, heads, hd))?
                .transpose(0, 1)?,
        )?;
        let shared = |t: &Option<Tensor>| -> Result<Tensor> {
            let t = t.as_ref().map_or_else(
                || Tensor::zeros((0, kv * hd), dtype, x.device()),
                |t| Ok(t.clone()),
            )?;
            Ok(wide(
                &t.reshape((total, kv, 1, hd))?
                    .broadcast_as((total, kv, heads / kv, hd))?
                    .reshape((total, heads, hd))?
                    .transpose(0, 1)?
                    .contiguous()?,
            )?)
        };
        let (k, v) = (shared(&cache.k)?, shared(&cache.v)?);
        let scores = (q.contiguous()?.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        // New token i (position start + i) sees keys j ≤ start + i.
        let mask: Vec<f32> = (0..n)
            .flat_map(|i| {
                (0..total).map(move |j| {
                    if j <= start + i {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (1, n, total), x.device())?;
        let scores = scores.broadcast_add(&mask)?;
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let y = p
            .matmul(&v)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((n, h))?
            .to_dtype(dtype)?;
        let x1 = ops::linear_residual(&y, &self.o_w.value, None, Some(x))?;
        let c = llama_ops::rms_norm(&x1, &self.mlp_norm.value, self.eps())?.y;
        let gu = ops::linear(&c, &self.gate_up_w.value, None)?;
        let m = llama_ops::swiglu(&gu)?;
        ops::linear_residual(&m, &self.down_w.value, None, Some(&x1))
    }
}
