//! The collectives that end a step, across all workers of a job ([`StepSync`]); the
//! data-parallel replicas' terms: a worker's [`Replica`], whose gradients a sum gets
//! ([`ReplicaPart`]) and the sum itself in replica order; and a tied table's ([`TiedPart`],
//! a worker's parts summed here or through the sync).

use crate::error::{Error, Result};
use crate::stage::tied::{TiedGrads, tied_sum};

/// The collective operations at the end of a step, across all workers of a job.
pub trait StepSync: Send + Sync {
    /// All-reduce: the sum over workers of their `local` squared gradient norms (for global
    /// norm clipping); every worker gets the same global sum.
    fn all_reduce_sq_norm(&self, step: u64, local: f64) -> Result<f64>;

    /// Gathers the microbatch losses of the last stage (each worker passes its own, empty
    /// if it holds no last stage) and returns the step's mean loss to every worker.
    fn mean_loss(&self, step: u64, local: &[f32]) -> Result<f32>;

    /// Data-parallel replicas: sums the gradients of `part`'s stage and step (`grads`, every
    /// parameter flattened in order) over the job's replicas, in replica order whatever the
    /// arrival order, and leaves the sum in `grads` on every replica. A sync without
    /// replicas refuses.
    fn all_reduce_replicas(&self, part: ReplicaPart, _grads: &mut [f64]) -> Result<()> {
        Err(Error::invalid(
            "replicas",
            format!("{part}: this transport has no replica all-reduce"),
        ))
    }

    /// Tied embeddings: sums the tied table's gradient parts of `part`'s step and replica
    /// (`grads`, in the embedding's `[V, h]` layout) from the embedding's holder and the
    /// head's, the embedding's first, and leaves the sum in `grads` on both. Only for
    /// holders on different workers (one holding both sums locally). A sync without it
    /// refuses.
    fn sum_tied(&self, part: TiedPart, _grads: &mut [f64]) -> Result<()> {
        Err(Error::invalid(
            "tie_embeddings",
            format!("{part}: this transport has no tied-table sum"),
        ))
    }

    /// A sharded optimizer (`data_parallel_shard_degree`): gathers the shards of `part`'s
    /// state (each replica of the shard group passes its own, `shard`) and returns them
    /// concatenated in shard order to every replica of the group. A sync without it
    /// refuses.
    fn all_gather_shards(&self, part: ShardPart, _shard: &[f32]) -> Result<Vec<f32>> {
        Err(Error::invalid(
            "data_parallel_shard_degree",
            format!("{part}: this transport has no all-gather of optimizer shards"),
        ))
    }

    /// `[validation]`: gathers one validation batch's `(window, mean loss)` pairs (each
    /// worker passes those its last stage evaluated, none elsewhere) and returns their sum
    /// in window order ([`sum_in_window_order`]) to every worker. `round` counts the run's
    /// validation batches. A sync without it refuses.
    fn validation_sum(&self, round: u64, _local: &[(u64, f64)]) -> Result<f64> {
        Err(Error::invalid(
            "validation",
            format!("validation batch {round}: this transport has no validation sum"),
        ))
    }
}

/// The sum of `(window, value)` pairs in window order, whichever worker gave them and in
/// whatever order they came: every run gives the same bits.
pub(crate) fn sum_in_window_order(pairs: &mut [(u64, f64)]) -> f64 {
    pairs.sort_by_key(|&(window, _)| window);
    pairs.iter().map(|&(_, value)| value).sum()
}

/// A worker's data-parallel replica: `index` of `count` copies of the pipeline, each
/// training on its share of every step's microbatches, their gradients summed before the
/// optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// This worker's replica (0-based).
    pub index: u32,
    /// How many replicas the job has.
    pub count: u32,
}

impl Default for Replica {
    fn default() -> Self {
        Self { index: 0, count: 1 }
    }
}

impl Replica {
    /// Refuses a count of 0 or an index not below the count.
    pub fn check(self) -> Result<()> {
        if self.count == 0 || self.index >= self.count {
            return Err(Error::invalid(
                "replicas",
                format!(
                    "replica {} of {}: the index must be below the count",
                    self.index, self.count
                ),
            ));
        }
        Ok(())
    }
}

/// Whose gradients a replica all-reduce gets: a stage's, in a step, from a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaPart {
    /// The step (0-based).
    pub step: u64,
    /// The stage whose gradients these are.
    pub stage: u32,
    /// The contributing worker's replica.
    pub replica: u32,
}

impl std::fmt::Display for ReplicaPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} stage {} (replica {})",
            self.step, self.stage, self.replica
        )
    }
}

/// Which state of a stage an all-gather of shards returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gathered {
    /// The updated values, after the optimizer step.
    Values,
    /// The f32 master values, for a checkpoint.
    Master,
    /// AdamW's first moment, for a checkpoint.
    FirstMoment,
    /// AdamW's second moment, for a checkpoint.
    SecondMoment,
}

/// Whose shard a [`StepSync::all_gather_shards`] gets: a stage's `what`, in a step, from
/// shard `shard` of shard group `group` (the replicas `group · S .. (group + 1) · S` for a
/// shard degree `S`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPart {
    /// The step (0-based).
    pub step: u64,
    /// The stage whose state this is.
    pub stage: u32,
    /// The shard group (which of the replicate degree's copies).
    pub group: u32,
    /// The contributing worker's shard.
    pub shard: u32,
    /// The shard degree: the parts the gather takes.
    pub shards: u32,
    /// The stage's flattened parameters, all shards' together.
    pub total: u64,
    /// Which state.
    pub what: Gathered,
}

impl std::fmt::Display for ShardPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} stage {} {:?} (shard {} of {} in group {})",
            self.step, self.stage, self.what, self.shard, self.shards, self.group
        )
    }
}

/// Which copy of a tied table a [`StepSync::sum_tied`] part comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TiedHolder {
    /// The embedding's (stage 0), summed first.
    Embedding,
    /// The head's (the last stage), transposed to the embedding's layout.
    Head,
}

/// Whose part of a tied table's gradient a [`StepSync::sum_tied`] gets: a holder's, in a
/// step, in a replica (each replica sums its own two copies, equal over the replicas once
/// their gradients are summed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiedPart {
    /// The step (0-based).
    pub step: u64,
    /// The contributing worker's replica.
    pub replica: u32,
    /// Which copy's gradient this is.
    pub holder: TiedHolder,
}

impl std::fmt::Display for TiedPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let holder = match self.holder {
            TiedHolder::Embedding => "embedding",
            TiedHolder::Head => "head",
        };
        write!(
            f,
            "step {} tied table, the {holder}'s copy (replica {})",
            self.step, self.replica
        )
    }
}

/// The tied table's summed gradient of a worker's `parts` of step `step` in `replica`:
/// summed here when the worker holds both copies, through `sync` when it holds one; `None`
/// when it holds neither (or the model is untied).
pub(crate) fn sum_tied_parts(
    sync: &dyn StepSync,
    step: u64,
    replica: Replica,
    parts: TiedGrads,
) -> Result<Option<Vec<f64>>> {
    let (holder, mut grads) = match parts {
        TiedGrads {
            embedding: Some(embedding),
            head: Some(head),
        } => {
            let sum = tied_sum(&embedding, &head).map_err(|(e, h)| {
                Error::invalid(
                    "tie_embeddings",
                    format!("step {step}: tied gradients of {e} and {h} values"),
                )
            })?;
            return Ok(Some(sum));
        }
        TiedGrads {
            embedding: Some(embedding),
            head: None,
        } => (TiedHolder::Embedding, embedding),
        TiedGrads {
            embedding: None,
            head: Some(head),
        } => (TiedHolder::Head, head),
        TiedGrads { .. } => return Ok(None),
    };
    let part = TiedPart {
        step,
        replica: replica.index,
        holder,
    };
    sync.sum_tied(part, &mut grads)?;
    Ok(Some(grads))
}

/// The replicas' gradient parts (`parts[r]`: replica `r`'s, f64 sums of f32 microbatch
/// gradients) summed in replica order, whatever order they arrived in, so every run gives
/// the same bits; parts of different lengths give the two lengths.
pub(crate) fn sum_in_replica_order(
    parts: &[Option<Vec<f64>>],
) -> std::result::Result<Vec<f64>, (usize, usize)> {
    let mut parts = parts.iter().flatten();
    let mut sum = parts.next().cloned().unwrap_or_default();
    for part in parts {
        if part.len() != sum.len() {
            return Err((sum.len(), part.len()));
        }
        for (s, p) in sum.iter_mut().zip(part) {
            *s += p;
        }
    }
    Ok(sum)
}
