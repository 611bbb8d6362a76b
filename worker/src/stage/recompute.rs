//! Activation recomputation ([`Recompute`], torchtitan's activation checkpointing): what a
//! stage keeps from a microbatch's `F` to its `B`, and what `B` rebuilds first.
//!
//! - `none`: every piece's whole stash.
//! - `selective`: per block its input, the attention core's output (the projection's input)
//!   and its f32 log-sum-exp per head and token; the embedding's and head's stashes whole.
//!   `B` first redoes each block's norms and linear layers (norm, QKV, RoPE for Llama,
//!   projection and residual, norm, MLP) from its input, but not the attention core's
//!   `t × t` products: its backward reads Q, K, V (rebuilt), its output and the
//!   log-sum-exp (kept), and recomputes the probabilities from them.
//! - `full` (the seed paper's 1F1B-R): the stage's input only (the last stage's targets
//!   too); `B` runs the stage's whole `F` again.
//!
//! The redone operations read only the parameters and what was kept, so the rebuilt
//! stashes are the ones the first `F` made, bit for bit, and training is unchanged; what
//! changes is the memory between a microbatch's `F` and its `B` and the time of `B`.

use candle_core::Tensor;
use pipewise_common::schedule::Recompute;

use super::{Forwarded, Pending, Stage};
use crate::error::Result;
use crate::piece::ForwardStash;

/// Bytes of a tensor held for a recomputation.
pub(super) fn bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

impl Stage {
    /// What `F` keeps and `B` redoes first. Set between steps: a microbatch's `F` and `B`
    /// run under the same setting.
    pub fn set_recompute(&mut self, mode: Recompute) {
        self.recompute = mode;
    }

    /// The stage's recomputation ([`Stage::set_recompute`]).
    pub fn recompute(&self) -> Recompute {
        self.recompute
    }

    /// Whether `F` keeps per block only what selective recomputation keeps.
    pub(super) fn keeps_selected(&self) -> bool {
        self.recompute == Recompute::Selective
    }

    /// Bytes of the stashes the `B` passes run since the last call rebuilt (0 without
    /// recomputation): held during those passes on top of [`Stage::stash_bytes`] as it stood
    /// before them.
    pub fn take_rebuilt_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.rebuilt_bytes)
    }

    /// Keeps what `B` of `mb` needs after its `F`: the stashes (under selective
    /// recomputation, what `F` kept of them), or under full recomputation its input and
    /// targets. `mode` is the stage's, or `none` for a microbatch kept whole. Returns `F`'s
    /// output.
    pub(super) fn stash_forward(
        &mut self,
        mb: u32,
        shape: (usize, usize),
        f: Forwarded,
        input: &Tensor,
        targets: Option<&Tensor>,
        mode: Recompute,
    ) -> Tensor {
        let pending = match mode {
            Recompute::Full => Pending::Recompute {
                shape,
                input: input.clone(),
                // Only the head reads them (other stages ignore any given).
                targets: targets.filter(|_| self.is_last()).cloned(),
            },
            Recompute::None | Recompute::Selective => Pending::Backward {
                shape,
                stashes: f.stashes,
            },
        };
        self.pending.insert(mb, pending);
        f.out
    }

    /// Takes `mb`'s forward stashes for its `B`, rebuilding what the stage's recomputation
    /// did not keep: its `(b, t)`, the stashes and the seconds a recomputed `F` spent in the
    /// embedding or head piece.
    pub(super) fn take_forward(
        &mut self,
        mb: u32,
    ) -> Result<((usize, usize), Vec<ForwardStash>, f64)> {
        match self.pending.remove(&mb) {
            Some(Pending::Backward { shape, stashes }) => {
                let mut whole = Vec::with_capacity(stashes.len());
                let mut rebuilt = 0;
                for (piece, stash) in self.pieces.iter().zip(stashes) {
                    let (stash, allocated) = piece.rebuild(stash)?;
                    whole.push(stash);
                    rebuilt += allocated;
                }
                self.count_rebuilt(rebuilt);
                Ok((shape, whole, 0.0))
            }
            Some(Pending::Recompute {
                shape,
                input,
                targets,
            }) => {
                let f = self.forward_compute(shape, &input, targets.as_ref(), false)?;
                self.count_rebuilt(f.stashes.iter().map(ForwardStash::bytes).sum());
                Ok((shape, f.stashes, f.edge_secs))
            }
            other => {
                if let Some(p) = other {
                    self.pending.insert(mb, p);
                }
                Err(self.order_error("B", mb, "no forward pending"))
            }
        }
    }

    /// Counts `bytes` of rebuilt stashes: held through `B`, beside what is pending, so the
    /// peaks count them though no pass boundary sees them.
    fn count_rebuilt(&mut self, bytes: u64) {
        self.rebuilt_bytes += bytes;
        self.peak_stash_bytes = self
            .peak_stash_bytes
            .max(self.stash_bytes + self.rebuilt_bytes);
    }
}
