//! Planning one configuration (a kind at a microbatch size): its partition, stage costs,
//! static state per worker, schedule and simulation, or the reason it is not planned.

use std::collections::BTreeMap;
use std::ops::Range;

use super::activation_limit::{Searched, search_limit};
use super::candidate::{Candidate, Configuration, Outcome, Rejected, Why};
use super::request::{AutoRequest, PieceCost, RecomputeSearch};
use super::worker_memory::{activation_bytes, static_reason, worker_bytes};
use crate::calibration::sums_end;
use crate::cost::{Costs, StageCost, Times};
use crate::error::Result;
use crate::generate::{Request, ScheduleKind, generate_with};
use crate::partition::{balance, by_counts, split_for_speeds, torchtitan_counts};
use crate::schedule::{Recompute, RecomputeShares, Schedule};
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

/// [`balance`]d stages of `pieces`, whatever the workers' speeds.
fn balanced_cut(pieces: &[PieceCost], stages: usize) -> Option<Vec<Range<usize>>> {
    let times: Vec<f64> = pieces.iter().map(|p| p.f + p.b + p.w).collect();
    let params: Vec<u64> = pieces.iter().map(|p| p.params).collect();
    balance(&times, &params, stages)
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
    let setting = Setting {
        req,
        kind,
        d,
        n,
        mbs,
        pieces,
        per_param,
        placement: &placement,
        stage_workers: &stage_workers,
        factors: (0..d).map(factor).collect(),
    };
    let mut partition = partition;
    let mut fitted = match setting.fit(&partition, None)? {
        Ok(f) => f,
        Err((why, reason, needed)) => return Ok(skip(why, reason, needed)),
    };
    // A cut for measured speeds may crowd a fast worker past the budget: the balanced cut
    // (unit speeds, parameters as the tie-break) is planned instead when only it fits.
    if !fitted.fits(req.memory_per_worker)
        && req.fixed.split.is_none()
        && req.measured.is_some()
        && let Some(cut) = balanced_cut(pieces, stages)
        && cut != partition
        && let Ok(again) = setting.fit(&cut, None)?
        && again.fits(req.memory_per_worker)
    {
        fitted = again;
        partition = cut;
    }
    // Recomputing stages take longer: the model cut again for the stages' modes, kept when
    // it fits and is faster (starting from those modes, or from none on the new cut).
    if fitted.recomputes()
        && req.fixed.split.is_none()
        && let Some(cut) = setting.split_for_modes(&fitted.recompute)
        && cut != partition
    {
        for start in [Some(fitted.recompute.clone()), None] {
            if let Ok(again) = setting.fit(&cut, start.as_deref())?
                && again.fits(req.memory_per_worker)
                && again.sim.makespan < fitted.sim.makespan * (1.0 - super::candidate::REL_EPS)
            {
                fitted = again;
                partition = cut.clone();
            }
        }
    }
    let Fitted {
        stage_costs,
        static_bytes,
        schedule,
        sim,
        note,
        worker_bytes,
        recompute,
    } = fitted;
    let max_static = static_bytes.iter().copied().max().unwrap_or(0);
    let budget = req.memory_per_worker;
    let activation_bytes = activation_bytes(&sim);
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
        recompute,
    })))
}

/// What one configuration is planned in: the request, kind, shape and stages' workers.
struct Setting<'a> {
    req: &'a AutoRequest,
    kind: ScheduleKind,
    d: u32,
    n: u32,
    mbs: u32,
    pieces: &'a [PieceCost],
    per_param: u64,
    placement: &'a crate::placement::Placement,
    stage_workers: &'a [u32],
    /// Each worker's time factor (measured speeds; 1 without).
    factors: Vec<f64>,
}

/// A configuration planned on one cut of the model.
struct Fitted {
    stage_costs: Vec<StageCost>,
    static_bytes: Vec<u64>,
    schedule: Schedule,
    sim: Simulation,
    note: String,
    worker_bytes: Vec<u64>,
    recompute: Vec<Recompute>,
}

impl Fitted {
    fn recomputes(&self) -> bool {
        self.recompute.iter().any(|m| *m != Recompute::None)
    }

    fn fits(&self, budget: u64) -> bool {
        self.worker_bytes.iter().all(|&b| b <= budget)
    }
}

impl Setting<'_> {
    /// The configuration on `partition`, its stages recomputing as `start` says (none when
    /// `None`) or as the request says; with [`RecomputeSearch::WhereNeeded`] a fixed kind's
    /// overflowing worker recomputes more ([`more_recompute`]) until it fits or can't.
    fn fit(
        &self,
        partition: &[Range<usize>],
        start: Option<&[Recompute]>,
    ) -> Result<Scheduled<Fitted>> {
        let (req, d) = (self.req, self.d);
        let stage_costs: Vec<StageCost> = partition
            .iter()
            .zip(self.stage_workers)
            .map(|(r, &w)| {
                let ps = &self.pieces[r.clone()];
                let k = self.factors[w as usize];
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
            .map_or(0.0, |m| m.hop_ms_per_sequence * f64::from(self.mbs));
        let costs = Costs::per_stage(self.placement, stage_costs.clone(), req.comm_ms + hop)?;
        let mut static_bytes = vec![0u64; d as usize];
        for (s, r) in partition.iter().enumerate() {
            let p = self.pieces[r.clone()]
                .iter()
                .map(|p| p.params)
                .fold(0, u64::saturating_add);
            let w = self.stage_workers[s] as usize;
            static_bytes[w] = static_bytes[w].saturating_add(p.saturating_mul(self.per_param));
        }
        let max_static = static_bytes.iter().copied().max().unwrap_or(0);
        let budget = req.memory_per_worker;
        let shares: Vec<RecomputeShares> = partition
            .iter()
            .map(|r| RecomputeShares::of_stage(&req.spec, r.clone(), self.mbs))
            .collect();
        let mut recompute = match (start, req.recompute) {
            (Some(modes), _) => modes.to_vec(),
            (None, RecomputeSearch::Every(mode)) => vec![mode; partition.len()],
            (None, RecomputeSearch::WhereNeeded) => vec![Recompute::None; partition.len()],
        };
        let escalate = req.recompute == RecomputeSearch::WhereNeeded && !self.kind.is_adaptive();
        loop {
            let recomputing = if recompute.iter().all(|m| *m == Recompute::None) {
                costs.clone()
            } else {
                costs.recomputing(&recompute, &shares)?
            };
            let (schedule, sim, note) =
                match schedule_for(self.kind, d, self.n, &recomputing, &static_bytes, budget)? {
                    Ok(found) => found,
                    Err(skipped) => return Ok(Err(skipped)),
                };
            let worker_bytes = worker_bytes(&static_bytes, &activation_bytes(&sim));
            let fullest = (0..d as usize).max_by_key(|&w| worker_bytes[w]);
            let over = fullest.filter(|&w| worker_bytes[w] > budget && max_static <= budget);
            let more =
                over.and_then(|w| more_recompute(&recompute, &stage_costs, self.stage_workers, w));
            match more {
                Some(s) if escalate => recompute[s] = next_mode(recompute[s]),
                _ => {
                    return Ok(Ok(Fitted {
                        stage_costs,
                        static_bytes,
                        schedule,
                        sim,
                        note,
                        worker_bytes,
                        recompute,
                    }));
                }
            }
        }
    }

    /// The cut of the model into the stages that minimises the slowest stage's time when
    /// each stage recomputes as `modes` says (its redone forward counted, at its worker's
    /// speed); `None` when the pieces do not cover the stages.
    fn split_for_modes(&self, modes: &[Recompute]) -> Option<Vec<Range<usize>>> {
        let (pieces, stages) = (self.pieces, modes.len());
        let len = pieces.len();
        if stages == 0 || stages > len {
            return None;
        }
        let mut prefix_all = vec![0.0; len + 1];
        let mut prefix_f = vec![0.0; len + 1];
        for (i, p) in pieces.iter().enumerate() {
            prefix_all[i + 1] = prefix_all[i] + p.f + p.b + p.w;
            prefix_f[i + 1] = prefix_f[i] + p.f;
        }
        let time = |k: usize, j: usize, i: usize| {
            let redo = match modes[k] {
                Recompute::None => 0.0,
                mode => {
                    RecomputeShares::of_stage(&self.req.spec, j..i, self.mbs).time(mode)
                        * (prefix_f[i] - prefix_f[j])
                }
            };
            self.factors[self.stage_workers[k] as usize] * (prefix_all[i] - prefix_all[j] + redo)
        };
        // best[k][i]: the slowest stage of the best cut of the first i pieces into k stages.
        let mut best = vec![vec![f64::INFINITY; len + 1]; stages + 1];
        let mut from = vec![vec![0usize; len + 1]; stages + 1];
        best[0][0] = 0.0;
        for k in 1..=stages {
            for i in k..=len - (stages - k) {
                for j in (k - 1)..i {
                    let value = best[k - 1][j].max(time(k - 1, j, i));
                    if value < best[k][i] {
                        best[k][i] = value;
                        from[k][i] = j;
                    }
                }
            }
        }
        let mut cut = vec![0..0; stages];
        let mut end = len;
        for k in (1..=stages).rev() {
            let start = from[k][end];
            cut[k - 1] = start..end;
            end = start;
        }
        best[stages][len].is_finite().then_some(cut)
    }
}

/// A planned `T`, or why it is not planned (and the bytes it needs, when known).
type Scheduled<T = (Schedule, Simulation, String)> =
    std::result::Result<T, (Why, String, Option<u64>)>;

/// Generates and simulates `kind`'s schedule on `costs` (the adaptive kinds under the
/// activation limit [`search_limit`] finds for `budget`).
fn schedule_for(
    kind: ScheduleKind,
    d: u32,
    n: u32,
    costs: &Costs,
    static_bytes: &[u64],
    budget: u64,
) -> Result<Scheduled> {
    if kind.is_adaptive() {
        return Ok(
            match search_limit(kind, d, n, costs, static_bytes, budget)? {
                Searched::Fits(found, note) => {
                    let (schedule, sim) = *found;
                    Ok((schedule, sim, note))
                }
                Searched::Rejected(why, reason, needed) => Err((why, reason, needed)),
            },
        );
    }
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
        Err(e) => return Ok(Err((Why::Skipped, format!("skipped: {e}"), None))),
    };
    let sim = simulate(&schedule, costs)?;
    Ok(Ok((schedule, sim, String::new())))
}

/// The stage of worker `w` to recompute more: the one recomputing least, then the one with
/// the largest stash a microbatch (the first such); `None` when all of them recompute fully.
fn more_recompute(
    modes: &[Recompute],
    stage_costs: &[StageCost],
    stage_workers: &[u32],
    w: usize,
) -> Option<usize> {
    (0..modes.len())
        .filter(|&s| stage_workers[s] as usize == w && modes[s] != Recompute::Full)
        .min_by(|&a, &b| {
            modes[a]
                .cmp(&modes[b])
                .then(stage_costs[b].mem.total_cmp(&stage_costs[a].mem))
                .then(a.cmp(&b))
        })
}

/// The mode that keeps less than `mode`.
fn next_mode(mode: Recompute) -> Recompute {
    match mode {
        Recompute::None => Recompute::Selective,
        Recompute::Selective | Recompute::Full => Recompute::Full,
    }
}
