//! The auto-planner with `[activation_checkpoint] mode = "auto"`: under a budget that 1F1B
//! without recomputation overflows, the plans of the fixed kinds recompute only the stages of
//! the workers that would overflow, fit, and are predicted faster than recomputing fully on
//! every stage; their memory and step time are those of a fresh simulation of their
//! recomputing costs.

#![allow(clippy::unwrap_used)]

use pipewise_common::auto::{AutoPlan, AutoRequest, Candidate, RecomputeSearch, auto_plan};
use pipewise_common::generate::ScheduleKind;
use pipewise_common::model::{DType, ModelSpec};
use pipewise_common::schedule::{Recompute, RecomputeShares};
use pipewise_common::{Costs, simulate};

const WORKERS: u32 = 4;
const BATCH: u32 = 16;

fn spec() -> ModelSpec {
    ModelSpec {
        vocab: 8000,
        hidden: 512,
        heads: 8,
        layers: 12,
        seq_len: 512,
        dtype: DType::F32,
        ..Default::default()
    }
}

fn try_plan(memory: u64, recompute: RecomputeSearch) -> pipewise_common::Result<AutoPlan> {
    let mut request = AutoRequest::new(spec(), BATCH, WORKERS, memory, 1000);
    request.fixed.microbatch_size = Some(1);
    request.recompute = recompute;
    auto_plan(&request)
}

fn plan(memory: u64, recompute: RecomputeSearch) -> AutoPlan {
    try_plan(memory, recompute).unwrap()
}

fn of_kind(plan: &AutoPlan, kind: ScheduleKind) -> &Candidate {
    plan.ranked
        .iter()
        .find(|c| c.config.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} plan among {:?}", labels(plan)))
}

fn labels(plan: &AutoPlan) -> Vec<String> {
    plan.ranked.iter().map(|c| c.label()).collect()
}

/// The candidate's step and activation peaks against a fresh simulation of its schedule
/// on its stage costs recomputing as it says.
fn check_against_simulation(c: &Candidate) {
    let placement = &c.schedule.placement;
    let costs = Costs::per_stage(placement, c.stage_costs.clone(), 0.0).unwrap();
    let shares: Vec<RecomputeShares> = c
        .partition
        .iter()
        .map(|r| RecomputeShares::of_stage(&spec(), r.clone(), c.config.microbatch_size))
        .collect();
    let costs = if c.recompute.iter().all(|m| *m == Recompute::None) {
        costs
    } else {
        costs.recomputing(&c.recompute, &shares).unwrap()
    };
    let sim = simulate(&c.schedule, &costs).unwrap();
    assert!(
        (sim.makespan - c.step_ms).abs() <= 1e-9 * sim.makespan,
        "{}",
        c.label()
    );
    let peaks: Vec<u64> = sim.peak_memory.iter().map(|m| m.ceil() as u64).collect();
    assert_eq!(peaks, c.activation_bytes, "{}", c.label());
}

#[test]
fn recomputation_goes_only_where_a_worker_would_overflow() {
    let unlimited = plan(u64::MAX, RecomputeSearch::Every(Recompute::None));
    let one_f_one_b = of_kind(&unlimited, ScheduleKind::OneFOneB);
    // A budget 1F1B's fullest worker overflows by a quarter of its activations.
    let fullest = (0..WORKERS as usize)
        .max_by_key(|&w| one_f_one_b.worker_bytes[w])
        .unwrap();
    let budget = one_f_one_b.static_bytes[fullest] + one_f_one_b.activation_bytes[fullest] * 3 / 4;

    let none = plan(budget, RecomputeSearch::Every(Recompute::None));
    assert!(
        none.ranked
            .iter()
            .all(|c| c.config.kind != ScheduleKind::OneFOneB),
        "{:?}",
        labels(&none)
    );
    let auto = plan(budget, RecomputeSearch::WhereNeeded);
    let c = of_kind(&auto, ScheduleKind::OneFOneB);
    assert!(c.fits && c.max_worker_bytes <= budget, "{}", c.label());
    check_against_simulation(c);
    // Some stage recomputes; the last, which keeps one microbatch, does not.
    assert!(
        c.recompute.iter().any(|m| *m != Recompute::None),
        "{:?}",
        c.recompute
    );
    assert_eq!(
        c.recompute[WORKERS as usize - 1],
        Recompute::None,
        "{:?}",
        c.recompute
    );
    // Each recomputing stage's worker overflows with one mode less on it.
    for (s, mode) in c.recompute.iter().enumerate() {
        if *mode == Recompute::None {
            continue;
        }
        let mut less = c.clone();
        less.recompute[s] = match mode {
            Recompute::Full => Recompute::Selective,
            _ => Recompute::None,
        };
        let costs = Costs::per_stage(&c.schedule.placement, c.stage_costs.clone(), 0.0).unwrap();
        let shares: Vec<RecomputeShares> = c
            .partition
            .iter()
            .map(|r| RecomputeShares::of_stage(&spec(), r.clone(), 1))
            .collect();
        let costs = if less.recompute.iter().all(|m| *m == Recompute::None) {
            costs
        } else {
            costs.recomputing(&less.recompute, &shares).unwrap()
        };
        let sim = simulate(&c.schedule, &costs).unwrap();
        let w = c.stage_workers[s] as usize;
        assert!(
            c.static_bytes[w] + sim.peak_memory[w].ceil() as u64 > budget,
            "stage {s} recomputes {mode} though {} would fit",
            less.recompute[s]
        );
    }

    // Everything the search ranks fits, each as a fresh simulation says.
    for c in &auto.ranked {
        assert!(c.fits, "{}", c.label());
        check_against_simulation(c);
    }
    // Recomputing only where needed is predicted well ahead of recomputing everywhere.
    let full = plan(budget, RecomputeSearch::Every(Recompute::Full));
    let full_1f1b = of_kind(&full, ScheduleKind::OneFOneB);
    assert!(full_1f1b.recompute.iter().all(|m| *m == Recompute::Full));
    check_against_simulation(full_1f1b);
    let gain = full_1f1b.step_ms / c.step_ms;
    assert!(
        gain >= 1.10,
        "1F1B {gain:.3}× faster than full recompute everywhere"
    );
    assert!(auto.ranked[0].step_ms <= c.step_ms);
}
