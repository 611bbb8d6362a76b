//! The stage kernels: fused, vectorised CPU code for what is not a GEMM, on contiguous f32
//! CPU tensors (the callers in `ops`, `optim` and `param` keep candle's ops, also the tests'
//! reference, for other dtypes and devices).
//!
//! - [`simd`]: run-time ISA dispatch ([`simd::multiversion`]), lane-wise `exp` / `tanh`,
//!   fixed-order reductions.
//! - [`cpu`]: f32 slices of CPU tensors (read, and write in place) and the split of rows or
//!   columns over rayon threads (results never depend on the thread count).
//! - [`gelu`], [`layer_norm`], [`cross_entropy`]: forward and input gradient (and
//!   LayerNorm's weight gradient).
//! - [`reduce`]: sums over tokens (bias gradients).
//! - [`adamw`]: the fused AdamW update, gradient accumulation, norm and zeroing, in place.

pub(crate) mod adamw;
pub(crate) mod cpu;
pub(crate) mod cross_entropy;
pub(crate) mod gelu;
pub(crate) mod layer_norm;
pub(crate) mod reduce;
pub(crate) mod simd;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod timing;
