//! The simulator: runs every worker's program under a cost model.
//!
//! A pass starts when its worker is free and every pass it depends on has ended (plus the
//! communication latency when the dependency ran on another worker). Activation memory of a
//! (stage, microbatch) is allocated when its F starts and released when its W (or BW) ends;
//! a fraction `release_at_b` may be released when B ends.
//!
//! A recomputing stage's B ([`Costs::recomputing`]) runs longer by the forward it redoes,
//! which counts as idle time in the bubble rates (busy time is training work), and holds the
//! stash it rebuilds while it runs.

use serde::Serialize;

use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::schedule::Schedule;
use crate::validate::{PassIndex, check_progress, check_structure, run_in_order};

/// A pass with its simulated start and end.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimedPass {
    /// The pass.
    pub pass: Pass,
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
}

/// What the simulator reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Simulation {
    /// `timeline[w]`: worker `w`'s passes in program order, with times.
    pub timeline: Vec<Vec<TimedPass>>,
    /// Time from the first start to the last end.
    pub makespan: f64,
    /// Busy time of every worker: its passes' time less the forwards they redo.
    pub busy: Vec<f64>,
    /// Time every worker spends redoing forwards inside recomputing backwards.
    pub recomputed: Vec<f64>,
    /// `1 − Σ busy / (workers × makespan)`.
    pub bubble: f64,
    /// `max_w (span_w − busy_w) / span_w`, span = first start to last end on `w` (the paper's tables).
    pub bubble_span: f64,
    /// Peak activation memory of every worker, in the cost model's memory unit.
    pub peak_memory: Vec<f64>,
    /// Lower bounds on the makespan.
    pub bounds: Bounds,
}

impl Simulation {
    /// The largest per-worker peak activation memory.
    pub fn max_peak_memory(&self) -> f64 {
        self.peak_memory.iter().copied().fold(0.0, f64::max)
    }

    /// The worker whose idle share of its own span is [`Simulation::bubble_span`] (the last
    /// such worker on ties; `None` when no worker has a span).
    pub fn worst_span_worker(&self) -> Option<usize> {
        span_bubbles(&self.timeline, &self.busy)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(w, _)| w)
    }
}

/// `(worker, (span − busy) / span)` of every worker with a span (first start to last end).
fn span_bubbles<'a>(
    timeline: &'a [Vec<TimedPass>],
    busy: &'a [f64],
) -> impl Iterator<Item = (usize, f64)> + 'a {
    timeline
        .iter()
        .zip(busy)
        .enumerate()
        .filter_map(|(w, (t, b))| {
            let span = t.last()?.end - t.first()?.start;
            (span > 0.0).then(|| (w, (span - b) / span))
        })
}

/// Lower bounds on the makespan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bounds {
    /// The largest per-worker time in passes (redone forwards included).
    pub max_work: f64,
    /// The longest dependency chain of one microbatch (all F, then all B, then one W,
    /// with communication on every hop between workers).
    pub critical_path: f64,
    /// `max(max_work, critical_path)`: holds for every schedule on this placement.
    pub lower_bound: f64,
    /// The paper's App. E.2 bound for V schedules, `(6n + 6d − 3k − 1)·t` with `k` the
    /// simulated peak in per-stage activations and `t` the shortest pass: a bound for
    /// squeezed-and-reordered V-shape schedules at that memory, not for every schedule.
    /// `None` off the V placement and for fewer microbatches than workers, where the
    /// formula exceeds real makespans (e.g. V-Half, d = 8, n = 1: 23.5 against 16.5).
    pub v_bound: Option<f64>,
}

const NOT_DONE: f64 = f64::NAN;

/// Validates `schedule` and simulates it under `costs`.
///
/// The same as [`validate`](crate::validate::validate) then [`simulate_validated`], with
/// the validator's progress rule checked by the timed run itself (the validator's own run
/// only when that one stops short or does not start, so the errors are the validator's):
/// the planning loops simulate every candidate.
pub fn simulate(schedule: &Schedule, costs: &Costs) -> Result<Simulation> {
    let index = check_structure(schedule)?;
    if let Err(e) = ready_to_simulate(schedule, costs) {
        check_progress(schedule, &index)?;
        return Err(e);
    }
    let timeline = timed_run(schedule, &index, costs);
    if timeline
        .iter()
        .zip(&schedule.workers)
        .any(|(t, ps)| t.len() < ps.len())
    {
        check_progress(schedule, &index)?;
    }
    conclude(schedule, costs, timeline)
}

/// Simulates a schedule already validated into `index`.
pub fn simulate_validated(
    schedule: &Schedule,
    index: &PassIndex,
    costs: &Costs,
) -> Result<Simulation> {
    ready_to_simulate(schedule, costs)?;
    let timeline = timed_run(schedule, index, costs);
    conclude(schedule, costs, timeline)
}

fn ready_to_simulate(schedule: &Schedule, costs: &Costs) -> Result<()> {
    // The planning loops simulate every candidate: a cancelled call ends here.
    crate::cancel::check()?;
    costs.check_for(&schedule.placement)
}

/// Every worker's passes with their times, as far as each worker gets (all of them for a
/// schedule that validates and finite times).
fn timed_run(schedule: &Schedule, index: &PassIndex, costs: &Costs) -> Vec<Vec<TimedPass>> {
    let worker_of = schedule.placement.table();
    let mut end = vec![NOT_DONE; index.slots()];
    let workers = schedule.workers.len();
    let mut timeline: Vec<Vec<TimedPass>> = schedule
        .workers
        .iter()
        .map(|ps| Vec::with_capacity(ps.len()))
        .collect();
    let mut free = vec![0.0f64; workers];
    // A pass starts when its worker is free and its inputs have arrived; the order the
    // workers are stepped in changes no time.
    run_in_order(
        schedule,
        |p| worker_of[p.stage as usize] as usize,
        |w, pass| {
            let mut ready = free[w];
            for (dep, _) in index.deps(pass) {
                let t = end[index.slot(dep)];
                if t.is_nan() {
                    return Some(dep);
                }
                let hop = if worker_of[dep.stage as usize] as usize != w {
                    costs.comm
                } else {
                    0.0
                };
                ready = ready.max(t + hop);
            }
            let finish = ready + costs.duration(pass.kind, pass.stage);
            end[index.slot(pass)] = finish;
            free[w] = finish;
            timeline[w].push(TimedPass {
                pass,
                start: ready,
                end: finish,
            });
            None
        },
    );
    timeline
}

/// The figures of a timed run, or the error for times or memory that overflow.
fn conclude(
    schedule: &Schedule,
    costs: &Costs,
    timeline: Vec<Vec<TimedPass>>,
) -> Result<Simulation> {
    // Huge times (e.g. 1e306 per pass over a thousand passes) overflow to infinity, and the
    // bubble to NaN: refuse them rather than report them as figures. A worker's passes end
    // in order, so its last pass tells.
    if timeline
        .iter()
        .filter_map(|t| t.last())
        .any(|p| !p.end.is_finite())
    {
        return Err(Error::InvalidArgument {
            field: "times",
            reason: "the simulated times overflow (a pass ends at infinity); give the times \
                     in a larger unit"
                .into(),
        });
    }
    let sim = summarise(schedule, costs, timeline);
    if sim.peak_memory.iter().any(|m| !m.is_finite()) {
        return Err(Error::InvalidArgument {
            field: "memory",
            reason: "the simulated memory overflows (a peak is infinite); give the stages' \
                     memory in a larger unit"
                .into(),
        });
    }
    Ok(sim)
}

fn summarise(schedule: &Schedule, costs: &Costs, timeline: Vec<Vec<TimedPass>>) -> Simulation {
    let first = timeline
        .iter()
        .filter_map(|t| t.first())
        .map(|p| p.start)
        .fold(f64::INFINITY, f64::min);
    let last = timeline
        .iter()
        .filter_map(|t| t.last())
        .map(|p| p.end)
        .fold(0.0, f64::max);
    let makespan = if first.is_finite() { last - first } else { 0.0 };
    let recomputed: Vec<f64> = timeline
        .iter()
        .map(|t| t.iter().map(|p| costs.redone(p.pass)).sum())
        .collect();
    let busy: Vec<f64> = timeline
        .iter()
        .zip(&recomputed)
        .map(|(t, redone)| t.iter().map(|p| p.end - p.start).sum::<f64>() - redone)
        .collect();
    let total: f64 = busy.iter().sum();
    let workers = timeline.len() as f64;
    let bubble = if makespan > 0.0 {
        1.0 - total / (workers * makespan)
    } else {
        0.0
    };
    let bubble_span = span_bubbles(&timeline, &busy)
        .map(|(_, b)| b)
        .fold(0.0, f64::max);
    let peak_memory = timeline
        .iter()
        .map(|t| peak_of(t, costs))
        .collect::<Vec<_>>();
    let bounds = bounds(schedule, costs, &busy, &recomputed, &peak_memory);
    Simulation {
        timeline,
        makespan,
        busy,
        recomputed,
        bubble,
        bubble_span,
        peak_memory,
        bounds,
    }
}

/// Peak memory of one worker: passes run one at a time in program order, so allocations
/// and releases happen in that order; a recomputing backward holds its rebuilt stash while
/// it runs.
fn peak_of(passes: &[TimedPass], costs: &Costs) -> f64 {
    let (mut now, mut peak) = (0.0f64, 0.0f64);
    for p in passes {
        peak = peak.max(now + costs.transient(p.pass));
        now += costs.memory_change(p.pass);
        peak = peak.max(now);
    }
    peak
}

fn bounds(
    schedule: &Schedule,
    costs: &Costs,
    busy: &[f64],
    recomputed: &[f64],
    peak: &[f64],
) -> Bounds {
    let placement = &schedule.placement;
    let max_work = busy
        .iter()
        .zip(recomputed)
        .map(|(b, r)| b + r)
        .fold(0.0, f64::max);
    let stages = placement.stages();
    let mut chain = 0.0;
    let mut hops = 0u32;
    for s in 0..stages {
        chain += costs.stages[s as usize].f + costs.stages[s as usize].b;
        if s + 1 < stages && placement.worker_of(s) != placement.worker_of(s + 1) {
            hops += 2;
        }
    }
    let critical_path = match costs.stages.first() {
        Some(first) => chain + first.w + f64::from(hops) * costs.comm,
        None => 0.0,
    };
    let v_bound = match placement {
        crate::placement::Placement::V { workers } => {
            let d = f64::from(*workers);
            let n = f64::from(schedule.microbatches);
            let m = costs
                .stages
                .iter()
                .map(|c| c.mem)
                .fold(f64::INFINITY, f64::min);
            let t = costs
                .stages
                .iter()
                .flat_map(|c| [c.f, c.b, c.w])
                .fold(f64::INFINITY, f64::min);
            let peak = peak.iter().copied().fold(0.0, f64::max);
            (m > 0.0 && schedule.microbatches >= *workers).then(|| {
                let k = (peak / m).round().min(2.0 * d);
                (6.0 * n + 6.0 * d - 3.0 * k - 1.0).max(0.0) * t
            })
        }
        _ => None,
    };
    Bounds {
        max_work,
        critical_path,
        lower_bound: max_work.max(critical_path),
        v_bound,
    }
}
