//! Tied embeddings (`tie_embeddings`): the embedding piece and the head each hold a copy of
//! the token table (the head's transposed, `[h, V]`). Every step, once each copy's gradient
//! is final (microbatches accumulated, replicas summed), the two gradients are summed, the
//! embedding's first, and both copies take the sum: both then take the same AdamW update and
//! stay bit-identical, as one shared parameter would. The sum travels in the embedding's
//! `[V, h]` layout, so it is the same bits whether the two copies share a stage, a worker or
//! neither.

use candle_core::Tensor;

use super::Stage;
use crate::error::{Error, Result};
use crate::param::Param;
use crate::piece::PieceState;

/// A stage's parts of the tied table's gradient, in the embedding's `[V, h]` layout.
#[derive(Debug, Default)]
pub(crate) struct TiedGrads {
    /// The embedding's copy's gradient (the stage holds the embedding).
    pub(crate) embedding: Option<Vec<f64>>,
    /// The head's copy's gradient, transposed (the stage holds the head).
    pub(crate) head: Option<Vec<f64>>,
}

/// The tied table's gradient: the embedding's part plus the head's, element by element (the
/// one order every placement uses). Parts of different lengths give the two lengths.
pub(crate) fn tied_sum(
    embedding: &[f64],
    head: &[f64],
) -> std::result::Result<Vec<f64>, (usize, usize)> {
    if embedding.len() != head.len() {
        return Err((embedding.len(), head.len()));
    }
    Ok(embedding.iter().zip(head).map(|(e, h)| e + h).collect())
}

impl Stage {
    /// Whether the model ties its head to its embedding table.
    pub(crate) fn is_tied(&self) -> bool {
        self.spec.tie_embeddings
    }

    /// This stage's parts of the tied table's gradient (none of an untied model's stage).
    pub(crate) fn tied_grads(&self) -> Result<TiedGrads> {
        let mut parts = TiedGrads::default();
        if !self.is_tied() {
            return Ok(parts);
        }
        for piece in &self.pieces {
            match piece {
                PieceState::Embedding(e) => {
                    parts.embedding = Some(e.wte.grad.flatten_all()?.to_vec1::<f64>()?);
                }
                PieceState::Head(hd) => {
                    let rows = hd.lm.grad.t()?.contiguous()?;
                    parts.head = Some(rows.flatten_all()?.to_vec1::<f64>()?);
                }
                _ => {}
            }
        }
        Ok(parts)
    }

    /// Sets the gradient of each copy of the tied table this stage holds to `sum` (the
    /// embedding's layout, [`tied_sum`] of the two parts).
    pub(crate) fn set_tied_grads(&mut self, sum: &[f64]) -> Result<()> {
        if !self.is_tied() {
            return Ok(());
        }
        let (vocab, hidden) = (self.spec.vocab as usize, self.spec.hidden as usize);
        if sum.len() != vocab * hidden {
            return Err(Error::invalid(
                "tie_embeddings",
                format!(
                    "a tied table's gradient of {} values for a table of {vocab} × {hidden}",
                    sum.len()
                ),
            ));
        }
        for piece in &mut self.pieces {
            let (param, transposed) = match piece {
                PieceState::Embedding(e) => (&mut e.wte, false),
                PieceState::Head(hd) => (&mut hd.lm, true),
                _ => continue,
            };
            let rows = Tensor::from_slice(sum, (vocab, hidden), param.grad.device())?;
            param.grad = if transposed {
                rows.t()?.contiguous()?
            } else {
                rows
            };
        }
        Ok(())
    }

    /// A stage holding both copies (the whole model): sums their gradients in place.
    pub(crate) fn sum_tied_grads(&mut self) -> Result<()> {
        let TiedGrads {
            embedding: Some(embedding),
            head: Some(head),
        } = self.tied_grads()?
        else {
            return Ok(());
        };
        let sum = tied_sum(&embedding, &head).map_err(|(e, h)| {
            Error::invalid(
                "tie_embeddings",
                format!("tied gradients of {e} and {h} values"),
            )
        })?;
        self.set_tied_grads(&sum)
    }

    /// Whether the copies of the tied table this stage holds agree bit for bit (true where
    /// it holds fewer than two, or the model is untied).
    pub(crate) fn tied_copies_agree(&self) -> Result<bool> {
        let (mut table, mut head) = (None, None);
        for piece in &self.pieces {
            match piece {
                PieceState::Embedding(e) if self.is_tied() => table = Some(&e.wte),
                PieceState::Head(hd) if self.is_tied() => head = Some(&hd.lm),
                _ => {}
            }
        }
        let (Some(table), Some(head)) = (table, head) else {
            return Ok(true);
        };
        // The master copy where there is one: it holds the bits the updates work on.
        let bits = |p: &Param, transposed: bool| -> Result<Vec<u32>> {
            let wide = match &p.master {
                Some(m) => m.clone(),
                None => p.value.to_dtype(candle_core::DType::F32)?,
            };
            let rows = if transposed { wide.t()? } else { wide };
            let values = rows.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
            Ok(values.into_iter().map(f32::to_bits).collect())
        };
        Ok(bits(table, false)? == bits(head, true)?)
    }

    /// The parameters global-norm clipping counts: all but a tied head's copy of the table,
    /// which the embedding's (with the same summed gradient) counts once for both.
    pub(crate) fn norm_params(&self) -> impl Iterator<Item = &Param> {
        let tied = self.is_tied();
        self.pieces.iter().flat_map(move |piece| {
            let skip = match piece {
                PieceState::Head(hd) if tied => Some(&hd.lm),
                _ => None,
            };
            piece
                .params()
                .into_iter()
                .filter(move |&p| !skip.is_some_and(|s| std::ptr::eq(s, p)))
        })
    }
}
