//! `pipewise export CHECKPOINT --to DIR`: a trained Llama-family model as a Hugging Face
//! directory (`config.json`, `model.safetensors`, and the job's `tokenizer.json` where it has
//! one) that `transformers`' `from_pretrained` loads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pipewise_common::job::JobSpec;
use pipewise_worker::{Stage, Tensor};

use crate::text_file::read_text;

/// The job file `pipewise local --output-dir` writes beside its outputs.
pub(crate) const JOB_FILE: &str = "job.toml";
/// The largest job file read.
const MAX_JOB_FILE: u64 = 4 << 20;

/// `pipewise export` arguments.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// A checkpoint: a step's directory of stage files (`…/step-K`), or a file of the whole
    /// model's parameters (`params.safetensors` of `pipewise local --output-dir`).
    #[arg(value_name = "CHECKPOINT")]
    pub(crate) checkpoint: PathBuf,
    /// The directory to write.
    #[arg(long, value_name = "DIR")]
    pub(crate) to: PathBuf,
    /// The job file of the run (default: the `job.toml` found beside the checkpoint or in a
    /// directory above it).
    #[arg(long, value_name = "JOB.toml")]
    pub(crate) job: Option<PathBuf>,
    /// A tokenizer.json to write beside the model (default: the job's, if it names one).
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
}

/// Runs `pipewise export`.
pub(crate) fn run(args: &ExportArgs) -> Result<()> {
    let job = match &args.job {
        Some(file) => file.clone(),
        None => find_job(&args.checkpoint)?,
    };
    let spec = read_job(&job)?;
    let params = read_params(&args.checkpoint, &spec)?;
    write(&args.to, &spec, &params, args.tokenizer.as_deref())?;
    println!(
        "wrote {} (config.json, model.safetensors{})",
        args.to.display(),
        if args.to.join("tokenizer.json").is_file() {
            ", tokenizer.json"
        } else {
            ""
        }
    );
    Ok(())
}

/// `spec`'s model with `params` as a Hugging Face directory `to`, with `tokenizer` copied
/// beside it.
pub(crate) fn write(
    to: &Path,
    spec: &JobSpec,
    params: &HashMap<String, Tensor>,
    tokenizer: Option<&Path>,
) -> Result<()> {
    pipewise_worker::hf::save_params(to, &spec.model, params)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("cannot write {}", to.display()))?;
    if let Some(file) = tokenizer {
        let dest = to.join("tokenizer.json");
        std::fs::copy(file, &dest)
            .with_context(|| format!("cannot copy {} to {}", file.display(), dest.display()))?;
    }
    Ok(())
}

/// The job of a run's job file `file`.
pub(crate) fn read_job(file: &Path) -> Result<JobSpec> {
    JobSpec::from_toml(&read_text(file, MAX_JOB_FILE)?)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("job file {}", file.display()))
}

/// The `job.toml` beside `checkpoint` or in one of the three directories above it.
pub(crate) fn find_job(checkpoint: &Path) -> Result<PathBuf> {
    let start = if checkpoint.is_dir() {
        checkpoint
    } else {
        checkpoint.parent().unwrap_or(Path::new("."))
    };
    for dir in start.ancestors().take(4) {
        let file = dir.join(JOB_FILE);
        if file.is_file() {
            return Ok(file);
        }
    }
    bail!(
        "no {JOB_FILE} beside {} or above it; name the run's job file with --job",
        checkpoint.display()
    )
}

/// The whole model's parameters from `checkpoint`: a step directory of stage files (loaded
/// into the whole model by name) or a file of whole-model tensors.
fn read_params(checkpoint: &Path, spec: &JobSpec) -> Result<HashMap<String, Tensor>> {
    let shown = || format!("checkpoint {}", checkpoint.display());
    if checkpoint.is_dir() {
        let model = pipewise_common::model::ModelSpec {
            path: None,
            ..spec.model.clone()
        };
        let mut stage = Stage::whole(&model, 0, &pipewise_worker::Device::Cpu)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        stage
            .load_checkpoint_dir(checkpoint)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(shown)?;
        return Ok(stage
            .params()
            .map(|p| (p.name.clone(), p.value.clone()))
            .collect());
    }
    candle_core::safetensors::load(checkpoint, &pipewise_worker::Device::Cpu).with_context(shown)
}
