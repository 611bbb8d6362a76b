//! `pipewise local`: a coordinator and N embedded workers on this machine. The job goes in
//! over the coordinator's real gRPC `JobService` and its steps come back over `WatchJob`; the
//! coordinator's driver runs the workers through [`EmbeddedRunner`], one thread and one
//! [`WorkerRuntime`] per worker.
//!
//! Workers exchange activations and gradients through a [`Transport`]: by default each worker
//! serves its own gRPC `ActivationService` on loopback ([`GrpcTransport`]) and streams frames
//! to its peers; `--transport memory` uses in-process mailboxes instead. The gradient-norm and
//! loss all-reduce at the end of a step goes through an in-process [`LocalSync`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use pipewise_common::job::{JobPlan, JobSpec, example};
use pipewise_common::{Costs, Times, simulate};
use pipewise_coordinator::{Coordinator, JobRunner, StepEventData};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use pipewise_worker::net::{GrpcConfig, GrpcTransport};
use pipewise_worker::runtime::{
    Frame, FrameKind, LocalSync, MemoryTransport, StepReport, Transport, WorkerRuntime,
};
use pipewise_worker::{AdamW, Corpus, Device, Sampler, Stage, Tensor};
use serde::Serialize;
use tokio_stream::StreamExt as _;

/// Model presets of `pipewise local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ModelPreset {
    /// vocab 256, hidden 64, 4 heads, 8 layers, sequence 32 (seconds per step on a CPU).
    Tiny,
    /// vocab 256, hidden 128, 4 heads, 16 layers, sequence 64.
    Small,
}

/// How embedded workers exchange activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TransportKind {
    /// Each worker serves gRPC on loopback; frames travel over real HTTP/2.
    Grpc,
    /// In-process mailboxes (no network).
    Memory,
}

/// One worker's transport, either kind.
enum AnyTransport {
    Grpc(Box<GrpcTransport>),
    Memory(MemoryTransport),
}

impl AnyTransport {
    fn abort(&self, reason: &str) {
        match self {
            AnyTransport::Grpc(t) => t.abort(reason),
            AnyTransport::Memory(t) => t.abort(reason),
        }
    }
}

impl Transport for AnyTransport {
    fn send(&self, to_worker: u32, frame: Frame) -> pipewise_worker::Result<()> {
        match self {
            AnyTransport::Grpc(t) => t.send(to_worker, frame),
            AnyTransport::Memory(t) => t.send(to_worker, frame),
        }
    }

    fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: FrameKind,
        timeout: Duration,
    ) -> pipewise_worker::Result<Tensor> {
        match self {
            AnyTransport::Grpc(t) => t.recv(job, step, stage, mb, kind, timeout),
            AnyTransport::Memory(t) => t.recv(job, step, stage, mb, kind, timeout),
        }
    }
}

/// `pipewise local` arguments.
#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// Workers (pipeline ranks), each with its own thread and stages.
    #[arg(long, short = 'd', default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) workers: u32,
    /// Schedule name (any `pipewise plan` schedule).
    #[arg(long, short = 's', default_value = "v-half")]
    pub(crate) schedule: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) steps: u32,
    /// Model size.
    #[arg(long, value_enum, default_value_t = ModelPreset::Tiny)]
    pub(crate) model: ModelPreset,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub(crate) global_batch: u32,
    /// Sequences per microbatch (microbatches = global batch / this).
    #[arg(long, default_value_t = 1)]
    pub(crate) microbatch_size: u32,
    /// Learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub(crate) lr: f64,
    /// Seed of initialisation and data.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Training text (default: the generated corpus).
    #[arg(long, value_name = "FILE")]
    pub(crate) data: Option<PathBuf>,
    /// Write summary.json and params.safetensors (and the coordinator's job store) here.
    #[arg(long, value_name = "DIR")]
    pub(crate) output_dir: Option<PathBuf>,
    /// No progress lines, only the summary.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// How workers exchange activations and gradients.
    #[arg(long, value_enum, default_value_t = TransportKind::Grpc)]
    pub(crate) transport: TransportKind,
}

/// One step of `summary.json`.
#[derive(Debug, Clone, Serialize)]
struct StepSummary {
    step: u64,
    loss: f64,
    step_time_ms: f64,
    planned_bubble: f64,
    measured_bubble: f64,
    peak_activation_bytes: Vec<u64>,
}

/// What the runner keeps for the summary.
#[derive(Debug, Default)]
struct RunResult {
    steps: Vec<StepSummary>,
    params: Vec<(String, Tensor)>,
}

/// Runs a job's workers in this process (see the module documentation).
pub(crate) struct EmbeddedRunner {
    corpus: Corpus,
    transport: TransportKind,
    result: Mutex<Option<RunResult>>,
}

/// Step gate: workers start step `k` only once the runner allows it (so a cancel stops
/// every worker at the same step boundary).
struct Gate {
    state: Mutex<(u64, bool)>,
    cond: Condvar,
}

impl Gate {
    fn allow(&self, next: u64, stop: bool) {
        if let Ok(mut s) = self.state.lock() {
            *s = (next, stop);
        }
        self.cond.notify_all();
    }

    /// Waits until step `step` may start; `false` when the run stops instead.
    fn wait(&self, step: u64) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        while s.0 <= step && !s.1 {
            s = match self.cond.wait(s) {
                Ok(s) => s,
                Err(_) => return false,
            };
        }
        !s.1 || s.0 > step
    }
}

type WorkerMsg = (u32, u64, pipewise_worker::Result<StepReport>);

impl JobRunner for EmbeddedRunner {
    fn run(
        &self,
        job: u64,
        spec: &JobSpec,
        plan: &JobPlan,
        report: &mut dyn FnMut(StepEventData),
        cancelled: &AtomicBool,
    ) -> std::result::Result<(), String> {
        let device = Device::Cpu;
        let schedule = &plan.schedule;
        let d = schedule.num_workers();
        let stages = schedule.placement.stages() as usize;
        let partition = Stage::even_split(&spec.model, stages).map_err(|e| e.to_string())?;
        let o = &spec.optimizer;
        let optimizer = AdamW {
            lr: o.lr,
            beta1: o.beta1,
            beta2: o.beta2,
            eps: o.eps,
            weight_decay: o.weight_decay,
            max_grad_norm: (spec.training.max_norm > 0.0).then_some(spec.training.max_norm),
        };
        let sampler = Sampler {
            seed: spec.training.seed,
            microbatch_size: spec.parallelism.pipeline_parallel_microbatch_size as usize,
            seq_len: spec.model.seq_len as usize,
        };
        let planned = Costs::uniform(&schedule.placement, Times::UNIT)
            .and_then(|c| simulate(schedule, &c))
            .map(|s| s.bubble)
            .unwrap_or(f64::NAN);
        let steps = u64::from(spec.training.steps);
        let n = plan.microbatches;
        let sync = LocalSync::new(d, Duration::from_secs(120));
        let network: Vec<AnyTransport> = match self.transport {
            TransportKind::Memory => MemoryTransport::network(d)
                .into_iter()
                .map(AnyTransport::Memory)
                .collect(),
            TransportKind::Grpc => {
                let mut nets = Vec::with_capacity(d as usize);
                for w in 0..d {
                    let config = GrpcConfig::new(job, schedule.placement.stages_of(w));
                    nets.push(GrpcTransport::start(config).map_err(|e| e.to_string())?);
                }
                let addrs: Vec<String> = nets.iter().map(|t| t.local_addr().to_string()).collect();
                for t in &nets {
                    t.set_peers(
                        addrs
                            .iter()
                            .enumerate()
                            .map(|(w, a)| (w as u32, a.as_str())),
                    )
                    .map_err(|e| e.to_string())?;
                }
                nets.into_iter()
                    .map(|t| AnyTransport::Grpc(Box::new(t)))
                    .collect()
            }
        };
        let gate = Gate {
            state: Mutex::new((0, false)),
            cond: Condvar::new(),
        };
        let (tx, rx) = std::sync::mpsc::channel::<WorkerMsg>();
        let mut result = RunResult::default();
        let outcome = std::thread::scope(|scope| -> std::result::Result<(), String> {
            let mut threads = Vec::new();
            for (w, transport) in network.into_iter().enumerate() {
                let w = w as u32;
                let tx = tx.clone();
                let (partition, sync, gate, sampler, device, corpus) =
                    (&partition, &sync, &gate, &sampler, &device, &self.corpus);
                threads.push(scope.spawn(
                    move || -> pipewise_worker::Result<Vec<(String, Tensor)>> {
                        let mut rt = WorkerRuntime::new(
                            w,
                            schedule,
                            &spec.model,
                            partition,
                            spec.training.seed,
                            device,
                            optimizer,
                        )?;
                        let mut step = 0u64;
                        while step < steps && gate.wait(step) {
                            let outcome =
                                sampler.step(corpus, step, n, device).and_then(|batches| {
                                    rt.run_step(
                                        job,
                                        step,
                                        &batches,
                                        &transport as &dyn Transport,
                                        sync,
                                    )
                                });
                            let failed = outcome.is_err();
                            let _ = tx.send((w, step, outcome));
                            if failed {
                                transport.abort("a worker failed");
                                sync.abort("a worker failed");
                                break;
                            }
                            step += 1;
                        }
                        Ok(rt
                            .params()
                            .map(|p| (p.name.clone(), p.value.clone()))
                            .collect())
                    },
                ));
            }
            drop(tx);
            let mut error: Option<String> = None;
            for step in 0..steps {
                if cancelled.load(Ordering::SeqCst) || error.is_some() {
                    break;
                }
                gate.allow(step + 1, false);
                let start = Instant::now();
                let mut reports: Vec<Option<StepReport>> = vec![None; d as usize];
                let mut got = 0;
                while got < d {
                    match rx.recv() {
                        Ok((w, s, Ok(r))) if s == step => {
                            reports[w as usize] = Some(r);
                            got += 1;
                        }
                        Ok((w, _, Err(e))) => {
                            error.get_or_insert(format!("worker {w}: {e}"));
                            got += 1;
                        }
                        Ok(_) => {}
                        Err(_) => {
                            error.get_or_insert("the workers stopped".into());
                            break;
                        }
                    }
                }
                if error.is_some() {
                    break;
                }
                let reports: Vec<StepReport> = reports.into_iter().flatten().collect();
                let wall = reports.iter().map(|r| r.wall_secs).fold(0.0, f64::max);
                let busy: f64 = reports.iter().map(|r| r.busy_secs).sum();
                let loss = reports
                    .iter()
                    .find_map(|r| r.loss)
                    .map_or(f64::NAN, f64::from);
                let event = StepEventData {
                    job,
                    step: step + 1,
                    loss,
                    step_time_ms: start.elapsed().as_secs_f64() * 1e3,
                    planned_bubble: planned,
                    measured_bubble: if wall > 0.0 {
                        1.0 - busy / (f64::from(d) * wall)
                    } else {
                        0.0
                    },
                    peaks: reports
                        .iter()
                        .enumerate()
                        .map(|(w, r)| (w as u32, r.peak_stash_bytes))
                        .collect(),
                    worker_bubbles: reports
                        .iter()
                        .enumerate()
                        .map(|(w, r)| (w as u32, 1.0 - r.busy_secs / wall.max(f64::MIN_POSITIVE)))
                        .collect(),
                    replan_reason: String::new(),
                };
                result.steps.push(StepSummary {
                    step: event.step,
                    loss: event.loss,
                    step_time_ms: event.step_time_ms,
                    planned_bubble: event.planned_bubble,
                    measured_bubble: event.measured_bubble,
                    peak_activation_bytes: event.peaks.iter().map(|p| p.1).collect(),
                });
                report(event);
            }
            gate.allow(u64::MAX, true);
            for t in threads {
                match t.join() {
                    Ok(Ok(params)) => result.params.extend(params),
                    Ok(Err(e)) => {
                        error.get_or_insert(e.to_string());
                    }
                    Err(_) => {
                        error.get_or_insert("a worker thread panicked".into());
                    }
                }
            }
            error.map_or(Ok(()), Err)
        });
        if let Ok(mut slot) = self.result.lock() {
            *slot = Some(result);
        }
        outcome
    }
}

fn job_spec(args: &LocalArgs) -> JobSpec {
    let mut spec = example(args.workers, &args.schedule);
    spec.job.name = format!("local-{}-{}w", args.schedule, args.workers);
    if args.model == ModelPreset::Small {
        spec.model.hidden = 128;
        spec.model.layers = 16;
        spec.model.seq_len = 64;
    }
    spec.training.steps = args.steps;
    spec.training.global_batch_size = args.global_batch;
    spec.training.seed = args.seed;
    spec.optimizer.lr = args.lr;
    spec.parallelism.pipeline_parallel_microbatch_size = args.microbatch_size;
    spec.data.path = args.data.as_ref().map(|p| p.display().to_string());
    spec
}

/// Runs `pipewise local`.
pub(crate) fn run(args: &LocalArgs) -> Result<()> {
    let spec = job_spec(args);
    let plan = spec
        .validate()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("invalid local job")?;
    let corpus = match &args.data {
        Some(path) => Corpus::from_file(path)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("--data {}", path.display()))?,
        None => Corpus::generated(),
    };
    let data_dir = match &args.output_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("pipewise-local-{}", std::process::id())),
    };
    let runner = Arc::new(EmbeddedRunner {
        corpus,
        transport: args.transport,
        result: Mutex::new(None),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let started = Instant::now();
    let final_status = runtime.block_on(drive(args, &spec, &plan, &data_dir, runner.clone()))?;
    let total = started.elapsed();
    let result = runner
        .result
        .lock()
        .map_err(|_| anyhow::anyhow!("runner state poisoned"))?
        .take()
        .unwrap_or_default();
    if final_status.state != pb::JobState::Succeeded as i32 {
        bail!("the job did not succeed: {}", final_status.error);
    }
    print_summary(args, &spec, &plan, &result, total);
    if let Some(dir) = &args.output_dir {
        write_outputs(dir, &spec, &result)?;
        println!(
            "wrote {}/summary.json and {}/params.safetensors",
            dir.display(),
            dir.display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    Ok(())
}

async fn drive(
    args: &LocalArgs,
    spec: &JobSpec,
    plan: &JobPlan,
    data_dir: &Path,
    runner: Arc<EmbeddedRunner>,
) -> Result<pb::JobStatus> {
    let coordinator = Coordinator::start(
        "127.0.0.1:0".parse().context("loopback address")?,
        data_dir,
        Some(runner),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))
    .context("cannot start the coordinator")?;
    let mut client = JobServiceClient::connect(format!("http://{}", coordinator.addr))
        .await
        .context("cannot reach the coordinator")?;
    let status = client
        .submit_job(pb::JobSpec {
            toml: spec.to_toml().map_err(|e| anyhow::anyhow!("{e}"))?,
            ..Default::default()
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))
        .context("the coordinator refused the job")?
        .into_inner();
    if !args.quiet {
        println!(
            "job {} ({}): {} on {} workers, {} microbatches × {} sequences, {} steps, coordinator {}",
            status.id,
            status.name,
            plan.kind,
            spec.parallelism.pipeline_parallel_degree,
            plan.microbatches,
            spec.parallelism.pipeline_parallel_microbatch_size,
            spec.training.steps,
            coordinator.addr
        );
    }
    let mut events = client
        .watch_job(pb::JobId { id: status.id })
        .await
        .context("cannot watch the job")?
        .into_inner();
    let tokens_per_step =
        f64::from(spec.training.global_batch_size) * f64::from(spec.model.seq_len);
    while let Some(event) = events.next().await {
        let e = event.context("watch stream")?;
        if !args.quiet {
            let peaks: Vec<String> = e
                .peaks
                .iter()
                .map(|p| format!("{:.0}", p.peak_activation_bytes as f64 / 1024.0))
                .collect();
            println!(
                "step {:>4}/{}  loss {:.4}  {:>8.0} tok/s  bubble planned {:>5.1}% measured {:>5.1}%  peak KiB [{}]",
                e.step,
                spec.training.steps,
                e.loss,
                tokens_per_step / (e.step_time_ms / 1e3).max(1e-9),
                100.0 * e.planned_bubble,
                100.0 * e.measured_bubble,
                peaks.join(" ")
            );
        }
    }
    let final_status = client
        .get_job(pb::JobId { id: status.id })
        .await
        .context("cannot read the job's status")?
        .into_inner();
    coordinator.shutdown().await;
    Ok(final_status)
}

fn print_summary(args: &LocalArgs, spec: &JobSpec, plan: &JobPlan, r: &RunResult, total: Duration) {
    let first = r.steps.first().map_or(f64::NAN, |s| s.loss);
    let last = r.steps.last().map_or(f64::NAN, |s| s.loss);
    let mean = |f: fn(&StepSummary) -> f64| {
        r.steps.iter().map(f).sum::<f64>() / r.steps.len().max(1) as f64
    };
    let peak = |w: usize| {
        r.steps
            .iter()
            .filter_map(|s| s.peak_activation_bytes.get(w).copied())
            .max()
            .unwrap_or(0)
    };
    println!();
    println!(
        "summary: {} on {} workers, {} steps in {:.1} s",
        plan.kind,
        args.workers,
        r.steps.len(),
        total.as_secs_f64()
    );
    println!("  loss            {first:.4} → {last:.4}");
    println!(
        "  step time       {:.1} ms (mean)",
        mean(|s| s.step_time_ms)
    );
    println!(
        "  tokens/s        {:.0}",
        f64::from(spec.training.global_batch_size) * f64::from(spec.model.seq_len)
            / (mean(|s| s.step_time_ms) / 1e3).max(1e-9)
    );
    println!(
        "  bubble          planned {:.1} % (unit times), measured {:.1} % (mean)",
        100.0 * mean(|s| s.planned_bubble),
        100.0 * mean(|s| s.measured_bubble)
    );
    for w in 0..args.workers as usize {
        println!(
            "  worker {w:<3}      peak activation {:.1} KiB",
            peak(w) as f64 / 1024.0
        );
    }
}

fn write_outputs(dir: &Path, spec: &JobSpec, r: &RunResult) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let summary = serde_json::json!({
        "job": spec,
        "steps": r.steps,
    });
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary)?,
    )
    .context("cannot write summary.json")?;
    let tensors: HashMap<String, Tensor> = r.params.iter().cloned().collect();
    candle_core::safetensors::save(&tensors, dir.join("params.safetensors"))
        .context("cannot write params.safetensors")?;
    Ok(())
}
