//! Generation with a key/value cache: a Llama block's forward on new tokens of one sequence,
//! attending to the keys and values of every earlier position kept from the calls before,
//! so each new token costs one position's work rather than the whole context's.

use candle_core::{D, DType, Tensor};

use super::llama::Block;
use crate::error::Result;
use crate::llama_ops::{self, Rope};
use crate::ops;

/// One block's keys (rotated) and values of the positions seen so far, per KV head and in
/// f32: `[kv, T, hd]` each. A new token appends its own; the query heads that share a KV
/// head read it where it is, nothing is repeated or widened again.
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerCache {
    k: Option<Tensor>,
    v: Option<Tensor>,
}

impl LayerCache {
    /// Positions cached.
    pub(crate) fn len(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dim(1).unwrap_or(0))
    }

    /// Appends the keys and values `[kv, n, hd]` of `n` new positions; all of them now.
    fn append(&mut self, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let grown = |old: &Option<Tensor>, new: Tensor| -> Result<Tensor> {
            Ok(match old {
                Some(old) => Tensor::cat(&[old, &new], 1)?,
                None => new,
            })
        };
        let (k, v) = (grown(&self.k, k)?, grown(&self.v, v)?);
        self.k = Some(k.clone());
        self.v = Some(v.clone());
        Ok((k, v))
    }
}

impl Block {
    /// The block's output for `x: [n, h]`, the hidden states of one sequence's tokens at
    /// positions `cache.len() ..`, their keys and values appended to `cache`.
    pub(crate) fn decode(&self, x: &Tensor, cache: &mut LayerCache, rope: &Rope) -> Result<Tensor> {
        let (heads, kv, hd) = self.heads();
        let group = heads / kv;
        let (n, start) = (x.dim(0)?, cache.len());
        let a = llama_ops::rms_norm(x, &self.attn_norm.value, self.eps())?.y;
        let qkv = ops::linear(&a, &self.qkv_w.value, None)?;
        let qkv = rope.apply_from(qkv, (1, n), (heads, kv, hd), false, start)?;
        let h = heads * hd;
        // `[n, kv·hd]` → `[kv, n, hd]` in f32.
        let per_kv_head = |at: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(1, at, kv * hd)?
                .reshape((n, kv, hd))?
                .transpose(0, 1)?
                .to_dtype(DType::F32)?
                .contiguous()?)
        };
        let (k, v) = cache.append(per_kv_head(h)?, per_kv_head(h + kv * hd)?)?;
        let total = start + n;
        // Query head `g·group + r` reads KV head `g` (`transformers`' `repeat_kv`): the
        // queries as `[kv, group·n, hd]`, row `r·n + i` head `g·group + r`'s token `i`.
        let q = qkv
            .narrow(1, 0, h)?
            .reshape((n, kv, group, hd))?
            .permute((1, 2, 0, 3))?
            .to_dtype(DType::F32)?
            .contiguous()?
            .reshape((kv, group * n, hd))?;
        let mut scores = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        // New token i (position start + i) sees keys j ≤ start + i; one new token sees
        // them all.
        if n > 1 {
            let mask: Vec<f32> = (0..group * n)
                .flat_map(|row| {
                    let i = row % n;
                    (0..total).map(move |j| {
                        if j <= start + i {
                            0.0
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                })
                .collect();
            let mask = Tensor::from_vec(mask, (1, group * n, total), x.device())?;
            scores = scores.broadcast_add(&mask)?;
        }
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
        let y = p
            .matmul(&v)?
            .reshape((kv, group, n, hd))?
            .permute((2, 0, 1, 3))?
            .contiguous()?
            .reshape((n, h))?
            .to_dtype(x.dtype())?;
        let x1 = ops::linear_residual(&y, &self.o_w.value, None, Some(x))?;
        let c = llama_ops::rms_norm(&x1, &self.mlp_norm.value, self.eps())?.y;
        let gu = ops::linear(&c, &self.gate_up_w.value, None)?;
        let m = llama_ops::swiglu(&gu)?;
        ops::linear_residual(&m, &self.down_w.value, None, Some(&x1))
    }
}
