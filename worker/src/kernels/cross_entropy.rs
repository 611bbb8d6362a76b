//! Cross-entropy of `[N, V]` logits: probabilities and loss in one pass per row (direct
//! storage access: two outputs), and the logits' gradient `(p − onehot)·seed/N` in one pass
//! (a candle custom op with a CPU path). Rows are split over threads; the per-row losses
//! are added in row order afterwards, so the loss does not depend on the thread count.

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::cpu::{rows_per_task, storage_f32, tensor, uninit, with_f32, with_u32, written};
use super::simd::{self, ACC, multiversion};
use crate::error::{Error, Result};

multiversion! {
    /// Probabilities of whole rows of `logits` and each row's log-probability of its
    /// target (`logp.len()` rows of `v`).
    fn forward_rows(logits: &[f32], targets: &[u32], v: usize, probs: &mut [f32], logp: &mut [f32]) {
        let rows = logits.chunks_exact(v).zip(probs.chunks_exact_mut(v));
        for (((x, p), &t), lp) in rows.zip(targets).zip(logp.iter_mut()) {
            let m = simd::max(x);
            // eˣ⁻ᵐ into the output, summed on the way (fixed lanes, as `simd::sum`).
            let mut acc = [0f32; ACC];
            let body = v - v % ACC;
            for (xc, pc) in x[..body].chunks_exact(ACC).zip(p[..body].chunks_exact_mut(ACC)) {
                for i in 0..ACC {
                    let e = simd::exp(xc[i] - m);
                    pc[i] = e;
                    acc[i] += e;
                }
            }
            for (i, (&xv, pv)) in x[body..].iter().zip(&mut p[body..]).enumerate() {
                let e = simd::exp(xv - m);
                *pv = e;
                acc[i] += e;
            }
            let sum = simd::combine_sum(acc);
            let inv = 1.0 / sum;
            for pv in p.iter_mut() {
                *pv *= inv;
            }
            *lp = (x[t as usize] - m) - sum.ln();
        }
    }
}

multiversion! {
    /// `(p − onehot(t))·scale` for whole rows.
    fn grad_rows(
        probs: &[f32],
        targets: &[u32],
        v: usize,
        scale: f32,
        out: &mut [MaybeUninit<f32>],
    ) {
        for ((p, o), &t) in probs.chunks_exact(v).zip(out.chunks_exact_mut(v)).zip(targets) {
            for (ov, &pv) in o.iter_mut().zip(p) {
                ov.write(pv * scale);
            }
            o[t as usize].write((p[t as usize] - 1.0) * scale);
        }
    }
}

/// Checks `targets` are below `vocab`.
fn check_targets(targets: &[u32], vocab: usize) -> candle_core::Result<()> {
    match targets.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => candle_core::bail!("cross-entropy: target {t} out of a vocabulary of {vocab}"),
        None => Ok(()),
    }
}

/// Softmax probabilities of contiguous f32 CPU `logits: [N, V]` and the mean negative
/// log-likelihood of contiguous u32 CPU `targets: [N]` (rank 0, f32).
pub(crate) fn forward(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let (rows, v) = logits.dims2()?;
    if targets.dims1()? != rows || v == 0 {
        return Err(Error::InvalidArgument {
            field: "cross_entropy",
            reason: format!("logits {:?}, targets {:?}", logits.dims(), targets.dims()),
        });
    }
    let (mut probs, mut logp) = (vec![0f32; rows * v], vec![0f32; rows]);
    let ran = with_f32(logits, |x| {
        with_u32(targets, |t| -> candle_core::Result<()> {
            check_targets(t, v)?;
            match rows_per_task(rows) {
                Some(k) => probs
                    .par_chunks_mut(k * v)
                    .zip(logp.par_chunks_mut(k))
                    .zip(x.par_chunks(k * v))
                    .zip(t.par_chunks(k))
                    .for_each(|(((p, lp), x), t)| forward_rows(x, t, v, p, lp)),
                None => forward_rows(x, t, v, &mut probs, &mut logp),
            }
            Ok(())
        })
    })
    .flatten();
    match ran {
        Some(r) => r?,
        None => {
            return Err(Error::InvalidArgument {
                field: "cross_entropy",
                reason: "the kernel takes contiguous f32 logits and u32 targets on the CPU".into(),
            });
        }
    }
    // In row order, in f64: the same loss on any thread count.
    let total: f64 = logp.iter().map(|&l| f64::from(l)).sum();
    let loss = Tensor::new(-(total / rows as f64) as f32, &candle_core::Device::Cpu)?;
    Ok((tensor(probs, (rows, v))?, loss))
}

struct Grad {
    seed: f64,
}

impl CustomOp2 for Grad {
    fn name(&self) -> &'static str {
        "pipewise-cross-entropy-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let probs = storage_f32(s1, l1, self.name())?;
        let (rows, v) = l1.shape().dims2()?;
        let targets = match (s2, l2.contiguous_offsets()) {
            (CpuStorage::U32(t), Some((a, b))) if b - a == rows => &t[a..b],
            _ => candle_core::bail!("{}: expects [{rows}] contiguous u32 targets", self.name()),
        };
        check_targets(targets, v)?;
        // As the reference: the scale rounded once to f32.
        let scale = (self.seed / rows as f64) as f32;
        let mut out = uninit(rows * v);
        if v > 0 {
            match rows_per_task(rows) {
                Some(k) => out
                    .par_chunks_mut(k * v)
                    .zip(probs.par_chunks(k * v))
                    .zip(targets.par_chunks(k))
                    .for_each(|((o, p), t)| grad_rows(p, t, v, scale, o)),
                None => grad_rows(probs, targets, v, scale, &mut out),
            }
        }
        // SAFETY: every row of `out` was written (none when `v` is 0).
        #[allow(unsafe_code)]
        let out = unsafe { written(out) };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// `(p − onehot(target))·seed/N` of contiguous f32 CPU `probs: [N, V]` and u32 `targets`.
pub(crate) fn grad(probs: &Tensor, targets: &Tensor, seed: f64) -> Result<Tensor> {
    Ok(probs.apply_op2_no_bwd(targets, &Grad { seed })?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::kernels::testing::{assert_close, awkward, bits, with_threads};
    use crate::ops;

    fn targets(rows: usize, v: usize) -> Result<Tensor> {
        let t: Vec<u32> = (0..rows).map(|i| ((i * 7919 + 3) % v) as u32).collect();
        Ok(Tensor::from_vec(t, rows, &Device::Cpu)?)
    }

    /// Against the candle-op reference on awkward shapes, with logits up to ±30 so that
    /// probabilities span many orders of magnitude. Probabilities: 1e-6·(1 + |ref|)
    /// absolute-ish, as the reference takes `exp(x − m − ln Σ)` and the kernel
    /// `exp(x − m)/Σ` (a few ulp apart, and `exp(x − m − ln Σ)` amplifies the rounding of
    /// `ln Σ` by up to |x − m|·2⁻²⁴ relative). Loss: 1e-6 relative (f64 versus f32 sum).
    /// Gradient: the same bits as the reference applied to the same probabilities.
    #[test]
    fn matches_the_candle_reference() -> Result<()> {
        for (rows, v) in [(13, 67), (37, 256), (1, 1), (5, 33), (70, 100)] {
            let x = awkward(rows, v, 10.0, 11)?;
            let t = targets(rows, v)?;
            let (p, loss) = forward(&x, &t)?;
            let (wp, wloss) = ops::cross_entropy_candle(&x, &t)?;
            assert_close(&p, &wp, 1e-6)?;
            let (l, wl) = (loss.to_scalar::<f32>()?, wloss.to_scalar::<f32>()?);
            assert!(
                (l - wl).abs() <= 1e-6 * wl.abs().max(1.0),
                "loss {l} vs {wl}"
            );
            for seed in [1.0, 0.25, 1.0 / 3.0] {
                let g = grad(&p, &t, seed)?;
                let want = ops::cross_entropy_grad_candle(&p, &t, seed)?;
                // ±0 may differ (the reference adds 0); compare values.
                assert_eq!(
                    crate::kernels::testing::flat(&g)?,
                    crate::kernels::testing::flat(&want)?
                );
            }
        }
        let bad = Tensor::new(&[3u32], &Device::Cpu)?;
        assert!(forward(&awkward(1, 3, 1.0, 1)?, &bad).is_err());
        assert!(grad(&awkward(1, 3, 1.0, 1)?, &bad, 1.0).is_err());
        Ok(())
    }

    #[test]
    fn threads_do_not_change_the_result() -> Result<()> {
        let (rows, v) = (131, 67);
        let x = awkward(rows, v, 5.0, 12)?;
        let t = targets(rows, v)?;
        let run = || -> Result<Vec<Vec<u64>>> {
            let (p, loss) = forward(&x, &t)?;
            let g = grad(&p, &t, 0.5)?;
            [p, loss, g].iter().map(bits).collect()
        };
        assert_eq!(with_threads(1, run)?, with_threads(2, run)?);
        Ok(())
    }
}
