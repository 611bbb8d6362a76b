//! The SwiGLU gate (Llama's MLP), forward and input gradient, one pass each, as candle
//! custom ops with a CPU path (as [`super::gelu`]).
//!
//! From the gate-and-up projection's output `gu: [N, 2m]` (gate `g` in the first `m`
//! columns, up `u` in the rest): `y = silu(g)·u = g·s·u` with `s = σ(g)`; the gradient
//! `[dg | du]` with `du = dy·g·s` and `dg = dy·u·(s + g·s·(1 − s))`, where
//! `s·(1 − s) = e·s²`, `e = e^{−g}`: one [`simd::exp`] per element, no cancellation where
//! `s → 1`.

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use super::cpu::{fill_rows, storage_f32};
use super::simd::{self, multiversion};
use crate::error::Result;

multiversion! {
    /// `y = silu(g)·u` of whole rows (`y.len() / m` rows of `gu`).
    fn forward_rows(gu: &[f32], m: usize, y: &mut [MaybeUninit<f32>]) {
        for (row, out) in gu.chunks_exact(2 * m).zip(y.chunks_exact_mut(m)) {
            let (g, u) = row.split_at(m);
            for ((o, &gv), &uv) in out.iter_mut().zip(g).zip(u) {
                let (s, _) = simd::sigmoid_and_exp(gv);
                o.write(gv * s * uv);
            }
        }
    }
}

multiversion! {
    /// `[dg | du]` of whole rows from `gu` and the product's gradient `dy`.
    fn backward_rows(gu: &[f32], dy: &[f32], m: usize, out: &mut [MaybeUninit<f32>]) {
        let rows = gu.chunks_exact(2 * m).zip(dy.chunks_exact(m)).zip(out.chunks_exact_mut(2 * m));
        for ((row, d), o) in rows {
            let (g, u) = row.split_at(m);
            let (dg, du) = o.split_at_mut(m);
            for ((((dgv, duv), &gv), &uv), &dv) in dg.iter_mut().zip(du).zip(g).zip(u).zip(d) {
                let (s, e) = simd::sigmoid_and_exp(gv);
                duv.write(dv * (gv * s));
                dgv.write(dv * uv * (s + gv * (e * s * s)));
            }
        }
    }
}

/// `(rows, m)` of `gu: [rows, 2m]`; an error naming `op` otherwise.
fn dims(op: &str, l: &Layout) -> candle_core::Result<(usize, usize)> {
    let (rows, cols) = l.shape().dims2()?;
    if cols % 2 != 0 {
        candle_core::bail!("{op}: gate and up [{rows}, {cols}] is not [N, 2m]");
    }
    Ok((rows, cols / 2))
}

struct Forward;

impl CustomOp1 for Forward {
    fn name(&self) -> &'static str {
        "pipewise-swiglu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let gu = storage_f32(s, l, self.name())?;
        let (rows, m) = dims(self.name(), l)?;
        // SAFETY: `forward_rows` writes every element of its rows.
        #[allow(unsafe_code)]
        let out = unsafe {
            fill_rows(rows, m, |r0, o| {
                forward_rows(&gu[r0 * 2 * m..(r0 * m + o.len()) * 2], m, o)
            })
        };
        Ok((CpuStorage::F32(out), Shape::from((rows, m))))
    }
}

struct Backward;

impl CustomOp2 for Backward {
    fn name(&self) -> &'static str {
        "pipewise-swiglu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (gu, dy) = (
            storage_f32(s1, l1, self.name())?,
            storage_f32(s2, l2, self.name())?,
        );
        let (rows, m) = dims(self.name(), l1)?;
        if l2.shape().dims() != [rows, m] {
            candle_core::bail!(
                "{}: gate and up {:?} but the product's gradient {:?}",
                self.name(),
                l1.shape(),
                l2.shape()
            );
        }
        // SAFETY: `backward_rows` writes every element of its rows.
        #[allow(unsafe_code)]
        let out = unsafe {
            fill_rows(rows, 2 * m, |r0, o| {
                let r1 = r0 + o.len() / (2 * m);
                backward_rows(&gu[r0 * 2 * m..r1 * 2 * m], &dy[r0 * m..r1 * m], m, o)
            })
        };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// `silu(g)·u` of a contiguous f32 CPU `gu: [N, 2m]`, `[N, m]`.
pub(crate) fn forward(gu: &Tensor) -> Result<Tensor> {
    Ok(gu.apply_op1_no_bwd(&Forward)?)
}

/// `[dg | du]` (`[N, 2m]`) of contiguous f32 CPU `gu: [N, 2m]` and `dy: [N, m]`.
pub(crate) fn backward(gu: &Tensor, dy: &Tensor) -> Result<Tensor> {
    Ok(gu.apply_op2_no_bwd(dy, &Backward)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::kernels::testing::{assert_close, awkward, bits, with_threads};
    use crate::llama_ops;

    /// Against the candle-op reference (libm's exp) on awkward shapes, including large |g|
    /// where the gate saturates. Tolerance 2e-6·(1 + |ref|): both sides round a handful of
    /// f32 operations, a few ulp each.
    #[test]
    fn matches_the_candle_reference() -> Result<()> {
        for (rows, m) in [(13, 67), (37, 64), (1, 1), (70, 344)] {
            let gu = awkward(rows, 2 * m, 4.0, 1)?;
            let dy = awkward(rows, m, 1.0, 2)?;
            assert_close(&forward(&gu)?, &llama_ops::swiglu_candle(&gu)?, 2e-6)?;
            assert_close(
                &backward(&gu, &dy)?,
                &llama_ops::swiglu_grad_input_candle(&gu, &dy)?,
                2e-6,
            )?;
        }
        let far = Tensor::new(
            &[[
                -90f32, -60.0, -12.0, 0.0, 1e-20, 12.0, 60.0, 90.0, 2.0, -3.0, 1.0, 1.0, 0.5, 1.0,
                7.0, 3.0,
            ]],
            &Device::Cpu,
        )?;
        let ones = Tensor::ones((1, 8), candle_core::DType::F32, &Device::Cpu)?;
        assert_close(&forward(&far)?, &llama_ops::swiglu_candle(&far)?, 2e-6)?;
        assert_close(
            &backward(&far, &ones)?,
            &llama_ops::swiglu_grad_input_candle(&far, &ones)?,
            2e-6,
        )?;
        Ok(())
    }

    /// An odd width or a gradient of the wrong shape is refused, naming the op.
    #[test]
    fn mismatched_shapes_are_refused() -> Result<()> {
        let odd = awkward(4, 7, 1.0, 5)?;
        let err = forward(&odd).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("pipewise-swiglu")));
        let gu = awkward(4, 8, 1.0, 6)?;
        let err = backward(&gu, &awkward(4, 8, 1.0, 7)?).err();
        assert!(err.is_some_and(|e| e.to_string().contains("pipewise-swiglu-grad")));
        Ok(())
    }

    /// Rows split over two threads give the bits of one thread.
    #[test]
    fn threads_do_not_change_the_result() -> Result<()> {
        let gu = awkward(131, 134, 3.0, 3)?;
        let dy = awkward(131, 67, 1.0, 4)?;
        let run = || -> Result<(Vec<u64>, Vec<u64>)> {
            Ok((bits(&forward(&gu)?)?, bits(&backward(&gu, &dy)?)?))
        };
        assert_eq!(with_threads(1, run)?, with_threads(2, run)?);
        Ok(())
    }
}
