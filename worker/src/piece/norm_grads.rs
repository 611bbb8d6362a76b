//! LayerNorm weight gradients done in `B`.

use candle_core::Tensor;

/// A piece's LayerNorm weight and bias gradients of one microbatch, which its `B` computes
/// (they need only the normalised input and the output gradient, both at hand there), so
/// that `W` stashes only the linear layers' inputs and output gradients. The stage adds them
/// to the parameters as `B` ends, in the order its `B` passes run (microbatch order in
/// every named schedule, as the single-device reference).
#[derive(Debug)]
pub(crate) struct NormGrads(pub(crate) Vec<Tensor>);
