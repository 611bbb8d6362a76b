//! What the auto-planner is asked, and what each piece of the model costs at a microbatch
//! size (its F, B, W times, activation bytes and parameters).

use serde::Serialize;

use crate::cost::Times;
use crate::error::{Error, Result};
use crate::model::{ModelSpec, Piece};
use crate::schedule::Recompute;

/// Sustained FLOP rate assumed without measured times: `1e11` FLOPs per millisecond
/// (100 TFLOP/s, a modest sustained rate for a current datacenter GPU in bf16).
pub const DEFAULT_FLOPS_PER_MS: f64 = 1e11;

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

/// How the search plans activation recomputation ([`Recompute`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RecomputeSearch {
    /// Every stage of every plan recomputes this way.
    Every(Recompute),
    /// Each plan of a fixed kind recomputes only where a worker would overflow the budget:
    /// on that worker's stage with the largest stash, `selective` before `full`, stage by
    /// stage until it fits (the adaptive kinds fit their schedule to the budget instead).
    WhereNeeded,
}

impl Default for RecomputeSearch {
    fn default() -> Self {
        RecomputeSearch::Every(Recompute::None)
    }
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
    /// Costs a running job measured (`None`: FLOPs or [`AutoRequest::layer_times`]).
    pub measured: Option<Measured>,
    /// What the job fixes; the search covers the rest.
    pub fixed: Fixed,
    /// Data-parallel replicas of the pipeline: a fixed count, or every count the workers
    /// and the batch allow.
    pub replicas: Replicas,
    /// How the stages recompute their activations.
    pub recompute: RecomputeSearch,
}

/// Milliseconds per gradient value summed over replicas before any sum is measured: 8 bytes
/// out and 8 back at about 1 GB/s.
pub const DEFAULT_SUM_MS_PER_VALUE: f64 = 16e-6;

/// The data-parallel replicas a search plans (torchtitan's `data_parallel_replicate_degree`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Replicas {
    /// `Some(r)`: `r` replicas of a pipeline of [`AutoRequest::workers`] workers, each taking
    /// `1/r` of the global batch. `None`: [`AutoRequest::workers`] is every worker, and the
    /// search weighs each `r` dividing it and the global batch, on pipelines of
    /// `workers / r`.
    pub count: Option<u32>,
    /// Milliseconds per gradient value summed over the replicas (each stage's sum starts
    /// when its last gradient pass ends, beside the rest of the drain).
    pub sum_ms_per_value: f64,
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas {
            count: Some(1),
            sum_ms_per_value: DEFAULT_SUM_MS_PER_VALUE,
        }
    }
}

impl AutoRequest {
    /// A request for `workers` workers of `memory_per_worker` bytes, ranking `top` plans,
    /// with nothing else given: times from FLOPs, free hops, nothing measured or fixed, one
    /// replica.
    pub fn new(
        spec: ModelSpec,
        global_batch: u32,
        workers: u32,
        memory_per_worker: u64,
        top: usize,
    ) -> AutoRequest {
        AutoRequest {
            spec,
            global_batch,
            workers,
            memory_per_worker,
            layer_times: None,
            comm_ms: 0.0,
            top,
            measured: None,
            fixed: Fixed::default(),
            replicas: Replicas::default(),
            recompute: RecomputeSearch::default(),
        }
    }

    /// The (replicas, pipeline workers) shapes searched, fewest replicas first: the fixed
    /// one, or every `r` dividing the workers and the global batch.
    pub fn shapes(&self) -> Vec<(u32, u32)> {
        match self.replicas.count {
            Some(r) => vec![(r, self.workers)],
            None => (1..=self.workers)
                .filter(|r| self.workers.is_multiple_of(*r) && self.global_batch.is_multiple_of(*r))
                .map(|r| (r, self.workers / r))
                .collect(),
        }
    }

    /// The request for one shape: `r` replicas of `d` workers, each taking its share of the
    /// batch; measured worker factors are the slowest worker of each rank over the replicas.
    pub(super) fn shape(&self, (r, d): (u32, u32)) -> AutoRequest {
        let mut sub = self.clone();
        sub.workers = d;
        sub.global_batch = self.global_batch / r.max(1);
        sub.replicas.count = Some(r);
        if self.replicas.count.is_none()
            && let Some(m) = &mut sub.measured
        {
            m.slowest_per_rank(d);
        }
        sub
    }
}

/// Costs from a job's cost model ([`crate::calibration::CostModel`]): what a pass over each
/// piece takes, each worker's speed, the hop.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// F, B, W milliseconds of the embedding, a block and the head, for a worker of the
    /// workers' mean speed, at [`Measured::microbatch_size`] (scaled linearly to others).
    pub pieces: [[f64; 3]; 3],
    /// The microbatch size the piece times are for.
    pub microbatch_size: u32,
    /// Every worker's pass times over a mean worker's (1: as fast as the mean). Stages are
    /// split to balance the workers at these speeds, and cost that much more on slow ones.
    /// With a replica search ([`Replicas::count`] `None`), one per worker replica by
    /// replica (`replica · d + rank`): each rank plans with its slowest replica's.
    pub worker_factors: Vec<f64>,
    /// Milliseconds of one hop per sequence in the microbatch (added to `comm_ms`).
    pub hop_ms_per_sequence: f64,
}

impl Measured {
    /// Worker factors given replica by replica (`replica · d + rank`) become one per rank:
    /// the slowest replica's, since every replica runs the same plan and the step waits
    /// for the last. Factors already one per rank stay.
    pub fn slowest_per_rank(&mut self, d: u32) {
        let d = d.max(1) as usize;
        if self.worker_factors.len() > d {
            self.worker_factors = slowest_per_rank(&self.worker_factors, d);
        }
    }
}

/// Per-worker factors given replica by replica (`replica · d + rank`), one per rank: the
/// slowest replica's.
pub fn slowest_per_rank(factors: &[f64], d: usize) -> Vec<f64> {
    (0..d)
        .map(|rank| {
            factors
                .iter()
                .skip(rank)
                .step_by(d.max(1))
                .copied()
                .fold(0.0, f64::max)
        })
        .collect()
}

/// What a job fixes of the plan (torchtitan's overrides); the search covers the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Fixed {
    /// Sequences per microbatch (`None`: every size dividing the global batch).
    pub microbatch_size: Option<u32>,
    /// torchtitan's layer split: first and last stage less layers, layers per stage
    /// (`None`: the balanced split).
    pub split: Option<(u32, u32, Option<u32>)>,
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
        let r = self.replicas.count.unwrap_or(1);
        if r == 0 || !self.global_batch.is_multiple_of(r) {
            return Err(Error::InvalidArgument {
                field: "replicas",
                reason: format!(
                    "{r} replicas do not divide the global batch of {}",
                    self.global_batch
                ),
            });
        }
        let sum = self.replicas.sum_ms_per_value;
        if !sum.is_finite() || sum < 0.0 {
            return Err(Error::InvalidArgument {
                field: "replicas",
                reason: format!(
                    "the sum's milliseconds per value must be finite and ≥ 0, got {sum}"
                ),
            });
        }
        if let Some(mbs) = self.fixed.microbatch_size
            && (mbs == 0
                || !mbs
                    .checked_mul(r)
                    .is_some_and(|per_step| self.global_batch.is_multiple_of(per_step)))
        {
            return Err(Error::InvalidArgument {
                field: "microbatch size",
                reason: format!(
                    "{mbs} does not divide the global batch of {} (in {r} replica{})",
                    self.global_batch,
                    if r == 1 { "" } else { "s" }
                ),
            });
        }
        if let Some(m) = &self.measured {
            let finite = |x: &f64| x.is_finite() && *x >= 0.0;
            if m.microbatch_size == 0
                || !m.pieces.as_flattened().iter().all(finite)
                || !finite(&m.hop_ms_per_sequence)
                || m.worker_factors.len() != self.workers as usize
                || !m.worker_factors.iter().all(|f| f.is_finite() && *f > 0.0)
            {
                return Err(Error::InvalidArgument {
                    field: "measured costs",
                    reason: format!(
                        "piece times and the hop must be finite and ≥ 0, the microbatch size \
                         at least 1, and one factor > 0 per worker ({} workers), got {m:?}",
                        self.workers
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Costs of one piece at one microbatch size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct PieceCost {
    pub(super) f: f64,
    pub(super) b: f64,
    pub(super) w: f64,
    /// Activation bytes held per microbatch (see the [module docs](super)).
    pub(super) mem: u64,
    pub(super) params: u64,
}

/// Per-piece costs at microbatch size `mbs`.
pub(super) fn piece_costs(req: &AutoRequest, mbs: u32) -> Vec<PieceCost> {
    let spec = &req.spec;
    spec.pieces()
        .into_iter()
        .map(|p| {
            let flops = spec.piece_flops(p, mbs);
            let (f, b, w) = match (&req.measured, req.layer_times) {
                (Some(m), _) => {
                    let i = match p {
                        Piece::Embedding => 0,
                        Piece::Block(_) => 1,
                        Piece::Head => 2,
                    };
                    let scale = f64::from(mbs) / f64::from(m.microbatch_size);
                    let [f, b, w] = m.pieces[i];
                    (f * scale, b * scale, w * scale)
                }
                (None, None) => {
                    let t = flops / DEFAULT_FLOPS_PER_MS;
                    (t, t, t)
                }
                (None, Some(lt)) => {
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
