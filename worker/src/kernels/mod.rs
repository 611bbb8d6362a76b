//! The stage kernels: fused, vectorised CPU code for what is not a GEMM, on contiguous f32
//! CPU tensors (the callers in `ops`, `llama_ops`, `optim` and `param` keep candle's ops,
//! also the tests' reference, for other dtypes and devices).
//!
//! - [`simd`]: run-time ISA dispatch ([`simd::multiversion`]), lane-wise `exp` / `tanh`,
//!   fixed-order reductions.
//! - [`cpu`]: f32 slices of CPU tensors (read, and write in place) and the split of rows or
//!   columns over rayon threads (results never depend on the thread count).
//! - [`gelu`], [`layer_norm`], [`cross_entropy`]: forward and input gradient (and
//!   LayerNorm's weight gradient).
//! - [`reduce`]: sums over tokens (bias gradients).
//! - [`adamw`]: the fused AdamW update, gradient accumulation, norm and zeroing, in place.
//! - [`matmul`]: linear layers on `gemm` (bias and residual folded into the product, weight
//!   gradients accumulated in place), as candle custom ops.
//! - [`attention`], [`attention_backward`], [`attention_tile`]: flash-style causal
//!   attention (online softmax over key tiles, no `t × t` stash), multi-head or
//!   grouped-query (shared key/value heads read in place).
//! - [`rms_norm`], [`rope`], [`swiglu`]: Llama's RMSNorm (forward, input gradient with the
//!   residual's added, weight gradient), rotary embeddings in place on Q and K (and the
//!   inverse on their gradients), and the SwiGLU gate and its gradient.

pub(crate) mod adamw;
pub(crate) mod attention;
pub(crate) mod attention_backward;
#[cfg(test)]
mod attention_tests;
pub(crate) mod attention_tile;
pub(crate) mod cpu;
pub(crate) mod cross_entropy;
pub(crate) mod gelu;
pub(crate) mod layer_norm;
pub(crate) mod matmul;
pub(crate) mod reduce;
pub(crate) mod rms_norm;
pub(crate) mod rope;
pub(crate) mod simd;
pub(crate) mod swiglu;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod timing;

/// The instruction sets the CPU kernels take on this machine, for benchmarks and logs (e.g.
/// `GEMM AVX2+FMA, element-wise and attention AVX2`).
pub fn in_use() -> String {
    let level = match simd::level() {
        simd::Level::Avx512 => "AVX-512",
        simd::Level::Avx2 => "AVX2",
        simd::Level::Baseline => "baseline (no AVX2)",
    };
    format!("GEMM {}, element-wise and attention {level}", matmul::isa())
}
