//! Forward without training: a stage's output on an input with nothing stashed, for
//! evaluation and generation.

use candle_core::{DType, Tensor};

use super::Stage;
use crate::error::{Error, Result};
use crate::piece::PieceState;

impl Stage {
    /// The causal mask for `t` tokens and the first piece's input: the ids `[b, t]` on the
    /// first stage, the hidden states as `[b·t, h]` after it.
    pub(super) fn forward_inputs(
        &self,
        (b, t): (usize, usize),
        input: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let mask = self.mask.narrow(0, 0, t)?.narrow(1, 0, t)?.contiguous()?;
        let x = if self.is_first() {
            input.clone()
        } else {
            input.reshape((b * t, self.spec.hidden as usize))?
        };
        Ok((mask, x))
    }

    /// The rotary tables a Llama block needs.
    pub(super) fn rope(&self) -> Result<&crate::llama_ops::Rope> {
        self.rope.as_ref().ok_or_else(|| Error::InvalidArgument {
            field: "model.family",
            reason: "a Llama block in a stage without rotary tables".into(),
        })
    }

    /// The stage's output on `input` (token ids `[b, t]` on the first stage, hidden states
    /// `[b, t, h]` after it): hidden states `[b, t, h]`, or on the last stage the logits
    /// `[b, t, V]` in f32.
    pub fn infer(&self, input: &Tensor) -> Result<Tensor> {
        let (b, t) = (input.dim(0)?, input.dim(1)?);
        if t > self.spec.seq_len as usize {
            return Err(Error::InvalidArgument {
                field: "input",
                reason: format!("{t} tokens, more than the model's {}", self.spec.seq_len),
            });
        }
        let h = self.spec.hidden as usize;
        let (mask, mut x) = self.forward_inputs((b, t), input)?;
        for piece in &self.pieces {
            x = match piece {
                PieceState::Embedding(e) => e.forward(&x)?.0,
                PieceState::Block(blk) => blk.forward(&x, (b, t), &mask)?.0,
                PieceState::LlamaBlock(blk) => blk.forward(&x, (b, t), &mask, self.rope()?)?.0,
                PieceState::Head(hd) => {
                    let v = self.spec.vocab as usize;
                    return Ok(hd.logits(&x)?.to_dtype(DType::F32)?.reshape((b, t, v))?);
                }
            };
        }
        Ok(x.reshape((b, t, h))?)
    }
}

/// One sequence's generation state on a stage: each of its blocks' keys and values so far.
#[derive(Debug, Clone, Default)]
pub struct DecodeCache {
    layers: Vec<crate::piece::llama_decode::LayerCache>,
}

impl Stage {
    /// Whether the stage can generate with a key/value cache ([`Stage::decode`]): every block
    /// of it is Llama's.
    pub fn can_decode(&self) -> bool {
        !self
            .pieces
            .iter()
            .any(|p| matches!(p, PieceState::Block(_)))
    }

    /// The stage's output for one sequence's new tokens (ids `[1, n]` on the first stage,
    /// hidden states `[1, n, h]` after it), each block attending to the positions `cache`
    /// holds and keeping the new ones: hidden states `[1, n, h]`, or the logits `[1, n, V]`
    /// in f32 on the last stage.
    pub fn decode(&self, input: &Tensor, cache: &mut DecodeCache) -> Result<Tensor> {
        let n = input.dim(1)?;
        let h = self.spec.hidden as usize;
        let blocks = self
            .pieces
            .iter()
            .filter(|p| matches!(p, PieceState::LlamaBlock(_)))
            .count();
        cache.layers.resize_with(blocks, Default::default);
        let mut layers = cache.layers.iter_mut();
        let mut x = if self.is_first() {
            input.clone()
        } else {
            input.reshape((n, h))?
        };
        for piece in &self.pieces {
            x = match piece {
                PieceState::Embedding(e) => e.forward(&x)?.0,
                PieceState::LlamaBlock(blk) => {
                    let layer = layers.next().ok_or_else(|| Error::InvalidArgument {
                        field: "cache",
                        reason: "fewer cached layers than blocks".into(),
                    })?;
                    blk.decode(&x, layer, self.rope()?)?
                }
                PieceState::Block(_) => {
                    return Err(Error::InvalidArgument {
                        field: "model.family",
                        reason: "generation with a key/value cache takes Llama blocks".into(),
                    });
                }
                PieceState::Head(hd) => {
                    let v = self.spec.vocab as usize;
                    return Ok(hd.logits(&x)?.to_dtype(DType::F32)?.reshape((1, n, v))?);
                }
            };
        }
        Ok(x.reshape((1, n, h))?)
    }
}
