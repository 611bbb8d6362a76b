//! `pipewise eval` and `pipewise generate`: a trained model's loss on a text, and what it
//! writes after a prompt. The model is a Hugging Face directory or a step of a pipewise
//! checkpoint; with `--workers N` it is cut into N stages that run one after the other (the
//! result is the same).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pipewise_common::model::{DType, ModelSpec};
use pipewise_worker::data::{DataSource, Tokenizer};
use pipewise_worker::eval::{self, Sampling};
use pipewise_worker::hf::HfModel;
use pipewise_worker::{Device, Stage};

use crate::text_file::read_text;

/// Where the model comes from, for both commands.
#[derive(Debug, Args)]
pub(crate) struct ModelArgs {
    /// A Hugging Face model directory (`config.json`, `model.safetensors`), or a step of a
    /// pipewise checkpoint (`…/step-K`, with the run's job.toml beside or above it).
    #[arg(long, value_name = "DIR|CHECKPOINT")]
    pub(crate) model: PathBuf,
    /// The tokenizer.json (default: the model directory's, else a byte a token).
    #[arg(long, value_name = "FILE")]
    pub(crate) tokenizer: Option<PathBuf>,
    /// Cut the model into this many stages, run one after the other.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) workers: u32,
}

/// `pipewise eval` arguments.
#[derive(Debug, Args)]
pub(crate) struct EvalArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The text: a text file, a folder of them, JSON Lines (`text` fields) or a `.bin` of
    /// token ids, as `[data] path` reads them.
    #[arg(long, value_name = "FILE")]
    pub(crate) data: PathBuf,
    /// Tokens per window.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) seq_len: u32,
    /// Windows per forward pass (the result does not depend on it).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch: u32,
    /// Bytes per id of a `.bin` file (2 or 4).
    #[arg(long, default_value_t = 2)]
    pub(crate) token_bytes: u32,
}

/// `pipewise generate` arguments.
#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The text to go on from.
    #[arg(long)]
    pub(crate) prompt: String,
    /// Tokens to write.
    #[arg(long, default_value_t = 32)]
    pub(crate) max_new_tokens: usize,
    /// 0 (default): greedy, the most likely token each time; else sample at this
    /// temperature.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f64,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub(crate) top_k: usize,
    /// Sample among the most likely tokens whose probabilities reach p.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) top_p: f64,
    /// The sampler's seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// The model's context in tokens (default: its positions, at most 2048).
    #[arg(long)]
    pub(crate) seq_len: Option<u32>,
    /// Also print the new token ids, on one line separated by spaces.
    #[arg(long)]
    pub(crate) ids: bool,
}

/// A model loaded as stages, with its tokenizer.
pub(crate) struct Loaded {
    pub(crate) stages: Vec<Stage>,
    pub(crate) tokenizer: Tokenizer,
}

/// Runs `pipewise eval`.
pub(crate) fn run_eval(args: &EvalArgs) -> Result<()> {
    let m = load(&args.model, args.seq_len)?;
    let spec = m.stages[0].spec().clone();
    let corpus = data_source(&args.model, Some((&args.data, args.token_bytes)))?
        .load(&spec)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("--data {}", args.data.display()))?
        .corpus;
    let tokens = corpus.to_vec();
    let seq = args.seq_len as usize;
    let out = eval::mean_loss(&m.stages, &tokens, seq, args.batch as usize)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    eprintln!(
        "{} windows of {seq} tokens ({} predicted) from {} tokens",
        out.windows,
        out.tokens,
        tokens.len()
    );
    println!("loss {:.6} perplexity {:.4}", out.loss, out.perplexity());
    Ok(())
}

/// Runs `pipewise generate`.
pub(crate) fn run_generate(args: &GenerateArgs) -> Result<()> {
    let seq_len = match args.seq_len {
        Some(s) => s,
        None => context_of(&args.model.model)?,
    };
    let m = load(&args.model, seq_len)?;
    let prompt = m
        .tokenizer
        .encode(&args.prompt)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("--prompt")?;
    let vocab = m.stages[0].spec().vocab;
    if let Some(&id) = prompt.iter().find(|&&id| id >= vocab) {
        bail!("--prompt: token id {id} is not below the model's vocabulary of {vocab}");
    }
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    if !(args.temperature >= 0.0 && args.temperature.is_finite()) {
        bail!(
            "--temperature: must be finite and ≥ 0, got {}",
            args.temperature
        );
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!("--top-p: must be in (0, 1], got {}", args.top_p);
    }
    let new = eval::generate(&m.stages, &prompt, args.max_new_tokens, sampling, None)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let text = m
        .tokenizer
        .decode(&new)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{}{text}", args.prompt);
    if args.ids {
        let ids: Vec<String> = new.iter().map(u32::to_string).collect();
        println!("{}", ids.join(" "));
    }
    Ok(())
}

/// The data reader of `data` and its bytes per `.bin` id (`None`: only the tokenizer)
/// with the model's tokenizer: `--tokenizer`, else the model directory's `tokenizer.json`,
/// else a byte a token.
fn data_source(args: &ModelArgs, data: Option<(&Path, u32)>) -> Result<DataSource> {
    // Without data the width of ids is never used.
    let (path, token_bytes) = data.map_or((None, 2), |(path, bytes)| (Some(path), bytes));
    let tokenizer = args.tokenizer.clone().or_else(|| {
        let file = args.model.join("tokenizer.json");
        file.is_file().then_some(file)
    });
    DataSource::plain_files(path, tokenizer.as_deref(), token_bytes)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// The context of the model at `dir`: its `max_position_embeddings`, at most 2048.
fn context_of(dir: &Path) -> Result<u32> {
    let file = dir.join("config.json");
    if !file.is_file() {
        return Ok(2048);
    }
    let text = read_text(&file, 1 << 20)?;
    let config: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}", file.display()))?;
    let positions = config["max_position_embeddings"].as_u64().unwrap_or(2048);
    Ok(positions.min(2048) as u32)
}

/// The model of `args` for sequences of `seq_len`, cut into `args.workers` stages.
pub(crate) fn load(args: &ModelArgs, seq_len: u32) -> Result<Loaded> {
    let dir = &args.model;
    let device = Device::Cpu;
    let (spec, hf) = if dir.join("config.json").is_file() {
        let model = HfModel::open(dir, seq_len, DType::F32)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("--model {}", dir.display()))?;
        (model.spec().clone(), Some(model))
    } else {
        (checkpoint_spec(dir, seq_len)?, None)
    };
    let ranges = Stage::even_split(&spec, args.workers as usize)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("--workers")?;
    let mut stages = Vec::with_capacity(ranges.len());
    for range in ranges {
        let mut stage = Stage::new(&spec, range, 0, &device).map_err(|e| anyhow::anyhow!("{e}"))?;
        match &hf {
            Some(model) => model.load_into(&mut stage),
            None => stage.load_checkpoint_dir(dir),
        }
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("--model {}", dir.display()))?;
        stages.push(stage);
    }
    let tokenizer = data_source(args, None)?
        .read_tokenizer()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if tokenizer.vocab_size() > spec.vocab {
        bail!(
            "the tokenizer's vocabulary of {} is larger than the model's {}",
            tokenizer.vocab_size(),
            spec.vocab
        );
    }
    Ok(Loaded { stages, tokenizer })
}

/// The model of a pipewise checkpoint step directory: the run's job.toml's, at `seq_len`.
fn checkpoint_spec(step: &Path, seq_len: u32) -> Result<ModelSpec> {
    let spec = crate::export::read_job(&crate::export::find_job(step)?)?;
    let model = ModelSpec {
        path: None,
        seq_len,
        ..spec.model
    };
    model.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(model)
}
