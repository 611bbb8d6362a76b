//! `[validation]`: a held-out loss between steps, through the pipeline, changing nothing.
//!
//! [`ValidationSet`] is the windows evaluated: window `k` of a token stream, as training
//! defines windows (input `t[kS .. kS+S]`, target one token on), `k` from 0, cut into
//! microbatches of the training's size, `global_batch` windows a batch (the last microbatch
//! and batch may be short). [`evaluate`] runs them batch by batch through the worker's
//! stages with a forward-only program: every stage the worker holds, first to last, each
//! running `F` of its share of the batch's microbatches in order (GPipe's forward half:
//! whatever the placement, the lowest pending `F` can always run), activations to other
//! workers through the transport as in training, nothing stashed, no gradient. The
//! workers holding the last stage give each window's mean token cross-entropy
//! ([`Stage::window_losses`]); [`StepSync::validation_sum`] sums a batch's in window order
//! (and so paces the workers a batch at a time, as steps do), and the loss is the sum of
//! the batch sums, in order, over the windows. Which worker or replica computes a window
//! changes none of its bits.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use candle_core::{Device, Tensor};
use pipewise_common::pass::Pass;

use super::exchange::{Input, Link, Local};
use super::program::WorkerProgram;
use super::recorder::Recorder;
use super::sync::{Replica, StepSync};
use super::transport::{FrameKind, Payload, Transport};
use crate::data::{Batch, Corpus, Sampler};
use crate::error::{Error, Result};
use crate::stage::Stage;

/// Validation microbatch `j` travels as microbatch `VALIDATION_MB + j` of the step its
/// caller tags the evaluation with: no training frame of that step has such an index.
pub(crate) const VALIDATION_MB: u32 = 1 << 31;

/// The windows one evaluation takes (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct ValidationSet {
    corpus: Corpus,
    seq_len: usize,
    microbatch_size: usize,
    global_batch: usize,
    windows: usize,
}

impl ValidationSet {
    /// The first `max` windows of `corpus` (`None`: every one) of `seq_len` tokens, in
    /// microbatches of `microbatch_size` and batches of `global_batch` windows.
    pub fn new(
        corpus: Corpus,
        seq_len: usize,
        microbatch_size: usize,
        global_batch: usize,
        max: Option<u64>,
    ) -> Result<Self> {
        if seq_len == 0 || microbatch_size == 0 || !global_batch.is_multiple_of(microbatch_size) {
            return Err(Error::invalid(
                "validation",
                format!(
                    "windows of {seq_len} tokens in microbatches of {microbatch_size} and \
                     batches of {global_batch}: each must be positive, the batch a whole \
                     number of microbatches"
                ),
            ));
        }
        let all = corpus.len().saturating_sub(1) / seq_len;
        if all == 0 {
            return Err(Error::invalid(
                "validation",
                format!(
                    "{} validation tokens hold no window of {seq_len} + 1 tokens",
                    corpus.len()
                ),
            ));
        }
        let windows = max.map_or(all, |m| all.min(usize::try_from(m).unwrap_or(usize::MAX)));
        let microbatches = windows.div_ceil(microbatch_size) as u64;
        if microbatches >= u64::from(VALIDATION_MB) {
            return Err(Error::invalid(
                "validation",
                format!(
                    "{windows} windows in microbatches of {microbatch_size}: at most {} \
                     microbatches are evaluated (set validation.steps)",
                    VALIDATION_MB - 1
                ),
            ));
        }
        Ok(ValidationSet {
            corpus,
            seq_len,
            microbatch_size,
            global_batch,
            windows,
        })
    }

    /// Windows evaluated.
    pub fn windows(&self) -> usize {
        self.windows
    }

    /// Microbatches of a whole batch.
    fn per_batch(&self) -> u64 {
        (self.global_batch / self.microbatch_size) as u64
    }

    /// Microbatches in all.
    fn microbatches(&self) -> u64 {
        self.windows.div_ceil(self.microbatch_size) as u64
    }

    /// Batches in all.
    pub fn batches(&self) -> u64 {
        self.microbatches().div_ceil(self.per_batch())
    }

    /// Microbatch `j`: its first window and its windows on `device`.
    pub fn microbatch(&self, j: u64, device: &Device) -> Result<(u64, Batch)> {
        let first = j.saturating_mul(self.microbatch_size as u64);
        let left = (self.windows as u64).saturating_sub(first);
        if left == 0 {
            return Err(Error::invalid(
                "validation",
                format!("microbatch {j} is past the {} windows", self.windows),
            ));
        }
        // Windows `first ..` in the stream's order: sequences of a one-window step.
        let sampler = Sampler {
            seed: 0,
            microbatch_size: left.min(self.microbatch_size as u64) as usize,
            seq_len: self.seq_len,
            global_batch: 1,
            shuffle: false,
        };
        Ok((first, sampler.batch(&self.corpus, first, 0, device)?))
    }

    /// The microbatches `replica` evaluates of batch `batch`: its share of them, as a
    /// training step shares its microbatches.
    fn share(&self, batch: u64, replica: Replica) -> Result<std::ops::Range<u64>> {
        let per = self.per_batch();
        let count = u64::from(replica.count.max(1));
        if !per.is_multiple_of(count) {
            return Err(Error::invalid(
                "replicas",
                format!("{per} validation microbatches a batch do not split into {count} replicas"),
            ));
        }
        let each = per / count;
        let start = batch * per + u64::from(replica.index) * each;
        let end = self.microbatches();
        Ok(start.min(end)..(start + each).min(end))
    }
}

/// Splits `corpus` for `[validation] fraction`: of its `W` windows of `seq_len`, the last
/// `⌈fraction · W⌉` are held out (at least one, leaving at least one to train on).
/// Returns the training stream (the tokens of the first windows, as training reads them:
/// it samples only those) and the held-out one, whose window `k` is window `W − V + k` of
/// `corpus`.
pub fn hold_out(corpus: &Corpus, seq_len: usize, fraction: f64) -> Result<(Corpus, Corpus)> {
    let all = corpus.len().saturating_sub(1) / seq_len.max(1);
    let held = pipewise_common::data::held_out_windows(fraction, all as u64) as usize;
    if all < 2 || held >= all {
        return Err(Error::invalid(
            "validation.fraction",
            format!(
                "{} tokens hold {all} windows of {seq_len}: holding out {fraction} of them \
                 leaves none to train on",
                corpus.len()
            ),
        ));
    }
    let kept = all - held;
    Ok((
        slice(corpus, 0..kept * seq_len + 1)?,
        slice(corpus, kept * seq_len..all * seq_len + 1)?,
    ))
}

/// Tokens `range` of `corpus` as a corpus of their own, of the same vocabulary (read out
/// as u32 ids once: 4 bytes a token for a moment, at the run's start).
fn slice(corpus: &Corpus, range: std::ops::Range<usize>) -> Result<Corpus> {
    let mut ids = Vec::with_capacity(range.len());
    corpus.extend_into(range.start, range.len(), &mut ids);
    Corpus::from_ids(&ids, corpus.vocab())
}

/// What [`evaluate`] runs on: one worker's stages and program, and its replica.
pub(super) struct Evaluator<'a> {
    pub(super) stages: &'a BTreeMap<u32, Stage>,
    pub(super) program: &'a WorkerProgram,
    pub(super) replica: Replica,
}

/// Evaluates `set` in run `job` (see the [module docs](self)): frames go through
/// `transport` as step `step`'s (the caller's tag, one per evaluation of a run), each
/// batch's sum through `sync` as validation batch `*rounds` of the run (which this counts
/// on). Returns the mean token cross-entropy.
pub(super) fn evaluate(
    e: &Evaluator<'_>,
    (job, step): (u64, u64),
    set: &ValidationSet,
    transport: &dyn Transport,
    sync: &dyn StepSync,
    rounds: &mut u64,
) -> Result<f64> {
    let link = e.program.link(transport, job, step);
    let device = e
        .stages
        .values()
        .next()
        .map_or(Device::Cpu, |s| s.device().clone());
    let mut total = 0.0;
    for batch in 0..set.batches() {
        let mbs = set
            .share(batch, e.replica)?
            .map(|j| {
                let (first, windows) = set.microbatch(j, &device)?;
                Ok((VALIDATION_MB + j as u32, first, windows))
            })
            .collect::<Result<Vec<_>>>()?;
        let losses = forward_only(e, &link, &mbs)?;
        total += sync.validation_sum(*rounds, &losses)?;
        *rounds += 1;
    }
    Ok(total / set.windows() as f64)
}

/// `F` of microbatches `mbs` (frame index, first window, windows) on every stage of the
/// worker, first stage to last; the `(window, mean loss)` of each window the last stage
/// evaluated.
fn forward_only(
    e: &Evaluator<'_>,
    link: &Link<'_>,
    mbs: &[(u32, u64, Batch)],
) -> Result<Vec<(u64, f64)>> {
    let last = e.program.placement.stages() - 1;
    let mut local: Local<Tensor> = HashMap::new();
    let mut rec = Recorder::start(Instant::now(), 0);
    let mut losses = Vec::new();
    for (&s, stage) in e.stages {
        for (mb, first, windows) in mbs {
            let pass = Pass::f(s, *mb);
            let input = if s == 0 {
                windows.tokens.clone()
            } else {
                match link.take(&mut local, &mut rec, pass, FrameKind::Activation)? {
                    Input::Local(x) => x,
                    Input::Received(payload) => {
                        let (b, t) = windows.tokens.dims2()?;
                        let dims = [b, t, stage.spec().hidden as usize];
                        if payload.dims() != dims || payload.dtype() != stage.dtype() {
                            let kind = FrameKind::Activation;
                            let want = (&dims[..], stage.dtype());
                            return Err(link.bad_frame(pass, kind, &payload, want));
                        }
                        payload
                            .into_tensor(stage.device())?
                            .to_device(stage.device())?
                    }
                }
            };
            if s == last {
                let means = stage.window_losses(&input, &windows.targets)?;
                losses.extend((*first..).zip(means));
            } else {
                let out = stage.infer(&input)?;
                let kind = FrameKind::Activation;
                link.deliver(
                    &mut local,
                    &mut rec,
                    pass,
                    s + 1,
                    kind,
                    out,
                    Payload::Tensor,
                )?;
            }
        }
    }
    if let Some(&(s, mb, kind)) = local.keys().next() {
        return Err(Error::invalid(
            "validation",
            format!("the {kind} for stage {s} microbatch {mb} was never consumed"),
        ));
    }
    Ok(losses)
}
