//! `pipewise local`: a coordinator and N workers on this machine, in one process, talking
//! over real gRPC on loopback exactly as separate processes do.
//!
//! The coordinator ([`Coordinator::start_cluster`]) listens on a free loopback port; N
//! [`WorkerNode`]s register with it, heartbeat, take their assignments, exchange
//! activations and gradients peer to peer over their own `ActivationService`s, and run the
//! end-of-step collectives through worker 0's `CollectiveService`. Each node computes on
//! its own executor thread. The job goes in over `JobService.SubmitJob` and its steps come
//! back over `WatchJob`; the progress lines and the summary are printed from those events.
//!
//! `--output-dir` writes `summary.json`, `loss.svg` (the loss curves) and
//! `params.safetensors` (every worker's final parameters merged under their whole-model
//! names) and keeps the coordinator's data (job store, checkpoints) there.
//! `--metrics-listen` serves the coordinator's and the workers' Prometheus metrics from one
//! endpoint; `--trace-dir` writes executed timelines (`JobService.GetStepTrace`).

use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};
use pipewise_common::job::{JobPlan, JobSpec, layout};
use pipewise_common::model::{DType, Family};
use pipewise_common::render::report::fmt_bytes;
use pipewise_common::run::StepEvent;
use pipewise_coordinator::traces::KEEP_STEPS;
use pipewise_coordinator::{Coordinator, Unfinished};
use pipewise_proto::v1 as pb;
use pipewise_worker::Tensor;
use pipewise_worker::data::DataSource;
use pipewise_worker::node::{NodeConfig, WorkerNode};
use tokio_stream::StreamExt as _;

use crate::device::{DeviceArg, parse_device};
use crate::logging::{LogFormat, init_logs_at};
use crate::runtime::{available_cores, runtime};
use crate::schedule_name::check_job_schedule;
use step_lines::StepLines;
use summary::Steps;

mod job_file;
mod plot;
mod sample;
mod step_lines;
mod summary;
use crate::trace::write_trace;
use crate::values::parse_dtype;

/// Stage compute of `pipewise local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ComputeArg {
    /// The stage compute library (candle, CPU).
    Real,
    /// Passes sleep for their cost-model time; frames are buffers of the true size.
    Emulate,
}

/// The model of `pipewise local`: a preset, or a Hugging Face directory to start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ModelArg {
    /// `tiny`: a byte-level GPT, vocab 256, hidden 64, 4 heads, 8 layers, sequence 32 (well
    /// under a second per step on a CPU).
    Tiny,
    /// `small`: a byte-level GPT, vocab 256, hidden 128, 4 heads, 16 layers, sequence 64.
    Small,
    /// A directory as `save_pretrained` writes it (`config.json`, `model.safetensors`).
    Dir(PathBuf),
}

/// `--model`: `tiny`, `small`, or a directory holding a `config.json`.
fn parse_model(s: &str) -> std::result::Result<ModelArg, String> {
    match s {
        "tiny" => Ok(ModelArg::Tiny),
        "small" => Ok(ModelArg::Small),
        dir if Path::new(dir).join("config.json").is_file() => Ok(ModelArg::Dir(dir.into())),
        other => Err(format!(
            "{other:?} is neither a preset (tiny, small) nor a directory with a config.json"
        )),
    }
}

/// `pipewise local` arguments.
#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// A job file (TOML, as `submit` takes), run here; the flags given override its fields.
    /// Without one, the job the flags describe.
    #[arg(value_name = "JOB.toml")]
    pub(crate) job: Option<PathBuf>,
    /// Workers (pipeline ranks), each with its own thread and stages.
    #[arg(long, short = 'd', default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) workers: u32,
    /// Data-parallel replicas of the pipeline, each on its own `--workers` workers and
    /// `1/R` of every step's microbatches (`[parallelism] data_parallel_replicate_degree`).
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) replicas: u32,
    /// Device memory each worker may use (bytes, e.g. 8GiB), as `pipewise worker
    /// --memory-bytes`: plans predicted to overflow it move before they start, and the
    /// dashboard draws it. Default: not watched.
    #[arg(long, value_name = "BYTES", value_parser = crate::values::parse_memory_bytes)]
    pub(crate) memory_bytes: Option<u64>,
    /// Schedule name (any of `pipewise plan`'s generators; not `csv:PATH`), or `auto`: the
    /// coordinator chooses the schedule, chunks, microbatch size and split on the workers.
    #[arg(long, short = 's', default_value = "v-half")]
    pub(crate) schedule: String,
    /// Optimizer steps.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) steps: u32,
    /// The model: `tiny` or `small` (byte-level GPTs), or a Hugging Face model directory
    /// (`config.json` and `model.safetensors`, a `LlamaForCausalLM`) whose weights the job
    /// starts from.
    #[arg(long, default_value = "tiny", value_name = "PRESET|DIR", value_parser = parse_model)]
    pub(crate) model: ModelArg,
    /// Model dtype: `f32`, or `bf16` (mixed precision: compute and activations in bf16;
    /// gradients, AdamW moments, master copies and the loss in f32). `f16` only with
    /// `--compute emulate` (real f16 training would need loss scaling).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub(crate) dtype: DType,
    /// Sequences per step.
    #[arg(long, default_value_t = 8)]
    pub(crate) global_batch: u32,
    /// Sequences per microbatch (microbatches = global batch / this; default 1, or with
    /// `--schedule auto` chosen on the workers).
    #[arg(long)]
    pub(crate) microbatch_size: Option<u32>,
    /// Learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub(crate) lr: f64,
    /// Seed of initialisation and data.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Training text (default: the generated corpus).
    #[arg(long, value_name = "FILE")]
    pub(crate) data: Option<PathBuf>,
    /// Write summary.json, loss.svg (the loss curves) and params.safetensors (and the
    /// coordinator's job store) here.
    #[arg(long, value_name = "DIR")]
    pub(crate) output_dir: Option<PathBuf>,
    /// No step lines or progress bar, only the summary.
    #[arg(long)]
    pub(crate) quiet: bool,
    /// Serve Prometheus metrics of the whole run (coordinator and every worker) on
    /// `http://ADDR/metrics`.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// Keep serving metrics this many seconds after the job ends (so a scraper sees the
    /// final values).
    #[arg(
        long,
        default_value_t = 0.0,
        value_name = "SECS",
        requires = "metrics_listen"
    )]
    pub(crate) metrics_linger: f64,
    /// Write the executed timeline of some steps next to their plan to DIR: a Chrome /
    /// Perfetto trace (`step-K.trace.json`) and an SVG (`step-K.svg`) per step.
    #[arg(long, value_name = "DIR")]
    pub(crate) trace_dir: Option<PathBuf>,
    /// Which steps `--trace-dir` writes (1-based, comma-separated; default: the last).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "K,...",
        requires = "trace_dir"
    )]
    pub(crate) trace_steps: Vec<u64>,
    /// Stage compute: `real` (candle) or `emulate` (each pass sleeps for its cost-model
    /// time and frames are real buffers of the true size; no learning, no parameters).
    #[arg(long, value_enum, default_value_t = ComputeArg::Real)]
    pub(crate) compute: ComputeArg,
    /// Activation recomputation on every stage: `none`, `selective` or `full`; or `auto`
    /// with `--schedule auto`: only the stages whose worker would overflow its
    /// `--memory-bytes` (`[activation_checkpoint] mode`; real compute only). Default: the
    /// job file's, or none.
    #[arg(long, value_name = "MODE", value_parser = job_file::parse_recompute)]
    pub(crate) recompute: Option<String>,
    /// Emulated pass times in milliseconds, F,B,W, of one stage holding 1/d of the model.
    #[arg(
        long,
        value_name = "F,B,W",
        value_delimiter = ',',
        default_value = "10,10,10"
    )]
    pub(crate) emulate_ms: Vec<f64>,
    /// After training a Llama-family model with a tokenizer: print this many tokens it
    /// writes (greedily) after the first line of its text (0: none).
    #[arg(long, default_value_t = 32)]
    pub(crate) sample_tokens: usize,
    /// Log format on standard error (logs are `warn` and up unless `RUST_LOG` says more).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Where every worker's stages run: `cpu`, or `cuda` / `cuda:N` (all workers share
    /// that GPU; needs a pipewise built with `--features cuda`, see docs/cuda.md).
    #[arg(long, value_name = "DEVICE", default_value = "cpu",
          value_parser = parse_device)]
    pub(crate) device: DeviceArg,
}

/// Runs `pipewise local`; `given(id)` says whether the flag of field `id` of [`LocalArgs`]
/// was given on the command line (not left at its default).
pub(crate) fn run(args: &LocalArgs, given: &dyn Fn(&str) -> bool) -> Result<()> {
    init_logs_at(args.log_format, "warn");
    let mut spec = job_file::local_job(args, given)?;
    let schedule_from_flag = args.job.is_none() || given("schedule");
    if schedule_from_flag {
        check_job_schedule("--schedule", &spec.parallelism.pipeline_parallel_schedule)?;
    }
    let plan = spec
        .validate()
        .map_err(|e| {
            if schedule_from_flag {
                named_as_flag(e)
            } else {
                anyhow::anyhow!("{e}")
            }
        })
        .context("invalid local job")?;
    let data = job_file::local_data(args, &spec);
    let tokenizer = spec.data.tokenizer.clone().map(PathBuf::from);
    check_data(&spec, data.as_deref(), tokenizer.as_deref())?;
    if args.emulate_ms.len() != 3 {
        bail!(
            "--emulate-ms: three times F,B,W in milliseconds, got {} values",
            args.emulate_ms.len()
        );
    }
    if args.device == DeviceArg::Cpu && !spec.compute.is_emulated() {
        fits_this_machine(&spec, &plan, pipewise_worker::node::host_available_memory())?;
    }
    if !(args.metrics_linger.is_finite() && args.metrics_linger >= 0.0) {
        bail!("--metrics-linger: must be a finite number of seconds ≥ 0");
    }
    // The coordinator keeps the traces of a job's last KEEP_STEPS steps.
    let steps = u64::from(spec.training.steps);
    let first_kept = steps.saturating_sub(KEEP_STEPS as u64) + 1;
    if let Some(&bad) = args
        .trace_steps
        .iter()
        .find(|&&k| k < first_kept || k > steps)
    {
        bail!(
            "--trace-steps: step {bad} is not one of steps {first_kept}..={steps} (the run's \
             last {KEEP_STEPS} steps, whose traces the coordinator keeps)"
        );
    }
    if let Some(dir) = &args.trace_dir {
        // Refused before the run rather than after it.
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--trace-dir: cannot create {}", dir.display()))?;
    }
    let data_dir = match &args.output_dir {
        Some(dir) => {
            std::path::absolute(dir).with_context(|| format!("--output-dir {}", dir.display()))?
        }
        None => std::env::temp_dir().join(format!("pipewise-local-{}", std::process::id())),
    };
    // Jobs name paths under the data directory only (the coordinator's and the workers').
    spec.checkpoint.folder = CHECKPOINTS.into();
    let staged = match &data {
        Some(path) => {
            let (staged, name) = stage_data(path, &data_dir, STAGED_DATA, "data")?;
            spec.data.path = Some(name);
            Some(staged)
        }
        None => None,
    };
    if let Some(file) = &tokenizer {
        stage_file(file, &data_dir.join(STAGED_TOKENIZER), "tokenizer")?;
        spec.data.tokenizer = Some(STAGED_TOKENIZER.into());
    }
    let staged_validation = job_file::stage_validation(&mut spec, &data_dir)?;
    if let Some(dir) = spec.model.path.clone() {
        stage_model(Path::new(&dir), &data_dir)?;
        spec.model.path = Some(STAGED_MODEL.into());
    }
    let runtime = runtime()?;
    let outcome = runtime.block_on(drive(args, (&spec, data.as_deref()), &plan, &data_dir));
    if args.output_dir.is_none() {
        let _ = std::fs::remove_dir_all(&data_dir);
    } else {
        for staged in staged.iter().chain(&staged_validation) {
            let _ = std::fs::remove_file(staged);
            let _ = std::fs::remove_dir_all(staged);
        }
    }
    outcome
}

/// The checkpoint folder of `pipewise local`'s job, under its data directory.
const CHECKPOINTS: &str = "checkpoints";
/// Where `--data` is linked (or copied) under the data directory for the workers to read,
/// with its extension (which says its form: `.jsonl`, `.bin`, text), or as a folder.
const STAGED_DATA: &str = "corpus";
/// Where the job's tokenizer is linked under the data directory.
const STAGED_TOKENIZER: &str = "tokenizer.json";

/// Where `--output-dir` writes a Llama-family model as a Hugging Face directory.
const HF_EXPORT: &str = "hf";

/// Where the model directory's files are linked (or copied) under the data directory.
const STAGED_MODEL: &str = "model";

/// Links the files of model directory `dir` into `data_dir/model` (copies where a hard link
/// cannot be made): a job names only paths under the workers' data directory.
fn stage_model(dir: &Path, data_dir: &Path) -> Result<()> {
    let staged = data_dir.join(STAGED_MODEL);
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged)
        .with_context(|| format!("cannot create {}", staged.display()))?;
    let entries = std::fs::read_dir(dir).with_context(|| format!("--model {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("--model {}", dir.display()))?;
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let to = staged.join(entry.file_name());
        if std::fs::hard_link(entry.path(), &to).is_err() {
            std::fs::copy(entry.path(), &to).with_context(|| {
                format!(
                    "--model: cannot copy {} to {}",
                    entry.path().display(),
                    to.display()
                )
            })?;
        }
    }
    Ok(())
}

/// Links `--data` `path` into `data_dir` (copies where a hard link cannot be made, e.g.
/// across file systems; a folder's text files one by one): a job names only paths under
/// the workers' data directory. The staged path, and its name under `data_dir`: `as_name`
/// (with the file's extension, which tells its form); `flag` names it in errors.
fn stage_data(
    path: &Path,
    data_dir: &Path,
    as_name: &str,
    flag: &str,
) -> Result<(PathBuf, String)> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    if path.is_dir() {
        let staged = data_dir.join(as_name);
        let _ = std::fs::remove_dir_all(&staged);
        std::fs::create_dir_all(&staged)
            .with_context(|| format!("cannot create {}", staged.display()))?;
        let entries =
            std::fs::read_dir(path).with_context(|| format!("--{flag} {}", path.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("--{flag} {}", path.display()))?;
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                stage_file(&entry.path(), &staged.join(entry.file_name()), flag)?;
            }
        }
        return Ok((staged, as_name.into()));
    }
    let name = match path.extension() {
        Some(ext) => format!("{as_name}.{}", ext.to_string_lossy()),
        None => as_name.into(),
    };
    let staged = data_dir.join(&name);
    stage_file(path, &staged, flag)?;
    Ok((staged, name))
}

/// Links (or copies) file `from` to `to`, replacing what is there.
fn stage_file(from: &Path, to: &Path, flag: &str) -> Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(to);
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).with_context(|| {
            format!(
                "--{flag} {}: cannot copy it to {}",
                from.display(),
                to.display()
            )
        })?;
    }
    Ok(())
}

/// Refuses, before anything starts, data the workers could not train on (they read it
/// again): unreadable, of ids past the model's vocabulary, shorter than one window, or
/// with a tokenizer larger than the model's vocabulary. The tokenizer is the job's, else
/// the model directory's.
fn check_data(spec: &JobSpec, data: Option<&Path>, tokenizer: Option<&Path>) -> Result<()> {
    let Some(path) = data else {
        return Ok(());
    };
    let model_tokenizer = spec
        .model
        .path
        .as_ref()
        .map(|dir| Path::new(dir).join("tokenizer.json"))
        .filter(|file| file.is_file());
    let mut local = spec.clone();
    local.data.path = Some(path.display().to_string());
    local.data.tokenizer = tokenizer
        .map(Path::to_path_buf)
        .or(model_tokenizer)
        .map(|t| t.display().to_string());
    DataSource::plain(&local)
        .and_then(|source| source.load(&spec.model))
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("--data {}", path.display()))?;
    Ok(())
}

/// The TOML path of the schedule in a job file, which `pipewise local` fills from `--schedule`.
const SCHEDULE_FIELD: &str = "parallelism.pipeline_parallel_schedule";

/// An error of validating the job `pipewise local` built from its flags: one about the
/// schedule names `--schedule`, where the value came from, rather than the TOML path of a
/// job file the user never wrote.
fn named_as_flag(e: pipewise_common::Error) -> anyhow::Error {
    match e {
        pipewise_common::Error::InvalidArgument { field, reason } if field == SCHEDULE_FIELD => {
            anyhow::anyhow!("--schedule: {reason}")
        }
        other => anyhow::anyhow!("{other}"),
    }
}

/// All the workers of `pipewise local` share this machine: what they are predicted to hold
/// together (training state and peak activations, [`JobPlan::predicted_bytes`]) must fit
/// the `available` memory (unknown: passes). Each worker checks only its own training
/// state, and an allocation the machine cannot make ends the process instead of failing
/// the job.
fn fits_this_machine(spec: &JobSpec, plan: &JobPlan, available: Option<u64>) -> Result<()> {
    let need = plan
        .predicted_bytes(spec)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .iter()
        .fold(0u64, |sum, &b| sum.saturating_add(b))
        .saturating_mul(u64::from(spec.replicas()));
    match available {
        Some(bytes) if need > bytes => bail!(
            "the {} workers are predicted to hold {} ({need} bytes: parameters, gradients, \
             optimizer state and peak activations) together, more than the {} ({bytes} \
             bytes) of memory available on this machine; use a smaller --model, \
             --microbatch-size or --global-batch, or --compute emulate",
            spec.workers_needed(),
            fmt_bytes(need as f64),
            fmt_bytes(bytes as f64),
        ),
        _ => Ok(()),
    }
}

/// Starts the coordinator and the workers, runs the job `spec` (its training text from `data`
/// on this machine, or the generated corpus) under `data_dir`, reports, then stops them all.
async fn drive(
    args: &LocalArgs,
    (spec, data): (&JobSpec, Option<&Path>),
    plan: &JobPlan,
    data_dir: &Path,
) -> Result<()> {
    if let Some(addr) = args.metrics_listen {
        // One job: its series stay while the run (and --metrics-linger) lasts.
        crate::metrics::serve(addr, None)?;
        pipewise_worker::metrics::describe();
    }
    let coordinator = Coordinator::start_cluster(
        "127.0.0.1:0".parse().context("loopback address")?,
        data_dir,
        // One job: an earlier run's unfinished job in a reused --output-dir is not
        // resumed before it.
        Unfinished::Fail,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))
    .context("cannot start the coordinator")?;
    let url = format!("http://{}", coordinator.addr);
    let device = args.device.open()?;
    let mut nodes = Vec::new();
    let mut failure = None;
    for w in 0..spec.workers_needed() {
        let mut config = NodeConfig::new(url.clone(), format!("local-{w}"));
        config.device = device.clone();
        config.data_dir = data_dir.to_path_buf();
        config.memory_bytes = args.memory_bytes.unwrap_or(0);
        // The workers are threads of this process: they share its cores.
        config.cores = available_cores() / f64::from(spec.workers_needed());
        match WorkerNode::start(config).await {
            Ok(node) => nodes.push(node),
            Err(e) => {
                failure = Some(anyhow::anyhow!("{e}").context(format!("cannot start worker {w}")));
                break;
            }
        }
    }
    let started = Instant::now();
    let outcome = match failure {
        Some(e) => Err(e),
        None => match run_job(args, (spec, data), plan, (&coordinator, &url)).await {
            Ok((status, mut steps)) => {
                let run = (status.clone(), data_dir);
                let done = finish(args, spec, plan, run, &mut steps, started, data);
                // The traces after the summary and the outputs: a trace that cannot be
                // fetched or written loses nothing else (and a failed job's traces still
                // show where it stopped).
                let traces = write_traces(args, &url, status.id).await;
                match (done, traces) {
                    (Err(e), Err(t)) => {
                        let _ = writeln!(std::io::stderr(), "warning: {t:#}");
                        Err(e)
                    }
                    (done, traces) => done.and(traces),
                }
            }
            Err(e) => Err(e),
        },
    };
    if outcome.is_ok()
        && let Some(addr) = args.metrics_listen
        && args.metrics_linger > 0.0
    {
        outln!(
            "serving metrics on http://{addr}/metrics for {} s more",
            args.metrics_linger
        );
        std::io::stdout().flush().ok();
        tokio::time::sleep(Duration::from_secs_f64(args.metrics_linger)).await;
    }
    for node in nodes {
        node.shutdown().await;
    }
    coordinator.shutdown().await;
    outcome
}

/// After the job: the summary, a sample of what a Llama model learnt to write, and with
/// `--output-dir` summary.json and the parameters.
fn finish(
    args: &LocalArgs,
    spec: &JobSpec,
    plan: &JobPlan,
    (status, data_dir): (pb::JobStatus, &Path),
    steps: &mut Steps,
    started: Instant,
    data: Option<&Path>,
) -> Result<()> {
    if status.state != pb::JobState::Succeeded as i32 {
        bail!("the job did not succeed: {}", status.error);
    }
    print_summary(plan, spec, steps, started.elapsed());
    // Emulated workers learn nothing and write no parameters.
    let params = if spec.compute.is_emulated() {
        None
    } else {
        let output = layout::job_dir(&data_dir.join(CHECKPOINTS), status.id);
        Some(merge_params(
            &output,
            spec.parallelism.pipeline_parallel_degree,
        )?)
    };
    let tokenizer = sample::tokenizer_in(data_dir, spec);
    if let (Some(params), Some(tokenizer), Some(data)) = (&params, &tokenizer, data)
        && spec.model.family == Family::Llama
        && args.sample_tokens > 0
        && let Some((prompt, text)) =
            sample::sample(spec, params, data, tokenizer, args.sample_tokens)?
    {
        outln!(
            "sample (greedy, {} tokens): {prompt}{text}",
            args.sample_tokens
        );
    }
    let Some(dir) = &args.output_dir else {
        std::io::stdout().flush().ok();
        return Ok(());
    };
    let written = steps.finish()?.join(", ");
    let Some(params) = params else {
        outln!("wrote {}/{written}", dir.display());
        return Ok(());
    };
    candle_core::safetensors::save(&params, dir.join("params.safetensors"))
        .context("cannot write params.safetensors")?;
    let toml = spec.to_toml().map_err(|e| anyhow::anyhow!("{e}"))?;
    let job = dir.join(crate::export::JOB_FILE);
    std::fs::write(&job, toml).with_context(|| format!("cannot write {}", job.display()))?;
    outln!(
        "wrote {}/{written}, params.safetensors and {}",
        dir.display(),
        crate::export::JOB_FILE
    );
    if spec.model.family == Family::Llama {
        let hf = dir.join(HF_EXPORT);
        crate::export::write(&hf, spec, &params, tokenizer.as_deref())?;
        outln!(
            "wrote {} (transformers' from_pretrained loads it)",
            hf.display()
        );
    }
    std::io::stdout().flush().ok();
    Ok(())
}

/// Submits the job and prints its progress; returns the final status and the steps'
/// figures (streamed to `summary.json` with `--output-dir`).
async fn run_job(
    args: &LocalArgs,
    (spec, data): (&JobSpec, Option<&Path>),
    plan: &JobPlan,
    (coordinator, url): (&Coordinator, &str),
) -> Result<(pb::JobStatus, Steps)> {
    let mut client = crate::connection::local_client(url)
        .await
        .context("cannot reach the coordinator")?;
    // Handed over as read (the coordinator runs in this process), not as TOML to parse
    // again; refused in the words a `SubmitJob` call's status would carry.
    let status = coordinator
        .submit(spec.clone())
        .await
        .map_err(|e| anyhow::anyhow!("{}", tonic::Status::from(e).message()))
        .context("the coordinator refused the job")?;
    if !args.quiet {
        outln!(
            "job {} ({}): {} on {}, {} × {}, {}, coordinator {}",
            status.id,
            status.name,
            kind_label(spec, plan),
            workers_label(spec),
            count(plan.microbatches.into(), "microbatch"),
            count(
                spec.parallelism.pipeline_parallel_microbatch_size.into(),
                "sequence"
            ),
            count(spec.training.steps.into(), "step"),
            url
        );
    }
    let mut events = client
        .watch_job(pb::JobId { id: status.id })
        .await
        .context("cannot watch the job")?
        .into_inner();
    // summary.json names the file given, not its staged link.
    let mut shown = spec.clone();
    shown.data.path = data.map(|p| p.display().to_string());
    let mut steps = Steps::new(args.output_dir.as_deref(), &shown)?;
    let mut lines = StepLines::new(spec, args.quiet);
    while let Some(event) = events.next().await {
        let e = StepEvent::from(event.context("watch stream")?);
        lines.event(&e);
        if let Some(v) = e.initial_validation_loss {
            steps.add_initial_validation(v)?;
        }
        steps.add(&e)?;
    }
    // The bar goes before the summary is printed.
    drop(lines);
    let final_status = client
        .get_job(pb::JobId { id: status.id })
        .await
        .context("cannot read the job's status")?
        .into_inner();
    Ok((final_status, steps))
}

/// Writes the traces `--trace-dir` and `--trace-steps` ask for.
async fn write_traces(args: &LocalArgs, url: &str, job: u64) -> Result<()> {
    let Some(dir) = &args.trace_dir else {
        return Ok(());
    };
    let mut client = crate::connection::local_client(url)
        .await
        .context("cannot reach the coordinator")?;
    let wanted = if args.trace_steps.is_empty() {
        vec![0]
    } else {
        args.trace_steps.clone()
    };
    for step in wanted {
        let path = write_trace(&mut client, job, step, dir).await?;
        if !args.quiet {
            outln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// Every worker's final parameters in a job's output directory, under their whole-model
/// names.
fn merge_params(output: &Path, workers: u32) -> Result<HashMap<String, Tensor>> {
    let mut all = HashMap::new();
    for w in 0..workers {
        let path = layout::final_file(output, w);
        let tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu)
            .with_context(|| format!("cannot read {}", path.display()))?;
        all.extend(tensors);
    }
    Ok(all)
}

/// The schedule a job runs, in words: its kind, or for `schedule = "auto"` that it is
/// chosen on the workers (the plan is the placeholder until then).
fn kind_label(spec: &JobSpec, plan: &JobPlan) -> String {
    if spec.is_auto() {
        "auto (chosen on the workers)".into()
    } else {
        plan.kind.to_string()
    }
}

/// `4 workers`, or with replicas `2 replicas × 4 workers`.
fn workers_label(spec: &JobSpec) -> String {
    let workers = count(spec.parallelism.pipeline_parallel_degree.into(), "worker");
    match spec.replicas() {
        1 => workers,
        r => format!("{r} replicas × {workers}"),
    }
}

/// `1 step`, `2 steps`, `1 microbatch`, `8 microbatches`.
fn count(n: u64, word: &str) -> String {
    match (n, word.ends_with("ch")) {
        (1, _) => format!("1 {word}"),
        (_, true) => format!("{n} {word}es"),
        (_, false) => format!("{n} {word}s"),
    }
}

fn print_summary(plan: &JobPlan, spec: &JobSpec, steps: &Steps, total: Duration) {
    let (first, last) = steps.losses();
    let means = steps.means();
    let step_time_ms = means.step_time_ms;
    outln!();
    outln!(
        "summary: {} on {}, {} in {:.1} s",
        kind_label(spec, plan),
        workers_label(spec),
        count(steps.count(), "step"),
        total.as_secs_f64()
    );
    if spec.compute.is_emulated() {
        outln!("  loss            n/a (emulated compute learns nothing)");
    } else {
        outln!("  loss            {first:.4} → {last:.4}");
    }
    if let Some((first, last)) = steps.validation_losses() {
        outln!("  validation loss {first:.4} → {last:.4}");
    }
    outln!("  step time       {:.1} ms (mean)", step_time_ms);
    outln!(
        "  tokens/s        {:.0}",
        f64::from(spec.training.global_batch_size) * f64::from(spec.model.seq_len)
            / (step_time_ms / 1e3).max(1e-9)
    );
    outln!(
        "  bubble          planned {:.1} % (simulated), measured {:.1} % (mean)",
        100.0 * means.planned_bubble,
        100.0 * means.measured_bubble
    );
    outln!(
        "    of which      {:.1} points waiting for a core, {:.1} for peers and the step's end",
        100.0 * means.core_wait_bubble,
        100.0 * (means.measured_bubble - means.core_wait_bubble).max(0.0)
    );
    outln!(
        "  passes          {:.1} % of their time waiting for a core (workers sharing cores)",
        100.0 * means.pass_core_wait
    );
    for w in 0..spec.parallelism.pipeline_parallel_degree as usize {
        outln!(
            "  worker {w:<3}      peak activation {:.1} KiB",
            steps.peak(w) as f64 / 1024.0
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use pipewise_common::job::example;

    /// The workers' predicted bytes together are checked against the machine's available
    /// memory: one byte less than they need is refused, with both figures; unknown passes.
    #[test]
    fn the_workers_together_must_fit_this_machine() {
        let spec = example(4, "v-half");
        let plan = spec.validate().unwrap();
        let need: u64 = plan.predicted_bytes(&spec).unwrap().iter().sum();
        assert!(need > 0);
        fits_this_machine(&spec, &plan, Some(need)).unwrap();
        fits_this_machine(&spec, &plan, None).unwrap();
        let err = fits_this_machine(&spec, &plan, Some(need - 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("({need} bytes:"))
                && err.contains(&format!("({} bytes)", need - 1)),
            "{err}"
        );
        assert!(err.contains("the 4 workers"), "{err}");
    }
}
