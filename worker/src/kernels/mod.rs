//! The stage kernels: fused, vectorised CPU code for the f32 fast path of `ops`, one op per
//! file. Unsafe code is allowed here (each file says so); each unsafe block has its reason.

pub(crate) mod attention;
pub(crate) mod attention_backward;
pub(crate) mod attention_tile;

#[cfg(test)]
mod attention_tests;
