//! Whole training steps of one worker (the single-device [`Trainer`]): step time, tokens/s,
//! achieved GFLOP/s and CPU MFU, at 1 thread and at every thread, for the model and
//! a larger one, and for a Llama of the same scale (issue 54's speed comparison).
//!
//! `cargo bench -p pipewise-worker --bench step`. Environment:
//!
//! - `PIPEWISE_BENCH_QUICK=1`: every part tiny (a smoke run);
//! - `PIPEWISE_BENCH_MODELS`: a comma list of `small`, `large`, `llama`, `both` (small and
//!   large, the default) and `all`;
//! - `PIPEWISE_BENCH_THREADS=1,2,…` (default: 1 and every core this process may use);
//!   each count above 1 runs twice: `side` (microbatches side by side, one per thread, the
//!   default) and `split` (every pass cut over the threads, `PIPEWISE_SIDE_BY_SIDE=0`);
//! - `PIPEWISE_BENCH_DEVICE=cuda` (or `cuda:N`): the model on a GPU (needs
//!   `--features cuda`); MFU is then left out, there being no CPU figure to hold it to.
//!
//! Models (f32, AdamW defaults: lr 6e-4, betas (0.9, 0.95), eps 1e-8, decay 0.1, clip 1.0),
//! each step 8 microbatches of 4 sequences of the generated corpus:
//!
//! - `small`: vocab 256, hidden 256, 4 heads, 4 blocks, seq 128 (4096 tokens a step);
//! - `large`: vocab 256, hidden 1024, 16 heads, 8 blocks, seq 256 (8192 tokens a step; about
//!   45 s a step at 1 thread, so 1 warm-up step and 3 timed ones);
//! - `llama`: the Llama family (RMSNorm, rotary positions, SwiGLU), vocab 4096, hidden 256,
//!   8 heads sharing 2 key/value heads, SwiGLU of 688, 4 blocks, seq 128 (4096 tokens a
//!   step): the model `bench/hf/speed.py` trains with `transformers`, and
//!   `bench/hf/speed_compare.py` runs both in one run.
//!
//! FLOPs per step (the count, for either family): `6 · P · tokens + 12 · blocks · seq
//! · hidden · tokens`, `P` the parameters outside the embeddings (blocks, final norm, LM
//! head). CPU MFU =
//! achieved FLOP/s ÷ (GEMM rate × threads), the GEMM rate being the single-thread GFLOP/s of a
//! square f32 GEMM (2048³) of the `gemm` crate with `Parallelism::None` (its ISA is printed:
//! the crate dispatches to AVX-512 where the CPU has it, as built with `x86-v4`). The rate is
//! measured beside the steps it is held against: in the child, before each timed step and
//! after the last (3 timings each), the median of all; this machine's speed drifts by 10 %
//! and more between minutes, and a rate taken once at the start would set a fast minute's
//! probe against a slow minute's steps, or the reverse. The start-of-run rate is printed too.
//!
//! Thread counts: candle and gemm read `RAYON_NUM_THREADS`, and rayon's global pool is fixed
//! at its first use, so each (model, threads) run is a child process of this binary,
//! re-executed with `RAYON_NUM_THREADS` set and `PIPEWISE_BENCH_CHILD` naming the model; it
//! prints one `RESULT` line the parent reads. Timings are medians over the timed steps; other
//! work on the machine skews them (the load average is printed).

// The GEMM-rate probe calls `gemm::gemm`, an unsafe fn on raw pointers.
#![allow(unsafe_code)]

mod common;

use std::process::{Command, Stdio};
use std::time::Instant;

use pipewise_common::model::{DType, Family, ModelSpec, Piece};
use pipewise_worker::{AdamW, Corpus, Sampler, Trainer};

/// Env var naming the model a child process trains.
const CHILD_ENV: &str = "PIPEWISE_BENCH_CHILD";

/// One benchmarked model and how long to run it.
#[derive(Debug, Clone)]
struct Case {
    name: &'static str,
    spec: ModelSpec,
    microbatch_size: usize,
    microbatches: u32,
    warmup: usize,
    timed: usize,
}

fn quick() -> bool {
    std::env::var("PIPEWISE_BENCH_QUICK").is_ok_and(|v| v == "1")
}

fn spec(hidden: u32, heads: u32, layers: u32, seq_len: u32) -> ModelSpec {
    ModelSpec {
        vocab: 256,
        hidden,
        heads,
        layers,
        seq_len,
        dtype: DType::F32,
        ..Default::default()
    }
}

/// A Llama: `hidden`, `heads` sharing `kv` key/value heads, SwiGLU of `mlp`, vocab `vocab`.
fn llama_spec(
    (hidden, heads, kv): (u32, u32, u32),
    mlp: u32,
    layers: u32,
    (vocab, seq_len): (u32, u32),
) -> ModelSpec {
    ModelSpec {
        family: Family::Llama,
        vocab,
        kv_heads: Some(kv),
        intermediate: Some(mlp),
        ..spec(hidden, heads, layers, seq_len)
    }
}

/// The cases, in order; in quick mode all are tiny.
fn cases() -> Vec<Case> {
    let q = quick();
    let small = Case {
        name: "small",
        spec: if q {
            spec(64, 2, 2, 32)
        } else {
            spec(256, 4, 4, 128)
        },
        microbatch_size: if q { 2 } else { 4 },
        microbatches: if q { 2 } else { 8 },
        warmup: 1,
        timed: if q { 2 } else { 5 },
    };
    let large = Case {
        name: "large",
        spec: if q {
            spec(128, 4, 2, 64)
        } else {
            spec(1024, 16, 8, 256)
        },
        microbatch_size: if q { 2 } else { 4 },
        microbatches: if q { 2 } else { 8 },
        warmup: 1,
        timed: if q { 2 } else { 3 },
    };
    let llama = Case {
        name: "llama",
        spec: if q {
            llama_spec((64, 4, 2), 176, 2, (512, 32))
        } else {
            llama_spec((256, 8, 2), 688, 4, (4096, 128))
        },
        microbatch_size: if q { 2 } else { 4 },
        microbatches: if q { 2 } else { 8 },
        warmup: 1,
        timed: if q { 2 } else { 5 },
    };
    let which = std::env::var("PIPEWISE_BENCH_MODELS").unwrap_or_else(|_| "both".into());
    let mut out = Vec::new();
    for name in which.split(',').map(str::trim) {
        match name {
            "small" => out.push(small.clone()),
            "large" => out.push(large.clone()),
            "llama" => out.push(llama.clone()),
            "both" | "" => out.extend([small.clone(), large.clone()]),
            "all" => out.extend([small.clone(), large.clone(), llama.clone()]),
            other => panic!(
                "PIPEWISE_BENCH_MODELS={which}: {other:?} is not small, large, llama, both or all"
            ),
        }
    }
    out
}

impl Case {
    fn tokens(&self) -> f64 {
        (self.microbatch_size * self.spec.seq_len as usize * self.microbatches as usize) as f64
    }

    /// Training FLOPs of one step, the count.
    fn flops(&self) -> f64 {
        let s = &self.spec;
        let dense: u64 = (0..s.layers)
            .map(|i| s.piece_params(Piece::Block(i)))
            .sum::<u64>()
            + s.piece_params(Piece::Head);
        let tokens = self.tokens();
        6.0 * dense as f64 * tokens
            + 12.0 * f64::from(s.layers) * f64::from(s.seq_len) * f64::from(s.hidden) * tokens
    }
}

/// The median (the mean of the middle two of an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// The child: trains `name`'s model and prints
/// `RESULT <median step s> <first loss> <last loss> <threads> <GEMM rate beside the steps>`
/// (the rate 0 for a model on a GPU).
fn child(name: &str) {
    let case = cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("{CHILD_ENV}={name}: no such model"));
    let device = common::bench_device();
    let mut trainer = Trainer::new(&case.spec, 42, &device, AdamW::default()).expect("model");
    let corpus = Corpus::generated();
    let sampler = Sampler {
        seed: 42,
        microbatch_size: case.microbatch_size,
        seq_len: case.spec.seq_len as usize,
        global_batch: case.microbatch_size * case.microbatches as usize,
        shuffle: true,
    };
    let mut times = Vec::new();
    let mut losses = Vec::new();
    // The CPU's GEMM rate beside the steps; none for a model on a GPU (no MFU is shown).
    let probe = || match device {
        candle_core::Device::Cpu => gemm_rates(probe_size(), 3),
        _ => Vec::new(),
    };
    let mut rates = Vec::new();
    for step in 0..(case.warmup + case.timed) {
        if step >= case.warmup {
            rates.extend(probe());
        }
        // Sampling is left out of the time: it is the model's speed being measured.
        let batches = sampler
            .step(&corpus, step as u64, case.microbatches, &device)
            .expect("batches");
        let t0 = Instant::now();
        let stats = trainer.train_step(&batches).expect("step");
        device.synchronize().expect("sync");
        let dt = t0.elapsed().as_secs_f64();
        eprintln!(
            "  [{name}, {} threads] step {step}: {:.3} s, loss {:.4}{}",
            candle_core::utils::get_num_threads(),
            dt,
            stats.loss,
            if step < case.warmup { " (warm-up)" } else { "" }
        );
        losses.push(stats.loss);
        if step >= case.warmup {
            times.push(dt);
        }
    }
    rates.extend(probe());
    println!(
        "RESULT {} {} {} {} {}",
        median(times),
        losses[0],
        losses[losses.len() - 1],
        candle_core::utils::get_num_threads(),
        if rates.is_empty() { 0.0 } else { median(rates) }
    );
}

/// The probe's side: 2048, or 256 in quick mode.
fn probe_size() -> usize {
    if quick() { 256 } else { 2048 }
}

/// Single-thread GFLOP/s of `reps` timings of an `n³` f32 GEMM (`gemm` crate,
/// `Parallelism::None`), after one warm-up.
fn gemm_rates(n: usize, reps: usize) -> Vec<f64> {
    let a: Vec<f32> = (0..n * n).map(|i| ((i % 17) as f32 - 8.0) * 0.01).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
    let mut c = vec![0f32; n * n];
    let mut times = Vec::new();
    for rep in 0..=reps {
        let t0 = Instant::now();
        // SAFETY: a, b and c are n × n row-major buffers (column stride 1, row stride n),
        // all live and c exclusively borrowed for the call; read_dst = false, so c's prior
        // contents are not read.
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr(),
                1,
                n as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        let dt = t0.elapsed().as_secs_f64();
        if rep > 0 {
            times.push(dt);
        }
    }
    std::hint::black_box(&c);
    let flop = 2.0 * (n as f64).powi(3);
    times.into_iter().map(|t| flop / t / 1e9).collect()
}

/// The instruction set `gemm` dispatches f32 to on this CPU.
fn gemm_isa() -> &'static str {
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "AVX2+FMA";
        }
        "scalar/SSE"
    }
    #[cfg(target_arch = "aarch64")]
    {
        "NEON"
    }
    #[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
    {
        "scalar"
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Thread counts to run: `PIPEWISE_BENCH_THREADS`, else 1 and every usable core.
fn thread_counts() -> Vec<usize> {
    if let Ok(list) = std::env::var("PIPEWISE_BENCH_THREADS") {
        return list
            .split(',')
            .map(|t| {
                t.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("PIPEWISE_BENCH_THREADS={list}: numbers, e.g. 1,4"))
            })
            .collect();
    }
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    if all > 1 { vec![1, all] } else { vec![1] }
}

/// How a run with several threads uses them: microbatches side by side (the default) or
/// every pass cut over the threads (`PIPEWISE_SIDE_BY_SIDE=0`).
fn modes(threads: usize) -> &'static [&'static str] {
    match threads {
        1 => &["-"],
        _ => &["side", "split"],
    }
}

/// What one child measured.
struct Measured {
    step_s: f64,
    first: f64,
    last: f64,
    /// The GEMM rate beside the steps, GFLOP/s.
    rate: f64,
}

/// Runs one child and parses its `RESULT` line.
fn run_child(case: &Case, threads: usize, mode: &str) -> Option<Measured> {
    let exe = std::env::current_exe().expect("own path");
    let side = if mode == "split" { "0" } else { "1" };
    let out = Command::new(exe)
        .env(CHILD_ENV, case.name)
        .env(pipewise_worker::lanes::SIDE_BY_SIDE_ENV, side)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .expect("spawn the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("RESULT "));
    let parsed = line.and_then(|l| {
        let v: Vec<f64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        (v.len() == 5).then(|| Measured {
            step_s: v[0],
            first: v[1],
            last: v[2],
            rate: v[4],
        })
    });
    if parsed.is_none() {
        eprintln!(
            "{} at {threads} threads failed ({}): {}",
            case.name,
            out.status,
            stdout.trim()
        );
    }
    parsed
}

fn main() {
    if let Ok(name) = std::env::var(CHILD_ENV) {
        // The process setup of the `pipewise` binary, so the step runs as a worker's does.
        // SAFETY: no thread has started yet.
        unsafe {
            pipewise_worker::set_up_process();
        }
        child(&name);
        return;
    }
    let q = quick();
    let device_name = std::env::var("PIPEWISE_BENCH_DEVICE").unwrap_or_default();
    let on_cpu = matches!(device_name.as_str(), "" | "cpu");
    println!("step: whole training steps of one worker (Trainer), f32, AdamW defaults");
    println!("CPU: {}", cpu_model());
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        println!("load average before the run: {}", load.trim());
    }
    let n = probe_size();
    let reps = if q { 3 } else { 5 };
    println!(
        "GEMM rate at the start: {:.1} GFLOP/s (f32 {n}³, 1 thread, gemm crate, \
         Parallelism::None, median of {reps}), ISA {}; MFU holds each row to the rate \
         measured beside its steps (column `GEMM`)",
        median(gemm_rates(n, reps)),
        gemm_isa()
    );
    println!(
        "pipewise's CPU kernels: {}",
        pipewise_worker::kernels_in_use()
    );
    if !on_cpu {
        println!("device: {device_name} (MFU omitted: no CPU peak applies)");
    }
    println!(
        " model family threads  mode     params  steps    step s   tokens/s   GFLOP/s    GEMM     \
         MFU  loss first→last"
    );
    for case in cases() {
        let s = &case.spec;
        eprintln!(
            "{}: vocab {} hidden {} heads {} blocks {} seq {}, {} × {} sequences a step, \
             {} tokens, {:.2} GFLOP a step",
            case.name,
            s.vocab,
            s.hidden,
            s.heads,
            s.layers,
            s.seq_len,
            case.microbatches,
            case.microbatch_size,
            case.tokens(),
            case.flops() / 1e9
        );
        for (threads, &mode) in thread_counts()
            .into_iter()
            .flat_map(|t| modes(t).iter().map(move |m| (t, m)))
        {
            let Some(Measured {
                step_s,
                first,
                last,
                rate,
            }) = run_child(&case, threads, mode)
            else {
                continue;
            };
            let gflops = case.flops() / step_s / 1e9;
            let (probe, mfu) = if on_cpu {
                (
                    format!("{rate:.1}"),
                    format!("{:.1}%", 100.0 * gflops / (rate * threads as f64)),
                )
            } else {
                ("-".into(), "-".into())
            };
            println!(
                "{:>6} {:>6} {threads:>7} {mode:>5} {:>10} {:>6} {step_s:>9.3} {:>10.0} {gflops:>9.1} \
                 {probe:>7} {mfu:>7}  {first:.4}→{last:.4}",
                case.name,
                s.family.as_str(),
                s.params(),
                format!("{}+{}", case.warmup, case.timed),
                case.tokens() / step_s,
            );
        }
    }
}
