//! Closed forms of the classic schedules under F = B = W = 1 (so a fused BW takes 2) and no
//! communication cost:
//!
//! - GPipe and 1F1B: makespan `3(n + d − 1)`, bubble `(d − 1)/(n + d − 1)`;
//! - peak activation on worker 0: `n` for GPipe (every forward before any backward),
//!   `min(n, d)` for 1F1B (`d − 1` warm-up forwards plus the one in flight);
//! - Megatron's interleaved 1F1B with `v` chunks and `n` a multiple of `d`: every worker
//!   idles `3(d − 1)/v`, 1F1B's idle time `3(d − 1)` divided by `v` (Narayanan et al. 2021,
//!   bubble `(d − 1)(t_f + t_b)/v`).

#![allow(clippy::unwrap_used)]

use pipewise_common::{Costs, Request, ScheduleKind, Simulation, Times, generate, simulate};

const TOL: f64 = 1e-9;

const UNIT: Times = Times::UNIT;

fn run(kind: ScheduleKind, d: u32, n: u32, chunks: u32) -> Simulation {
    let mut req = Request::new(kind, d, n);
    req.chunks = chunks;
    req.times = UNIT;
    let s = generate(&req).unwrap_or_else(|e| panic!("{kind} d={d} n={n} v={chunks}: {e}"));
    let costs = Costs::uniform(&s.placement, UNIT).unwrap();
    simulate(&s, &costs).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOL * b.abs().max(1.0)
}

#[test]
fn gpipe_and_1f1b_makespan_and_bubble() {
    let mut failures = Vec::new();
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        for d in 1..=8u32 {
            for n in 1..=32u32 {
                let sim = run(kind, d, n, 1);
                let (df, nf) = (f64::from(d), f64::from(n));
                let makespan = 3.0 * (nf + df - 1.0);
                let bubble = (df - 1.0) / (nf + df - 1.0);
                if !close(sim.makespan, makespan) || !close(sim.bubble, bubble) {
                    failures.push(format!(
                        "{kind} d={d} n={n}: makespan {} (expected {makespan}), bubble {} (expected {bubble})",
                        sim.makespan, sim.bubble
                    ));
                }
                // Every worker does 3n units of work.
                if let Some((w, b)) = sim
                    .busy
                    .iter()
                    .enumerate()
                    .find(|(_, b)| !close(**b, 3.0 * nf))
                {
                    failures.push(format!("{kind} d={d} n={n}: worker {w} busy {b}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn gpipe_and_1f1b_peak_memory_on_worker_0() {
    let mut failures = Vec::new();
    for d in 1..=8u32 {
        for n in 1..=32u32 {
            let gpipe = run(ScheduleKind::GPipe, d, n, 1).peak_memory[0];
            let one = run(ScheduleKind::OneFOneB, d, n, 1).peak_memory[0];
            if !close(gpipe, f64::from(n)) {
                failures.push(format!("gpipe d={d} n={n}: peak {gpipe}, expected {n}"));
            }
            let expected = f64::from(n.min(d));
            if !close(one, expected) {
                failures.push(format!("1f1b d={d} n={n}: peak {one}, expected {expected}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Idle time of every worker: makespan − busy.
fn idle(sim: &Simulation) -> Vec<f64> {
    sim.busy.iter().map(|b| sim.makespan - b).collect()
}

#[test]
fn one_f1b_idles_three_times_d_minus_one() {
    for d in 1..=8u32 {
        for n in 1..=32u32 {
            let sim = run(ScheduleKind::OneFOneB, d, n, 1);
            for (w, i) in idle(&sim).into_iter().enumerate() {
                assert!(
                    close(i, 3.0 * f64::from(d - 1)),
                    "1f1b d={d} n={n} worker {w}: idle {i}"
                );
            }
        }
    }
}

/// Megatron-LM's interleaved schedule runs `2(d − 1 − w) + (v − 1)·d` warm-up forwards on
/// worker `w` (`get_num_warmup_microbatches`), then one more before its first backward;
/// each chunk holds `1/v` of the worker's activation. Worker 0 thus peaks at
/// `min(n·v, v·d + d − 1)/v = d + (d − 1)/v` once `n·v` covers the warm-up.
#[test]
fn interleaved_peak_memory_on_worker_0() {
    let mut failures = Vec::new();
    for d in 1..=8u32 {
        for v in 1..=4u32 {
            for n in (d..=32).filter(|n| n % d == 0) {
                let sim = run(ScheduleKind::Interleaved1F1B, d, n, v);
                let expected = f64::from((n * v).min(v * d + d - 1)) / f64::from(v);
                if !close(sim.peak_memory[0], expected) {
                    failures.push(format!(
                        "d={d} n={n} v={v}: peak {} on worker 0, expected {expected}",
                        sim.peak_memory[0]
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Interleaved 1F1B with `v` chunks cuts 1F1B's idle time `3(d − 1)` to `3(d − 1)/v` on
/// every worker. Every failing (d, n, v) is listed with the idle times seen.
#[test]
fn interleaved_idle_is_1f1b_idle_over_v() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for d in 1..=8u32 {
        for v in 2..=4u32 {
            for n in (d..=32).filter(|n| n % d == 0) {
                checked += 1;
                let sim = run(ScheduleKind::Interleaved1F1B, d, n, v);
                let expected = 3.0 * f64::from(d - 1) / f64::from(v);
                let seen = idle(&sim);
                if seen.iter().any(|i| !close(*i, expected)) {
                    failures.push(format!(
                        "d={d} n={n} v={v}: expected idle {expected:.4} on every worker, got [{}] (makespan {}, 3n + expected = {})",
                        seen.iter()
                            .map(|i| format!("{i:.4}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        sim.makespan,
                        3.0 * f64::from(n) + expected
                    ));
                }
            }
        }
    }
    assert!(checked > 100);
    assert!(
        failures.is_empty(),
        "{} of {checked} (d, n, v) fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The App. E.2 V bound is reported only where it is one: from `n = d` microbatches on it
/// never exceeds the simulated makespan of a V schedule (unit and Table 5 times), and below
/// that it is absent (the formula would exceed real makespans there).
#[test]
fn v_bound_is_a_bound_where_reported() {
    let table5 = Times {
        f: 12.96,
        b: 13.22,
        w: 9.76,
        comm: 0.0,
    };
    for kind in [
        ScheduleKind::VMin,
        ScheduleKind::VHalf,
        ScheduleKind::VZb,
        ScheduleKind::AdaptiveV,
    ] {
        for d in 2..=8u32 {
            for n in 1..=3 * d {
                for times in [UNIT, table5] {
                    let Ok(s) = generate(&Request {
                        times,
                        ..Request::new(kind, d, n)
                    }) else {
                        continue;
                    };
                    let sim = simulate(&s, &Costs::uniform(&s.placement, times).unwrap()).unwrap();
                    match sim.bounds.v_bound {
                        Some(v) => {
                            assert!(n >= d, "{kind} d={d} n={n}: a V bound below n = d");
                            assert!(
                                v <= sim.makespan * (1.0 + TOL),
                                "{kind} d={d} n={n}: V bound {v} > makespan {}",
                                sim.makespan
                            );
                        }
                        None => assert!(n < d, "{kind} d={d} n={n}: no V bound"),
                    }
                }
            }
        }
    }
}
