//! Every generator, over random and exhaustive small shapes: the schedule it returns passes
//! the validator and the simulator, has the documented placement and pass count, and does
//! the expected amount of work; unsupported shapes are refused with the right error.
//!
//! The expectations are computed here from the shape alone (stage count from the placement
//! family, pass count from the backward style, total work `3·d·n` under unit times), not
//! from the generators' own output.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use pipewise_common::{
    Costs, Error, Pass, PassKind, Placement, Request, Schedule, ScheduleKind, Times, generate,
    simulate, validate,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const EPS: f64 = 1e-9;

/// How a kind emits its backward passes (module docs of `generate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backward {
    /// One BW per (stage, microbatch).
    Fused,
    /// One B and one W per (stage, microbatch).
    Split,
    /// Either, per (stage, microbatch) (DualPipeV).
    Mixed,
}

fn backward_of(kind: ScheduleKind) -> Backward {
    use ScheduleKind::*;
    match kind {
        GPipe | OneFOneB | Eager1F1B | Interleaved1F1B | LoopedBfs | OneFOneBV => Backward::Fused,
        ZbH1 | ZbH2 | VMin | VHalf | VZb | AdaptiveV | AdaptiveZb => Backward::Split,
        DualPipeV => Backward::Mixed,
    }
}

/// The placement the kind must use on `d` workers with `chunks` chunks.
fn expected_placement(kind: ScheduleKind, d: u32, chunks: u32) -> Placement {
    use ScheduleKind::*;
    match kind {
        GPipe | OneFOneB | Eager1F1B | ZbH1 | ZbH2 | AdaptiveZb => {
            Placement::OnePerWorker { workers: d }
        }
        Interleaved1F1B | LoopedBfs => Placement::Loop { workers: d, chunks },
        VMin | VHalf | VZb | OneFOneBV | DualPipeV | AdaptiveV => Placement::V { workers: d },
    }
}

fn request(kind: ScheduleKind, d: u32, n: u32, chunks: u32) -> Request {
    let mut req = Request::new(kind, d, n);
    req.chunks = chunks;
    req
}

/// True when the generator must accept `(d, n, chunks)`.
fn supported(kind: ScheduleKind, d: u32, n: u32, chunks: u32) -> bool {
    if n < kind.min_microbatches(d) {
        return false;
    }
    !(kind == ScheduleKind::Interleaved1F1B && chunks > 1 && !n.is_multiple_of(d))
}

/// Checks one generated schedule against expectations derived from the shape alone.
fn check_generated(
    kind: ScheduleKind,
    d: u32,
    n: u32,
    chunks: u32,
    schedule: &Schedule,
) -> Result<(), String> {
    let ctx = format!("{kind} d={d} n={n} chunks={chunks}");
    let placement = expected_placement(kind, d, chunks);
    if schedule.placement != placement {
        return Err(format!(
            "{ctx}: placement {:?}, expected {placement:?}",
            schedule.placement
        ));
    }
    if schedule.microbatches != n || schedule.num_workers() != d {
        return Err(format!(
            "{ctx}: schedule has {} microbatches on {} workers",
            schedule.microbatches,
            schedule.num_workers()
        ));
    }
    validate(schedule).map_err(|e| format!("{ctx}: validate: {e}\n{}", schedule.to_text()))?;

    // Independent count of every pass.
    let stages = placement.stages();
    let mut count: HashMap<Pass, u32> = HashMap::new();
    for pass in schedule.workers.iter().flatten() {
        *count.entry(*pass).or_default() += 1;
    }
    if let Some((pass, c)) = count.iter().find(|(_, c)| **c != 1) {
        return Err(format!("{ctx}: {pass} appears {c} times"));
    }
    let of_kind = |k: PassKind| count.keys().filter(|p| p.kind == k).count();
    let (f, b, w, bw) = (
        of_kind(PassKind::F),
        of_kind(PassKind::B),
        of_kind(PassKind::W),
        of_kind(PassKind::BW),
    );
    let cells = (stages * n) as usize;
    if f != cells {
        return Err(format!("{ctx}: {f} F passes, expected {cells}"));
    }
    let total = schedule.num_passes();
    match backward_of(kind) {
        Backward::Fused => {
            if b + w != 0 || bw != cells || total != 2 * cells {
                return Err(format!(
                    "{ctx}: fused kind has {b} B, {w} W, {bw} BW, {total} passes; expected {} = 2 × {stages} stages × {n}",
                    2 * cells
                ));
            }
        }
        Backward::Split => {
            if bw != 0 || b != cells || w != cells || total != 3 * cells {
                return Err(format!(
                    "{ctx}: split kind has {b} B, {w} W, {bw} BW, {total} passes; expected {} = 3 × {stages} stages × {n}",
                    3 * cells
                ));
            }
        }
        Backward::Mixed => {
            if b != w || b + bw != cells || total != 2 * cells + b {
                return Err(format!(
                    "{ctx}: mixed kind has {b} B, {w} W, {bw} BW, {total} passes; every (stage, mb) needs F + BW or F + B + W"
                ));
            }
        }
    }
    // Every (stage, mb) individually: one F, and BW xor (B and W).
    for s in 0..stages {
        for mb in 0..n {
            let has = |p: Pass| count.contains_key(&p);
            let split = has(Pass::b(s, mb)) && has(Pass::w(s, mb)) && !has(Pass::bw(s, mb));
            let fused = has(Pass::bw(s, mb)) && !has(Pass::b(s, mb)) && !has(Pass::w(s, mb));
            if !has(Pass::f(s, mb)) || split == fused {
                return Err(format!(
                    "{ctx}: stage {s} microbatch {mb} lacks F or has no unique backward"
                ));
            }
        }
    }
    // Every pass on the worker that holds its stage.
    for (wk, passes) in schedule.workers.iter().enumerate() {
        if let Some(p) = passes
            .iter()
            .find(|p| placement.worker_of(p.stage) != wk as u32)
        {
            return Err(format!("{ctx}: {p} runs on worker {wk}"));
        }
    }

    // Simulation under unit times: each worker does F + B + W = 3 units per microbatch
    // over its 1/d of the model, so Σ busy = 3·d·n and the makespan is at least 3n.
    let costs = Costs::uniform(&schedule.placement, Times::UNIT)
        .map_err(|e| format!("{ctx}: costs: {e}"))?;
    let sim = simulate(schedule, &costs).map_err(|e| format!("{ctx}: simulate: {e}"))?;
    let busy: f64 = sim.busy.iter().sum();
    let work = 3.0 * f64::from(d) * f64::from(n);
    if (busy - work).abs() > 1e-6 * work.max(1.0) {
        return Err(format!("{ctx}: total busy {busy}, expected 3·d·n = {work}"));
    }
    for (wk, b) in sim.busy.iter().enumerate() {
        if (b - 3.0 * f64::from(n)).abs() > 1e-6 * f64::from(n) {
            return Err(format!("{ctx}: worker {wk} busy {b}, expected 3n"));
        }
    }
    if sim.makespan + EPS < 3.0 * f64::from(n) || sim.makespan + EPS < sim.bounds.lower_bound {
        return Err(format!(
            "{ctx}: makespan {} below a lower bound (3n = {}, bounds {:?})",
            sim.makespan,
            3 * n,
            sim.bounds
        ));
    }
    if !(-EPS..1.0).contains(&sim.bubble) || !(-EPS..1.0).contains(&sim.bubble_span) {
        return Err(format!(
            "{ctx}: bubble {} / bubble_span {} out of [0, 1)",
            sim.bubble, sim.bubble_span
        ));
    }
    for (wk, line) in sim.timeline.iter().enumerate() {
        if line.len() != schedule.workers[wk].len() {
            return Err(format!(
                "{ctx}: worker {wk} simulated only part of its program"
            ));
        }
    }
    Ok(())
}

/// Generates a supported shape and checks it.
fn check_kind(kind: ScheduleKind, d: u32, n: u32, chunks: u32) -> Result<(), String> {
    let schedule = generate(&request(kind, d, n, chunks))
        .map_err(|e| format!("{kind} d={d} n={n} chunks={chunks}: generate: {e}"))?;
    check_generated(kind, d, n, chunks, &schedule)
}

/// Maps a raw draw `n_raw ∈ 1..=64` to a microbatch count the kind supports: at least
/// `min_microbatches(d)`, and a multiple of `d` for interleaved 1F1B with `chunks > 1`.
fn supported_n(kind: ScheduleKind, d: u32, n_raw: u32, chunks: u32) -> u32 {
    if kind == ScheduleKind::Interleaved1F1B && chunks > 1 {
        (n_raw / d).max(1) * d
    } else {
        n_raw.max(kind.min_microbatches(d))
    }
}

fn prop_kind(kind: ScheduleKind, d: u32, n_raw: u32, chunks: u32) -> Result<(), TestCaseError> {
    let chunks = if kind.uses_chunks() { chunks } else { 2 };
    let n = supported_n(kind, d, n_raw, chunks);
    prop_assert!(supported(kind, d, n, chunks));
    check_kind(kind, d, n, chunks).map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn prop_gpipe(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::GPipe, d, n, c)?;
    }

    #[test]
    fn prop_1f1b(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::OneFOneB, d, n, c)?;
    }

    #[test]
    fn prop_eager_1f1b(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::Eager1F1B, d, n, c)?;
    }

    #[test]
    fn prop_interleaved_1f1b(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::Interleaved1F1B, d, n, c)?;
    }

    #[test]
    fn prop_looped_bfs(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::LoopedBfs, d, n, c)?;
    }

    #[test]
    fn prop_zb_h1(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::ZbH1, d, n, c)?;
    }

    #[test]
    fn prop_zb_h2(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::ZbH2, d, n, c)?;
    }

    #[test]
    fn prop_v_min(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::VMin, d, n, c)?;
    }

    #[test]
    fn prop_v_half(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::VHalf, d, n, c)?;
    }

    #[test]
    fn prop_v_zb(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::VZb, d, n, c)?;
    }

    #[test]
    fn prop_1f1b_v(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::OneFOneBV, d, n, c)?;
    }

    #[test]
    fn prop_dualpipe_v(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::DualPipeV, d, n, c)?;
    }
}

proptest! {
    // The adaptive searches are slower; fewer cases (the grid tests of `adaptive.rs` cover
    // the acceptance shapes).
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn prop_adaptive_v(d in 1u32..=12, n in 1u32..=48, c in 1u32..=4) {
        prop_kind(ScheduleKind::AdaptiveV, d, n, c)?;
    }

    #[test]
    fn prop_adaptive_zb(d in 1u32..=16, n in 1u32..=64, c in 1u32..=4) {
        prop_kind(ScheduleKind::AdaptiveZb, d, n, c)?;
    }
}

/// A kind added to `ScheduleKind::ALL` must get its own property test above.
#[test]
fn every_kind_has_a_property_test() {
    assert_eq!(ScheduleKind::ALL.len(), 14);
    let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        [
            "gpipe",
            "1f1b",
            "eager-1f1b",
            "interleaved-1f1b",
            "looped-bfs",
            "zb-h1",
            "zb-h2",
            "v-min",
            "v-half",
            "v-zb",
            "1f1b-v",
            "dualpipe-v",
            "adaptive-v",
            "adaptive-zb"
        ]
    );
}

/// Every kind, every `d ≤ 6`, `n ≤ 12` (and `chunks ≤ 4` for the loop kinds): supported
/// shapes generate valid schedules, unsupported ones are refused with `Unsupported`.
#[test]
fn exhaustive_small_grid() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for kind in ScheduleKind::ALL {
        let chunk_range = if kind.uses_chunks() { 1..=4 } else { 2..=2 };
        for chunks in chunk_range {
            for d in 1..=6u32 {
                for n in 1..=12u32 {
                    checked += 1;
                    if supported(kind, d, n, chunks) {
                        if let Err(e) = check_kind(kind, d, n, chunks) {
                            failures.push(e);
                        }
                    } else {
                        match generate(&request(kind, d, n, chunks)) {
                            Err(Error::Unsupported { schedule, .. }) if schedule == kind.name() => {}
                            other => failures.push(format!(
                                "{kind} d={d} n={n} chunks={chunks}: expected Unsupported, got {:?}",
                                other.map(|s| s.name)
                            )),
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 1000);
    assert!(
        failures.is_empty(),
        "{} of {checked} shapes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn field_of(result: Result<Schedule, Error>) -> Option<&'static str> {
    match result {
        Err(Error::InvalidArgument { field, .. }) => Some(field),
        _ => None,
    }
}

#[test]
fn zero_workers_or_microbatches_are_invalid() {
    for kind in ScheduleKind::ALL {
        assert_eq!(
            field_of(generate(&request(kind, 0, 8, 2))),
            Some("workers"),
            "{kind} with 0 workers"
        );
        assert_eq!(
            field_of(generate(&request(kind, 4, 0, 2))),
            Some("microbatches"),
            "{kind} with 0 microbatches"
        );
    }
}

#[test]
fn zero_chunks_are_invalid_for_loop_kinds() {
    for kind in [ScheduleKind::Interleaved1F1B, ScheduleKind::LoopedBfs] {
        assert_eq!(
            field_of(generate(&request(kind, 4, 8, 0))),
            Some("chunks"),
            "{kind} with 0 chunks"
        );
    }
}

#[test]
fn bad_times_are_invalid() {
    for times in [
        Times {
            f: -1.0,
            ..Times::UNIT
        },
        Times {
            w: f64::NAN,
            ..Times::UNIT
        },
        Times {
            comm: f64::INFINITY,
            ..Times::UNIT
        },
        Times {
            f: 0.0,
            b: 0.0,
            w: 0.0,
            comm: 0.0,
        },
    ] {
        for kind in ScheduleKind::ALL {
            let mut req = request(kind, 4, 8, 2);
            req.times = times;
            assert_eq!(
                field_of(generate(&req)),
                Some("times"),
                "{kind} with {times:?}"
            );
        }
    }
}

/// Times so large that the simulated ends overflow are refused (field `times`), not reported
/// as an infinite makespan and a NaN bubble.
#[test]
fn overflowing_times_are_invalid() {
    let huge = Times {
        f: 1e306,
        b: 1e306,
        w: 1e306,
        comm: 0.0,
    };
    let s = generate(&request(ScheduleKind::OneFOneB, 4, 1000, 2)).unwrap();
    let costs = Costs::uniform(&s.placement, huge).unwrap();
    assert!(matches!(
        simulate(&s, &costs),
        Err(Error::InvalidArgument { field: "times", .. })
    ));
    let mut req = request(ScheduleKind::ZbH1, 4, 1000, 2);
    req.times = huge;
    assert_eq!(field_of(generate(&req)), Some("times"));
    // Large but finite: planned as usual.
    let big = Costs::uniform(
        &s.placement,
        Times {
            f: 1e300,
            b: 1e300,
            w: 1e300,
            comm: 0.0,
        },
    )
    .unwrap();
    assert!(simulate(&s, &big).is_ok_and(|sim| sim.makespan.is_finite()));
}

/// Valid times with zero or vanishing backward passes (frozen weights: W = 0; B = W = 0), or
/// all tiny (the time unit is free): every kind plans a valid schedule. The App. C cool-down
/// reordering used to put a W ahead of its own B when that B, later in the order, ended by
/// the time the pass before it started.
#[test]
fn zero_or_tiny_backward_times_still_plan() {
    for times in [
        Times {
            b: 0.0,
            w: 0.0,
            ..Times::UNIT
        },
        Times {
            w: 0.0,
            ..Times::UNIT
        },
        Times {
            b: 1e-10,
            w: 1e-10,
            ..Times::UNIT
        },
        Times {
            f: 1e-10,
            b: 1e-10,
            w: 1e-10,
            comm: 0.0,
        },
    ] {
        for kind in ScheduleKind::ALL {
            let mut req = request(kind, 4, 8, 2);
            req.times = times;
            let s = generate(&req).unwrap_or_else(|e| panic!("{kind} with {times:?}: {e}"));
            validate(&s).unwrap_or_else(|e| panic!("{kind} with {times:?}: {e}"));
        }
    }
}

#[test]
fn dualpipe_v_needs_two_microbatches_per_worker() {
    for d in 1..=16u32 {
        for n in 1..2 * d {
            let got = generate(&request(ScheduleKind::DualPipeV, d, n, 2));
            assert!(
                matches!(&got, Err(Error::Unsupported { schedule, .. }) if schedule == "dualpipe-v"),
                "dualpipe-v d={d} n={n}: {:?}",
                got.map(|s| s.name)
            );
        }
        check_kind(ScheduleKind::DualPipeV, d, 2 * d, 2).unwrap();
    }
}

#[test]
fn interleaved_needs_a_multiple_of_the_workers() {
    for d in 2..=8u32 {
        for chunks in 2..=4u32 {
            for n in (1..=4 * d).filter(|n| n % d != 0) {
                let got = generate(&request(ScheduleKind::Interleaved1F1B, d, n, chunks));
                assert!(
                    matches!(&got, Err(Error::Unsupported { schedule, .. }) if schedule == "interleaved-1f1b"),
                    "interleaved d={d} n={n} v={chunks}: {:?}",
                    got.map(|s| s.name)
                );
            }
        }
        // One chunk is plain 1F1B order on a loop placement: any n.
        for n in 1..=2 * d {
            check_kind(ScheduleKind::Interleaved1F1B, d, n, 1).unwrap();
        }
    }
}
