//! A run's `[validation]`: the windows it evaluates (its own file, or the end of the
//! training stream, which training then no longer samples) and when (before the job's first
//! step, then after every `freq`-th and the last); the evaluation itself is
//! [`WorkerRuntime::validate`].

use pipewise_common::job::{JobSpec, Validation};

use crate::confined::Confined;
use crate::data::{Corpus, DataSource};
use crate::error::Result;
use crate::runtime::{StepReport, StepSync, Transport, ValidationSet, WorkerRuntime, hold_out};

/// What a run with `[validation]` evaluates, and when.
///
/// An evaluation's frames travel as validation microbatches of the step numbered by the
/// steps done before it: 0 for the one before the first step, `k + 1` for the one after
/// step `k` (0-based). Each evaluation so has frame keys of its own, which the receiving
/// inbox needs (it refuses a key it took before as a duplicate), also when one follows
/// step 0 (`freq = 1`, or a job of one step).
pub(crate) struct Validating {
    set: ValidationSet,
    section: Validation,
    /// The job's steps: the last one evaluates too.
    steps: u64,
    /// The run's validation batches so far (every worker counts the same).
    rounds: u64,
}

/// The training stream and what the run validates, from the job's training `corpus` (read
/// from `data`) and, with `validation.path`, the file `path`: without `[validation]` the
/// corpus as it is and nothing; with `validation.fraction` the corpus less its held-out
/// windows, and those.
pub(crate) fn prepare(
    spec: &JobSpec,
    data: &DataSource,
    path: Option<&Confined>,
    corpus: Corpus,
) -> Result<(Corpus, Option<Validating>)> {
    let Some(section) = spec.validation.clone() else {
        return Ok((corpus, None));
    };
    let seq_len = spec.model.seq_len as usize;
    let (training, held) = match (path, section.fraction) {
        // Read as `[data] path` is: its forms, tokenizer, token bytes and cache.
        (Some(path), _) => {
            let source = DataSource {
                path: Some(path.clone()),
                ..data.clone()
            };
            (corpus, source.load(&spec.model)?.corpus)
        }
        (None, Some(fraction)) => hold_out(&corpus, seq_len, fraction)?,
        (None, None) => return Ok((corpus, None)),
    };
    let global = spec.training.global_batch_size;
    let set = ValidationSet::new(
        held,
        seq_len,
        spec.parallelism.pipeline_parallel_microbatch_size as usize,
        global as usize,
        section.max_windows(global),
    )?;
    let validating = Validating {
        set,
        section,
        steps: u64::from(spec.training.steps),
        rounds: 0,
    };
    Ok((training, Some(validating)))
}

impl Validating {
    /// Evaluates the model the run starts from, before its first step `first` (through the
    /// run's `transport` and `sync`), when that is the job's first step: the starting
    /// validation loss (torchtitan's and Megatron's step-0 evaluation). A run that goes on
    /// from a checkpoint, or from another run's stages, evaluated it already.
    pub(crate) fn before_first_step(
        &mut self,
        rt: &WorkerRuntime,
        (run, first): (u64, u64),
        (transport, sync): (&dyn Transport, &dyn StepSync),
    ) -> Result<Option<f64>> {
        if first != 0 {
            return Ok(None);
        }
        let loss = rt.validate((run, first), &self.set, transport, sync, &mut self.rounds)?;
        tracing::debug!(
            step = 0,
            loss,
            windows = self.set.windows(),
            "validation before the first step"
        );
        Ok(Some(loss))
    }

    /// Evaluates after step `step` of run `run` where one is due (through the run's
    /// `transport` and `sync`), into `report`.
    pub(crate) fn after_step(
        &mut self,
        rt: &WorkerRuntime,
        (run, step): (u64, u64),
        (transport, sync): (&dyn Transport, &dyn StepSync),
        report: &mut StepReport,
    ) -> Result<()> {
        if !self.section.due(step, self.steps) {
            return Ok(());
        }
        // Tagged by the steps done before it (see the struct's docs).
        let tag = step + 1;
        let loss = rt.validate((run, tag), &self.set, transport, sync, &mut self.rounds)?;
        tracing::debug!(
            step = step + 1,
            loss,
            windows = self.set.windows(),
            "validation"
        );
        report.validation_loss = Some(loss);
        Ok(())
    }
}
