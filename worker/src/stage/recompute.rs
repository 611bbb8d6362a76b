//! Full activation recomputation (torchtitan's `full` activation checkpointing, the seed
//! paper's 1F1B-R): a stage that recomputes keeps only its input after `F` (the last stage
//! its targets too) and runs `F` again at the start of `B` to rebuild what `B` and `W` need.
//! `F` reads only the parameters and its input, so the rebuilt stashes are the ones the first
//! `F` made, bit for bit, and training is unchanged; what changes is the memory between a
//! microbatch's `F` and its `B` (its input instead of every piece's activations) and the time
//! of `B` (an `F` more).

use candle_core::Tensor;

use super::{Forwarded, Pending, Stage};
use crate::error::Result;
use crate::piece::ForwardStash;

/// Bytes of a tensor held for a recomputation.
pub(super) fn bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

impl Stage {
    /// Whether `F` keeps only the stage's input and `B` runs `F` again first. Set between
    /// steps: a microbatch's `F` and `B` run under the same setting.
    pub fn set_recompute(&mut self, on: bool) {
        self.recompute = on;
    }

    /// Whether the stage recomputes ([`Stage::set_recompute`]).
    pub fn recomputes(&self) -> bool {
        self.recompute
    }

    /// Bytes of the stashes the `B` passes run since the last call rebuilt (0 without
    /// recomputation): held during those passes on top of [`Stage::stash_bytes`] as it stood
    /// before them.
    pub fn take_rebuilt_bytes(&mut self) -> u64 {
        std::mem::take(&mut self.rebuilt_bytes)
    }

    /// Keeps what `B` of `mb` needs after its `F`: the stashes, or with recomputation its
    /// input and targets. Returns `F`'s output.
    pub(super) fn stash_forward(
        &mut self,
        mb: u32,
        shape: (usize, usize),
        f: Forwarded,
        input: &Tensor,
        targets: Option<&Tensor>,
    ) -> Tensor {
        let pending = if self.recompute {
            Pending::Recompute {
                shape,
                input: input.clone(),
                targets: targets.cloned(),
            }
        } else {
            Pending::Backward {
                shape,
                stashes: f.stashes,
            }
        };
        self.pending.insert(mb, pending);
        f.out
    }

    /// Takes `mb`'s forward stashes for its `B`, running `F` again where the stage
    /// recomputes: its `(b, t)`, the stashes and the seconds the recomputed `F` spent in the
    /// embedding or head piece.
    pub(super) fn take_forward(
        &mut self,
        mb: u32,
    ) -> Result<((usize, usize), Vec<ForwardStash>, f64)> {
        match self.pending.remove(&mb) {
            Some(Pending::Backward { shape, stashes }) => Ok((shape, stashes, 0.0)),
            Some(Pending::Recompute {
                shape,
                input,
                targets,
            }) => {
                let f = self.forward_compute(shape, &input, targets.as_ref())?;
                // The rebuilt stashes are held through `B`, beside what is pending: the
                // peaks count them though no pass boundary sees them.
                self.rebuilt_bytes += f.stashes.iter().map(ForwardStash::bytes).sum::<u64>();
                self.peak_stash_bytes =
                    (self.peak_stash_bytes).max(self.stash_bytes + self.rebuilt_bytes);
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
}
