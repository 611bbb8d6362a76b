//! Planning one configuration (a kind at a microbatch size): its partition, stage costs,
//! static state per worker, schedule and simulation, or the reason it is not planned.

use std::collections::BTreeMap;
use std::ops::Range;

use super::activation_limit::{Searched, search_limit};
use super::candidate::{Candidate, Configuration, Outcome, Rejected, Why};
use super::request::{AutoRequest, PieceCost};
use super::worker_memory::{activation_bytes, static_reason, worker_bytes};
use crate::calibration::sums_end;
use crate::cost::{Costs, StageCost, Times};
use crate::error::Result;
use crate::generate::{Request, ScheduleKind, generate_with};
use crate::partition::{balance, by_counts, split_for_speeds, torchtitan_counts};
use crate::simulate::{Simulation, simulate};

/// Chunks per worker of the interleaved 1F1B candidates.
pub const INTERLEAVED_CHUNKS: u32 = 2;

/// The adaptive kinds are searched only when `microbatches × workers` is at most this.
pub const MAX_ADAPTIVE_SHAPE: u64 = 8192;

/// The fixed kinds are planned only when `stages × microbatches` is at most this.
pub const MAX_FIXED_SHAPE: u64 = 1_000_000;

/// The partition of `pieces` into the stages of `stage_workers` (stage → worker): the
/// job's fixed torchtitan split, else with measured worker speeds the split balancing the
/// workers at those speeds ([`split_for_speeds`]), else [`balance`]d stages.
fn split(
    req: &AutoRequest,
    pieces: &[PieceCost],
    stage_workers: &[u32],
) -> std::result::Result<Vec<Range<usize>>, String> {
    let stages = stage_workers.len();
    let times: Vec<f64> = pieces.iter().map(|p| p.f + p.b + p.w).collect();
    let counts = match (req.fixed.split, &req.measured) {
        (Some((first, last, per_stage)), _) => {
            torchtitan_counts(req.spec.layers, stages as u32, first, last, per_stage)
                .map_err(|e| e.to_string())?
        }
        (None, Some(m)) => {
            split_for_speeds(&times, stage_workers, &m.worker_factors).map_err(|e| e.to_string())?
        }
        (None, None) => {
            let params: Vec<u64> = pieces.iter().map(|p| p.params).collect();
            return balance(&times, &params, stages)
                .ok_or_else(|| "no partition of the pieces into the stages".into());
        }
    };
    by_counts(pieces.len(), &counts).map_err(|e| e.to_string())
}

/// Plans one (kind, microbatch size) configuration. `partitions` holds the partitions of
/// `pieces` by the stages' workers ([`split`]), computed on first use.
pub(super) fn plan_one(
    req: &AutoRequest,
    kind: ScheduleKind,
    mbs: u32,
    n: u32,
    pieces: &[PieceCost],
    per_param: u64,
    partitions: &mut BTreeMap<Vec<u32>, std::result::Result<Vec<Range<usize>>, String>>,
) -> Result<Outcome> {
    let d = req.workers;
    let replicas = req.replicas.count.unwrap_or(1);
    let config = Configuration {
        kind,
        microbatch_size: mbs,
        microbatches: n,
        replicas,
    };
    let skip = |why: Why, reason: String, needed: Option<u64>| {
        Outcome::Rejected(Rejected {
            config,
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
    let stage_workers: Vec<u32> = (0..stages as u32).map(|s| placement.worker_of(s)).collect();
    let partition = partitions
        .entry(stage_workers.clone())
        .or_insert_with(|| split(req, pieces, &stage_workers));
    let partition = match partition.clone() {
        Ok(p) => p,
        Err(reason) => return Ok(skip(Why::Skipped, format!("skipped: {reason}"), None)),
    };
    let factor = |w: u32| {
        req.measured
            .as_ref()
            .and_then(|m| m.worker_factors.get(w as usize).copied())
            .unwrap_or(1.0)
    };
    let stage_costs: Vec<StageCost> = partition
        .iter()
        .zip(&stage_workers)
        .map(|(r, &w)| {
            let ps = &pieces[r.clone()];
            let k = factor(w);
            StageCost {
                f: k * ps.iter().map(|p| p.f).sum::<f64>(),
                b: k * ps.iter().map(|p| p.b).sum::<f64>(),
                w: k * ps.iter().map(|p| p.w).sum::<f64>(),
                mem: ps.iter().map(|p| p.mem).fold(0, u64::saturating_add) as f64,
            }
        })
        .collect();
    let hop = req
        .measured
        .as_ref()
        .map_or(0.0, |m| m.hop_ms_per_sequence * f64::from(mbs));
    let costs = Costs::per_stage(&placement, stage_costs.clone(), req.comm_ms + hop)?;
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
        match search_limit(kind, d, n, &costs, &static_bytes, budget)? {
            Searched::Fits(found, note) => {
                let (schedule, sim) = *found;
                (schedule, sim, note)
            }
            Searched::Rejected(why, reason, needed) => return Ok(skip(why, reason, needed)),
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
    // Every replica runs the same schedule; a stage's gradient sum starts when its last
    // gradient pass ends and the step's end waits for the last sum.
    let mut step_ms = sim.makespan;
    let mut bubble = sim.bubble;
    if replicas > 1 {
        let values: Vec<u64> = partition
            .iter()
            .map(|r| pieces[r.clone()].iter().map(|p| p.params).sum())
            .collect();
        let sums = sums_end(
            &sim,
            &schedule.placement,
            &values,
            req.replicas.sum_ms_per_value,
        );
        if sums > step_ms {
            step_ms = sums;
            bubble = 1.0 - sim.busy.iter().sum::<f64>() / (f64::from(d) * step_ms);
        }
    }
    let tokens = f64::from(req.global_batch) * f64::from(replicas) * f64::from(req.spec.seq_len);
    Ok(Outcome::Planned(Box::new(Candidate {
        config,
        partition,
        stage_workers,
        stage_costs,
        step_ms,
        bubble,
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
