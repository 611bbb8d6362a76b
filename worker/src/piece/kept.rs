//! What a block keeps from `F` to `B` under selective recomputation, for both families:
//! what the attention core's backward needs besides Q, K and V (its output and
//! log-sum-exp), and the block's input, from which the block's `rebuild` redoes the norms
//! and linear layers but not the attention core.

use candle_core::Tensor;

use crate::ops;

/// A block's kept activations (the Llama block adds its rotation).
#[derive(Debug)]
pub(crate) struct KeptAttention {
    pub(crate) b: usize,
    pub(crate) t: usize,
    /// The block's input `[N, h]`.
    pub(crate) x: Tensor,
    pub(crate) lse: Tensor,
    pub(crate) y: Tensor,
    pub(crate) mask: Tensor,
}

impl KeptAttention {
    pub(crate) fn bytes(&self) -> u64 {
        [&self.x, &self.lse, &self.y]
            .into_iter()
            .map(ops::bytes)
            .sum()
    }

    /// Bytes of what the stash rebuilt from this shares with it (attention's output and
    /// log-sum-exp move into it).
    pub(crate) fn shared_bytes(&self) -> u64 {
        ops::bytes(&self.lse) + ops::bytes(&self.y)
    }
}
