//! The pieces a stage is made of, dispatched by kind.

pub(crate) mod block;
pub(crate) mod embedding;
pub(crate) mod head;
pub(crate) mod kept;
pub(crate) mod llama;
pub(crate) mod llama_decode;
pub(crate) mod norm_grads;

use candle_core::{DType, Device, Tensor};
use pipewise_common::model::{Family, ModelSpec, Piece};

use crate::error::Result;
use crate::param::Param;
pub(crate) use norm_grads::NormGrads;

/// One piece with its parameters.
#[derive(Debug, Clone)]
pub(crate) enum PieceState {
    Embedding(embedding::Embedding),
    Block(Box<block::Block>),
    LlamaBlock(Box<llama::Block>),
    Head(head::Head),
}

/// A piece's stash from `F` to `B`.
#[derive(Debug)]
pub(crate) enum ForwardStash {
    Embedding(embedding::ForwardStash),
    Block(Box<block::ForwardStash>),
    LlamaBlock(Box<llama::ForwardStash>),
    Head(head::ForwardStash),
    /// A block's under selective recomputation, rebuilt whole before `B`
    /// ([`PieceState::rebuild`]).
    KeptBlock(Box<block::Kept>),
    KeptLlamaBlock(Box<llama::Kept>),
}

/// A piece's stash from `B` to `W`.
#[derive(Debug)]
pub(crate) enum WeightStash {
    Embedding(embedding::WeightStash),
    Block(Box<block::WeightStash>),
    LlamaBlock(Box<llama::WeightStash>),
    Head(head::WeightStash),
}

impl ForwardStash {
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            ForwardStash::Embedding(s) => s.bytes(),
            ForwardStash::Block(s) => s.bytes(),
            ForwardStash::LlamaBlock(s) => s.bytes(),
            ForwardStash::Head(s) => s.bytes(),
            ForwardStash::KeptBlock(s) => s.bytes(),
            ForwardStash::KeptLlamaBlock(s) => s.bytes(),
        }
    }

    /// What selective recomputation keeps of this stash of a piece whose input was `x`: a
    /// block's input, attention output and log-sum-exp; the embedding's and head's stash
    /// whole.
    pub(crate) fn selected(self, x: &Tensor) -> ForwardStash {
        match self {
            ForwardStash::Block(s) => ForwardStash::KeptBlock(Box::new(s.keep(x))),
            ForwardStash::LlamaBlock(s) => ForwardStash::KeptLlamaBlock(Box::new(s.keep(x))),
            other => other,
        }
    }
}

impl WeightStash {
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            WeightStash::Embedding(s) => s.bytes(),
            WeightStash::Block(s) => s.bytes(),
            WeightStash::LlamaBlock(s) => s.bytes(),
            WeightStash::Head(s) => s.bytes(),
        }
    }
}

impl PieceState {
    /// Builds `piece` of `spec` with its seeded initial values.
    pub(crate) fn new(
        spec: &ModelSpec,
        piece: Piece,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let (v, h) = (spec.vocab as usize, spec.hidden as usize);
        let llama = spec.family == Family::Llama;
        Ok(match piece {
            Piece::Embedding => PieceState::Embedding(embedding::Embedding::new(
                v,
                h,
                (!llama).then_some(spec.seq_len as usize),
                seed,
                dtype,
                device,
            )?),
            Piece::Block(i) if llama => {
                PieceState::LlamaBlock(Box::new(llama::Block::new(spec, i, seed, dtype, device)?))
            }
            Piece::Block(i) => PieceState::Block(Box::new(block::Block::new(
                i,
                h,
                spec.heads as usize,
                spec.layers as usize,
                seed,
                dtype,
                device,
            )?)),
            Piece::Head => PieceState::Head(head::Head::new(spec, seed, dtype, device)?),
        })
    }

    pub(crate) fn params(&self) -> Vec<&Param> {
        match self {
            PieceState::Embedding(p) => p.params(),
            PieceState::Block(p) => p.params(),
            PieceState::LlamaBlock(p) => p.params(),
            PieceState::Head(p) => p.params(),
        }
    }

    pub(crate) fn params_mut(&mut self) -> Vec<&mut Param> {
        match self {
            PieceState::Embedding(p) => p.params_mut(),
            PieceState::Block(p) => p.params_mut(),
            PieceState::LlamaBlock(p) => p.params_mut(),
            PieceState::Head(p) => p.params_mut(),
        }
    }

    /// The whole stash `F` made, from what selective recomputation kept of it (a stash
    /// kept whole comes back as it is), and the bytes the rebuilding allocated.
    pub(crate) fn rebuild(&self, stash: ForwardStash) -> Result<(ForwardStash, u64)> {
        let (whole, kept_shared) = match (self, stash) {
            (PieceState::Block(p), ForwardStash::KeptBlock(k)) => {
                let shared = k.shared_bytes();
                (ForwardStash::Block(Box::new(p.rebuild(*k)?)), shared)
            }
            (PieceState::LlamaBlock(p), ForwardStash::KeptLlamaBlock(k)) => {
                let shared = k.shared_bytes();
                (ForwardStash::LlamaBlock(Box::new(p.rebuild(*k)?)), shared)
            }
            (_, whole) => return Ok((whole, 0)),
        };
        let allocated = whole.bytes().saturating_sub(kept_shared);
        Ok((whole, allocated))
    }

    /// Adds the LayerNorm gradients `B` computed for one microbatch.
    pub(crate) fn add_norm_grads(&mut self, grads: NormGrads) -> Result<()> {
        let params = match self {
            PieceState::Embedding(_) => Vec::new(),
            PieceState::Block(p) => p.norm_params_mut(),
            PieceState::LlamaBlock(p) => p.norm_params_mut(),
            PieceState::Head(p) => p.norm_params_mut(),
        };
        for (param, g) in params.into_iter().zip(&grads.0) {
            param.accumulate(g)?;
        }
        Ok(())
    }
}
