//! Planning time: every fixed generator (the adaptive ones have `benches/adaptive.rs`) at d = 16, n = 256 and d = 128, n = 4096 (two chunks for
//! the loop kinds, unit times), and the simulator alone on pre-generated schedules at both
//! sizes.
//!
//! At the large size every generator is first timed once with `Instant`. Criterion needs at
//! least eleven calls (warm-up plus ten samples), so a generator slower than [`SLOW`] per call
//! is only reported (`SLOW …` on stderr, with its one-shot time) and not sampled; above
//! [`BUG`] the line says so, since that is a performance bug. This keeps
//! `cargo bench -p pipewise-common --bench planning` within a few minutes.
//! `PIPEWISE_BENCH_QUICK=1` skips the large size. Without `--bench` (e.g. `cargo test
//! --benches`) only the small size runs, once per benchmark, as a smoke test.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use pipewise_common::{Costs, Request, Schedule, ScheduleKind, Times, generate, simulate};

/// A generator slower than this per call is timed once instead of sampled.
const SLOW: Duration = Duration::from_secs(10);
/// A generator slower than this per call at d = 128, n = 4096 is a performance bug.
const BUG: Duration = Duration::from_secs(20);

/// Kinds whose schedule the simulator benchmark runs on: one stage per worker, loop, and V
/// with split and with mixed backward passes.
const SIMULATED: [ScheduleKind; 4] = [
    ScheduleKind::OneFOneB,
    ScheduleKind::Interleaved1F1B,
    ScheduleKind::VZb,
    ScheduleKind::DualPipeV,
];

#[derive(Clone, Copy)]
struct Size {
    label: &'static str,
    d: u32,
    n: u32,
}

const SMALL: Size = Size {
    label: "d16_n256",
    d: 16,
    n: 256,
};
const LARGE: Size = Size {
    label: "d128_n4096",
    d: 128,
    n: 4096,
};

fn request(kind: ScheduleKind, size: Size) -> Request {
    let mut req = Request::new(kind, size.d, size.n);
    req.chunks = 2;
    req.times = Times::UNIT;
    req
}

fn gen_or_die(req: &Request) -> Schedule {
    generate(req)
        .unwrap_or_else(|e| panic!("{} d={} n={}: {e}", req.kind, req.workers, req.microbatches))
}

/// One timed call per kind; returns the schedules and the kinds fast enough to sample.
fn precheck(size: Size) -> (Vec<(ScheduleKind, Schedule)>, Vec<ScheduleKind>) {
    let mut schedules = Vec::new();
    let mut fast = Vec::new();
    for kind in ScheduleKind::ALL.into_iter().filter(|k| !k.is_adaptive()) {
        let start = Instant::now();
        let schedule = gen_or_die(&request(kind, size));
        let took = start.elapsed();
        eprintln!(
            "precheck generate/{kind}/{}: {:.3} s ({} passes)",
            size.label,
            took.as_secs_f64(),
            schedule.num_passes()
        );
        if took > SLOW {
            eprintln!(
                "SLOW generate/{kind}/{}: {:.1} s per call (> {} s): not sampled by criterion{}",
                size.label,
                took.as_secs_f64(),
                SLOW.as_secs(),
                if took > BUG {
                    " -- PERFORMANCE BUG (> 20 s per call)"
                } else {
                    ""
                }
            );
        } else {
            fast.push(kind);
        }
        schedules.push((kind, schedule));
    }
    (schedules, fast)
}

fn bench_size(c: &mut Criterion, size: Size, large: bool) {
    let (schedules, fast) = if large {
        precheck(size)
    } else {
        let all: Vec<_> = ScheduleKind::ALL
            .into_iter()
            .filter(|k| !k.is_adaptive())
            .map(|k| (k, gen_or_die(&request(k, size))))
            .collect();
        let kinds = all.iter().map(|(k, _)| *k).collect();
        (all, kinds)
    };

    let mut group = c.benchmark_group(format!("generate/{}", size.label));
    if large {
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(5));
    } else {
        group
            .sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2));
    }
    for kind in fast {
        let req = request(kind, size);
        group.bench_with_input(BenchmarkId::from_parameter(kind.name()), &req, |b, req| {
            b.iter(|| generate(black_box(req)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group(format!("simulate/{}", size.label));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(if large { 5 } else { 2 }));
    for (kind, schedule) in schedules.iter().filter(|(k, _)| SIMULATED.contains(k)) {
        let costs = Costs::uniform(&schedule.placement, Times::UNIT)
            .unwrap_or_else(|e| panic!("costs for {kind}: {e}"));
        group.bench_with_input(
            BenchmarkId::from_parameter(kind.name()),
            schedule,
            |b, schedule| b.iter(|| simulate(black_box(schedule), black_box(&costs))),
        );
    }
    group.finish();
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench");
    let quick = std::env::var_os("PIPEWISE_BENCH_QUICK").is_some_and(|v| v != "0");
    let mut c = Criterion::default().configure_from_args();
    bench_size(&mut c, SMALL, false);
    if benching && !quick {
        bench_size(&mut c, LARGE, true);
    }
    c.final_summary();
}
