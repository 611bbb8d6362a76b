//! The auto-planner: picks the layer partition, microbatch size and schedule that maximise
//! predicted throughput while fitting a per-worker memory budget.
//!
//! # What it searches
//!
//! For every microbatch size `b` dividing the global batch (`n = global_batch / b`
//! microbatches) and every kind in [`AUTO_KINDS`], the planner
//!
//! 1. takes the kind's placement on `d` workers (`S` stages; interleaved 1F1B with
//!    [`INTERLEAVED_CHUNKS`] chunks, only when `n` is a multiple of `d`);
//! 2. splits the model's pieces ([`ModelSpec::pieces`]: embedding, blocks, head) into `S`
//!    contiguous non-empty stages with [`balance`]: the largest stage time `F + B + W` first,
//!    then the largest stage parameter count, then the spread of the stage times. The LM head
//!    costs about `2V / (24h + 4t)` blocks of compute, so the last stage gets fewer blocks;
//!    the embedding costs almost no compute but `V·h` parameters, so the parameter tie-break
//!    gives the first stage fewer blocks where the time balance leaves room (torchtitan's
//!    "first and last stage hold fewer layers");
//! 3. checks the static memory of every worker: parameters, gradients and AdamW state,
//!    [`DType::training_state_bytes`](crate::model::DType::training_state_bytes) bytes per parameter;
//! 4. generates the schedule with the stage costs and simulates it; the adaptive kinds are
//!    searched under one activation limit for every worker: the budget minus the smallest
//!    static state if the schedule found then fits every worker, else the largest limit
//!    found by bisection down to the budget minus the largest static state (which always
//!    fits) whose schedule fits every worker; when no limit fits in the room on the fullest
//!    worker, the schedule at the smallest limit the search accepts is tried too (its peaks
//!    may fall on emptier workers). The budget a rejected adaptive kind is reported to need
//!    is what that least-memory schedule needs on its fullest worker, so that budget gets it;
//! 5. keeps it if every worker's static bytes plus simulated activation peak fit.
//!
//! The fitting plans are ranked by predicted step time (throughput is `global_batch ·
//! seq_len / step`, the same for every plan), then by the largest per-worker memory.
//!
//! Left out: `eager-1f1b` (1F1B with more memory for no modelled gain), `looped-bfs`
//! (GPipe-like memory on the loop placement) and `dualpipe-v` (its overlap of F with B is
//! not modelled by the simulator, so its step time would be pessimistic).
//!
//! # Cost model
//!
//! - Pass times in milliseconds. Without measured times every piece's F, B and W each take
//!   `piece_flops / DEFAULT_FLOPS_PER_MS`. With [`LayerTimes`] (measured F, B, W of one
//!   transformer block at some microbatch size) every piece's times are those, scaled by
//!   the piece's FLOPs at the planned microbatch size over a block's FLOPs at the measured
//!   one (linear in the microbatch size; the embedding and head by their FLOPs ratio).
//! - Activation bytes held per microbatch by a stage: the larger of what its pieces stash
//!   after F and what they still hold after B ([`ModelSpec::piece_activation_bytes`]),
//!   allocated when F starts and freed when W (or BW) ends. This is conservative: it never
//!   releases anything at B and charges the larger stash for the whole F → W span.
//! - Communication: `comm_ms` on every hop between workers.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Serialize, Serializer};

use crate::cost::{Costs, StageCost, Times};
use crate::error::{Error, Result};
use crate::generate::{
    LOCAL_SEARCH_BUDGET, Request, ScheduleKind, adaptive_v, adaptive_zb, generate_with,
};
use crate::model::{ModelSpec, Piece};
use crate::render::report::fmt_bytes;
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

/// Sustained FLOP rate assumed without measured times: `1e11` FLOPs per millisecond
/// (100 TFLOP/s, a modest sustained rate for a current datacenter GPU in bf16).
pub const DEFAULT_FLOPS_PER_MS: f64 = 1e11;

/// Chunks per worker of the interleaved 1F1B candidates.
pub const INTERLEAVED_CHUNKS: u32 = 2;

/// The adaptive kinds are searched only when `microbatches × workers` is at most this.
pub const MAX_ADAPTIVE_SHAPE: u64 = 8192;

/// Extra searches of an adaptive kind, bisecting the activation limit for the least memory
/// that keeps the fastest makespan (the search itself breaks makespan ties by bubble).
pub const ADAPTIVE_DESCENT_STEPS: usize = 8;

/// Extra searches of an adaptive kind, bisecting the activation limit between the room on
/// the fullest worker and the room on the emptiest for the largest limit that still fits
/// every worker (when the emptiest worker's room does not).
pub const ADAPTIVE_ASCENT_STEPS: usize = 6;

/// The fixed kinds are planned only when `stages × microbatches` is at most this.
pub const MAX_FIXED_SHAPE: u64 = 1_000_000;

/// The schedules the auto-planner considers, in tie-break order.
pub const AUTO_KINDS: [ScheduleKind; 11] = [
    ScheduleKind::GPipe,
    ScheduleKind::OneFOneB,
    ScheduleKind::Interleaved1F1B,
    ScheduleKind::ZbH1,
    ScheduleKind::ZbH2,
    ScheduleKind::VMin,
    ScheduleKind::VHalf,
    ScheduleKind::VZb,
    ScheduleKind::OneFOneBV,
    ScheduleKind::AdaptiveV,
    ScheduleKind::AdaptiveZb,
];

/// Relative tolerance when comparing step times.
const REL_EPS: f64 = 1e-9;

/// Measured pass times (milliseconds) of one transformer block at one microbatch size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LayerTimes {
    /// Forward.
    pub f: f64,
    /// Input-gradient backward.
    pub b: f64,
    /// Weight-gradient backward.
    pub w: f64,
    /// The microbatch size (sequences) they were measured at.
    pub microbatch_size: u32,
}

/// What to plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoRequest {
    /// The model.
    pub spec: ModelSpec,
    /// Sequences per training step.
    pub global_batch: u32,
    /// Pipeline workers `d`.
    pub workers: u32,
    /// Memory of one worker, in bytes.
    pub memory_per_worker: u64,
    /// Measured block times; `None` derives times from FLOPs at [`DEFAULT_FLOPS_PER_MS`].
    pub layer_times: Option<LayerTimes>,
    /// Latency of one hop between workers, in milliseconds.
    pub comm_ms: f64,
    /// How many fitting plans to rank; the other fitting ones are reported as slower.
    pub top: usize,
}

impl AutoRequest {
    /// Rejects an invalid spec, zero counts, a zero budget and bad times.
    pub fn validate(&self) -> Result<()> {
        self.spec.validate()?;
        let counts: [(&'static str, u64); 4] = [
            ("global batch", u64::from(self.global_batch)),
            ("workers", u64::from(self.workers)),
            ("memory per worker", self.memory_per_worker),
            ("top", self.top as u64),
        ];
        for (field, value) in counts {
            if value == 0 {
                return Err(Error::InvalidArgument {
                    field,
                    reason: "must be at least 1".into(),
                });
            }
        }
        if !self.comm_ms.is_finite() || self.comm_ms < 0.0 {
            return Err(Error::InvalidArgument {
                field: "times",
                reason: format!(
                    "communication time must be finite and ≥ 0, got {}",
                    self.comm_ms
                ),
            });
        }
        if let Some(t) = self.layer_times {
            if t.microbatch_size == 0 {
                return Err(Error::InvalidArgument {
                    field: "layer times",
                    reason: "the microbatch size must be at least 1".into(),
                });
            }
            Times {
                f: t.f,
                b: t.b,
                w: t.w,
                comm: 0.0,
            }
            .check()
            .map_err(|_| Error::InvalidArgument {
                field: "layer times",
                reason: format!(
                    "F, B, W must be finite, ≥ 0 and not all zero, got {},{},{}",
                    t.f, t.b, t.w
                ),
            })?;
        }
        Ok(())
    }
}

/// Costs of one piece at one microbatch size.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PieceCost {
    f: f64,
    b: f64,
    w: f64,
    /// Activation bytes held per microbatch (see the module docs).
    mem: u64,
    params: u64,
}

/// Per-piece costs at microbatch size `mbs`.
fn piece_costs(req: &AutoRequest, mbs: u32) -> Vec<PieceCost> {
    let spec = &req.spec;
    spec.pieces()
        .into_iter()
        .map(|p| {
            let flops = spec.piece_flops(p, mbs);
            let (f, b, w) = match req.layer_times {
                None => {
                    let t = flops / DEFAULT_FLOPS_PER_MS;
                    (t, t, t)
                }
                Some(lt) => {
                    let scale = flops / spec.piece_flops(Piece::Block(0), lt.microbatch_size);
                    (lt.f * scale, lt.b * scale, lt.w * scale)
                }
            };
            let act = spec.piece_activation_bytes(p, mbs);
            PieceCost {
                f,
                b,
                w,
                mem: act.after_forward.max(act.after_backward_input),
                params: spec.piece_params(p),
            }
        })
        .collect()
}

/// Minimises a stage objective over the partitions of `0..len` into `stages` contiguous
/// non-empty ranges. `cost(j, i)` is the cost of the stage `j..i` (`None`: not allowed);
/// the partition's objective folds the stage costs with `fold` (max or sum). Returns the
/// objective and the ranges, or `None` when no partition is allowed. Among equal
/// objectives the earliest cut wins.
///
/// Contract, which lets the search stop early: a longer stage never costs less (`cost(j, i)`
/// does not decrease as `j` decreases, and once it is `None` it stays `None`), and
/// `fold(a, c) >= c` for every objective `a >= 0` (max and sum of non-negative costs). So
/// the scan over a stage's start `j`, from the shortest stage down, ends at the first
/// stage that is not allowed or that alone costs more than the best so far; the search is
/// about `len²` steps in all rather than `stages · len²`.
fn partition_dp(
    len: usize,
    stages: usize,
    cost: &dyn Fn(usize, usize) -> Option<f64>,
    fold: fn(f64, f64) -> f64,
) -> Option<(f64, Vec<Range<usize>>)> {
    if stages == 0 || stages > len {
        return None;
    }
    // best[k][i]: best objective of the first i pieces in k stages; from[k][i]: the cut.
    let mut best = vec![vec![f64::INFINITY; len + 1]; stages + 1];
    let mut from = vec![vec![0usize; len + 1]; stages + 1];
    best[0][0] = 0.0;
    for k in 1..=stages {
        // Leave at least one piece for each of the stages still to come.
        for i in k..=len - (stages - k) {
            for j in ((k - 1)..i).rev() {
                let Some(c) = cost(j, i) else { break };
                if c > best[k][i] {
                    break;
                }
                let prev = best[k - 1][j];
                if !prev.is_finite() {
                    continue;
                }
                let value = if k == 1 { c } else { fold(prev, c) };
                // `<=`: the scan runs from the latest cut down, and the earliest wins.
                if value <= best[k][i] {
                    best[k][i] = value;
                    from[k][i] = j;
                }
            }
        }
    }
    let objective = best[stages][len];
    if !objective.is_finite() {
        return None;
    }
    let mut ranges = Vec::with_capacity(stages);
    let mut end = len;
    for k in (1..=stages).rev() {
        let start = from[k][end];
        ranges.push(start..end);
        end = start;
    }
    ranges.reverse();
    Some((objective, ranges))
}

/// Splits pieces with compute times `times` and parameter counts `params` into `stages`
/// contiguous non-empty ranges (indices into the slices).
///
/// Lexicographic objective: the smallest largest stage time; among those, the smallest
/// largest stage parameter count; among those, the smallest sum of squared stage times.
/// `None` when `stages` is 0, exceeds the piece count, or the slices differ in length.
pub fn balance(times: &[f64], params: &[u64], stages: usize) -> Option<Vec<Range<usize>>> {
    if times.len() != params.len() {
        return None;
    }
    let len = times.len();
    let mut tp = vec![0.0; len + 1];
    let mut pp = vec![0u64; len + 1];
    for i in 0..len {
        tp[i + 1] = tp[i] + times[i];
        pp[i + 1] = pp[i] + params[i];
    }
    let time = |j: usize, i: usize| tp[i] - tp[j];
    let par = |j: usize, i: usize| (pp[i] - pp[j]) as f64;
    let (t_max, _) = partition_dp(len, stages, &|j, i| Some(time(j, i)), f64::max)?;
    let t_cap = t_max * (1.0 + REL_EPS) + f64::MIN_POSITIVE;
    let (p_max, _) = partition_dp(
        len,
        stages,
        &|j, i| (time(j, i) <= t_cap).then(|| par(j, i)),
        f64::max,
    )?;
    let (_, ranges) = partition_dp(
        len,
        stages,
        &|j, i| (time(j, i) <= t_cap && par(j, i) <= p_max).then(|| time(j, i) * time(j, i)),
        |a, b| a + b,
    )?;
    Some(ranges)
}

/// A short text form of a partition: `emb+3 | 4 | 4 | 3+head`, with runs of three or more
/// equal middle stages written `4 ×5`.
pub fn partition_summary(spec: &ModelSpec, partition: &[Range<usize>]) -> String {
    let last = spec.layers as usize + 1;
    let mut items: Vec<String> = Vec::with_capacity(partition.len());
    for r in partition {
        let emb = r.start == 0 && r.end > 0;
        let head = r.start <= last && r.end > last;
        let blocks = r.end.min(last).saturating_sub(r.start.max(1));
        let mut parts: Vec<String> = Vec::new();
        if emb {
            parts.push("emb".into());
        }
        if blocks > 0 || (!emb && !head) {
            parts.push(blocks.to_string());
        }
        if head {
            parts.push("head".into());
        }
        items.push(parts.join("+"));
    }
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let mut j = i + 1;
        while j < items.len() && items[j] == items[i] {
            j += 1;
        }
        let run = j - i;
        if run >= 3 {
            out.push(format!("{} ×{run}", items[i]));
        } else {
            out.extend(items[i..j].iter().cloned());
        }
        i = j;
    }
    out.join(" | ")
}

fn serialize_kind<S: Serializer>(
    kind: &ScheduleKind,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(kind.name())
}

/// One planned configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The schedule kind.
    #[serde(serialize_with = "serialize_kind")]
    pub kind: ScheduleKind,
    /// Sequences per microbatch.
    pub microbatch_size: u32,
    /// Microbatches per step.
    pub microbatches: u32,
    /// Piece index ranges (into [`ModelSpec::pieces`]) of every stage, in stage order.
    pub partition: Vec<Range<usize>>,
    /// The worker holding each stage.
    pub stage_workers: Vec<u32>,
    /// Per-stage costs the schedule was planned and simulated with (times in ms, memory in
    /// bytes per microbatch).
    pub stage_costs: Vec<StageCost>,
    /// Predicted step time (simulated makespan), in milliseconds.
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
}

impl Candidate {
    /// `kind b×n`, e.g. `zb-h1 2×16`.
    pub fn label(&self) -> String {
        label(self.kind, self.microbatch_size, self.microbatches)
    }
}

fn label(kind: ScheduleKind, mbs: u32, n: u32) -> String {
    format!("{} {mbs}×{n}", kind.name())
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
    /// The schedule kind.
    #[serde(serialize_with = "serialize_kind")]
    pub kind: ScheduleKind,
    /// Sequences per microbatch.
    pub microbatch_size: u32,
    /// Microbatches per step.
    pub microbatches: u32,
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
    /// `kind b×n`, e.g. `zb-h1 2×16`.
    pub fn label(&self) -> String {
        label(self.kind, self.microbatch_size, self.microbatches)
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
enum Outcome {
    Planned(Box<Candidate>),
    Rejected(Rejected),
}

/// Plans every configuration of `req` and ranks the ones that fit.
///
/// Fails with [`Error::InvalidArgument`] on an invalid request, or with field
/// `"memory per worker"` when nothing fits, naming the smallest budget that would, or with
/// field `"workers"` when nothing can be planned at any budget (e.g. fewer model pieces
/// than stages), naming the reasons.
pub fn auto_plan(req: &AutoRequest) -> Result<AutoPlan> {
    req.validate()?;
    let per_param = req.spec.dtype.training_state_bytes();
    let mut planned: Vec<Candidate> = Vec::new();
    let mut rejected: Vec<Rejected> = Vec::new();
    for mbs in (1..=req.global_batch).filter(|b| req.global_batch.is_multiple_of(*b)) {
        let n = req.global_batch / mbs;
        let pieces = piece_costs(req, mbs);
        // The kinds with the same stage count share the partition of these pieces.
        let mut partitions = BTreeMap::new();
        for kind in AUTO_KINDS {
            match plan_one(req, kind, mbs, n, &pieces, per_param, &mut partitions)? {
                Outcome::Planned(c) => planned.push(*c),
                Outcome::Rejected(r) => rejected.push(r),
            }
        }
    }
    // Fastest first; then less memory; then the lower bubble; then search order (stable).
    planned.sort_by(|a, b| {
        let tol = REL_EPS * a.step_ms.max(b.step_ms);
        if (a.step_ms - b.step_ms).abs() > tol {
            a.step_ms.total_cmp(&b.step_ms)
        } else {
            a.max_worker_bytes
                .cmp(&b.max_worker_bytes)
                .then(a.bubble.total_cmp(&b.bubble))
        }
    });
    let (fits, no_fit): (Vec<Candidate>, Vec<Candidate>) =
        planned.into_iter().partition(|c| c.fits);
    for c in no_fit {
        let worst = c
            .worker_bytes
            .iter()
            .enumerate()
            .max_by_key(|&(_, b)| *b)
            .map_or(0, |(w, _)| w);
        rejected.push(Rejected {
            kind: c.kind,
            microbatch_size: c.microbatch_size,
            microbatches: c.microbatches,
            why: Why::DoesNotFit,
            reason: format!(
                "does not fit: worker {worst} needs {} > budget {} ({} static + {} activations)",
                fmt_bytes(c.max_worker_bytes as f64),
                fmt_bytes(req.memory_per_worker as f64),
                fmt_bytes(c.static_bytes[worst] as f64),
                fmt_bytes(c.activation_bytes[worst] as f64)
            ),
            needed_bytes: Some(c.max_worker_bytes),
            step_ms: Some(c.step_ms),
        });
    }
    if fits.is_empty() {
        let smallest = rejected
            .iter()
            .filter_map(|r| r.needed_bytes.map(|b| (b, r.label())))
            .min_by_key(|(b, _)| *b);
        let reason = match smallest {
            Some((u64::MAX, _)) => format!(
                "no plan fits {} bytes per worker; every plan needs more than 2^64 bytes",
                req.memory_per_worker
            ),
            Some((bytes, what)) => format!(
                "no plan fits {} bytes per worker; the smallest plan needs {bytes} bytes ({what})",
                req.memory_per_worker
            ),
            None => {
                // Nothing was even planned: the reasons are the shape's, not the budget's.
                let mut why: Vec<&str> = Vec::new();
                for r in &rejected {
                    if !why.contains(&r.reason.as_str()) {
                        why.push(&r.reason);
                    }
                }
                return Err(Error::InvalidArgument {
                    field: "workers",
                    reason: format!(
                        "no schedule could be planned for {} workers, {} layers and a global \
                         batch of {}: {}",
                        req.workers,
                        req.spec.layers,
                        req.global_batch,
                        why.iter().take(3).copied().collect::<Vec<_>>().join("; ")
                    ),
                });
            }
        };
        return Err(Error::InvalidArgument {
            field: "memory per worker",
            reason,
        });
    }
    let fitting = fits.len();
    let best_ms = fits[0].step_ms;
    let mut ranked = Vec::with_capacity(req.top.min(fitting));
    for (i, c) in fits.into_iter().enumerate() {
        if i < req.top {
            ranked.push(c);
        } else {
            rejected.push(Rejected {
                kind: c.kind,
                microbatch_size: c.microbatch_size,
                microbatches: c.microbatches,
                why: Why::Slower,
                reason: format!("slower: step {:.3} ms vs best {best_ms:.3} ms", c.step_ms),
                needed_bytes: Some(c.max_worker_bytes),
                step_ms: Some(c.step_ms),
            });
        }
    }
    Ok(AutoPlan {
        params: req.spec.params(),
        bytes_per_param: per_param,
        memory_per_worker: req.memory_per_worker,
        tokens_per_step: u64::from(req.global_batch) * u64::from(req.spec.seq_len),
        fitting,
        ranked,
        rejected,
    })
}

/// Between `fitting` (whose schedule `at` fits every worker) and `optimistic` (whose
/// schedule did not), bisects the activation limit for the largest one whose schedule still
/// fits every worker; returns the fastest fitting schedule seen and its limit.
fn widen_limit(
    search: &dyn Fn(f64) -> Result<crate::generate::Planned>,
    fits_all: &dyn Fn(&Simulation) -> bool,
    at: crate::generate::Planned,
    fitting: f64,
    optimistic: f64,
) -> Result<(crate::generate::Planned, f64)> {
    let (mut lo, mut hi) = (fitting, optimistic);
    let mut best = (at, fitting);
    for _ in 0..ADAPTIVE_ASCENT_STEPS {
        if hi - lo <= 0.01 * hi {
            break;
        }
        let mid = 0.5 * (lo + hi);
        match search(mid) {
            Ok(p) if fits_all(&p.simulation) => {
                if p.simulation.makespan < best.0.simulation.makespan {
                    best = (p, mid);
                }
                lo = mid;
            }
            Ok(_) | Err(Error::MemoryLimit { .. }) => hi = mid,
            Err(e) => return Err(e),
        }
    }
    Ok(best)
}

/// Plans one (kind, microbatch size) configuration. `partitions` holds the balanced
/// partitions of `pieces` by stage count, computed on first use.
fn plan_one(
    req: &AutoRequest,
    kind: ScheduleKind,
    mbs: u32,
    n: u32,
    pieces: &[PieceCost],
    per_param: u64,
    partitions: &mut BTreeMap<usize, Option<Vec<Range<usize>>>>,
) -> Result<Outcome> {
    let d = req.workers;
    let skip = |why: Why, reason: String, needed: Option<u64>| {
        Outcome::Rejected(Rejected {
            kind,
            microbatch_size: mbs,
            microbatches: n,
            why,
            reason,
            needed_bytes: needed,
            step_ms: None,
        })
    };
    if kind == ScheduleKind::Interleaved1F1B && !n.is_multiple_of(d) {
        return Ok(skip(
            Why::Skipped,
            format!(
                "skipped: {n} microbatch{} not a multiple of {d} workers",
                if n == 1 { " is" } else { "es are" }
            ),
            None,
        ));
    }
    let placement = kind.placement(d, INTERLEAVED_CHUNKS);
    let stages = placement.stages() as usize;
    if stages > pieces.len() {
        return Ok(skip(
            Why::Skipped,
            format!(
                "skipped: {stages} stages but the model has only {} pieces",
                pieces.len()
            ),
            None,
        ));
    }
    let shape = u64::from(n) * stages as u64;
    if kind.is_adaptive() && u64::from(n) * u64::from(d) > MAX_ADAPTIVE_SHAPE {
        return Ok(skip(
            Why::Skipped,
            format!("skipped: {n} microbatches × {d} workers is too large to search"),
            None,
        ));
    }
    if shape > MAX_FIXED_SHAPE {
        return Ok(skip(
            Why::Skipped,
            format!("skipped: {stages} stages × {n} microbatches is too large to plan"),
            None,
        ));
    }
    let partition = partitions.entry(stages).or_insert_with(|| {
        let times: Vec<f64> = pieces.iter().map(|p| p.f + p.b + p.w).collect();
        let params: Vec<u64> = pieces.iter().map(|p| p.params).collect();
        balance(&times, &params, stages)
    });
    let Some(partition) = partition.clone() else {
        return Ok(skip(
            Why::Skipped,
            "skipped: no partition of the pieces into the stages".into(),
            None,
        ));
    };
    let stage_costs: Vec<StageCost> = partition
        .iter()
        .map(|r| {
            let ps = &pieces[r.clone()];
            StageCost {
                f: ps.iter().map(|p| p.f).sum(),
                b: ps.iter().map(|p| p.b).sum(),
                w: ps.iter().map(|p| p.w).sum(),
                mem: ps.iter().map(|p| p.mem).fold(0, u64::saturating_add) as f64,
            }
        })
        .collect();
    let costs = Costs::per_stage(&placement, stage_costs.clone(), req.comm_ms)?;
    let stage_workers: Vec<u32> = (0..stages as u32).map(|s| placement.worker_of(s)).collect();
    let mut static_bytes = vec![0u64; d as usize];
    for (s, r) in partition.iter().enumerate() {
        let p = pieces[r.clone()]
            .iter()
            .map(|p| p.params)
            .fold(0, u64::saturating_add);
        let w = stage_workers[s] as usize;
        static_bytes[w] = static_bytes[w].saturating_add(p.saturating_mul(per_param));
    }
    let max_static = static_bytes.iter().copied().max().unwrap_or(0);
    let budget = req.memory_per_worker;

    let (schedule, sim, note) = if kind.is_adaptive() {
        let room = static_bytes
            .iter()
            .map(|&s| budget as f64 - s as f64)
            .fold(f64::INFINITY, f64::min);
        let search = |limit: f64| match kind {
            ScheduleKind::AdaptiveV => adaptive_v(d, n, &costs, limit, LOCAL_SEARCH_BUDGET),
            _ => adaptive_zb(d, n, &costs, limit, LOCAL_SEARCH_BUDGET),
        };
        // The bytes the fullest worker of a schedule needs.
        let needs = |sim: &Simulation| {
            worker_bytes(&static_bytes, &activation_bytes(sim))
                .into_iter()
                .max()
                .unwrap_or(0)
        };
        // What the least-memory schedule (the one found at the smallest limit the search
        // accepts) needs: a budget this procedure accepts (it tries that limit).
        let least_need = |smallest: f64| match search(smallest) {
            Ok(p) => Some(needs(&p.simulation)),
            Err(_) => None,
        };
        if room < 1.0 {
            // Static state alone does not fit: ask for the smallest activation limit.
            let needed = match search(f64::MIN_POSITIVE) {
                Err(Error::MemoryLimit { smallest, .. }) => least_need(smallest),
                _ => None,
            };
            return Ok(skip(
                Why::DoesNotFit,
                static_reason(&static_bytes, budget),
                needed,
            ));
        }
        let fits_all = |sim: &Simulation| needs(sim) <= budget;
        // One limit serves every worker: first the room on the emptiest worker (kept only
        // if every worker then fits), then the room on the fullest one (always fits).
        let min_static = static_bytes.iter().copied().min().unwrap_or(0);
        let optimistic = budget as f64 - min_static as f64;
        let mut found: Option<(crate::generate::Planned, f64)> = None;
        let mut failure: Option<Error> = None;
        // The need of the least-memory schedule, when it was planned and did not fit.
        let mut least: Option<u64> = None;
        match search(optimistic) {
            Ok(p) if fits_all(&p.simulation) => found = Some((p, optimistic)),
            Ok(_) => {}
            Err(e) => failure = Some(e),
        }
        if found.is_none() && optimistic > room {
            match search(room) {
                Ok(p) => found = Some(widen_limit(&search, &fits_all, p, room, optimistic)?),
                // No schedule fits in the room on the fullest worker; the least-memory one
                // may still fit every worker when its peaks fall on the emptier ones.
                Err(Error::MemoryLimit {
                    schedule,
                    limit,
                    smallest,
                }) => match search(smallest) {
                    Ok(p) if fits_all(&p.simulation) => {
                        found = Some(widen_limit(&search, &fits_all, p, smallest, optimistic)?);
                    }
                    Ok(p) => {
                        failure = Some(Error::MemoryLimit {
                            schedule,
                            limit,
                            smallest,
                        });
                        least = Some(needs(&p.simulation));
                    }
                    Err(e) => failure = Some(e),
                },
                Err(e) => failure = Some(e),
            }
        }
        match (found, failure) {
            (Some((mut planned, mut limit)), _) => {
                // The search breaks makespan ties by bubble, not memory: bisect the limit
                // for the least memory that keeps the makespan.
                let best_ms = planned.simulation.makespan * (1.0 + REL_EPS);
                let mut lo = 0.0f64;
                for _ in 0..ADAPTIVE_DESCENT_STEPS {
                    let hi = planned.simulation.max_peak_memory();
                    if hi - lo <= 0.01 * hi {
                        break;
                    }
                    let mid = 0.5 * (lo + hi);
                    match search(mid) {
                        Ok(p) if p.simulation.makespan <= best_ms && fits_all(&p.simulation) => {
                            planned = p;
                            limit = mid;
                        }
                        Ok(_) | Err(Error::MemoryLimit { .. }) => lo = mid,
                        Err(e) => return Err(e),
                    }
                }
                (
                    planned.schedule,
                    planned.simulation,
                    format!(
                        "searched under an activation limit of {} per worker, the lowest found \
                         that keeps its step time (the budget leaves {} for activations on the \
                         fullest worker, {} on the emptiest)",
                        fmt_bytes(limit),
                        fmt_bytes(room),
                        fmt_bytes(optimistic)
                    ),
                )
            }
            (None, Some(Error::MemoryLimit { smallest, .. })) => {
                let needed = least.or_else(|| least_need(smallest));
                return Ok(skip(
                    Why::DoesNotFit,
                    format!(
                        "does not fit: the smallest {} schedule needs {} of activations per \
                         worker, {} are left after the static state{}",
                        kind.name(),
                        fmt_bytes(smallest.ceil()),
                        fmt_bytes(room),
                        needed.map_or(String::new(), |b| format!(
                            " (it needs {} on its fullest worker)",
                            fmt_bytes(b as f64)
                        ))
                    ),
                    needed,
                ));
            }
            (None, Some(e)) => return Ok(skip(Why::Skipped, format!("skipped: {e}"), None)),
            (None, None) => {
                return Ok(skip(
                    Why::DoesNotFit,
                    format!(
                        "does not fit: no {} schedule fits every worker",
                        kind.name()
                    ),
                    None,
                ));
            }
        }
    } else {
        let request = Request {
            kind,
            workers: d,
            microbatches: n,
            chunks: INTERLEAVED_CHUNKS,
            times: Times::UNIT,
            memory_limit: None,
        };
        let schedule = match generate_with(&request, &|_| Ok(costs.clone())) {
            Ok(s) => s,
            Err(e) => return Ok(skip(Why::Skipped, format!("skipped: {e}"), None)),
        };
        let sim: Simulation = simulate(&schedule, &costs)?;
        (schedule, sim, String::new())
    };
    let activation_bytes = activation_bytes(&sim);
    let worker_bytes = worker_bytes(&static_bytes, &activation_bytes);
    let max_worker_bytes = worker_bytes.iter().copied().max().unwrap_or(0);
    if max_static > budget {
        return Ok(skip(
            Why::DoesNotFit,
            static_reason(&static_bytes, budget),
            Some(max_worker_bytes),
        ));
    }
    let step_ms = sim.makespan;
    let tokens = f64::from(req.global_batch) * f64::from(req.spec.seq_len);
    Ok(Outcome::Planned(Box::new(Candidate {
        kind,
        microbatch_size: mbs,
        microbatches: n,
        partition,
        stage_workers,
        stage_costs,
        step_ms,
        bubble: sim.bubble,
        bubble_span: sim.bubble_span,
        tokens_per_s: if step_ms > 0.0 {
            tokens / (step_ms / 1000.0)
        } else {
            f64::INFINITY
        },
        static_bytes,
        activation_bytes,
        fits: max_worker_bytes <= budget,
        worker_bytes,
        max_worker_bytes,
        note,
        schedule,
    })))
}

/// "parameters and optimizer state need X on worker w" for the fullest worker.
/// Each worker's simulated activation peak, in whole bytes.
fn activation_bytes(sim: &Simulation) -> Vec<u64> {
    sim.peak_memory.iter().map(|m| m.ceil() as u64).collect()
}

/// What each worker holds: its static state plus its activation peak.
fn worker_bytes(static_bytes: &[u64], activation_bytes: &[u64]) -> Vec<u64> {
    static_bytes
        .iter()
        .zip(activation_bytes)
        .map(|(s, a)| s.saturating_add(*a))
        .collect()
}

fn static_reason(static_bytes: &[u64], budget: u64) -> String {
    let (w, bytes) = static_bytes
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|&(_, b)| b)
        .unwrap_or((0, 0));
    format!(
        "does not fit: parameters and optimizer state need {} on worker {w} > budget {}",
        fmt_bytes(bytes as f64),
        fmt_bytes(budget as f64)
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec(layers: u32, vocab: u32) -> ModelSpec {
        ModelSpec {
            vocab,
            hidden: 64,
            heads: 4,
            layers,
            seq_len: 32,
            dtype: crate::model::DType::BF16,
        }
    }

    fn request(layers: u32, vocab: u32, workers: u32, memory: u64) -> AutoRequest {
        AutoRequest {
            spec: spec(layers, vocab),
            global_batch: 8,
            workers,
            memory_per_worker: memory,
            layer_times: None,
            comm_ms: 0.0,
            top: 3,
        }
    }

    /// Every composition of `len` into `stages` positive parts, as ranges.
    fn compositions(len: usize, stages: usize) -> Vec<Vec<Range<usize>>> {
        if stages == 1 {
            return vec![vec![0..len]];
        }
        let mut out = Vec::new();
        for first in 1..=len - (stages - 1) {
            for rest in compositions(len - first, stages - 1) {
                let mut p = vec![Range {
                    start: 0,
                    end: first,
                }];
                p.extend(rest.into_iter().map(|r| r.start + first..r.end + first));
                out.push(p);
            }
        }
        out
    }

    fn key(times: &[f64], params: &[u64], p: &[Range<usize>]) -> (f64, u64, f64) {
        let t: Vec<f64> = p.iter().map(|r| times[r.clone()].iter().sum()).collect();
        let max_t = t.iter().copied().fold(0.0, f64::max);
        let max_p = p
            .iter()
            .map(|r| params[r.clone()].iter().sum::<u64>())
            .max()
            .unwrap();
        (max_t, max_p, t.iter().map(|x| x * x).sum())
    }

    /// `partition_dp` without its early stops: every cut of every stage.
    fn partition_full_scan(
        len: usize,
        stages: usize,
        cost: &dyn Fn(usize, usize) -> Option<f64>,
        fold: fn(f64, f64) -> f64,
    ) -> Option<(f64, Vec<Range<usize>>)> {
        if stages == 0 || stages > len {
            return None;
        }
        let mut best = vec![vec![f64::INFINITY; len + 1]; stages + 1];
        let mut from = vec![vec![0usize; len + 1]; stages + 1];
        best[0][0] = 0.0;
        for k in 1..=stages {
            for i in k..=len - (stages - k) {
                for j in (k - 1)..i {
                    let prev = best[k - 1][j];
                    let Some(c) = cost(j, i).filter(|_| prev.is_finite()) else {
                        continue;
                    };
                    let value = if k == 1 { c } else { fold(prev, c) };
                    if value < best[k][i] {
                        best[k][i] = value;
                        from[k][i] = j;
                    }
                }
            }
        }
        let objective = best[stages][len];
        if !objective.is_finite() {
            return None;
        }
        let mut ranges = vec![0..0; stages];
        let mut end = len;
        for k in (1..=stages).rev() {
            ranges[k - 1] = from[k][end]..end;
            end = from[k][end];
        }
        Some((objective, ranges))
    }

    /// The early stops change nothing: the same objective and the same cuts (ties
    /// included) as the full scan, for max and sum folds and for costs with caps.
    #[test]
    fn partition_dp_matches_the_full_scan() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for case in 0..300 {
            let len = 1 + next(40) as usize;
            let stages = 1 + next(len as u64) as usize;
            let times: Vec<f64> = (0..len).map(|_| next(4) as f64).collect();
            let mut prefix = vec![0.0; len + 1];
            for i in 0..len {
                prefix[i + 1] = prefix[i] + times[i];
            }
            let cap = prefix[len] / stages as f64 + next(6) as f64;
            let time = |j: usize, i: usize| prefix[i] - prefix[j];
            let capped = |j: usize, i: usize| (time(j, i) <= cap).then(|| time(j, i));
            let squared = |j: usize, i: usize| capped(j, i).map(|t| t * t);
            let costs: [&dyn Fn(usize, usize) -> Option<f64>; 3] =
                [&|j, i| Some(time(j, i)), &capped, &squared];
            for cost in costs {
                for fold in [f64::max, |a: f64, b: f64| a + b] {
                    assert_eq!(
                        partition_dp(len, stages, cost, fold),
                        partition_full_scan(len, stages, cost, fold),
                        "case {case}: {times:?} in {stages} stages, cap {cap}"
                    );
                }
            }
        }
    }

    #[test]
    fn balance_matches_brute_force() {
        // A small deterministic pseudo-random generator (no external crates).
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for case in 0..200 {
            let len = 1 + next(8) as usize;
            let stages = 1 + next(len as u64) as usize;
            // Small integer times so that ties (and the tie-breaks) really occur.
            let times: Vec<f64> = (0..len).map(|_| 1.0 + next(4) as f64).collect();
            let params: Vec<u64> = (0..len).map(|_| 1 + next(5)).collect();
            let got = balance(&times, &params, stages).unwrap();
            assert_eq!(got.len(), stages, "case {case}");
            assert_eq!(got[0].start, 0);
            assert_eq!(got[stages - 1].end, len);
            for w in got.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            assert!(got.iter().all(|r| !r.is_empty()));
            let best = compositions(len, stages)
                .into_iter()
                .map(|p| key(&times, &params, &p))
                .min_by(|a, b| {
                    a.0.total_cmp(&b.0)
                        .then(a.1.cmp(&b.1))
                        .then(a.2.total_cmp(&b.2))
                })
                .unwrap();
            let mine = key(&times, &params, &got);
            assert_eq!(mine.0, best.0, "case {case}: max time {times:?} {params:?}");
            assert_eq!(mine.1, best.1, "case {case}: max params");
            assert!((mine.2 - best.2).abs() < 1e-9, "case {case}: spread");
        }
        assert_eq!(balance(&[1.0, 2.0], &[1, 1], 3), None);
        assert_eq!(balance(&[1.0, 2.0], &[1, 1], 0), None);
        assert_eq!(balance(&[1.0], &[1, 1], 1), None);
    }

    #[test]
    fn heavy_head_and_embedding_get_fewer_blocks() {
        // Vocabulary 4096, h = 64, t = 32: the head costs 2V/(24h + 4t) ≈ 4.9 blocks of
        // compute and the embedding V/(12h) ≈ 5 blocks of parameters. The head's stage
        // (head + 1 block ≈ 5.9) sets the largest time; the parameter tie-break then moves
        // blocks away from the embedding's stage: 3 | 5 | 5 | 1.
        let req = request(14, 4096, 4, u64::MAX);
        let pieces = piece_costs(&req, 1);
        let times: Vec<f64> = pieces.iter().map(|p| p.f + p.b + p.w).collect();
        let params: Vec<u64> = pieces.iter().map(|p| p.params).collect();
        let p = balance(&times, &params, 4).unwrap();
        let last = req.spec.layers as usize + 1;
        let blocks = |r: &Range<usize>| r.end.min(last).saturating_sub(r.start.max(1));
        let counts: Vec<usize> = p.iter().map(blocks).collect();
        assert_eq!(counts.iter().sum::<usize>(), 14);
        let most = *counts.iter().max().unwrap();
        assert!(counts[0] < most, "{counts:?}");
        assert!(counts[3] < most, "{counts:?}");
        let text = partition_summary(&req.spec, &p);
        assert!(text.starts_with("emb+"), "{text}");
        assert!(text.ends_with("head"), "{text}");
        // A tiny vocabulary: the blocks split evenly.
        let req = request(16, 8, 4, u64::MAX);
        let pieces = piece_costs(&req, 1);
        let times: Vec<f64> = pieces.iter().map(|p| p.f + p.b + p.w).collect();
        let params: Vec<u64> = pieces.iter().map(|p| p.params).collect();
        let p = balance(&times, &params, 4).unwrap();
        assert_eq!(partition_summary(&req.spec, &p), "emb+4 | 4 | 4 | 4+head");
    }

    #[test]
    fn summary_forms() {
        let s = spec(6, 256);
        assert_eq!(partition_summary(&s, &[0..1, 1..7, 7..8]), "emb | 6 | head");
        let whole = Range { start: 0, end: 8 };
        assert_eq!(partition_summary(&s, &[whole]), "emb+6+head");
        assert_eq!(
            partition_summary(&s, &[0..2, 2..3, 3..4, 4..5, 5..6, 6..8]),
            "emb+1 | 1 ×4 | 1+head"
        );
    }

    #[test]
    fn rejects_bad_requests() {
        let good = request(4, 256, 2, 1 << 30);
        assert!(good.validate().is_ok());
        let cases: [(&str, AutoRequest); 6] = [
            (
                "global batch",
                AutoRequest {
                    global_batch: 0,
                    ..good.clone()
                },
            ),
            (
                "workers",
                AutoRequest {
                    workers: 0,
                    ..good.clone()
                },
            ),
            (
                "memory per worker",
                AutoRequest {
                    memory_per_worker: 0,
                    ..good.clone()
                },
            ),
            (
                "times",
                AutoRequest {
                    comm_ms: f64::NAN,
                    ..good.clone()
                },
            ),
            (
                "layer times",
                AutoRequest {
                    layer_times: Some(LayerTimes {
                        f: 1.0,
                        b: -1.0,
                        w: 1.0,
                        microbatch_size: 1,
                    }),
                    ..good.clone()
                },
            ),
            (
                "heads",
                AutoRequest {
                    spec: ModelSpec {
                        heads: 5,
                        ..good.spec
                    },
                    ..good.clone()
                },
            ),
        ];
        for (want, req) in cases {
            match auto_plan(&req) {
                Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, want),
                other => panic!("expected {want}, got {other:?}"),
            }
        }
    }

    #[test]
    fn rejection_reasons() {
        let loose = auto_plan(&request(4, 256, 2, u64::MAX)).unwrap();
        assert_eq!(loose.ranked.len(), 3);
        assert!(
            loose
                .ranked
                .windows(2)
                .all(|w| w[0].step_ms <= w[1].step_ms)
        );
        // Everything fitting beyond the top 3 is reported slower than the best.
        let slower: Vec<&Rejected> = loose
            .rejected
            .iter()
            .filter(|r| r.why == Why::Slower)
            .collect();
        assert_eq!(slower.len(), loose.fitting - 3);
        for r in &slower {
            assert!(r.reason.starts_with("slower: step"), "{}", r.reason);
            assert!(r.step_ms.unwrap() >= loose.ranked[0].step_ms);
        }
        // 2 workers, 4 layers: V placements have 4 stages ≤ 6 pieces; 16 pieces never.
        assert!(loose.rejected.iter().all(|r| r.why != Why::DoesNotFit));

        // A budget between the smallest and the largest plan: some do not fit, with the
        // bytes they need above the budget.
        let mut needs: Vec<u64> = loose
            .ranked
            .iter()
            .map(|c| c.max_worker_bytes)
            .chain(loose.rejected.iter().filter_map(|r| r.needed_bytes))
            .collect();
        needs.sort_unstable();
        let budget = needs[needs.len() / 2];
        let mid = auto_plan(&request(4, 256, 2, budget)).unwrap();
        assert!(
            mid.ranked
                .iter()
                .all(|c| c.fits && c.max_worker_bytes <= budget)
        );
        let no_fit: Vec<&Rejected> = mid
            .rejected
            .iter()
            .filter(|r| r.why == Why::DoesNotFit)
            .collect();
        assert!(!no_fit.is_empty());
        for r in no_fit {
            assert!(r.reason.starts_with("does not fit"), "{}", r.reason);
            assert!(r.needed_bytes.is_none_or(|b| b > budget), "{r:?}");
        }

        // Far below every plan: a clear error naming the smallest need; that budget fits.
        let smallest = match auto_plan(&request(4, 256, 2, 1000)) {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "memory per worker");
                let tail = reason.split("the smallest plan needs ").nth(1).unwrap();
                tail.split(' ').next().unwrap().parse::<u64>().unwrap()
            }
            other => panic!("expected a memory error, got {other:?}"),
        };
        assert!(smallest <= needs[0]);
        let at = auto_plan(&request(4, 256, 2, smallest)).unwrap();
        assert!(at.ranked.iter().all(|c| c.max_worker_bytes <= smallest));
        // Parameters alone over budget name the static state.
        let tiny = auto_plan(&request(4, 256, 2, 1000));
        assert!(matches!(tiny, Err(Error::InvalidArgument { .. })));
        let r = plan_one(
            &request(4, 256, 2, 1000),
            ScheduleKind::OneFOneB,
            1,
            8,
            &piece_costs(&request(4, 256, 2, 1000), 1),
            12,
            &mut BTreeMap::new(),
        )
        .unwrap();
        match r {
            Outcome::Rejected(r) => {
                assert!(
                    r.reason.contains("parameters and optimizer state"),
                    "{}",
                    r.reason
                )
            }
            Outcome::Planned(_) => panic!("1000 bytes cannot fit"),
        }
    }

    #[test]
    fn too_many_stages_are_skipped() {
        // 1 layer = 3 pieces; V on 2 workers needs 4 stages.
        let plan = auto_plan(&request(1, 256, 2, u64::MAX)).unwrap();
        assert!(plan.rejected.iter().any(|r| r.kind == ScheduleKind::VMin
            && r.why == Why::Skipped
            && r.reason.contains("only 3 pieces")));
        assert!(plan.ranked.iter().all(|c| c.partition.len() == 2));
    }

    #[test]
    fn too_few_layers_for_the_workers_name_the_shape_not_the_budget() {
        // 1 layer = 3 pieces, 4 workers need 4 stages: nothing can be planned at any budget.
        match auto_plan(&request(1, 256, 4, u64::MAX)) {
            Err(Error::InvalidArgument { field, reason }) => {
                assert_eq!(field, "workers");
                assert!(reason.contains("only 3 pieces"), "{reason}");
            }
            other => panic!("expected an error naming the workers, got {other:?}"),
        }
    }

    #[test]
    fn measured_times_scale_with_flops() {
        let mut req = request(4, 256, 2, u64::MAX);
        req.layer_times = Some(LayerTimes {
            f: 2.0,
            b: 3.0,
            w: 1.0,
            microbatch_size: 2,
        });
        let pieces = piece_costs(&req, 4);
        // Block at microbatch 4 = twice the measured block at 2.
        assert!((pieces[1].f - 4.0).abs() < 1e-12);
        assert!((pieces[1].b - 6.0).abs() < 1e-12);
        assert!((pieces[1].w - 2.0).abs() < 1e-12);
        let ratio = req.spec.piece_flops(Piece::Head, 4) / req.spec.piece_flops(Piece::Block(0), 2);
        assert!((pieces[5].f - 2.0 * ratio).abs() < 1e-12);
    }
}
