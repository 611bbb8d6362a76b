//! tanh-GELU (GPT-2's) forward and input gradient, one pass each, as candle custom ops
//! (one output each) with a CPU path.
//!
//! `0.5·(1 + tanh z) = σ(2z)`, so `gelu(u) = u·σ(2z)` with `z = k·(u + c·u³)`, and the
//! derivative `0.5·(1 + th) + 0.5·u·(1 − th²)·z'` is `s + 2·u·s·(1 − s)·z'` with
//! `s = σ(2z)`, `s·(1 − s) = e·s²`, `e = e^{−2z}`: one [`simd::exp`] per element, no
//! cancellation where `tanh z → −1` (where `1 + tanh z` would lose every digit).

use std::mem::MaybeUninit;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Shape, Tensor};

use super::cpu::{fill_rows, storage_f32};
use super::simd::{self, multiversion};
use crate::error::Result;

/// `sqrt(2/π)`.
const K: f32 = 0.797_884_6;
/// The cubic coefficient.
const C: f32 = 0.044_715;

/// `(σ(2z), e^{−2z})` for input `u`.
#[inline(always)]
fn gate(u: f32) -> (f32, f32) {
    let z2 = (2.0 * K) * (u + C * (u * u * u));
    simd::sigmoid_and_exp(z2)
}

multiversion! {
    fn forward_chunk(u: &[f32], out: &mut [MaybeUninit<f32>]) {
        for (o, &x) in out.iter_mut().zip(u) {
            o.write(x * gate(x).0);
        }
    }
}

multiversion! {
    fn backward_chunk(u: &[f32], dy: &[f32], out: &mut [MaybeUninit<f32>]) {
        for ((o, &x), &d) in out.iter_mut().zip(u).zip(dy) {
            let (s, e) = gate(x);
            let dz = K + (3.0 * C * K) * (x * x);
            o.write(d * (s + 2.0 * x * (e * s * s) * dz));
        }
    }
}

/// Rows of a `[.., features]` shape (1 for a rank-0 or rank-1 one).
fn rows_of(shape: &Shape) -> usize {
    let dims = shape.dims();
    if dims.len() < 2 {
        1
    } else {
        dims[..dims.len() - 1].iter().product()
    }
}

struct Forward;

impl CustomOp1 for Forward {
    fn name(&self) -> &'static str {
        "pipewise-gelu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let u = storage_f32(s, l, self.name())?;
        let rows = rows_of(l.shape());
        let cols = u.len() / rows.max(1);
        // SAFETY: `forward_chunk` writes every element of its block.
        #[allow(unsafe_code)]
        let out = unsafe {
            fill_rows(rows, cols, |r0, o| {
                forward_chunk(&u[r0 * cols..r0 * cols + o.len()], o)
            })
        };
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

struct Backward;

impl CustomOp2 for Backward {
    fn name(&self) -> &'static str {
        "pipewise-gelu-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (u, dy) = (
            storage_f32(s1, l1, self.name())?,
            storage_f32(s2, l2, self.name())?,
        );
        if l1.shape() != l2.shape() {
            candle_core::bail!(
                "{}: u {:?} but dy {:?}",
                self.name(),
                l1.shape(),
                l2.shape()
            );
        }
        let rows = rows_of(l1.shape());
        let cols = u.len() / rows.max(1);
        // SAFETY: `backward_chunk` writes every element of its block.
        #[allow(unsafe_code)]
        let out = unsafe {
            fill_rows(rows, cols, |r0, o| {
                let r = r0 * cols..r0 * cols + o.len();
                backward_chunk(&u[r.clone()], &dy[r], o)
            })
        };
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// `gelu(u)` of a contiguous f32 CPU tensor.
pub(crate) fn forward(u: &Tensor) -> Result<Tensor> {
    Ok(u.apply_op1_no_bwd(&Forward)?)
}

/// `dy · gelu'(u)` of contiguous f32 CPU tensors of one shape.
pub(crate) fn backward(u: &Tensor, dy: &Tensor) -> Result<Tensor> {
    Ok(u.apply_op2_no_bwd(dy, &Backward)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::kernels::testing::{assert_close, awkward, bits, with_threads};
    use crate::ops;

    /// Against the candle-op reference (libm tanh) on awkward shapes, including large |u|
    /// where the gate saturates. Tolerance 2e-6·(1 + |ref|): both sides round a handful of
    /// f32 operations (a few ulp each) and the reference's `0.5 + 0.5·tanh` loses up to
    /// 1e-7 absolute; 2e-6 leaves a margin of ten.
    #[test]
    fn matches_the_candle_reference() -> Result<()> {
        for (rows, cols) in [(13, 67), (37, 64), (1, 1), (5, 1024)] {
            let u = awkward(rows, cols, 4.0, 1)?;
            let dy = awkward(rows, cols, 1.0, 2)?;
            assert_close(&forward(&u)?, &ops::gelu_candle(&u)?, 2e-6)?;
            assert_close(
                &backward(&u, &dy)?,
                &ops::gelu_grad_input_candle(&u, &dy)?,
                2e-6,
            )?;
        }
        let far = Tensor::new(
            &[[-60f32, -12.0, -5.0, 0.0, 1e-20, 5.0, 12.0, 60.0]],
            &Device::Cpu,
        )?;
        let ones = far.ones_like()?;
        assert_close(&forward(&far)?, &ops::gelu_candle(&far)?, 2e-6)?;
        assert_close(
            &backward(&far, &ones)?,
            &ops::gelu_grad_input_candle(&far, &ones)?,
            2e-6,
        )?;
        Ok(())
    }

    /// Rows split over two threads give the bits of one thread.
    #[test]
    fn threads_do_not_change_the_result() -> Result<()> {
        let u = awkward(131, 67, 3.0, 3)?;
        let dy = awkward(131, 67, 1.0, 4)?;
        let run = || -> Result<(Vec<u64>, Vec<u64>)> {
            Ok((bits(&forward(&u)?)?, bits(&backward(&u, &dy)?)?))
        };
        assert_eq!(with_threads(1, run)?, with_threads(2, run)?);
        Ok(())
    }
}
