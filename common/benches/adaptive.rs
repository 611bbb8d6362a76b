//! Adaptive planning time (issue: memory-budget planning): `adaptive-v` at the V-ZB limit
//! (d units) with the Table 5 times of seed 000, for d = 16, n = 128 (target < 1 s) and
//! d = 64, n = 1024 (target < 10 s), plus `adaptive-zb` and `adaptive-v` at the V-Half limit
//! for d = 16, n = 128, and the named V-Min / V-Half / V-ZB at d = 16, n = 64 (each the better
//! of the paper's schedule and `adaptive-v` at its class's limit: `pipewise plan`'s and job
//! planning's time for them; target < 1 s). Each shape runs three times in one process; the
//! table gives the median and the fastest, and the ratio to the target.
//!
//! `cargo bench -p pipewise-common --bench adaptive`; `PIPEWISE_BENCH_QUICK=1` skips d = 64.
//! Without `--bench` (as `cargo test --benches` runs it) only d = 16 runs, once.

use std::time::Instant;

use pipewise_common::generate::{Bounds, adaptive_v, adaptive_zb};
use pipewise_common::{Costs, Placement, Request, ScheduleKind, Times, generate, simulate};

const TABLE5: Times = Times {
    f: 12.96,
    b: 13.22,
    w: 9.76,
    comm: 0.0,
};

/// What a case plans.
#[derive(Clone, Copy)]
enum Case {
    /// `adaptive-v` at the case's limit.
    V,
    /// `adaptive-zb` at the case's limit.
    Zb,
    /// The named V schedule (the limit column is its class's, for the table only).
    Named(ScheduleKind),
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let quick = std::env::var_os("PIPEWISE_BENCH_QUICK").is_some() || !bench;
    let runs = if bench { 3 } else { 1 };
    let mut cases: Vec<(&str, u32, u32, f64, Case, f64)> = vec![
        ("adaptive-v  V-ZB limit", 16, 128, 16.0, Case::V, 1.0),
        ("adaptive-v  V-Half limit", 16, 128, 9.0, Case::V, 1.0),
        ("adaptive-zb 1x limit", 16, 128, 16.0, Case::Zb, 1.0),
        (
            "v-min  (named)",
            16,
            64,
            6.0,
            Case::Named(ScheduleKind::VMin),
            1.0,
        ),
        (
            "v-half (named)",
            16,
            64,
            9.0,
            Case::Named(ScheduleKind::VHalf),
            1.0,
        ),
        (
            "v-zb   (named)",
            16,
            64,
            16.0,
            Case::Named(ScheduleKind::VZb),
            1.0,
        ),
    ];
    if !quick {
        cases.push(("adaptive-v  V-ZB limit", 64, 1024, 64.0, Case::V, 10.0));
    }
    println!(
        "{:<26} {:>4} {:>5} {:>10} {:>10} {:>8} {:>9}",
        "case", "d", "n", "median s", "min s", "target", "med/tgt"
    );
    for (name, d, n, limit, case, target) in cases {
        let mut times = Vec::new();
        let mut bubble = 0.0;
        for _ in 0..runs {
            let start = Instant::now();
            let v_costs = || Costs::uniform(&Placement::V { workers: d }, TABLE5).expect("costs");
            let simulation = match case {
                Case::V => {
                    adaptive_v(d, n, &v_costs(), Bounds::limit(limit))
                        .expect("plans")
                        .simulation
                }
                Case::Zb => {
                    let costs = Costs::uniform(&Placement::OnePerWorker { workers: d }, TABLE5)
                        .expect("costs");
                    adaptive_zb(d, n, &costs, Bounds::limit(limit))
                        .expect("plans")
                        .simulation
                }
                Case::Named(kind) => {
                    let request = Request {
                        times: TABLE5,
                        ..Request::new(kind, d, n)
                    };
                    let schedule = generate(&request).expect("generates");
                    simulate(&schedule, &v_costs()).expect("simulates")
                }
            };
            times.push(start.elapsed().as_secs_f64());
            bubble = simulation.bubble_span;
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "{name:<26} {d:>4} {n:>5} {median:>10.3} {:>10.3} {target:>8.1} {:>9.3}   (bubble_span {:.2} %)",
            times[0],
            median / target,
            100.0 * bubble
        );
    }
}
