//! Acceptance test of the auto-planner: a 24-layer model on 8 workers under three memory
//! budgets gets three different plans, the tighter budget the lower-memory one, and every
//! ranked plan fits, with its memory recomputed here from the model spec and a fresh
//! simulation of its schedule.

#![allow(clippy::unwrap_used)]

use pipewise_common::auto::{AutoPlan, AutoRequest, Candidate, DEFAULT_FLOPS_PER_MS, auto_plan};
use pipewise_common::model::{DType, ModelSpec};
use pipewise_common::{Costs, StageCost, simulate};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn spec() -> ModelSpec {
    ModelSpec {
        vocab: 32000,
        hidden: 1024,
        heads: 16,
        layers: 24,
        seq_len: 1024,
        dtype: DType::BF16,
        ..Default::default()
    }
}

fn request(memory: u64, top: usize) -> AutoRequest {
    AutoRequest::new(spec(), 32, 8, memory, top)
}

/// Recomputes a candidate's costs and memory from the spec and a fresh simulation, and
/// checks them against what the planner reported and against the budget.
fn check_candidate(c: &Candidate, budget: u64) {
    let s = spec();
    let pieces = s.pieces();
    let placement = c.config.kind.placement(8, 2);
    let stages = placement.stages() as usize;
    // The partition covers every piece once, in order, one non-empty range per stage.
    assert_eq!(c.partition.len(), stages, "{}", c.label());
    assert_eq!(c.partition[0].start, 0);
    assert_eq!(c.partition[stages - 1].end, pieces.len());
    assert!(c.partition.windows(2).all(|w| w[0].end == w[1].start));
    assert!(c.partition.iter().all(|r| !r.is_empty()));
    assert_eq!(c.config.microbatch_size * c.config.microbatches, 32);

    // Stage costs from FLOPs (F = B = W) and the larger activation stash.
    let mbs = c.config.microbatch_size;
    let stage_costs: Vec<StageCost> = c
        .partition
        .iter()
        .map(|r| {
            let t: f64 = pieces[r.clone()]
                .iter()
                .map(|&p| s.piece_flops(p, mbs) / DEFAULT_FLOPS_PER_MS)
                .sum();
            let a = s.range_activation_bytes(r.clone(), mbs);
            let mem: u64 = pieces[r.clone()]
                .iter()
                .map(|&p| {
                    let x = s.piece_activation_bytes(p, mbs);
                    x.after_forward.max(x.after_backward_input)
                })
                .sum();
            assert!(mem >= a.after_forward.max(a.after_backward_input));
            StageCost {
                f: t,
                b: t,
                w: t,
                mem: mem as f64,
            }
        })
        .collect();
    for (mine, theirs) in stage_costs.iter().zip(&c.stage_costs) {
        assert!((mine.f - theirs.f).abs() <= 1e-9 * mine.f.max(1.0));
        assert_eq!(mine.mem, theirs.mem);
    }
    let costs = Costs::per_stage(&placement, stage_costs, 0.0).unwrap();
    let sim = simulate(&c.schedule, &costs).unwrap();
    assert!(
        (sim.makespan - c.step_ms).abs() <= 1e-9 * sim.makespan,
        "{}",
        c.label()
    );

    // Static state: the parameter in bf16; an f64 gradient; an f32 master copy and two
    // moments.
    let mut worker_bytes = vec![0u64; 8];
    for (stage, r) in c.partition.iter().enumerate() {
        let params: u64 = pieces[r.clone()].iter().map(|&p| s.piece_params(p)).sum();
        worker_bytes[placement.worker_of(stage as u32) as usize] += params * (2 + 8 + 4 + 4 + 4);
    }
    for (w, bytes) in worker_bytes.iter_mut().enumerate() {
        *bytes += sim.peak_memory[w].ceil() as u64;
    }
    assert_eq!(worker_bytes, c.worker_bytes, "{}", c.label());
    assert_eq!(c.max_worker_bytes, *worker_bytes.iter().max().unwrap());
    assert!(
        c.max_worker_bytes <= budget,
        "{} needs {} > {budget}",
        c.label(),
        c.max_worker_bytes
    );
    assert!(c.fits);
}

fn check_plan(plan: &AutoPlan, budget: u64) {
    assert!(!plan.ranked.is_empty());
    for c in &plan.ranked {
        check_candidate(c, budget);
    }
    assert!(plan.ranked.windows(2).all(|w| w[0].step_ms <= w[1].step_ms));
    for r in &plan.rejected {
        if let Some(b) = r.needed_bytes
            && r.reason.starts_with("does not fit")
        {
            assert!(b > budget, "{}: {}", r.label(), r.reason);
        }
    }
}

fn describe(name: &str, budget: u64, plan: &AutoPlan) -> String {
    let w = &plan.ranked[0];
    format!(
        "{name}: budget {:.3} GiB → {} ({}), step {:.1} ms, bubble {:.1}%, max worker {:.3} GiB",
        budget as f64 / GIB,
        w.label(),
        pipewise_common::auto::partition_summary(&spec(), &w.partition),
        w.step_ms,
        100.0 * w.bubble,
        w.max_worker_bytes as f64 / GIB
    )
}

#[test]
fn three_budgets_get_three_plans() {
    // Unlimited memory: every configuration is planned; what they need sets the budgets.
    let open = auto_plan(&request(1 << 40, usize::MAX)).unwrap();
    assert_eq!(open.fitting, open.ranked.len());
    // The least memory any plan needs, from the planner's "nothing fits" error.
    let err = auto_plan(&request(1 << 20, 5)).unwrap_err().to_string();
    let tail = err.split("the smallest plan needs ").nth(1).unwrap();
    let smallest: u64 = tail.split(' ').next().unwrap().parse().unwrap();
    let fastest = open.ranked[0].max_worker_bytes;
    assert!(smallest < fastest);
    // It is the budget of a plan the planner finds, and one byte less fits none.
    let at = auto_plan(&request(smallest, 5)).unwrap();
    assert!(at.ranked.iter().any(|c| c.max_worker_bytes == smallest));
    let below = auto_plan(&request(smallest - 1, 5))
        .unwrap_err()
        .to_string();
    assert!(
        below.contains(&format!("needs {smallest} bytes")),
        "{below}"
    );

    // Tight: the smallest plan; loose: room for every plan of the open run; medium: half
    // way between the smallest and the fastest plan.
    let tight = smallest;
    let medium = smallest + (fastest - smallest) / 2;
    let loose = open
        .ranked
        .iter()
        .map(|c| c.max_worker_bytes)
        .max()
        .unwrap();
    let plans: Vec<(&str, u64, AutoPlan)> =
        [("tight", tight), ("medium", medium), ("loose", loose)]
            .into_iter()
            .map(|(name, b)| (name, b, auto_plan(&request(b, 5)).unwrap()))
            .collect();
    for (name, budget, plan) in &plans {
        println!("{}", describe(name, *budget, plan));
        check_plan(plan, *budget);
    }
    let winners: Vec<&Candidate> = plans.iter().map(|(_, _, p)| &p.ranked[0]).collect();
    // Three different plans (an adaptive kind searched under different limits gives
    // different schedules of the same kind and shape); the tighter budget gets the
    // lower-memory and slower one.
    for (i, j) in [(0, 1), (1, 2), (0, 2)] {
        assert_ne!(winners[i].schedule, winners[j].schedule);
        assert!(winners[i].max_worker_bytes < winners[j].max_worker_bytes);
        assert!(winners[i].step_ms > winners[j].step_ms);
    }
    // The loose winner is as fast as the open run's.
    assert!(winners[2].step_ms <= open.ranked[0].step_ms * (1.0 + 1e-9));
    // Far below the smallest plan nothing fits, and the error says what would.
    let err = auto_plan(&request(smallest / 2, 5)).unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("the smallest plan needs {smallest} bytes")),
        "{err}"
    );
}

/// When nothing fits, the budget the error names is what the least-memory plan needs on its
/// fullest worker, exactly: that budget gets a plan needing just that, and one byte less
/// gets none. Here the fullest static state (worker 0: the embedding) and the fullest
/// activations (the middle workers) are on different workers, where the planner used to
/// name the largest static state plus the smallest activation limit, 2.2 % more.
#[test]
fn nothing_fits_names_the_exact_smallest_budget() {
    let spec = ModelSpec {
        vocab: 32000,
        hidden: 256,
        heads: 4,
        layers: 8,
        seq_len: 1024,
        dtype: DType::BF16,
        ..Default::default()
    };
    let request = |memory: u64| AutoRequest::new(spec.clone(), 16, 4, memory, 3);
    let needs = |memory: u64| {
        let err = auto_plan(&request(memory)).unwrap_err().to_string();
        let tail = err.split("the smallest plan needs ").nth(1).unwrap();
        tail.split(' ').next().unwrap().parse::<u64>().unwrap()
    };
    let smallest = needs(1000);
    let at = auto_plan(&request(smallest)).unwrap();
    println!(
        "smallest budget {smallest} bytes: {} needs {} (static {:?}, activations {:?})",
        at.ranked[0].label(),
        at.ranked[0].max_worker_bytes,
        at.ranked[0].static_bytes,
        at.ranked[0].activation_bytes
    );
    assert!(at.ranked.iter().any(|c| c.max_worker_bytes == smallest));
    for c in &at.ranked {
        check_fits(c, smallest);
    }
    assert_eq!(needs(smallest - 1), smallest);
}

fn check_fits(c: &Candidate, budget: u64) {
    assert!(c.fits && c.max_worker_bytes <= budget, "{}", c.label());
    for (s, a) in c.static_bytes.iter().zip(&c.activation_bytes) {
        assert!(s + a <= budget, "{}", c.label());
    }
}
