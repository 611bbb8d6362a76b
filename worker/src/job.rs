//! What a worker derives from a job spec: the optimizer, the data sampler, the corpus and
//! the stage partition, the same for an embedded and a remote worker (and for the
//! single-device reference a run is compared with).

use std::ops::Range;

use pipewise_common::job::JobSpec;
use pipewise_common::placement::Placement;

use crate::data::{Corpus, DataSource, Sampler};
use crate::error::Result;
use crate::optim::AdamW;

/// The spec's AdamW hyper-parameters (`max_norm` ≤ 0: no clipping).
pub fn optimizer_of(spec: &JobSpec) -> AdamW {
    let o = &spec.optimizer;
    AdamW {
        lr: o.lr,
        beta1: o.beta1,
        beta2: o.beta2,
        eps: o.eps,
        weight_decay: o.weight_decay,
        max_grad_norm: (spec.training.max_norm > 0.0).then_some(spec.training.max_norm),
        schedule: spec
            .lr_scheduler
            .map(|s| (s, u64::from(spec.training.steps))),
    }
}

/// The spec's microbatch sampler (seeded by `training.seed`).
pub fn sampler_of(spec: &JobSpec) -> Sampler {
    Sampler {
        seed: spec.training.seed,
        microbatch_size: spec.parallelism.pipeline_parallel_microbatch_size as usize,
        seq_len: spec.model.seq_len as usize,
        global_batch: spec.training.global_batch_size as usize,
        shuffle: spec.data.shuffle,
    }
}

/// The spec's training data: `[data]` at its paths as given (relative to the current
/// directory; no token cache), or the generated corpus, checked against the model.
pub fn corpus_of(spec: &JobSpec) -> Result<Corpus> {
    Ok(DataSource::plain(spec)?.load(&spec.model)?.corpus)
}

/// The default split of the model's pieces into `placement`'s stages, what an assignment
/// without `stage_pieces` runs ([`ModelSpec::balanced_split`]: the workers' compute
/// balanced, as the coordinator plans it).
///
/// [`ModelSpec::balanced_split`]: pipewise_common::model::ModelSpec::balanced_split
pub fn partition_of(spec: &JobSpec, placement: &Placement) -> Result<Vec<Range<usize>>> {
    Ok(spec.model.balanced_split(placement)?)
}
