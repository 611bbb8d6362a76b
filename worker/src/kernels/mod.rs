//! The stage kernels on the CPU (f32): fused, vectorised passes behind `ops`' fast path,
//! one op per file, as candle custom ops where an op has one output. bf16 and CUDA keep the
//! candle-op path of `ops`. Unsafe code is allowed here (each file says so); each unsafe
//! block has its reason.
//!
//! - `cpu`: reading candle's CPU storage as slices; when the kernels apply.
//! - `matmul`: linear layers on `gemm` (bias and residual folded, weight gradients
//!   accumulated in place).
//! - `attention`, `attention_backward`, `attention_tile`: flash-style causal attention.

pub(crate) mod attention;
pub(crate) mod attention_backward;
pub(crate) mod attention_tile;
pub(crate) mod cpu;
pub(crate) mod matmul;

#[cfg(test)]
mod attention_tests;
