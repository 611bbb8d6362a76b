//! Test helpers for the kernels: awkward inputs, tolerant comparison, thread pools.

use candle_core::{DType, Device, Tensor};

use crate::error::Result;
use crate::rng::SplitMix64;

/// A `[rows, cols]` f32 tensor of normal values times `scale`, from `seed`.
pub(crate) fn awkward(rows: usize, cols: usize, scale: f64, seed: u64) -> Result<Tensor> {
    let mut rng = SplitMix64::for_stream(seed, "kernels-test");
    let host: Vec<f32> = (0..rows * cols)
        .map(|_| (rng.normal() * scale) as f32)
        .collect();
    Ok(Tensor::from_vec(host, (rows, cols), &Device::Cpu)?)
}

/// All elements of `t` as f32, flattened.
pub(crate) fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// The bit patterns of `t`'s elements (for exact comparisons that also tell −0 from 0),
/// at f64 width (an f64 tensor, accumulated gradients, keeps all of its bits).
pub(crate) fn bits(t: &Tensor) -> Result<Vec<u64>> {
    let wide = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    Ok(wide.into_iter().map(f64::to_bits).collect())
}

/// Asserts equal shapes and `|got − want| ≤ tol·(1 + |want|)` element-wise.
#[track_caller]
pub(crate) fn assert_close(got: &Tensor, want: &Tensor, tol: f32) -> Result<()> {
    assert_eq!(got.dims(), want.dims(), "shapes");
    for (i, (g, w)) in flat(got)?.into_iter().zip(flat(want)?).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: {g} vs reference {w} (tolerance {tol})"
        );
    }
    Ok(())
}

/// Runs `f` inside a rayon pool of `n` threads.
pub(crate) fn with_threads<R: Send>(n: usize, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| crate::Error::InvalidArgument {
            field: "threads",
            reason: e.to_string(),
        })?;
    pool.install(f)
}
