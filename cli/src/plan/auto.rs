//! `pipewise plan --auto`: the auto-planner's arguments and its report.
//!
//! The arguments are flattened into `pipewise plan`; `--workers` and the COMM part of
//! `--times` come from the plan arguments. All planning is
//! [`pipewise_common::auto::auto_plan`]; this module parses and prints.

use std::fmt::Write as _;

use anyhow::{Result, anyhow, bail};
use clap::Args;
use pipewise_common::auto::{
    AutoPlan, AutoRequest, Candidate, DEFAULT_FLOPS_PER_MS, DEFAULT_SUM_MS_PER_VALUE, LayerTimes,
    RecomputeSearch, Rejected, Replicas, Why, auto_plan, partition_summary, recompute_summary,
};
use pipewise_common::model::{DType, ModelSpec};

use crate::values::{parse_bytes, parse_dtype};

/// Rejected configurations listed per reason before "… and N more".
const LIST_PER_GROUP: usize = 6;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `pipewise plan --auto` arguments as typed.
#[derive(Debug, Clone, PartialEq, Args)]
pub(crate) struct AutoArgs {
    /// Choose the partition, microbatch size and schedule automatically.
    ///
    /// Plans every schedule for every microbatch size dividing
    /// --global-batch on --workers workers, with the model cut into
    /// stages balanced by compute, and ranks the plans that fit
    /// --memory-per-worker (parameters, gradients, AdamW state and
    /// activations) by predicted step time. Needs --layers, --hidden,
    /// --heads, --seq-len, --global-batch, --memory-per-worker and
    /// --workers; COMM of --times is the per-hop latency in ms.
    #[arg(long, verbatim_doc_comment)]
    pub(crate) auto: bool,

    /// Transformer blocks of the model (--auto).
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) layers: Option<u32>,

    /// Hidden size of the model (--auto).
    #[arg(long, value_name = "H",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) hidden: Option<u32>,

    /// Attention heads of the model; must divide --hidden (--auto).
    #[arg(long, value_name = "A",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) heads: Option<u32>,

    /// Sequence length in tokens (--auto).
    #[arg(long, value_name = "T",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) seq_len: Option<u32>,

    /// Vocabulary size (--auto) [default: 50257].
    #[arg(long, value_name = "V",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) vocab: Option<u32>,

    /// Element type of parameters and activations: f32, f16 or bf16 (--auto) [default: bf16].
    #[arg(long, value_name = "DTYPE", value_parser = parse_dtype)]
    pub(crate) dtype: Option<DType>,

    /// Sequences per training step (--auto).
    #[arg(long, value_name = "B",
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) global_batch: Option<u32>,

    /// Memory of one worker, e.g. 80GB, 24GiB, 8e9 (--auto).
    ///
    /// A number of bytes, optionally with a unit: B, KB, MB, GB, TB, PB, EB
    /// (powers of 1000) or KiB, MiB, GiB, TiB, PiB, EiB (powers of 1024);
    /// Kubernetes' K, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei also.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes,
          verbatim_doc_comment)]
    pub(crate) memory_per_worker: Option<f64>,

    /// Measured F,B,W times (ms) of one transformer block at microbatch size MBS (--auto).
    ///
    /// Without it, every piece's F, B and W each take its FLOPs at
    /// 100 TFLOP/s. MBS defaults to 1; times scale linearly with the
    /// microbatch size, the embedding and head by their FLOPs.
    #[arg(long, value_name = "F,B,W[@MBS]", value_parser = parse_layer_times,
          verbatim_doc_comment)]
    pub(crate) layer_times: Option<LayerTimes>,

    /// Data-parallel replicas (--auto): R copies of a pipeline of
    /// --workers / R workers, each taking 1/R of --global-batch, their
    /// gradients summed stage by stage beside the drain; or `auto`, to
    /// weigh every R dividing --workers and --global-batch [default: 1].
    #[arg(long, value_name = "R|auto", value_parser = parse_replicas,
          verbatim_doc_comment)]
    pub(crate) replicas: Option<ReplicasArg>,

    /// Nanoseconds per gradient value summed over the replicas, sent
    /// and summed back (--auto with --replicas) [default: 16, 8 bytes
    /// each way at 1 GB/s]. A run's trace shows what its sums took
    /// (the all-reduce spans over the stage's parameters).
    #[arg(long, value_name = "NS", value_parser = parse_ns,
          verbatim_doc_comment)]
    pub(crate) all_reduce_ns: Option<f64>,

    /// How many of the fitting plans to show (--auto) [default: 5].
    #[arg(long, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) top: Option<u32>,
}

/// `--vocab` without a value: GPT-2's vocabulary.
const DEFAULT_VOCAB: u32 = 50257;
/// `--top` without a value.
const DEFAULT_TOP: u32 = 5;

impl AutoArgs {
    /// The model-spec and budget flags given on the command line. They only mean something
    /// with `--auto`, so `pipewise plan` refuses them without it rather than ignore them.
    pub(crate) fn given(&self) -> Vec<&'static str> {
        [
            ("--layers", self.layers.is_some()),
            ("--hidden", self.hidden.is_some()),
            ("--heads", self.heads.is_some()),
            ("--seq-len", self.seq_len.is_some()),
            ("--vocab", self.vocab.is_some()),
            ("--dtype", self.dtype.is_some()),
            ("--global-batch", self.global_batch.is_some()),
            ("--memory-per-worker", self.memory_per_worker.is_some()),
            ("--layer-times", self.layer_times.is_some()),
            ("--top", self.top.is_some()),
            ("--replicas", self.replicas.is_some()),
            ("--all-reduce-ns", self.all_reduce_ns.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect()
    }
}

/// `--replicas`: a count, or every count the workers and the batch allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicasArg {
    Count(u32),
    Auto,
}

/// Parses `--all-reduce-ns NS`: finite and ≥ 0.
fn parse_ns(text: &str) -> std::result::Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(ns) if ns.is_finite() && ns >= 0.0 => Ok(ns),
        _ => Err(format!(
            "{:?} is not a number of nanoseconds ≥ 0",
            text.trim()
        )),
    }
}

/// Parses `--replicas R|auto`.
fn parse_replicas(text: &str) -> std::result::Result<ReplicasArg, String> {
    match text.trim() {
        "auto" => Ok(ReplicasArg::Auto),
        n => match n.parse::<u32>() {
            Ok(0) | Err(_) => Err(format!(
                "{n:?} is neither `auto` nor a whole number from 1 to {}",
                u32::MAX
            )),
            Ok(r) => Ok(ReplicasArg::Count(r)),
        },
    }
}

/// Parses `--layer-times F,B,W[@MBS]`.
/// The longest pass time of one layer accepted (ms): about eleven days.
const MAX_LAYER_MS: f64 = 1e9;

pub(crate) fn parse_layer_times(text: &str) -> std::result::Result<LayerTimes, String> {
    let (times, mbs) = match text.split_once('@') {
        Some((t, m)) => (
            t,
            m.trim().parse::<u32>().map_err(|_| {
                format!(
                    "microbatch size {:?} is not a whole number from 1 to {}",
                    m.trim(),
                    u32::MAX
                )
            })?,
        ),
        None => (text, 1),
    };
    if mbs == 0 {
        return Err("the microbatch size must be at least 1".into());
    }
    let values: Vec<f64> = times
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<f64>()
                .map_err(|_| format!("{:?} is not a number", v.trim()))
        })
        .collect::<std::result::Result<_, _>>()?;
    let [f, b, w] = values[..] else {
        return Err(format!(
            "expected three times F,B,W, got {} values",
            values.len()
        ));
    };
    if [f, b, w].iter().any(|t| !t.is_finite() || *t < 0.0) || f + b + w <= 0.0 {
        return Err("times must be finite, ≥ 0 and not all zero".into());
    }
    // Scaled to the model's pieces and summed over stages, larger times overflow (1e308
    // made every partition infinite and the error blamed --workers).
    if [f, b, w].iter().any(|t| *t > MAX_LAYER_MS) {
        return Err(format!(
            "times must be at most {MAX_LAYER_MS:e} ms per layer (F,B,W = {f},{b},{w})"
        ));
    }
    Ok(LayerTimes {
        f,
        b,
        w,
        microbatch_size: mbs,
    })
}

/// Builds the planner's request from the arguments.
fn request(
    args: &AutoArgs,
    workers: u32,
    comm_ms: f64,
    recompute: RecomputeSearch,
) -> Result<AutoRequest> {
    fn need(value: Option<u32>, flag: &str) -> Result<u32> {
        value.ok_or_else(|| anyhow!("--auto needs {flag}"))
    }
    let memory = args
        .memory_per_worker
        .ok_or_else(|| anyhow!("--auto needs --memory-per-worker"))?;
    if memory < 1.0 || memory > u64::MAX as f64 {
        bail!("--memory-per-worker: {memory} bytes is out of range");
    }
    if args.all_reduce_ns.is_some() && args.replicas.is_none() {
        bail!("--all-reduce-ns applies only with --replicas");
    }
    // --workers counts every worker; a fixed R plans pipelines of workers / R.
    let (workers, count) = match args.replicas.unwrap_or(ReplicasArg::Count(1)) {
        ReplicasArg::Auto => (workers, None),
        ReplicasArg::Count(r) if workers.is_multiple_of(r) => (workers / r, Some(r)),
        ReplicasArg::Count(r) => bail!("--replicas: {r} replicas do not divide {workers} workers"),
    };
    Ok(AutoRequest {
        spec: ModelSpec {
            vocab: args.vocab.unwrap_or(DEFAULT_VOCAB),
            hidden: need(args.hidden, "--hidden")?,
            heads: need(args.heads, "--heads")?,
            layers: need(args.layers, "--layers")?,
            seq_len: need(args.seq_len, "--seq-len")?,
            dtype: args.dtype.unwrap_or(DType::BF16),
            ..Default::default()
        },
        global_batch: need(args.global_batch, "--global-batch")?,
        workers,
        memory_per_worker: memory as u64,
        layer_times: args.layer_times,
        comm_ms,
        top: args.top.unwrap_or(DEFAULT_TOP) as usize,
        measured: None,
        fixed: Default::default(),
        replicas: Replicas {
            count,
            sum_ms_per_value: args
                .all_reduce_ns
                .map_or(DEFAULT_SUM_MS_PER_VALUE, |ns| ns * 1e-6),
        },
        recompute,
    })
}

/// Runs `pipewise plan --auto` on `workers` workers with `comm_ms` per hop and returns the
/// report: a table, or JSON when `json`.
pub(crate) fn run_auto(
    args: &AutoArgs,
    workers: u32,
    comm_ms: f64,
    recompute: RecomputeSearch,
    json: bool,
) -> Result<String> {
    let req = request(args, workers, comm_ms, recompute)?;
    let plan = auto_plan(&req).map_err(|e| anyhow!("--auto: {e}"))?;
    if json {
        let value = serde_json::json!({ "request": req, "plan": plan });
        let mut text = serde_json::to_string_pretty(&value)?;
        text.push('\n');
        return Ok(text);
    }
    Ok(report(&req, &plan))
}

fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / GIB)
}

/// The text report.
fn report(req: &AutoRequest, plan: &AutoPlan) -> String {
    let s = &req.spec;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Auto plan: {} layers, hidden {}, {} heads, sequence {}, vocabulary {}, {}",
        s.layers, s.hidden, s.heads, s.seq_len, s.vocab, s.dtype
    );
    let _ = writeln!(
        out,
        "  parameters: {:.1} M × {} bytes (parameter in {}, gradient, {}AdamW moments in f32) = {} GiB",
        plan.params as f64 / 1e6,
        plan.bytes_per_param,
        s.dtype,
        if s.dtype == DType::F32 {
            ""
        } else {
            "master copy, "
        },
        gib(plan.params * plan.bytes_per_param)
    );
    let _ = writeln!(
        out,
        "  {} workers{}, global batch {} ({} tokens per step), budget {} GiB ({} bytes) per worker, comm {} ms",
        req.workers * req.replicas.count.unwrap_or(1),
        match req.replicas.count {
            Some(1) => String::new(),
            Some(r) => format!(" ({r} replicas of {})", req.workers),
            None => " (every replica count weighed)".into(),
        },
        req.global_batch,
        plan.tokens_per_step,
        gib(plan.memory_per_worker),
        plan.memory_per_worker,
        req.comm_ms
    );
    match req.layer_times {
        Some(t) => {
            let _ = writeln!(
                out,
                "  times: measured F {} B {} W {} ms per block at microbatch size {}",
                t.f, t.b, t.w, t.microbatch_size
            );
        }
        None => {
            let _ = writeln!(
                out,
                "  times: FLOPs at {} TFLOP/s, F = B = W",
                DEFAULT_FLOPS_PER_MS * 1e3 / 1e12
            );
        }
    }
    let _ = writeln!(
        out,
        "\n{} of {} configurations fit; top {}:\n",
        plan.fitting,
        plan.ranked.len() + plan.rejected.len(),
        plan.ranked.len()
    );
    // A column of replicas × pipeline workers where replicas were asked for.
    let shapes = req.replicas.count != Some(1);
    let rows: Vec<Vec<String>> = plan
        .ranked
        .iter()
        .enumerate()
        .map(|(i, c)| row(i, c, s, plan, shapes))
        .collect();
    let mut header = vec![
        "rank",
        "schedule",
        "mbs×n",
        "stages",
        "step ms",
        "tokens/s",
        "bubble",
        "max worker GiB",
    ];
    if shapes {
        header.insert(1, "R×d");
    }
    // Text columns (left-aligned): schedule, mbs×n and stages.
    let text = if shapes { 2..=4 } else { 1..=3 };
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            let pad = w - cell.chars().count();
            // Text columns left-aligned, numbers right-aligned.
            if text.contains(&i) {
                l.push_str(cell);
                l.push_str(&" ".repeat(pad));
            } else {
                l.push_str(&" ".repeat(pad));
                l.push_str(cell);
            }
            l.push_str("  ");
        }
        l.trim_end().to_string()
    };
    let header: Vec<String> = header.into_iter().map(String::from).collect();
    let _ = writeln!(out, "{}", line(&header));
    for r in &rows {
        let _ = writeln!(out, "{}", line(r));
    }
    for c in plan.ranked.iter().filter(|c| !c.note.is_empty()) {
        let _ = writeln!(out, "  {}: {}", c.label(), c.note);
    }
    for c in &plan.ranked {
        let recompute = recompute_summary(&c.recompute);
        if !recompute.is_empty() {
            let _ = writeln!(out, "  {}: {recompute}", c.label());
        }
    }
    rejected_section(&mut out, plan);
    out
}

fn row(i: usize, c: &Candidate, spec: &ModelSpec, plan: &AutoPlan, shapes: bool) -> Vec<String> {
    let mut cells = vec![
        (i + 1).to_string(),
        c.config.kind.name().to_string(),
        format!("{}×{}", c.config.microbatch_size, c.config.microbatches),
        partition_summary(spec, &c.partition),
        format!("{:.1}", c.step_ms),
        format!("{:.0}", c.tokens_per_s),
        format!("{:.1}%", 100.0 * c.bubble),
        format!(
            "{} / {}",
            gib(c.max_worker_bytes),
            gib(plan.memory_per_worker)
        ),
    ];
    if shapes {
        cells.insert(1, format!("{}×{}", c.config.replicas, c.degree()));
    }
    cells
}

fn rejected_section(out: &mut String, plan: &AutoPlan) {
    let best = plan.ranked.first().map_or(0.0, |c| c.step_ms);
    let groups: [(Why, &str); 3] = [
        (Why::DoesNotFit, "does not fit"),
        (Why::Slower, "slower"),
        (Why::Skipped, "skipped"),
    ];
    for (why, title) in groups {
        let mut list: Vec<&Rejected> = plan.rejected.iter().filter(|r| r.why == why).collect();
        if list.is_empty() {
            continue;
        }
        match why {
            // Closest to fitting first.
            Why::DoesNotFit => list.sort_by_key(|r| r.needed_bytes.unwrap_or(u64::MAX)),
            Why::Slower => list.sort_by(|a, b| {
                a.step_ms
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&b.step_ms.unwrap_or(f64::INFINITY))
            }),
            Why::Skipped => {}
        }
        let _ = writeln!(out, "\nRejected, {title} ({}):", list.len());
        for r in list.iter().take(LIST_PER_GROUP) {
            let text = match why {
                Why::DoesNotFit => {
                    let need = r.needed_bytes.map_or_else(
                        || "more than the budget".to_string(),
                        |b| format!("{} GiB", gib(b)),
                    );
                    let what = if r.reason.contains("parameters and optimizer state") {
                        " (parameters and optimizer state alone exceed the budget)"
                    } else {
                        ""
                    };
                    format!("needs {need} > {} GiB{what}", gib(plan.memory_per_worker))
                }
                Why::Slower => match r.step_ms {
                    Some(ms) => format!(
                        "step {ms:.1} ms vs best {best:.1} ms (+{:.1}%)",
                        if best > 0.0 {
                            100.0 * (ms / best - 1.0)
                        } else {
                            0.0
                        }
                    ),
                    None => r.reason.clone(),
                },
                Why::Skipped => r
                    .reason
                    .strip_prefix("skipped: ")
                    .unwrap_or(&r.reason)
                    .to_string(),
            };
            let _ = writeln!(out, "  {:<24} {text}", r.label());
        }
        if list.len() > LIST_PER_GROUP {
            let _ = writeln!(out, "  … and {} more", list.len() - LIST_PER_GROUP);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn layer_times_parse() {
        let t = parse_layer_times("1.5,3,1.5@4").unwrap();
        assert_eq!((t.f, t.b, t.w, t.microbatch_size), (1.5, 3.0, 1.5, 4));
        assert_eq!(parse_layer_times("1,2,1").unwrap().microbatch_size, 1);
        assert!(parse_layer_times("1,2").is_err());
        assert!(parse_layer_times("1,2,x").is_err());
        assert!(parse_layer_times("1,2,1@0").is_err());
        assert!(parse_layer_times("0,0,0").is_err());
        assert!(parse_layer_times("-1,2,1").is_err());
        // Used to reach the planner and fail as "invalid workers".
        assert!(parse_layer_times("1e308,1e308,1e308").is_err_and(|e| e.contains("at most")));
        assert!(parse_layer_times("1,1,1@4294967296").is_err_and(|e| e.contains("from 1 to")));
    }
}
