//! The memory-pressure policy: the fastest plan predicted to fit the workers' registered
//! memory when one overflows (or is predicted to).
//!
//! A worker's predicted bytes are its peak activations, replayed from its pass order over
//! the job's layer split, plus its parameters, gradients and AdamW state: 20 bytes per
//! parameter in f32 (f64 gradients), 22 in bf16, whose parameters keep f32 moments and master
//! copies as Megatron-LM's mixed-precision optimizer does. They are checked against the
//! memory the worker registered before a run starts (a device fails to allocate rather than
//! report), and after each step the measured peak plus those bytes are. When a worker holds
//! more, the job goes on (from the start, or after every worker stops after the same step)
//! with the fastest schedule of [`FITTING_KINDS`] on the same workers predicted to fit
//! every worker's memory and to hold less on the overflowing one. An adaptive schedule whose default limit (1F1B's peak) does
//! not fit is planned to the bytes there are: `FIT_STEPS` limits bisected below it, the fastest
//! that fits kept. Later losses and growths re-plan that schedule and limit.

use super::respec::{adopt, respec};
use super::worker::{StepReport, Worker};
use crate::job::{JobPlan, JobSpec};
use crate::render::report::fmt_bytes;
use crate::{Costs, simulate};

/// Schedules a job under memory pressure may move to (with the job's worker count).
pub const FITTING_KINDS: [&str; 9] = [
    "1f1b",
    "zb-h1",
    "zb-h2",
    "interleaved-1f1b",
    "v-min",
    "v-half",
    "v-zb",
    "adaptive-zb",
    "adaptive-v",
];

/// The job as planned for the run's worker count (after a loss it may be fewer than the
/// degree, without a stage count pinned by blocks per stage), and its layer ranges on the
/// split in use (`in_use`: pieces per stage, empty for the job's own split).
pub(crate) fn in_use_ranges(
    spec: &JobSpec,
    plan: &JobPlan,
    in_use: &[u32],
) -> Option<(JobSpec, Vec<std::ops::Range<usize>>)> {
    let spec = respec(spec, plan.schedule.num_workers());
    let ranges = if in_use.is_empty() {
        spec.stage_ranges(&plan.schedule.placement)
    } else {
        spec.model.split_by_counts(in_use)
    };
    let ranges = ranges.ok()?;
    Some((spec, ranges))
}

/// Every worker's predicted peak activation bytes under `plan` on the split in use (empty
/// when they cannot be predicted).
pub fn predicted_peaks(spec: &JobSpec, plan: &JobPlan, in_use: &[u32]) -> Vec<u64> {
    in_use_ranges(spec, plan, in_use)
        .and_then(|(spec, ranges)| plan.predicted_peak_bytes_over(&spec, &ranges).ok())
        .unwrap_or_default()
}

/// Whether worker `w` registered a memory size and `need` bytes exceed it.
fn over_budget(workers: &[Worker], w: usize, need: u64) -> bool {
    workers
        .get(w)
        .is_some_and(|w| w.memory_bytes > 0 && need > w.memory_bytes)
}

/// The first worker predicted to hold more than its registered memory under `plan` on the
/// split in use, and what it is predicted to hold (`None`: every worker fits, or the bytes
/// cannot be predicted).
pub fn predicted_overflow(
    spec: &JobSpec,
    plan: &JobPlan,
    in_use: &[u32],
    workers: &[Worker],
) -> Option<(usize, u64)> {
    let (spec, ranges) = in_use_ranges(spec, plan, in_use)?;
    let now = plan.predicted_bytes_over(&spec, &ranges).ok()?;
    (0..now.len()).find_map(|w| over_budget(workers, w, now[w]).then_some((w, now[w])))
}

/// When a worker with a registered memory size held more than it (its step's peak
/// activations plus its parameters, gradients and optimizer state, in `measured`; without
/// reports: is predicted to hold more, before a run starts), the reason and the fastest
/// plan (simulated under the job's planning times) predicted to fit every worker
/// that registered one, holding less on the overflowing worker than the plan in use;
/// `None` if nothing overflowed or nothing fits.
pub fn pressure(
    spec: &JobSpec,
    plan: &JobPlan,
    in_use: &[u32],
    measured: Option<&[StepReport]>,
    workers: &[Worker],
) -> Option<(String, Fitting)> {
    // The plan in use on the split in use (a straggler move's), the candidates on the
    // job's split (a move goes back to it).
    let (spec, ranges) = in_use_ranges(spec, plan, in_use)?;
    let spec = &spec;
    let predicted = |p: &JobPlan| p.predicted_bytes(spec).ok();
    let now = plan.predicted_bytes_over(spec, &ranges).ok()?;
    let (over, need, held) = match measured {
        Some(reports) => reports.iter().find_map(|r| {
            let need = r.held_bytes();
            let w = r.worker_index as usize;
            over_budget(workers, w, need).then_some((w, need, "held"))
        })?,
        None => (0..now.len()).find_map(|w| {
            over_budget(workers, w, now[w]).then_some((w, now[w], "is predicted to hold"))
        })?,
    };
    // A candidate spec's plan, when it fits every worker that registered a size and holds
    // less on the overflowing one.
    let assess = |candidate: &JobSpec| -> Assessed {
        let Ok(p) = candidate.validate() else {
            return Assessed::Unplannable;
        };
        let Some(bytes) = predicted(&p) else {
            return Assessed::Unplannable;
        };
        let fits = bytes
            .iter()
            .zip(workers)
            .all(|(b, w)| w.memory_bytes == 0 || *b <= w.memory_bytes);
        if !fits || bytes[over] >= now[over] {
            return Assessed::TooBig;
        }
        match Costs::uniform(&p.schedule.placement, candidate.planning_times())
            .and_then(|c| simulate(&p.schedule, &c))
        {
            Ok(sim) => Assessed::Fits(Box::new(Fitting {
                makespan: sim.makespan,
                spec: candidate.clone(),
                plan: p,
                bytes,
            })),
            Err(_) => Assessed::Unplannable,
        }
    };
    let mut best: Option<Fitting> = None;
    for kind in FITTING_KINDS {
        let mut candidate = spec.clone();
        candidate.parallelism.pipeline_parallel_schedule = kind.into();
        candidate.parallelism.memory_limit = None;
        let found = match assess(&candidate) {
            Assessed::Fits(found) => Some(*found),
            // An adaptive schedule planned to a limit that fits the bytes left.
            Assessed::TooBig if kind.starts_with("adaptive") => fit_limit(&candidate, &assess),
            Assessed::TooBig | Assessed::Unplannable => None,
        };
        if let Some(found) = found
            && best.as_ref().is_none_or(|b| found.makespan < b.makespan)
        {
            best = Some(found);
        }
    }
    let best = best?;
    let limit = best
        .spec
        .parallelism
        .memory_limit
        .map(|l| format!(" at a limit of {l:.2} units"))
        .unwrap_or_default();
    Some((
        format!(
            "worker {over} ({}) {held} {} of its {} ({} planned); moved to {}{limit}, \
             predicted {} there",
            workers[over].id,
            fmt_bytes(need as f64),
            fmt_bytes(workers[over].memory_bytes as f64),
            plan.kind.name(),
            best.plan.kind.name(),
            fmt_bytes(best.bytes[over] as f64)
        ),
        best,
    ))
}

/// A plan memory pressure may move to.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitting {
    /// Simulated under the job's planning times.
    pub makespan: f64,
    /// The spec it was planned from (its schedule and memory limit).
    pub spec: JobSpec,
    /// The plan.
    pub plan: JobPlan,
    /// Predicted bytes per worker (activations and training state).
    pub bytes: Vec<u64>,
}

impl Fitting {
    /// Makes `current` (the spec the runs follow) plan this schedule and memory limit from
    /// now on ([`adopt`]); the plan.
    pub fn adopt_into(self, current: &mut JobSpec) -> JobPlan {
        let p = self.spec.parallelism;
        let d = self.plan.schedule.num_workers();
        adopt(current, p.pipeline_parallel_schedule, p.memory_limit, d);
        self.plan
    }
}

/// What a candidate spec of a memory-pressure move comes to.
enum Assessed {
    /// It plans, fits every worker and holds less on the overflowing one.
    Fits(Box<Fitting>),
    /// Its plan holds too much somewhere.
    TooBig,
    /// It does not plan: e.g. an adaptive limit below the smallest feasible one.
    Unplannable,
}

/// Plans of an adaptive schedule at its default limit (1F1B's peak) do not fit: the
/// fastest plan that does among [`FIT_STEPS`] limits bisected below it (a limit the
/// planner cannot meet moves up, one whose plan does not fit moves down).
fn fit_limit(candidate: &JobSpec, assess: &dyn Fn(&JobSpec) -> Assessed) -> Option<Fitting> {
    let (mut lo, mut hi) = (
        0.0,
        f64::from(candidate.parallelism.pipeline_parallel_degree),
    );
    let mut best: Option<Fitting> = None;
    for _ in 0..FIT_STEPS {
        let mid = 0.5 * (lo + hi);
        let mut c = candidate.clone();
        c.parallelism.memory_limit = Some(mid);
        match assess(&c) {
            Assessed::Fits(found) => {
                lo = mid;
                if best.as_ref().is_none_or(|b| found.makespan < b.makespan) {
                    best = Some(*found);
                }
            }
            Assessed::Unplannable => lo = mid,
            Assessed::TooBig => hi = mid,
        }
    }
    best
}

/// How many limits [`fit_limit`] tries (the last step is 1/64 of 1F1B's peak).
const FIT_STEPS: usize = 6;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::respec::replan_after_loss;
    use super::*;
    use crate::job::example;
    /// Live workers that registered these memory sizes.
    fn registered(memory: impl Iterator<Item = u64>) -> Vec<Worker> {
        memory
            .enumerate()
            .map(|(i, memory_bytes)| Worker {
                id: format!("w{i}"),
                address: String::new(),
                memory_bytes,
                incarnation: i as u64 + 1,
                ..Worker::default()
            })
            .collect()
    }

    /// A step's reports in which worker 0 held `peak` bytes of activations.
    fn overflow_on_worker_0(peak: u64) -> Vec<StepReport> {
        vec![StepReport {
            worker_index: 0,
            peak_activation_bytes: peak,
            ..Default::default()
        }]
    }

    /// Memory pressure predicts with the job's layer split and may move to a schedule with
    /// another stage count even when blocks per stage pinned the first one.
    #[test]
    fn pressure_follows_the_layer_split() {
        let mut spec = example(4, "gpipe");
        spec.model.layers = 10;
        spec.parallelism.pipeline_parallel_first_stage_less_layers = 2;
        spec.parallelism.pipeline_parallel_layers_per_stage = Some(3);
        let plan = spec.validate().unwrap();
        let mut even = spec.clone();
        even.parallelism.pipeline_parallel_first_stage_less_layers = 0;
        even.parallelism.pipeline_parallel_layers_per_stage = None;
        // Worker 0 holds one block and the embedding, not three pieces.
        let state = |s: &JobSpec| {
            plan.predicted_state_bytes_over(s, &s.stage_ranges(&plan.schedule.placement).unwrap())
                .unwrap()
        };
        let split = state(&spec);
        assert!(split[0] < state(&even)[0], "{split:?}");
        let need = |kind: &str| -> Vec<u64> {
            let mut c = respec(&spec, 4);
            c.parallelism.pipeline_parallel_schedule = kind.into();
            c.validate().unwrap().predicted_bytes(&c).unwrap()
        };
        let (gpipe, v_half, one_f_one_b) = (need("gpipe"), need("v-half"), need("1f1b"));
        // Every worker has exactly V-Half's need: 1F1B does not fit worker 0, GPipe
        // overflowed it.
        assert!(gpipe[0] > v_half[0] && one_f_one_b[0] > v_half[0]);
        let workers = registered(v_half.iter().copied());
        let reports = overflow_on_worker_0(gpipe[0]);
        let (reason, fits) = pressure(&spec, &plan, &[], Some(&reports), &workers).unwrap();
        assert!(reason.contains("worker 0 (w0) held"), "{reason}");
        // Before a run, from the plan's prediction alone: the same move.
        let (ahead, same) = pressure(&spec, &plan, &[], None, &workers).unwrap();
        assert!(
            ahead.contains("worker 0 (w0) is predicted to hold"),
            "{ahead}"
        );
        assert_eq!(same.plan.schedule, fits.plan.schedule);
        // A plan predicted to fit is left alone.
        assert!(pressure(&spec, &fits.plan, &[], None, &workers).is_none());
        // V-Half's class: two stages per worker, not the four stages the spec pinned.
        assert_eq!(fits.plan.schedule.placement.stages(), 8, "{reason}");
        let moved = &fits.spec;
        assert_eq!(moved.validate().unwrap().schedule, fits.plan.schedule);
        let bytes = fits.plan.predicted_bytes(moved).unwrap();
        for (w, worker) in workers.iter().enumerate() {
            assert!(bytes[w] <= worker.memory_bytes, "{reason}");
        }
    }

    /// Memory pressure plans the adaptive schedules to the bytes the workers have: with
    /// worker 0 between V-Min's need and V-Half's (each named V schedule is the best of its
    /// memory class, so adaptive-v gains between the classes), adaptive-v at a limit
    /// between the two is faster than V-Min.
    #[test]
    fn pressure_plans_adaptive_schedules_to_the_bytes_left() {
        let mut spec = example(4, "gpipe");
        spec.model.layers = 14;
        spec.training.global_batch_size = 16;
        let plan = spec.validate().unwrap();
        let planned = |kind: &str| -> (Vec<u64>, f64) {
            let mut c = spec.clone();
            c.parallelism.pipeline_parallel_schedule = kind.into();
            let p = c.validate().unwrap();
            let sim = simulate(
                &p.schedule,
                &Costs::uniform(&p.schedule.placement, c.planning_times()).unwrap(),
            )
            .unwrap();
            (p.predicted_bytes(&c).unwrap(), sim.makespan)
        };
        let (gpipe, _) = planned("gpipe");
        let (v_min, v_min_makespan) = planned("v-min");
        let (v_half, _) = planned("v-half");
        let (one_f_one_b, _) = planned("1f1b");
        let (adaptive, _) = planned("adaptive-v");
        // Worker 0 between V-Min's need and V-Half's, nearer V-Half's; the others hold
        // any of them.
        let workers = registered((0..4).map(|i| {
            if i == 0 {
                (v_min[0] + 3 * v_half[0]) / 4
            } else {
                v_min[i].max(v_half[i]).max(adaptive[i]).max(one_f_one_b[i])
            }
        }));
        // Neither 1F1B, V-Half nor adaptive-v at its default limit fits worker 0.
        assert!(v_half[0] > workers[0].memory_bytes);
        assert!(adaptive[0] > workers[0].memory_bytes);
        assert!(one_f_one_b[0] > workers[0].memory_bytes);
        let reports = overflow_on_worker_0(gpipe[0]);
        let (reason, fits) = pressure(&spec, &plan, &[], Some(&reports), &workers).unwrap();
        println!(
            "{reason}; makespan {} against v-min's {v_min_makespan}",
            fits.makespan
        );
        assert_eq!(fits.plan.kind.name(), "adaptive-v", "{reason}");
        let limit = fits.spec.parallelism.memory_limit.unwrap();
        // Below the default of 4 units, which does not fit.
        assert!(limit < 4.0, "{reason}");
        assert!(fits.makespan < v_min_makespan, "{reason}");
        for (b, w) in fits.bytes.iter().zip(&workers) {
            assert!(*b <= w.memory_bytes, "{reason}");
        }
    }

    /// The plan in use is judged on the split in use: layers a straggler move put on
    /// worker 0 can overflow it where the job's split would not.
    #[test]
    fn pressure_judges_the_split_in_use() {
        let mut spec = example(2, "1f1b");
        spec.training.global_batch_size = 16;
        let plan = spec.validate().unwrap();
        let total = |ranges: &[std::ops::Range<usize>]| -> u64 {
            plan.predicted_bytes_over(&spec, ranges).unwrap()[0]
        };
        let moved = [8u32, 2];
        let even = total(&spec.stage_ranges(&plan.schedule.placement).unwrap());
        let heavy = total(&spec.model.split_by_counts(&moved).unwrap());
        assert!(heavy > even, "{heavy} {even}");
        let workers = registered([(even + heavy) / 2, u64::MAX / 4].into_iter());
        assert!(pressure(&spec, &plan, &[], None, &workers).is_none());
        let (reason, fits) = pressure(&spec, &plan, &moved, None, &workers).unwrap();
        assert!(reason.contains("is predicted to hold"), "{reason}");
        assert!(fits.bytes[0] <= workers[0].memory_bytes, "{reason}");
        // One range for two stages.
        let whole = spec.model.split_by_counts(&[10]).unwrap();
        assert!(plan.predicted_peak_bytes_over(&spec, &whole).is_err());
    }

    /// The peaks a run's steps report as predicted (and the metrics show) are those of its
    /// plan on its split: a straggler move's split, or a re-plan's fewer workers.
    #[test]
    fn predicted_peaks_follow_the_run() {
        let mut spec = example(2, "1f1b");
        spec.training.global_batch_size = 16;
        let plan = spec.validate().unwrap();
        let even = predicted_peaks(&spec, &plan, &[]);
        assert_eq!(even, plan.predicted_peak_bytes(&spec).unwrap());
        let moved = predicted_peaks(&spec, &plan, &[8, 2]);
        assert_eq!(moved.len(), 2);
        assert!(moved[0] > even[0], "{moved:?} {even:?}");
        let (on_one, one) = replan_after_loss(spec.clone(), &spec, 1).unwrap();
        let alone = predicted_peaks(&on_one, &one, &[]);
        assert_eq!(alone.len(), 1);
        assert!(alone[0] > even[0], "{alone:?} {even:?}");
        // One range for two stages cannot be predicted.
        assert!(predicted_peaks(&spec, &plan, &[10]).is_empty());
    }
}
