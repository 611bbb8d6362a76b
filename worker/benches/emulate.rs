//! Emulated compute: planned against measured bubble, and the runtime's per-step overhead.
//!
//! `cargo bench -p pipewise-worker --bench emulate`
//!
//! For V-Half, ZB-H1 and 1F1B at d = 8, n = 64, and V-Half at d = 32, n = 64, every worker
//! runs its program of the schedule (planned exactly as the coordinator plans an emulated
//! job: `JobSpec::validate` with `[compute] mode = "emulate"`) on its own thread with
//! [`EmulatedRuntime`]: each pass sleeps for its cost-model time and each frame between
//! workers is a real `[1, seq_len, hidden]` f32 buffer (512 KiB with the default model). Two
//! transports:
//!
//! - `memory`: [`MemoryTransport`] and one in-process [`LocalSync`];
//! - `grpc`: one [`GrpcTransport`] per worker on loopback (its own tokio runtime, as a
//!   worker process has), and the end-of-step collectives over gRPC to worker 0's
//!   `CollectiveService` ([`NetSync`]), after the same start barrier a worker node joins.
//!
//! Printed per run: the planned bubble (the schedule simulated with the emulated times and
//! no communication cost), the measured bubble (mean over workers and steps of
//! `1 − time in passes / step wall time`, the first step left out as a warm-up), their
//! difference in points, the planned makespan, the measured step time (the slowest
//! worker's wall time, mean over the measured steps), the per-step coordination overhead
//! `(measured step − planned makespan) / planned makespan` (transport latency, waking up,
//! the collectives) and the mean pass overshoot (recorded pass time − emulated time). A
//! second line breaks the last step down along its critical path (the chain of passes and
//! hops that ends with the step's last pass, walked back from the spans the workers
//! recorded): planned pass time, overshoot, local gaps between a worker's passes (and how
//! much of them went into handing frames to the transport), and the hops on which a pass
//! waited for its frame, with their mean time from the producing pass's end.
//!
//! Pass times: F = B = W = 20 ms for one stage of `1/d` of the model (a V-Half chunk pass
//! is 10 ms). They must be long against what the machine adds per pass and per hop: the
//! sleep's wake-up (tens of µs, more when the cores are busy), and on gRPC the encoding,
//! HTTP/2 and decoding of a 512 KiB frame (a few hundred µs of CPU). With 8 (or 32) workers
//! sharing 2 cores that are also used by others, 1–5 ms passes would measure the machine's
//! load, not the schedule; at 10–20 ms the runtime's own cost is a few per cent and visible.
//!
//! Environment: `PIPEWISE_EMU_MS=F,B,W` (default `20,20,20`), `PIPEWISE_EMU_STEPS` (steps
//! per d = 8 run, default 3, the first a warm-up), `PIPEWISE_EMU_D32_STEPS` (default 2),
//! `PIPEWISE_EMU_HIDDEN` / `PIPEWISE_EMU_SEQ` (frame size, default 1024 × 128),
//! `PIPEWISE_EMU_ONLY=memory|grpc`, `PIPEWISE_EMU_SCHEDULE=v-half|zb-h1|1f1b`,
//! `PIPEWISE_BENCH_QUICK=1` (d = 4, n = 8, 2 ms passes:
//! a smoke test), `PIPEWISE_SCHED=default` (the transports' runtime threads stay normal
//! threads instead of `SCHED_BATCH`, see `pipewise_worker::sched`). The machine's load average is printed before and after, since the
//! figures depend on it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pipewise_common::job::{Compute, JobSpec, example};
use pipewise_common::model::DType;
use pipewise_common::pass::{Pass, PassKind};
use pipewise_common::schedule::Schedule;
use pipewise_common::trace::{Activity, Span};
use pipewise_common::{Costs, simulate};
use pipewise_worker::net::{Delivery, GrpcConfig, GrpcTransport, NetSync};
use pipewise_worker::runtime::{
    EmulatedRuntime, LocalSync, MemoryTransport, Replica, StepReport, StepSync, Transport,
};

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const JOB: u64 = 1;
const TIMEOUT: Duration = Duration::from_secs(120);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn env_times(default: [f64; 3]) -> BenchResult<[f64; 3]> {
    let Ok(text) = std::env::var("PIPEWISE_EMU_MS") else {
        return Ok(default);
    };
    let v: Vec<f64> = text
        .split(',')
        .map(|s| s.trim().parse::<f64>())
        .collect::<Result<_, _>>()?;
    match v[..] {
        [f, b, w] => Ok([f, b, w]),
        _ => Err(format!("PIPEWISE_EMU_MS={text}: expected F,B,W in ms").into()),
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".into())
}

/// The job the coordinator would plan: `d` workers, `n` microbatches of one sequence.
fn job(schedule: &str, d: u32, n: u32, ms: [f64; 3], hidden: u32, seq: u32) -> JobSpec {
    let mut spec = example(d, schedule);
    spec.job.name = format!("emulate-{schedule}-{d}");
    spec.model.hidden = hidden;
    spec.model.heads = 16;
    spec.model.seq_len = seq;
    spec.model.layers = (4 * d).max(8); // a V shape on d workers has 2d stages
    spec.model.dtype = DType::F32;
    spec.training.global_batch_size = n;
    spec.parallelism.pipeline_parallel_microbatch_size = 1;
    spec.compute = Compute::emulate(ms[0], ms[1], ms[2]);
    spec
}

enum WorkerSync<'a> {
    Local(&'a LocalSync),
    Net(Box<NetSync>),
}

impl WorkerSync<'_> {
    fn start(&self) -> BenchResult<()> {
        match self {
            WorkerSync::Local(_) => Ok(()),
            WorkerSync::Net(s) => Ok(s.barrier()?),
        }
    }

    fn get(&self) -> &dyn StepSync {
        match self {
            WorkerSync::Local(s) => *s,
            WorkerSync::Net(s) => s.as_ref(),
        }
    }
}

/// Runs `steps` steps of every worker on its own thread; `reports[step][worker]`.
fn run(
    runtimes: Vec<EmulatedRuntime>,
    transports: &[Box<dyn Transport>],
    syncs: Vec<WorkerSync<'_>>,
    steps: u64,
) -> BenchResult<Vec<Vec<StepReport>>> {
    let per_worker: Vec<BenchResult<Vec<StepReport>>> = std::thread::scope(|scope| {
        let threads: Vec<_> = runtimes
            .into_iter()
            .zip(transports.iter())
            .zip(syncs)
            .map(|((mut rt, transport), sync)| {
                scope.spawn(move || -> BenchResult<Vec<StepReport>> {
                    sync.start()?;
                    let mut reports = Vec::new();
                    for step in 0..steps {
                        reports.push(rt.run_step(JOB, step, transport.as_ref(), sync.get())?);
                    }
                    Ok(reports)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a worker panicked".into())))
            .collect()
    });
    let mut reports: Vec<Vec<StepReport>> = (0..steps).map(|_| Vec::new()).collect();
    for worker in per_worker {
        for (step, r) in worker?.into_iter().enumerate() {
            reports[step].push(r);
        }
    }
    Ok(reports)
}

struct Row {
    schedule: String,
    d: u32,
    n: u32,
    transport: &'static str,
    planned: f64,
    measured: f64,
    makespan: f64,
    step: f64,
    overshoot_us: f64,
    critical: CriticalPath,
    steps: usize,
    frame_kib: u64,
}

/// Where the measured step's time went: the chain of passes and hops that ends with the
/// step's last pass, walked back from it. Each pass on the chain waited either for the
/// previous pass of its worker (a local gap: handing its output to the transport, taking
/// an input that had arrived, bookkeeping) or, when the frame it needed was produced after
/// that, for the frame (a hop: from the producing pass's end to this pass's start).
#[derive(Default)]
struct CriticalPath {
    passes: usize,
    planned: f64,
    overshoot: f64,
    gaps: f64,
    gaps_in_send: f64,
    hops: usize,
    hop_secs: f64,
}

impl CriticalPath {
    fn of(step: &[StepReport], pass_secs: &[Vec<f64>]) -> CriticalPath {
        let is_pass = |s: &Span| matches!(s.activity, Activity::Pass(_));
        let mut at: HashMap<Pass, (usize, usize)> = HashMap::new();
        let mut planned: HashMap<Pass, f64> = HashMap::new();
        for (w, r) in step.iter().enumerate() {
            for (i, span) in r.spans.iter().enumerate() {
                if let Activity::Pass(p) = span.activity {
                    at.insert(p, (w, i));
                }
            }
            for (t, &secs) in r.pass_times.iter().zip(&pass_secs[w]) {
                planned.insert(t.pass, secs);
            }
        }
        let last_end = |w: usize| {
            step[w]
                .spans
                .iter()
                .rfind(|s| is_pass(s))
                .map_or(f64::MIN, |s| s.end)
        };
        let mut path = CriticalPath::default();
        let Some(mut w) = (0..step.len()).max_by(|&a, &b| last_end(a).total_cmp(&last_end(b)))
        else {
            return path;
        };
        let Some(mut i) = step[w].spans.iter().rposition(is_pass) else {
            return path;
        };
        loop {
            let span = step[w].spans[i];
            let Activity::Pass(p) = span.activity else {
                break;
            };
            let want = planned.get(&p).copied().unwrap_or(0.0);
            path.passes += 1;
            path.planned += want;
            path.overshoot += span.duration() - want;
            let previous = step[w].spans[..i].iter().rposition(is_pass);
            let previous_end = previous.map(|j| step[w].spans[j].end);
            let producer = match p.kind {
                PassKind::F if p.stage > 0 => at.get(&Pass::new(PassKind::F, p.stage - 1, p.mb)),
                PassKind::B | PassKind::BW => [PassKind::B, PassKind::BW]
                    .into_iter()
                    .find_map(|k| at.get(&Pass::new(k, p.stage + 1, p.mb))),
                _ => None,
            };
            if let Some(&(qw, qi)) = producer {
                let produced = step[qw].spans[qi].end;
                if qw != w && previous_end.is_none_or(|e| produced > e) {
                    path.hops += 1;
                    path.hop_secs += span.start - produced;
                    (w, i) = (qw, qi);
                    continue;
                }
            }
            let Some(j) = previous else {
                break;
            };
            path.gaps += span.start - step[w].spans[j].end;
            path.gaps_in_send += step[w].spans[j + 1..i]
                .iter()
                .filter(|s| matches!(s.activity, Activity::Send { .. }))
                .map(Span::duration)
                .sum::<f64>();
            i = j;
        }
        path
    }
}

impl std::fmt::Display for CriticalPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "critical path: {} passes {:.0} ms planned {:+.1} ms overshoot; local gaps {:.1} ms \
             ({:.1} ms in send); {} hops {:.1} ms ({:.0} µs each)",
            self.passes,
            1e3 * self.planned,
            1e3 * self.overshoot,
            1e3 * self.gaps,
            1e3 * self.gaps_in_send,
            self.hops,
            1e3 * self.hop_secs,
            1e6 * self.hop_secs / self.hops.max(1) as f64
        )
    }
}

fn measure(spec: &JobSpec, transport: &'static str, steps: u64) -> BenchResult<Row> {
    let plan = spec.validate()?;
    let schedule: &Schedule = &plan.schedule;
    let times = spec.compute.times_secs();
    let sim = simulate(schedule, &Costs::uniform(&schedule.placement, times)?)?;
    let d = schedule.num_workers();
    let mbs = spec.parallelism.pipeline_parallel_microbatch_size;
    let runtimes = (0..d)
        .map(|w| {
            let mut rt = EmulatedRuntime::new(w, schedule, &spec.model, mbs, times)?;
            rt.set_timeout(TIMEOUT);
            Ok(rt)
        })
        .collect::<BenchResult<Vec<_>>>()?;
    let frame_kib = runtimes.first().map_or(0, |r| r.frame_bytes() / 1024);
    let pass_secs: Vec<Vec<f64>> = runtimes
        .iter()
        .map(|rt| rt.program().iter().map(|&p| rt.pass_secs(p)).collect())
        .collect();
    let local_sync = LocalSync::new(d, TIMEOUT);
    let reports = match transport {
        "memory" => {
            let transports: Vec<Box<dyn Transport>> = MemoryTransport::network(d)
                .into_iter()
                .map(|t| Box::new(t) as Box<dyn Transport>)
                .collect();
            let syncs = (0..d).map(|_| WorkerSync::Local(&local_sync)).collect();
            run(runtimes, &transports, syncs, steps)?
        }
        _ => {
            let mut nets = Vec::with_capacity(d as usize);
            for w in 0..d {
                let mut config = GrpcConfig::new(JOB, schedule.placement.stages_of(w));
                // As a worker node assigned an emulated job does.
                config.delivery = Delivery::Buffers;
                nets.push(GrpcTransport::start(config)?);
            }
            let addrs: Vec<String> = nets.iter().map(|t| t.local_addr().to_string()).collect();
            for t in &nets {
                t.set_peers(
                    JOB,
                    addrs
                        .iter()
                        .enumerate()
                        .map(|(w, a)| (w as u32, a.as_str())),
                )?;
            }
            nets[0]
                .collective()
                .configure(JOB, d, Replica::default(), TIMEOUT);
            let syncs = nets
                .iter()
                .enumerate()
                .map(|(w, t)| {
                    Ok(WorkerSync::Net(Box::new(
                        t.sync_to(&addrs[0], JOB, w as u32, TIMEOUT)?,
                    )))
                })
                .collect::<BenchResult<Vec<_>>>()?;
            // The transports outlive every worker thread: worker 0's serves the collectives.
            let transports: Vec<Box<dyn Transport>> = nets
                .into_iter()
                .map(|t| Box::new(t) as Box<dyn Transport>)
                .collect();
            run(runtimes, &transports, syncs, steps)?
        }
    };
    let measured_steps = &reports[1.min(reports.len() - 1)..];
    let (mut bubble_sum, mut bubble_count, mut wall_sum) = (0.0, 0usize, 0.0);
    let (mut over_sum, mut over_count) = (0.0, 0usize);
    for step in measured_steps {
        let mut wall = 0.0f64;
        for (w, r) in step.iter().enumerate() {
            bubble_sum += 1.0 - r.busy_secs / r.wall_secs;
            bubble_count += 1;
            wall = wall.max(r.wall_secs);
            for (t, want) in r.pass_times.iter().zip(&pass_secs[w]) {
                over_sum += t.secs - want;
                over_count += 1;
            }
        }
        wall_sum += wall;
    }
    Ok(Row {
        schedule: spec.parallelism.pipeline_parallel_schedule.clone(),
        d,
        n: plan.microbatches,
        transport,
        planned: sim.bubble,
        measured: bubble_sum / bubble_count.max(1) as f64,
        makespan: sim.makespan,
        step: wall_sum / measured_steps.len().max(1) as f64,
        overshoot_us: 1e6 * over_sum / over_count.max(1) as f64,
        critical: measured_steps
            .last()
            .map(|step| CriticalPath::of(step, &pass_secs))
            .unwrap_or_default(),
        steps: measured_steps.len(),
        frame_kib,
    })
}

fn main() -> BenchResult<()> {
    // Before any thread starts, as the `pipewise` binary does.
    let heap = pipewise_worker::alloc::policy_from_env();
    let quick = std::env::var("PIPEWISE_BENCH_QUICK").is_ok_and(|v| v == "1");
    let ms = env_times(if quick {
        [2.0, 2.0, 2.0]
    } else {
        [20.0, 20.0, 20.0]
    })?;
    let steps = env_u64("PIPEWISE_EMU_STEPS", 3).max(2);
    let steps32 = env_u64("PIPEWISE_EMU_D32_STEPS", 2).max(2);
    let hidden = env_u64("PIPEWISE_EMU_HIDDEN", 1024) as u32;
    let seq = env_u64("PIPEWISE_EMU_SEQ", 128) as u32;
    let only = std::env::var("PIPEWISE_EMU_ONLY").ok();
    let only_schedule = std::env::var("PIPEWISE_EMU_SCHEDULE").ok();
    let cases: Vec<(&str, u32, u32, u64)> = if quick {
        vec![("v-half", 4, 8, 2), ("zb-h1", 4, 8, 2)]
    } else {
        vec![
            ("v-half", 8, 64, steps),
            ("zb-h1", 8, 64, steps),
            ("1f1b", 8, 64, steps),
            ("v-half", 32, 64, steps32),
        ]
    };
    let transports: Vec<&'static str> = ["memory", "grpc"]
        .into_iter()
        .filter(|t| only.as_deref().is_none_or(|o| o == *t))
        .collect();
    println!(
        "emulated compute: F,B,W = {},{},{} ms per stage of 1/d; {} cores; load average {}; \
         heap: {heap}",
        ms[0],
        ms[1],
        ms[2],
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    println!(
        "{:<8} {:>3} {:>3} {:<7} {:>7} {:>8} {:>7} {:>9} {:>9} {:>8} {:>9} {:>5} {:>6}",
        "schedule",
        "d",
        "n",
        "net",
        "planned",
        "measured",
        "diff",
        "makespan",
        "step",
        "overhead",
        "overshoot",
        "steps",
        "frame"
    );
    let started = Instant::now();
    for (schedule, d, n, steps) in cases {
        if only_schedule.as_deref().is_some_and(|o| o != schedule) {
            continue;
        }
        for &transport in &transports {
            let spec = job(schedule, d, n, ms, hidden, seq);
            let r = measure(&spec, transport, steps)?;
            println!(
                "{:<8} {:>3} {:>3} {:<7} {:>6.2}% {:>7.2}% {:>+6.2}p {:>7.0}ms {:>7.0}ms {:>+7.2}% {:>7.0}µs {:>5} {:>4}KiB",
                r.schedule,
                r.d,
                r.n,
                r.transport,
                100.0 * r.planned,
                100.0 * r.measured,
                100.0 * (r.measured - r.planned),
                1e3 * r.makespan,
                1e3 * r.step,
                100.0 * (r.step - r.makespan) / r.makespan,
                r.overshoot_us,
                r.steps,
                r.frame_kib
            );
            println!("  {}", r.critical);
        }
    }
    println!(
        "(diff = measured − planned bubble in points; overhead = (step − makespan) / makespan; \
         first step of each run left out; {:.0} s in all; load average now {})",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    if let Some(policy) = pipewise_worker::sched::runtime_policy() {
        println!("gRPC transports' {policy}");
    }
    Ok(())
}
