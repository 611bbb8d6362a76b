//! The auto-planner's answer: the planned configurations that fit, ranked, and the others
//! with the reason.

use std::ops::Range;

use serde::{Serialize, Serializer};

use crate::cost::StageCost;
use crate::generate::ScheduleKind;
use crate::model::ModelSpec;
use crate::schedule::{Recompute, Schedule};

/// Relative tolerance when comparing step times.
pub(super) const REL_EPS: f64 = 1e-9;

/// A short text form of a partition of `spec`'s pieces ([`crate::partition::summary`]):
/// `emb+3 | 4 | 4 | 3+head`.
pub fn partition_summary(spec: &ModelSpec, partition: &[Range<usize>]) -> String {
    crate::partition::summary(spec.layers, partition)
}

fn serialize_kind<S: Serializer>(
    kind: &ScheduleKind,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(kind.name())
}

/// Which stages recompute, in words: empty when none does, else e.g. `full recompute on
/// every stage` or `recompute: stage 0 full, stage 1 selective`.
pub fn recompute_summary(modes: &[Recompute]) -> String {
    let recomputing: Vec<String> = modes
        .iter()
        .enumerate()
        .filter(|(_, m)| **m != Recompute::None)
        .map(|(s, m)| format!("stage {s} {m}"))
        .collect();
    match modes.first() {
        _ if recomputing.is_empty() => String::new(),
        Some(first) if recomputing.len() == modes.len() && modes.iter().all(|m| m == first) => {
            format!("{first} recompute on every stage")
        }
        _ => format!("recompute: {}", recomputing.join(", ")),
    }
}

/// What the search varies: the schedule, the microbatching and the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Configuration {
    /// The schedule kind.
    #[serde(serialize_with = "serialize_kind")]
    pub kind: ScheduleKind,
    /// Sequences per microbatch.
    pub microbatch_size: u32,
    /// Microbatches per step (of one replica).
    pub microbatches: u32,
    /// Data-parallel replicas of the pipeline (each on its own workers, each taking
    /// `microbatches` microbatches of every step).
    pub replicas: u32,
}

impl Configuration {
    /// `kind b×n`, e.g. `zb-h1 2×16`, and `R× kind b×n` with replicas (`2× zb-h1 2×8`).
    pub fn label(&self) -> String {
        let (kind, mbs, n) = (self.kind.name(), self.microbatch_size, self.microbatches);
        match self.replicas {
            0 | 1 => format!("{kind} {mbs}×{n}"),
            r => format!("{r}× {kind} {mbs}×{n}"),
        }
    }
}

/// One planned configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// What was planned.
    #[serde(flatten)]
    pub config: Configuration,
    /// Piece index ranges (into [`ModelSpec::pieces`]) of every stage, in stage order.
    pub partition: Vec<Range<usize>>,
    /// The worker holding each stage.
    pub stage_workers: Vec<u32>,
    /// Per-stage costs the schedule was planned and simulated with (times in ms, memory in
    /// bytes per microbatch).
    pub stage_costs: Vec<StageCost>,
    /// Predicted step time (simulated makespan, or the end of the replicas' gradient sums
    /// when later), in milliseconds.
    pub step_ms: f64,
    /// Bubble rate `1 − Σ busy / (d × step)`.
    pub bubble: f64,
    /// The largest per-worker bubble over that worker's own span.
    pub bubble_span: f64,
    /// Predicted throughput, tokens per second.
    pub tokens_per_s: f64,
    /// Parameters, gradients and optimizer state of every worker, in bytes.
    pub static_bytes: Vec<u64>,
    /// Simulated activation peak of every worker, in bytes.
    pub activation_bytes: Vec<u64>,
    /// `static_bytes + activation_bytes` of every worker.
    pub worker_bytes: Vec<u64>,
    /// The largest of `worker_bytes`.
    pub max_worker_bytes: u64,
    /// Every worker fits the budget.
    pub fits: bool,
    /// How it was obtained (e.g. the adaptive search's activation limit).
    pub note: String,
    /// The schedule itself (not serialized).
    #[serde(skip)]
    pub schedule: Schedule,
    /// Each stage's activation recomputation.
    pub recompute: Vec<Recompute>,
}

impl Candidate {
    /// [`Configuration::label`].
    pub fn label(&self) -> String {
        self.config.label()
    }

    /// Pipeline workers of one replica.
    pub fn degree(&self) -> u32 {
        self.schedule.placement.workers()
    }
}

/// Why a configuration is not among the ranked plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Why {
    /// Some worker would exceed the budget.
    DoesNotFit,
    /// It fits, but `top` plans are faster.
    Slower,
    /// Not planned: unsupported shape, too large to search, or too few pieces.
    Skipped,
}

/// A configuration that is not among the ranked plans, with the reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rejected {
    /// What was considered.
    #[serde(flatten)]
    pub config: Configuration,
    /// The class of reason.
    pub why: Why,
    /// The reason in words.
    pub reason: String,
    /// Bytes the fullest worker needs, when known: the smallest budget it fits for the fixed
    /// kinds; for the adaptive kinds what the schedule found at the smallest activation
    /// limit the search accepts needs (static state plus peak) on its fullest worker.
    pub needed_bytes: Option<u64>,
    /// Predicted step time, when simulated.
    pub step_ms: Option<f64>,
}

impl Rejected {
    /// [`Configuration::label`].
    pub fn label(&self) -> String {
        self.config.label()
    }
}

/// The auto-planner's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoPlan {
    /// Total parameter count of the model.
    pub params: u64,
    /// Training-state bytes per parameter
    /// ([`DType::training_state_bytes`](crate::model::DType::training_state_bytes)).
    pub bytes_per_param: u64,
    /// The budget, bytes per worker.
    pub memory_per_worker: u64,
    /// Tokens per step (`global_batch × seq_len`).
    pub tokens_per_step: u64,
    /// Fitting plans found in all (ranked and slower).
    pub fitting: usize,
    /// The best `top` fitting plans, fastest first.
    pub ranked: Vec<Candidate>,
    /// Everything else, with the reason.
    pub rejected: Vec<Rejected>,
}

/// What planning one configuration gave.
pub(super) enum Outcome {
    Planned(Box<Candidate>),
    Rejected(Rejected),
}
