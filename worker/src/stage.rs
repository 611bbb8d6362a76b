//! A stage: a contiguous range of pieces with the passes the schedules use.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use pipewise_common::model::{self, Family, ModelSpec, Piece};
use pipewise_common::schedule::Recompute;

use crate::error::{Error, Result};
use crate::llama_ops::Rope;
use crate::ops;
use crate::optim::{self, AdamW};
use crate::param::Param;
use crate::piece::{ForwardStash, NormGrads, PieceState, WeightStash};

mod evaluate;
pub mod infer;
mod passes_in_lanes;
mod recompute;
mod sharded;
pub(crate) mod tied;

/// One microbatch's `F` among side-by-side passes: its index, input and (on the last
/// stage) targets.
pub(crate) type ForwardItem<'a> = (u32, &'a Tensor, Option<&'a Tensor>);

/// The candle dtype of a spec dtype.
pub fn candle_dtype(d: model::DType) -> DType {
    match d {
        model::DType::F32 => DType::F32,
        model::DType::F16 => DType::F16,
        model::DType::BF16 => DType::BF16,
    }
}

/// What a microbatch has on this stage between passes.
#[derive(Debug)]
enum Pending {
    /// After `F`: one stash per piece (under selective recomputation a block's is what it
    /// keeps), and the microbatch's `(b, t)`.
    Backward {
        shape: (usize, usize),
        stashes: Vec<ForwardStash>,
    },
    /// After `F` on a stage under full recomputation ([`Stage::set_recompute`]): only the
    /// stage's input (and the last stage's targets); `B` runs `F` again first.
    Recompute {
        shape: (usize, usize),
        input: Tensor,
        targets: Option<Tensor>,
    },
    /// After `B`: one stash per piece.
    Weight { stashes: Vec<WeightStash> },
}

impl Pending {
    fn bytes(&self) -> u64 {
        match self {
            Pending::Backward { stashes, .. } => stashes.iter().map(ForwardStash::bytes).sum(),
            Pending::Recompute { input, targets, .. } => std::iter::once(input)
                .chain(targets)
                .map(recompute::bytes)
                .sum(),
            Pending::Weight { stashes } => stashes.iter().map(WeightStash::bytes).sum(),
        }
    }
}

/// A contiguous range of the model's pieces, with `F`, `B`, `W`, `BW` and the optimizer step.
///
/// Tensors crossing stage boundaries: the first stage takes token ids `[b, t]` (u32); other
/// stages take and give hidden states `[b, t, h]` in the model dtype; the last stage (the
/// one holding [`Piece::Head`]) takes the targets `[b, t]` (u32) in `forward` and returns the
/// microbatch's mean cross-entropy as a rank-0 f32 tensor. Gradients go the other way with the
/// same shapes; the first stage's `B` returns `None` (token ids take no gradient).
///
/// The step's loss is the mean over its `n` microbatches ([`Stage::set_microbatches`]): the
/// last stage seeds each microbatch's backward with `1/n`, as torchtitan's loss rescaling.
///
/// Memory: [`Stage::stash_bytes`] is the sum of the sizes of the tensors held for pending
/// `B` and `W` passes, updated at every pass boundary (transient buffers inside a pass are
/// not counted); without recomputation ([`Stage::set_recompute`]) it equals
/// [`ModelSpec::range_activation_bytes`] times the microbatches in each state. Parameters are kept in the model dtype; accumulated gradients, AdamW moments
/// and the master copy of bf16 and f16 parameters in f32.
#[derive(Debug)]
pub struct Stage {
    pub(crate) spec: ModelSpec,
    pub(crate) range: Range<usize>,
    pub(crate) kinds: Vec<Piece>,
    pub(crate) pieces: Vec<PieceState>,
    pub(crate) step: u64,
    pub(crate) adamw: AdamW,
    device: Device,
    dtype: DType,
    mask: Tensor,
    /// Rotary tables (Llama).
    rope: Option<Rope>,
    loss_seed: f64,
    pending: BTreeMap<u32, Pending>,
    stash_bytes: u64,
    peak_stash_bytes: u64,
    /// Seconds the last pass spent in the stage's embedding or head piece.
    edge_secs: f64,
    /// What `F` keeps and `B` redoes first ([`Stage::set_recompute`]).
    recompute: Recompute,
    /// Bytes of the stashes `B` rebuilt since [`Stage::take_rebuilt_bytes`] last asked.
    rebuilt_bytes: u64,
}

impl Stage {
    /// The stage holding pieces `range` (indices into [`ModelSpec::pieces`]) of `spec`, each
    /// parameter initialised from `(seed, its name)` alone: building the model whole or stage
    /// by stage gives the same values.
    pub fn new(spec: &ModelSpec, range: Range<usize>, seed: u64, device: &Device) -> Result<Self> {
        spec.validate()?;
        let all = spec.pieces();
        if range.start >= range.end || range.end > all.len() {
            return Err(Error::InvalidArgument {
                field: "range",
                reason: format!(
                    "pieces {}..{} is empty or beyond the model's {} pieces",
                    range.start,
                    range.end,
                    all.len()
                ),
            });
        }
        let dtype = candle_dtype(spec.dtype);
        let kinds = all[range.clone()].to_vec();
        let pieces = kinds
            .iter()
            .map(|&p| PieceState::new(spec, p, seed, dtype, device))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            spec: spec.clone(),
            range,
            kinds,
            pieces,
            step: 0,
            adamw: AdamW::default(),
            device: device.clone(),
            dtype,
            mask: ops::causal_mask(spec.seq_len as usize, dtype, device)?,
            rope: match spec.family {
                Family::Gpt => None,
                Family::Llama => Some(Rope::new(
                    spec.seq_len as usize,
                    spec.head_dim() as usize,
                    spec.rope_theta,
                    device,
                )?),
            },
            loss_seed: 1.0,
            pending: BTreeMap::new(),
            stash_bytes: 0,
            peak_stash_bytes: 0,
            edge_secs: 0.0,
            recompute: Recompute::None,
            rebuilt_bytes: 0,
        })
    }

    /// The whole model as one stage.
    pub fn whole(spec: &ModelSpec, seed: u64, device: &Device) -> Result<Self> {
        Stage::new(spec, 0..spec.layers as usize + 2, seed, device)
    }

    /// Splits the model into `stages` contiguous stages with blocks spread as evenly as
    /// possible (earlier stages get the extra blocks); the embedding goes with the first
    /// stage and the head with the last. Returns the piece ranges.
    pub fn even_split(spec: &ModelSpec, stages: usize) -> Result<Vec<Range<usize>>> {
        Ok(spec.even_split(stages)?)
    }

    /// The model spec.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// The piece range (indices into [`ModelSpec::pieces`]).
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The pieces held, in model order.
    pub fn pieces(&self) -> &[Piece] {
        &self.kinds
    }

    /// The device the stage computes on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether this stage holds the embedding (its input is token ids).
    pub fn is_first(&self) -> bool {
        self.kinds.first() == Some(&Piece::Embedding)
    }

    /// Whether this stage holds the head (its output is the loss).
    pub fn is_last(&self) -> bool {
        self.kinds.last() == Some(&Piece::Head)
    }

    /// Sets the microbatch count of a step: the loss gradient seed becomes `1/n`.
    pub fn set_microbatches(&mut self, n: u32) {
        self.loss_seed = 1.0 / f64::from(n.max(1));
    }

    /// Sets the optimizer's hyper-parameters.
    pub fn set_optimizer(&mut self, adamw: AdamW) {
        self.adamw = adamw;
    }

    /// The optimizer's hyper-parameters.
    pub fn optimizer(&self) -> &AdamW {
        &self.adamw
    }

    /// Optimizer steps taken.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Every parameter, in model order, named `"{piece}.{local}"`.
    pub fn params(&self) -> impl Iterator<Item = &Param> {
        self.pieces.iter().flat_map(PieceState::params)
    }

    pub(crate) fn params_mut(&mut self) -> impl Iterator<Item = &mut Param> {
        self.pieces.iter_mut().flat_map(PieceState::params_mut)
    }

    /// Parameter elements held.
    pub fn param_count(&self) -> u64 {
        self.params().map(|p| p.value.elem_count() as u64).sum()
    }

    /// Bytes held right now in stashes for pending `B` and `W` passes (the sum of the sizes
    /// of the tensors actually held).
    pub fn stash_bytes(&self) -> u64 {
        self.stash_bytes
    }

    /// Seconds the last pass (`F`, `B`, `W` or `BW`) spent in this stage's embedding or
    /// head piece: 0 for a stage of blocks only; `None` off the CPU (not timed there).
    pub fn edge_secs(&self) -> Option<f64> {
        self.device.is_cpu().then_some(self.edge_secs)
    }

    /// The largest [`Stage::stash_bytes`] seen at a pass boundary since creation or the last
    /// [`Stage::reset_peak`].
    pub fn peak_stash_bytes(&self) -> u64 {
        self.peak_stash_bytes
    }

    /// Restarts peak tracking from the current stash.
    pub fn reset_peak(&mut self) {
        self.peak_stash_bytes = self.stash_bytes;
    }

    /// Microbatches waiting for `B` and for `W`, in microbatch order.
    pub fn pending(&self) -> (Vec<u32>, Vec<u32>) {
        let mut b = Vec::new();
        let mut w = Vec::new();
        for (&mb, p) in &self.pending {
            match p {
                Pending::Backward { .. } | Pending::Recompute { .. } => b.push(mb),
                Pending::Weight { .. } => w.push(mb),
            }
        }
        (b, w)
    }

    fn account(&mut self) {
        self.stash_bytes = self.pending.values().map(Pending::bytes).sum();
        self.peak_stash_bytes = self.peak_stash_bytes.max(self.stash_bytes);
    }

    fn order_error(&self, pass: &'static str, mb: u32, reason: impl Into<String>) -> Error {
        Error::PassOrder {
            stage: format!(
                "{}..{}",
                self.kinds
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                self.kinds
                    .last()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ),
            pass,
            mb,
            reason: reason.into(),
        }
    }

    /// `F`: runs microbatch `mb` through the stage and stashes what `B` and `W` need.
    ///
    /// `input` is token ids `[b, t]` on the first stage and hidden states `[b, t, h]`
    /// elsewhere; `targets` (`[b, t]` u32) is required on the last stage and ignored
    /// elsewhere. Returns hidden states `[b, t, h]`, or on the last stage the microbatch's
    /// mean loss (rank-0 f32, not yet scaled by `1/n`).
    pub fn forward(&mut self, mb: u32, input: &Tensor, targets: Option<&Tensor>) -> Result<Tensor> {
        self.forward_keeping(mb, input, targets, false)
    }

    /// [`Stage::forward`], keeping the whole stash whatever the stage's recomputation when
    /// `whole` (a microbatch whose `B` is the worker's next pass: rebuilding it would save
    /// nothing).
    pub fn forward_keeping(
        &mut self,
        mb: u32,
        input: &Tensor,
        targets: Option<&Tensor>,
        whole: bool,
    ) -> Result<Tensor> {
        let shape = self.check_forward(mb, input, targets)?;
        let mode = if whole {
            Recompute::None
        } else {
            self.recompute
        };
        let f = self.forward_compute(shape, input, targets, mode == Recompute::Selective)?;
        self.edge_secs = f.edge_secs;
        let out = self.stash_forward(mb, shape, f, input, targets, mode);
        self.account();
        Ok(out)
    }

    /// Checks that `F` of `mb` may run on `input` (and `targets`); its `(b, t)`.
    fn check_forward(
        &self,
        mb: u32,
        input: &Tensor,
        targets: Option<&Tensor>,
    ) -> Result<(usize, usize)> {
        if self.pending.contains_key(&mb) {
            return Err(self.order_error("F", mb, "already has a forward pending"));
        }
        if self.is_last() && targets.is_none() {
            return Err(self.order_error("F", mb, "the last stage needs targets"));
        }
        let h = self.spec.hidden as usize;
        let (b, t) = if self.is_first() {
            input.dims2()?
        } else {
            let (b, t, hh) = input.dims3()?;
            if hh != h {
                return Err(Error::InvalidArgument {
                    field: "input",
                    reason: format!("hidden size {hh}, the model has {h}"),
                });
            }
            (b, t)
        };
        if t == 0 || t > self.spec.seq_len as usize || b == 0 {
            return Err(Error::InvalidArgument {
                field: "input",
                reason: format!(
                    "shape [{b}, {t}] (need b ≥ 1 and 1 ≤ t ≤ seq_len {})",
                    self.spec.seq_len
                ),
            });
        }
        Ok((b, t))
    }

    /// The arithmetic of `F` on a checked input of `(b, t)`; with `selected`, each piece's
    /// stash is what selective recomputation keeps of it.
    fn forward_compute(
        &self,
        (b, t): (usize, usize),
        input: &Tensor,
        targets: Option<&Tensor>,
        selected: bool,
    ) -> Result<Forwarded> {
        let h = self.spec.hidden as usize;
        let (mask, mut x) = self.forward_inputs((b, t), input)?;
        let mut stashes = Vec::with_capacity(self.pieces.len());
        let mut edge = 0.0;
        for piece in &self.pieces {
            let started = edge_clock(&self.device, piece);
            let (out, stash) = match (piece, targets) {
                (PieceState::Embedding(e), _) => {
                    let (out, s) = e.forward(&x)?;
                    (out, ForwardStash::Embedding(s))
                }
                (PieceState::Block(blk), _) => {
                    let (out, s) = blk.forward(&x, (b, t), &mask)?;
                    (out, ForwardStash::Block(Box::new(s)))
                }
                (PieceState::LlamaBlock(blk), _) => {
                    let (out, s) = blk.forward(&x, (b, t), &mask, self.rope()?)?;
                    (out, ForwardStash::LlamaBlock(Box::new(s)))
                }
                (PieceState::Head(hd), Some(targets)) => {
                    let (loss, s) = hd.forward(&x, targets)?;
                    (loss, ForwardStash::Head(s))
                }
                (PieceState::Head(_), None) => {
                    return Err(Error::InvalidArgument {
                        field: "targets",
                        reason: "the last stage needs targets".into(),
                    });
                }
            };
            edge += since(started);
            stashes.push(if selected { stash.selected(&x) } else { stash });
            x = out;
        }
        let out = if self.is_last() {
            x.to_dtype(DType::F32)?
        } else {
            x.reshape((b, t, h))?
        };
        Ok(Forwarded {
            stashes,
            out,
            edge_secs: edge,
        })
    }

    /// `B`: the gradient with respect to the stage's input only; what `W` needs stays
    /// stashed. `grad_output` (`[b, t, h]`) is required except on the last stage, where it is
    /// ignored: the loss seeds the backward with `1/n` ([`Stage::set_microbatches`]).
    /// Returns `None` on the first stage.
    pub fn backward_input(
        &mut self,
        mb: u32,
        grad_output: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        self.check_backward_input(mb, grad_output)?;
        let (shape, stashes, recompute_edge) = self.take_forward(mb)?;
        let b = self.backward_input_compute(mb, shape, stashes, grad_output)?;
        self.edge_secs = b.edge_secs + recompute_edge;
        self.add_norm_grads(b.norms)?;
        self.pending
            .insert(mb, Pending::Weight { stashes: b.stashes });
        self.account();
        Ok(b.dx)
    }

    /// Adds the LayerNorm gradients of one microbatch's `B` (one entry per piece).
    fn add_norm_grads(&mut self, norms: Vec<NormGrads>) -> Result<()> {
        for (piece, g) in self.pieces.iter_mut().zip(norms) {
            piece.add_norm_grads(g)?;
        }
        Ok(())
    }

    /// Checks that `B` of `mb` may run, with `grad_output` if given.
    fn check_backward_input(&self, mb: u32, grad_output: Option<&Tensor>) -> Result<()> {
        match self.pending.get(&mb) {
            Some(Pending::Backward { .. } | Pending::Recompute { .. }) => {}
            Some(Pending::Weight { .. }) => {
                return Err(self.order_error("B", mb, "B already ran (waiting for W)"));
            }
            None => return Err(self.order_error("B", mb, "no forward pending")),
        }
        if !self.is_last() && grad_output.is_none() {
            return Err(self.order_error("B", mb, "needs the output gradient"));
        }
        Ok(())
    }

    /// The arithmetic of `B` of `mb` from its forward stashes.
    fn backward_input_compute(
        &self,
        mb: u32,
        (b, t): (usize, usize),
        fstashes: Vec<ForwardStash>,
        grad_output: Option<&Tensor>,
    ) -> Result<BackwardInput> {
        let h = self.spec.hidden as usize;
        let mut dy: Option<Tensor> = match grad_output {
            Some(g) if !self.is_last() => Some(g.reshape((b * t, h))?),
            _ => None,
        };
        let mut wstashes = Vec::with_capacity(fstashes.len());
        let mut norms = Vec::with_capacity(fstashes.len());
        let mut edge = 0.0;
        for (piece, stash) in self.pieces.iter().zip(fstashes).rev() {
            let started = edge_clock(&self.device, piece);
            let (w, norm) = match (piece, stash) {
                (PieceState::Head(hd), ForwardStash::Head(s)) => {
                    let (dx, w, norm) = hd.backward_input(s, self.loss_seed)?;
                    dy = Some(dx);
                    (WeightStash::Head(w), norm)
                }
                (PieceState::Block(blk), ForwardStash::Block(s)) => {
                    let g = dy
                        .take()
                        .ok_or_else(|| self.order_error("B", mb, "no gradient"))?;
                    let (dx, w, norm) = blk.backward_input(*s, g)?;
                    dy = Some(dx);
                    (WeightStash::Block(Box::new(w)), norm)
                }
                (PieceState::LlamaBlock(blk), ForwardStash::LlamaBlock(s)) => {
                    let g = dy
                        .take()
                        .ok_or_else(|| self.order_error("B", mb, "no gradient"))?;
                    let (dx, w, norm) = blk.backward_input(*s, g)?;
                    dy = Some(dx);
                    (WeightStash::LlamaBlock(Box::new(w)), norm)
                }
                (PieceState::Embedding(e), ForwardStash::Embedding(s)) => {
                    let g = dy
                        .take()
                        .ok_or_else(|| self.order_error("B", mb, "no gradient"))?;
                    (
                        WeightStash::Embedding(e.backward_input(s, g)),
                        NormGrads(Vec::new()),
                    )
                }
                _ => return Err(self.order_error("B", mb, "stash does not match its piece")),
            };
            edge += since(started);
            wstashes.push(w);
            norms.push(norm);
        }
        wstashes.reverse();
        norms.reverse();
        let dx = dy.map(|dx| dx.reshape((b, t, h))).transpose()?;
        Ok(BackwardInput {
            stashes: wstashes,
            norms,
            dx,
            edge_secs: edge,
        })
    }

    /// `W`: weight gradients of microbatch `mb` from its stash, added to the accumulated
    /// gradients; frees the stash.
    pub fn backward_weight(&mut self, mb: u32) -> Result<()> {
        let wstashes = self.take_weight(mb)?;
        let mut edge = 0.0;
        for (piece, stash) in self.pieces.iter_mut().zip(wstashes) {
            let started = edge_clock(&self.device, piece);
            piece_backward_weight(piece, stash, mb)?;
            edge += since(started);
        }
        self.edge_secs = edge;
        self.account();
        Ok(())
    }

    /// Takes microbatch `mb`'s weight stashes for `W` (erring, with nothing taken, where
    /// `B` has not run).
    fn take_weight(&mut self, mb: u32) -> Result<Vec<WeightStash>> {
        match self.pending.remove(&mb) {
            Some(Pending::Weight { stashes }) => Ok(stashes),
            Some(other) => {
                self.pending.insert(mb, other);
                Err(self.order_error("W", mb, "B has not run yet"))
            }
            None => Err(self.order_error("W", mb, "nothing pending")),
        }
    }

    /// Drops whatever microbatch `mb` has pending (e.g. after an evaluation-only forward).
    pub fn discard(&mut self, mb: u32) {
        self.pending.remove(&mb);
        self.account();
    }

    /// `BW`: `B` then `W`, for schedules without the split.
    pub fn backward(&mut self, mb: u32, grad_output: Option<&Tensor>) -> Result<Option<Tensor>> {
        let dx = self.backward_input(mb, grad_output)?;
        let edge = self.edge_secs;
        self.backward_weight(mb)?;
        self.edge_secs += edge;
        Ok(dx)
    }

    /// The accumulated gradients, every parameter flattened in [`Stage::params`] order (for
    /// an all-reduce over replicas).
    pub fn flat_grads(&self) -> Result<Vec<f64>> {
        let mut flat = Vec::new();
        for p in self.params() {
            flat.extend(p.grad.flatten_all()?.to_vec1::<f64>()?);
        }
        Ok(flat)
    }

    /// Replaces the accumulated gradients with `flat` (as [`Stage::flat_grads`] lays them
    /// out).
    pub fn set_flat_grads(&mut self, flat: &[f64]) -> Result<()> {
        let want: usize = self.params().map(|p| p.grad.elem_count()).sum();
        if flat.len() != want {
            return Err(Error::invalid(
                "replicas",
                format!("{} gradient values for a stage of {want}", flat.len()),
            ));
        }
        let mut at = 0;
        for p in self.params_mut() {
            let n = p.grad.elem_count();
            let grad = Tensor::from_slice(&flat[at..at + n], p.grad.shape(), p.grad.device())?;
            p.grad = grad;
            at += n;
        }
        Ok(())
    }

    /// This stage's squared L2 norm of the accumulated gradients (for global clipping); a
    /// tied table counts once, at the embedding.
    pub fn grad_sq_norm(&self) -> Result<f64> {
        self.norm_params().map(Param::grad_sq_sum).sum()
    }

    /// One AdamW step with gradients multiplied by `clip_scale` (from
    /// [`crate::optim::clip_scale`] over all stages' [`Stage::grad_sq_norm`]); zeroes the
    /// gradients. Fails while microbatches are pending.
    pub fn optimizer_step(&mut self, clip_scale: f64) -> Result<()> {
        if let Some((&mb, _)) = self.pending.iter().next() {
            return Err(self.order_error("step", mb, "still pending at the optimizer step"));
        }
        self.step += 1;
        let step = self.step;
        let cfg = AdamW {
            lr: self.adamw.lr_at(step),
            ..self.adamw
        };
        for p in self.params_mut() {
            optim::update(p, &cfg, step, clip_scale)?;
        }
        Ok(())
    }

    /// Drops the accumulated gradients (in place on the CPU).
    pub fn zero_grad(&mut self) -> Result<()> {
        for p in self.params_mut() {
            p.zero_grad()?;
        }
        Ok(())
    }

    /// Installs loaded `(value, m, v)` per parameter (in [`Stage::params`] order, all in f32:
    /// `value` is the master copy of a bf16 or f16 parameter, on any device) and the step;
    /// zeroes gradients and drops pending microbatches. Tensors move to this stage's device
    /// one parameter at a time, each replacing the one it succeeds, so the device holds at
    /// most one parameter's state twice.
    pub(crate) fn replace_state(
        &mut self,
        loaded: Vec<(Tensor, Tensor, Tensor)>,
        step: u64,
    ) -> Result<()> {
        let device = self.device.clone();
        for (p, (wide, m, v)) in self.params_mut().zip(loaded) {
            let wide = wide.to_device(&device)?;
            p.grad = Tensor::zeros(wide.shape(), crate::param::GRAD_DTYPE, &device)?;
            p.set_wide(wide)?;
            p.m = m.to_device(&device)?;
            p.v = v.to_device(&device)?;
        }
        self.step = step;
        self.pending.clear();
        self.account();
        Ok(())
    }

    /// The model dtype as candle's.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// What the arithmetic of `F` gives.
struct Forwarded {
    /// What `B` and `W` need, one per piece.
    stashes: Vec<ForwardStash>,
    /// Hidden states, or on the last stage the loss.
    out: Tensor,
    /// Seconds spent in the embedding or head piece ([`Stage::edge_secs`]).
    edge_secs: f64,
}

/// What the arithmetic of `B` gives.
struct BackwardInput {
    /// What `W` needs, one per piece.
    stashes: Vec<WeightStash>,
    /// The LayerNorm gradients, one entry per piece (for [`Stage::add_norm_grads`]).
    norms: Vec<NormGrads>,
    /// The input gradient (`None` on the first stage).
    dx: Option<Tensor>,
    /// Seconds spent in the embedding or head piece ([`Stage::edge_secs`]).
    edge_secs: f64,
}

/// When a pass started on `piece`, where its time counts in [`Stage::edge_secs`]: the
/// embedding or the head, on the CPU (a GPU runs the ops asynchronously, so the clock
/// would measure their launch).
fn edge_clock(device: &Device, piece: &PieceState) -> Option<Instant> {
    let edge = matches!(piece, PieceState::Embedding(_) | PieceState::Head(_));
    (edge && device.is_cpu()).then(Instant::now)
}

/// Seconds since `started` (0 for none).
fn since(started: Option<Instant>) -> f64 {
    started.map_or(0.0, |t| t.elapsed().as_secs_f64())
}

/// `W` of one piece: its weight gradients of microbatch `mb` from `stash`, accumulated.
fn piece_backward_weight(piece: &mut PieceState, stash: WeightStash, mb: u32) -> Result<()> {
    match (piece, stash) {
        (PieceState::Embedding(e), WeightStash::Embedding(s)) => e.backward_weight(s),
        (PieceState::Block(blk), WeightStash::Block(s)) => blk.backward_weight(*s),
        (PieceState::LlamaBlock(blk), WeightStash::LlamaBlock(s)) => blk.backward_weight(*s),
        (PieceState::Head(hd), WeightStash::Head(s)) => hd.backward_weight(s),
        _ => Err(Error::InvalidArgument {
            field: "stash",
            reason: format!("microbatch {mb}: stash does not match its piece"),
        }),
    }
}
