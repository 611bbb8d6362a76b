//! Sums over tokens (rows) of `[N, C]` gradients: the weight gradient of a bias, as a
//! candle custom op (one output) with a CPU path. Columns are split over threads, each
//! summed over the rows in order, so the result does not depend on the thread count.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::cpu::{cols_per_task, storage_f32};
use super::simd::multiversion;
use crate::error::Result;

multiversion! {
    /// `out += Σ rows[.., c0..c0 + out.len()]`, rows in order.
    fn sum_cols(x: &[f32], cols: usize, c0: usize, out: &mut [f32]) {
        let w = out.len();
        for row in x.chunks_exact(cols) {
            for (o, &v) in out.iter_mut().zip(&row[c0..c0 + w]) {
                *o += v;
            }
        }
    }
}

struct SumRows;

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        "pipewise-sum-tokens"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = storage_f32(s, l, self.name())?;
        let (rows, cols) = l.shape().dims2()?;
        let mut out = vec![0f32; cols];
        match cols_per_task(rows, cols) {
            Some(w) => out
                .par_chunks_mut(w)
                .enumerate()
                .for_each(|(i, o)| sum_cols(x, cols, i * w, o)),
            None if cols > 0 => sum_cols(x, cols, 0, &mut out),
            None => {}
        }
        Ok((CpuStorage::F32(out), Shape::from(cols)))
    }
}

/// `Σ_rows x` of a contiguous f32 CPU `x: [N, C]`, `[C]`.
pub(crate) fn sum_rows(x: &Tensor) -> Result<Tensor> {
    Ok(x.apply_op1_no_bwd(&SumRows)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{awkward, bits, with_threads};

    /// candle's `sum(0)` adds rows in order too: the same bits, on awkward shapes and on
    /// one and two threads (columns split).
    #[test]
    fn matches_candle_bit_for_bit_on_any_thread_count() -> Result<()> {
        for (rows, cols) in [(13, 67), (1, 1), (131, 1000), (64, 128), (37, 3)] {
            let x = awkward(rows, cols, 1.0, 9)?;
            let want = bits(&x.sum(0)?)?;
            assert_eq!(with_threads(1, || bits(&sum_rows(&x)?))?, want);
            assert_eq!(with_threads(2, || bits(&sum_rows(&x)?))?, want);
        }
        Ok(())
    }
}
