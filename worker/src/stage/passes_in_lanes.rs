//! A stage's passes for several microbatches at once, side by side on the CPU's threads
//! ([`crate::lanes`]): `F` and `B` one microbatch per lane (they only read the parameters;
//! the LayerNorm gradients `B` computes are added afterwards, in the order given), `W` one
//! group of pieces per lane, each piece accumulating its microbatches in the order given. The results are those of running the passes one after the other in that order,
//! bit for bit.

use candle_core::Tensor;

use super::{ForwardItem, Pending, Stage, piece_backward_weight};
use crate::error::Result;
use crate::lanes::{Ran, side_by_side, timed};
use crate::piece::{PieceState, WeightStash};

/// A piece's weight stashes, by microbatch, in the order `W` adds them.
type PieceStashes = Vec<(u32, WeightStash)>;

impl Stage {
    /// `F` of each item side by side ([`Stage::forward`] of each, in any order): each
    /// output, timed.
    pub(crate) fn forward_side_by_side(
        &mut self,
        items: &[ForwardItem<'_>],
    ) -> Result<Vec<Ran<Tensor>>> {
        self.check_distinct("F", items.iter().map(|i| i.0))?;
        let shapes = items
            .iter()
            .map(|&(mb, input, targets)| self.check_forward(mb, input, targets))
            .collect::<Result<Vec<_>>>()?;
        let this = &*self;
        let selected = self.keeps_selected();
        let work: Vec<_> = items.iter().zip(&shapes).collect();
        let ran = side_by_side(work, |(&(_, input, targets), &shape)| {
            this.forward_compute(shape, input, targets, selected)
        })?;
        let mut outs = Vec::with_capacity(ran.len());
        for ((r, &(mb, input, targets)), shape) in ran.into_iter().zip(items).zip(shapes) {
            let out = self.stash_forward(mb, shape, r.value?, input, targets, self.recompute);
            outs.push(Ran {
                value: out,
                started: r.started,
                ended: r.ended,
            });
        }
        self.account();
        Ok(outs)
    }

    /// `B` of each `(microbatch, output gradient)` side by side ([`Stage::backward_input`]
    /// of each): each input gradient, timed. Nothing is taken unless every item may run.
    pub(crate) fn backward_input_side_by_side(
        &mut self,
        items: &[(u32, Option<&Tensor>)],
    ) -> Result<Vec<Ran<Option<Tensor>>>> {
        self.check_distinct("B", items.iter().map(|i| i.0))?;
        for &(mb, g) in items {
            self.check_backward_input(mb, g)?;
        }
        // A recomputing stage rebuilds its microbatches' stashes here, one after the other.
        let mut work = Vec::with_capacity(items.len());
        for &(mb, g) in items {
            let (shape, stashes, _) = self.take_forward(mb)?;
            work.push((mb, shape, stashes, g));
        }
        let this = &*self;
        let ran = side_by_side(work, |(mb, shape, stashes, g)| {
            this.backward_input_compute(mb, shape, stashes, g)
        })?;
        let mut outs = Vec::with_capacity(ran.len());
        // The LayerNorm gradients are added here, in the items' order, as one thread would.
        for (r, &(mb, _)) in ran.into_iter().zip(items) {
            let b = r.value?;
            self.add_norm_grads(b.norms)?;
            self.pending
                .insert(mb, Pending::Weight { stashes: b.stashes });
            outs.push(Ran {
                value: b.dx,
                started: r.started,
                ended: r.ended,
            });
        }
        self.account();
        Ok(outs)
    }

    /// `W` of microbatches `mbs`, accumulated in that order into every parameter (as
    /// [`Stage::backward_weight`] of each in turn), with the pieces shared among `lanes`
    /// lanes: contiguous groups of about equal parameter counts. Returns when it started
    /// and ended.
    pub(crate) fn backward_weight_side_by_side(
        &mut self,
        mbs: &[u32],
        lanes: usize,
    ) -> Result<Ran<()>> {
        self.check_distinct("W", mbs.iter().copied())?;
        if let Some(&mb) = mbs
            .iter()
            .find(|mb| !matches!(self.pending.get(mb), Some(Pending::Weight { .. })))
        {
            return Err(self.order_error("W", mb, "B has not run yet"));
        }
        // Per piece, its stashes in microbatch order.
        let mut per_piece: Vec<PieceStashes> = self.pieces.iter().map(|_| Vec::new()).collect();
        for &mb in mbs {
            for (slot, stash) in per_piece.iter_mut().zip(self.take_weight(mb)?) {
                slot.push((mb, stash));
            }
        }
        let sizes: Vec<u64> = self
            .pieces
            .iter()
            .map(|p| p.params().iter().map(|p| p.value.elem_count() as u64).sum())
            .collect();
        let mut groups: Vec<(&mut [PieceState], Vec<PieceStashes>)> = Vec::new();
        let mut rest: &mut [PieceState] = &mut self.pieces;
        let mut stashes = per_piece.into_iter();
        for len in split_evenly(&sizes, lanes) {
            let (group, tail) = rest.split_at_mut(len);
            rest = tail;
            groups.push((group, stashes.by_ref().take(len).collect()));
        }
        let ran = timed(|| {
            side_by_side(groups, |(pieces, stashes)| -> Result<()> {
                for (piece, stashes) in pieces.iter_mut().zip(stashes) {
                    for (mb, stash) in stashes {
                        piece_backward_weight(piece, stash, mb)?;
                    }
                }
                Ok(())
            })
        });
        self.account();
        for r in ran.value? {
            r.value?;
        }
        Ok(Ran {
            value: (),
            started: ran.started,
            ended: ran.ended,
        })
    }

    /// Errs where a microbatch appears twice among one call's items.
    fn check_distinct(&self, pass: &'static str, mbs: impl Iterator<Item = u32>) -> Result<()> {
        let mut seen = Vec::new();
        for mb in mbs {
            if seen.contains(&mb) {
                return Err(self.order_error(pass, mb, "appears twice among side-by-side passes"));
            }
            seen.push(mb);
        }
        Ok(())
    }
}

/// Lengths of at most `parts` contiguous groups of `sizes`, each of about `Σ sizes / parts`
/// (a piece goes to the part its middle falls in), none empty.
fn split_evenly(sizes: &[u64], parts: usize) -> Vec<usize> {
    let total: u64 = sizes.iter().sum::<u64>().max(1);
    let parts = parts.clamp(1, sizes.len().max(1)) as u64;
    let mut lens: Vec<usize> = Vec::new();
    let (mut before, mut current) = (0u64, None);
    for &size in sizes {
        // The part this piece's middle falls in, scaled to avoid fractions.
        let part = ((2 * before + size) * parts / (2 * total)).min(parts - 1);
        if current == Some(part) {
            if let Some(last) = lens.last_mut() {
                *last += 1;
            }
        } else {
            lens.push(1);
            current = Some(part);
        }
        before += size;
    }
    lens
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use pipewise_common::model::{DType, ModelSpec};
    use pipewise_common::schedule::Recompute;

    use super::*;
    use crate::kernels::testing::{bits, with_threads};
    use crate::rng::SplitMix64;

    const MBS: u32 = 5;

    /// A small model of `layers` blocks: awkward sizes (3 heads of 8, sequences of 13).
    fn spec(layers: u32) -> ModelSpec {
        ModelSpec {
            vocab: 61,
            hidden: 24,
            heads: 3,
            layers,
            seq_len: 13,
            dtype: DType::F32,
            ..Default::default()
        }
    }

    /// The input gradient a stage without the embedding must give.
    fn given(g: Option<Tensor>) -> Result<Tensor> {
        g.ok_or_else(|| crate::Error::InvalidArgument {
            field: "B",
            reason: "no input gradient".into(),
        })
    }

    /// Seeded ids and targets `[2, 13]` for microbatch `mb`.
    fn batch(mb: u32) -> Result<(Tensor, Tensor)> {
        let mut rng = SplitMix64::new(7 + u64::from(mb));
        let mut ids = || -> Result<Tensor> {
            let v: Vec<u32> = (0..26).map(|_| rng.below(61) as u32).collect();
            Ok(Tensor::from_vec(v, (2, 13), &Device::Cpu)?)
        };
        Ok((ids()?, ids()?))
    }

    /// After `F`, `B` and `W` of every microbatch, run one after the other (`lanes` = 1) or
    /// in groups of `lanes` side by side, the stage without the embedding under `mode`: the
    /// bits of the losses, of that stage's input gradients and of every accumulated
    /// gradient, and its peak stash.
    #[allow(clippy::type_complexity)]
    fn run(lanes: usize, mode: Recompute) -> Result<(Vec<u64>, Vec<u64>, Vec<Vec<u64>>, u64)> {
        let spec = spec(3);
        let device = Device::Cpu;
        let mut first = Stage::new(&spec, 0..2, 3, &device)?;
        let mut rest = Stage::new(&spec, 2..5, 3, &device)?;
        rest.set_recompute(mode);
        let batches: Vec<_> = (0..MBS).map(batch).collect::<Result<_>>()?;
        let (mut losses, mut grads) = (Vec::new(), Vec::new());
        for s in [&mut first, &mut rest] {
            s.set_microbatches(MBS);
        }
        let mbs: Vec<u32> = (0..MBS).collect();
        for group in mbs.chunks(lanes) {
            let hidden: Vec<Tensor> = group
                .iter()
                .map(|&mb| first.forward(mb, &batches[mb as usize].0, None))
                .collect::<Result<_>>()?;
            let items: Vec<ForwardItem<'_>> = group
                .iter()
                .zip(&hidden)
                .map(|(&mb, x)| (mb, x, Some(&batches[mb as usize].1)))
                .collect();
            if lanes == 1 {
                for &(mb, x, t) in &items {
                    losses.extend(bits(&rest.forward(mb, x, t)?)?);
                    grads.extend(bits(&given(rest.backward_input(mb, None)?)?)?);
                    rest.take_rebuilt_bytes();
                    rest.backward_weight(mb)?;
                }
            } else {
                for l in rest.forward_side_by_side(&items)? {
                    losses.extend(bits(&l.value)?);
                }
                let seeds: Vec<(u32, Option<&Tensor>)> =
                    group.iter().map(|&mb| (mb, None)).collect();
                for g in rest.backward_input_side_by_side(&seeds)? {
                    grads.extend(bits(&given(g.value)?)?);
                }
                rest.backward_weight_side_by_side(group, lanes)?;
            }
            // As the runtime does after each pass: a group's rebuilt stashes are gone.
            rest.take_rebuilt_bytes();
            for &mb in group {
                first.discard(mb);
            }
        }
        let params = rest
            .params()
            .map(|p| bits(&p.grad))
            .collect::<Result<_>>()?;
        Ok((losses, grads, params, rest.peak_stash_bytes()))
    }

    /// Side-by-side passes give the bits of the passes one after the other, in groups of
    /// two and of three (an uneven last group), each lane on one thread, under every
    /// recomputation (whose rebuilt stashes are those kept without it); a group holds as
    /// many stashes as it has microbatches.
    #[test]
    fn side_by_side_passes_give_the_same_bits() -> Result<()> {
        let (losses, grads, params, _) = with_threads(2, || run(1, Recompute::None))?;
        for mode in Recompute::ALL {
            let (l, g, p, peak) = with_threads(2, || run(1, mode))?;
            assert_eq!(
                (l, g, p),
                (losses.clone(), grads.clone(), params.clone()),
                "{mode}"
            );
            for lanes in [2, 3] {
                let (l, g, p, pk) = with_threads(lanes, || run(lanes, mode))?;
                assert_eq!(l, losses, "{mode}, {lanes} lanes: losses");
                assert_eq!(g, grads, "{mode}, {lanes} lanes: input gradients");
                assert_eq!(p, params, "{mode}, {lanes} lanes: weight gradients");
                assert_eq!(pk, peak * lanes as u64, "{mode}, {lanes} lanes: peak stash");
            }
        }
        Ok(())
    }

    /// A pass out of order or a microbatch twice in one call is refused, leaving the
    /// stage as it was.
    #[test]
    fn side_by_side_order_errors() -> Result<()> {
        let mut stage = Stage::whole(&spec(1), 1, &Device::Cpu)?;
        let (ids, targets) = batch(0)?;
        let twice = [(0, &ids, Some(&targets)), (0, &ids, Some(&targets))];
        assert!(stage.forward_side_by_side(&twice).is_err());
        assert!(stage.backward_input_side_by_side(&[(0, None)]).is_err());
        assert!(stage.backward_weight_side_by_side(&[0], 2).is_err());
        assert_eq!(stage.stash_bytes(), 0);
        stage.forward_side_by_side(&twice[..1])?;
        assert!(stage.backward_weight_side_by_side(&[0], 2).is_err());
        assert!(stage.forward_side_by_side(&twice[..1]).is_err());
        Ok(())
    }

    /// Pieces go to the lane their middle falls in; no lane is empty.
    #[test]
    fn pieces_split_by_size() {
        // The small model: embedding, 4 blocks, head.
        let small = [98_304, 789_760, 789_760, 789_760, 789_760, 66_048];
        assert_eq!(split_evenly(&small, 2), [3, 3]);
        assert_eq!(split_evenly(&small, 1), [6]);
        let many = split_evenly(&small, 16);
        assert!(many.len() <= 6 && many.iter().all(|&l| l > 0), "{many:?}");
        assert_eq!(many.iter().sum::<usize>(), 6);
        assert_eq!(split_evenly(&[5], 2), [1]);
        assert_eq!(split_evenly(&[1, 1, 1, 1], 2), [2, 2]);
    }
}
