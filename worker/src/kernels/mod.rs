//! The stage kernels on the CPU (f32): fused, vectorised passes that replace chains of
//! candle ops, as candle custom ops. bf16 and CUDA keep the candle-op path of `ops`.
//!
//! - `cpu`: reading candle's CPU storage as slices; when the kernels apply.
//! - `matmul`: linear layers on `gemm` (bias and residual folded, weight gradients
//!   accumulated in place).

pub(crate) mod cpu;
pub(crate) mod matmul;
