//! `pipewise plan` arguments as typed (ripgrep's "low-level" arguments): the clap
//! definitions, the output formats and `--memory-limit`. [`super::request`] checks them
//! together into the request the command runs.

use std::fmt;
use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use pipewise_common::generate::{MAX_CHUNKS, MAX_MICROBATCHES, MAX_WORKERS};
use pipewise_common::schedule::Recompute;
use pipewise_common::{ScheduleKind, Times};

use crate::values::{parse_bytes, parse_times, positive};

/// The help after `pipewise plan --help`: units, pass text and examples.
pub(crate) const PLAN_AFTER_HELP: &str = "\
Conventions:
  Times (--times, --stage-times) are in any time unit you like; all reported times use it.
  --times gives the cost of one pass over one stage holding 1/d of the model. A schedule
  with v stages (chunks) per worker splits that: each chunk pass takes 1/v of it. A fused
  backward (BW) takes B + W.
  Memory is reported in units of one microbatch's activation over 1/d of the model (1F1B
  peaks at d units on worker 0); --activation-bytes gives the bytes of one unit.
  Pass text: <stage><kind><microbatch>, kinds F (forward), B (input-gradient backward),
  W (weight-gradient backward), BW (full backward). In CSV files the PyTorch letters are
  used instead: F, I (input gradient), W (weight gradient), B (full backward).

Examples:
  pipewise plan --schedule 1f1b --workers 4 --microbatches 8
  pipewise plan -s v-half -d 8 -n 32 --format svg -o v-half.svg
  pipewise plan -s interleaved-1f1b -d 4 -n 16 --chunks 3 --times 1,2,1,0.1
  pipewise plan --compare -d 8 -n 32 --times 1,1,1 --activation-bytes 2GiB
  pipewise plan -s zb-h1 -d 4 -n 8 --format csv -o zb.csv
  pipewise plan -s 1f1b-r -d 16 -n 64 --times 12.96,13.22,9.76,0.67
  pipewise plan -s v-half -d 8 -n 32 --recompute selective
  pipewise plan -s csv:zb.csv --format grid";

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    /// Human-readable report: makespan, bubble, peak memory per worker, bounds, planning time.
    Table,
    /// Text timeline, one row per worker, one cell per shortest pass ('.' = idle).
    Grid,
    /// The schedule as CSV in the torchtitan / torch.distributed.pipelining form.
    Csv,
    /// SVG figure: one row per worker, passes coloured by kind, time axis and legend.
    Svg,
    /// Chrome / Perfetto trace JSON (one time unit shown as 1 ms).
    Chrome,
    /// The report as JSON.
    Json,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self
            .to_possible_value()
            .map(|v| v.get_name().to_string())
            .unwrap_or_default();
        f.write_str(&name)
    }
}

fn schedule_help() -> String {
    let names: Vec<&str> = ScheduleKind::ALL.iter().map(|k| k.name()).collect();
    let mut known = String::new();
    let mut line = String::new();
    for name in names {
        if !line.is_empty() && line.len() + name.len() + 2 > 70 {
            known.push_str(line.trim_end());
            known.push('\n');
            line.clear();
        }
        line.push_str(name);
        line.push_str(", ");
    }
    known.push_str(line.trim_end_matches([',', ' ']));
    format!(
        "The schedule to plan: a generator name (case-insensitive), or\n\
         csv:PATH to import a schedule from a CSV file in the torchtitan /\n\
         torch.distributed.pipelining form (one row per worker, cells like\n\
         0F0, 2I0, 2W0, 1B3, and DualPipeV's (0F7;7B3)OVERLAP_F_B; the\n\
         communication actions of PyTorch's default dump are read past;\n\
         workers, microbatches and placement are read from the file).\n\n\
         Known schedules:\n{known}\n\n\
         Required unless --compare or --auto is given."
    )
}

/// `pipewise plan` arguments as typed.
#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// Schedule name (e.g. 1f1b, zb-h1, v-half) or csv:PATH.
    #[arg(
        long,
        short = 's',
        value_name = "NAME|csv:PATH",
        long_help = schedule_help(),
        required_unless_present_any = ["compare", "auto"],
        conflicts_with_all = ["compare", "auto"]
    )]
    pub(crate) schedule: Option<String>,

    /// Number of workers (pipeline ranks) d.
    ///
    /// Required for generated schedules. For csv:PATH it is read from
    /// the file (one row per worker); if given, it must match.
    #[arg(long, short = 'd', value_name = "D", verbatim_doc_comment,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_WORKERS)))]
    pub(crate) workers: Option<u32>,

    /// Number of microbatches per training step n.
    ///
    /// Required for generated schedules. For csv:PATH it is read from
    /// the file (largest microbatch + 1); if given, it must match.
    #[arg(long, short = 'n', value_name = "N", verbatim_doc_comment,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_MICROBATCHES)))]
    pub(crate) microbatches: Option<u32>,

    /// Stages (chunks) per worker v, for interleaved-1f1b and looped-bfs [default: 2].
    ///
    /// Only those two schedules take it: the V-shape schedules always
    /// have 2 chunks per worker and the others 1.
    #[arg(long, value_name = "V", verbatim_doc_comment,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_CHUNKS)))]
    pub(crate) chunks: Option<u32>,

    /// Pass times F,B,W or F,B,W,COMM of one stage holding 1/d of the model.
    ///
    /// F: forward, B: input-gradient backward, W: weight-gradient
    /// backward, COMM: latency of one hop between workers (default 0).
    /// A schedule with v chunks per worker gives every chunk pass 1/v of
    /// these; a full backward BW takes B + W. The zero-bubble and V-shape
    /// generators also use them to fill idle time.
    #[arg(long, value_name = "F,B,W[,COMM]", default_value = "1,1,1,0",
          value_parser = parse_times, verbatim_doc_comment)]
    pub(crate) times: Times,

    /// Per-stage times from FILE: one line per stage, "f,b,w" or "f,b,w,mem".
    ///
    /// Lines are in stage (model) order, stage 0 first: d lines for
    /// one-stage-per-worker schedules, 2d for the V-shape ones, v·d for
    /// interleaved-1f1b and looped-bfs. f, b, w are the times of that
    /// stage's own passes (not divided by v); mem is its activation memory
    /// per microbatch, in units of one microbatch's activation over 1/d of
    /// the model (default 1/v). Blank lines and text after '#' are ignored.
    /// Replaces the compute times of --times; COMM still comes from --times.
    #[arg(long, value_name = "FILE", verbatim_doc_comment)]
    pub(crate) stage_times: Option<PathBuf>,

    /// Bytes of one microbatch's activation over 1/d of the model, to report memory in bytes.
    ///
    /// A number, optionally with a unit: B, KB, MB, GB, TB, PB, EB (powers
    /// of 1000) or KiB, MiB, GiB, TiB, PiB, EiB (powers of 1024), e.g. 3.5e8,
    /// 512MiB; Kubernetes' K, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei also.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, verbatim_doc_comment)]
    pub(crate) activation_bytes: Option<f64>,

    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,

    /// Plan every known schedule for the same workers, microbatches and times, one row each.
    ///
    /// Schedules that do not support the shape are skipped and listed,
    /// with the reason, after the table. Works with --format table and json.
    #[arg(long, verbatim_doc_comment)]
    pub(crate) compare: bool,

    /// Per-worker activation-memory limit of adaptive-v and adaptive-zb.
    ///
    /// In the memory units of this report (one microbatch's activation
    /// over 1/d of the model), e.g. 6.5; as a multiple of 1F1B's peak
    /// (d units; with a memory column in --stage-times, 1F1B's peak on
    /// the same layers per worker), e.g. 0.5x; or in bytes with a unit,
    /// e.g. 24GiB, which needs --activation-bytes. Default: 1x.
    #[arg(long, value_name = "L|Fx|BYTES", value_parser = parse_memory_limit,
          allow_hyphen_values = true, verbatim_doc_comment)]
    pub(crate) memory_limit: Option<MemoryLimit>,

    /// Plan adaptive-v or adaptive-zb at every limit from the smallest that
    /// fits up to 2x 1F1B's peak and print bubble against limit.
    ///
    /// --format table (default) prints the table, svg a line chart, json
    /// the points.
    #[arg(long, verbatim_doc_comment, conflicts_with_all = ["compare", "memory_limit"])]
    pub(crate) sweep_memory: bool,

    /// Activation recomputation on every stage: none, selective or full.
    ///
    /// full: F keeps only the stage's input, B first re-runs F; selective:
    /// F keeps each block's input, attention output and log-sum-exp, B
    /// first redoes the block's linear layers. Without a model, a stage's
    /// kept share is GPT's at large hidden size (full 1/16 of a unit,
    /// selective 1/8) and selective redoes all of F's time. The redone
    /// forward counts as idle time in the bubble rates (seed 000's Table 4
    /// counts 1F1B-R so). -s 1f1b-r is 1F1B with full recomputation.
    #[arg(long, value_name = "MODE", value_parser = parse_recompute, verbatim_doc_comment)]
    pub(crate) recompute: Option<RecomputeArg>,

    /// Write the output to FILE instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,

    /// The auto-planner's options (`--auto` and the model spec).
    #[command(flatten)]
    pub(crate) auto: super::auto::AutoArgs,
}

/// `--memory-limit` as typed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum MemoryLimit {
    /// Memory units.
    Units(f64),
    /// A multiple of 1F1B's peak (`d` units when every worker holds 1/d of the model).
    Times1F1B(f64),
    /// Bytes (converted with `--activation-bytes`).
    Bytes(f64),
}

impl MemoryLimit {
    /// The limit in memory units; `one_f_one_b_peak` gives 1F1B's peak in units (asked
    /// only for a multiple of it).
    pub(crate) fn units(
        self,
        one_f_one_b_peak: impl FnOnce() -> Result<f64>,
        activation_bytes: Option<f64>,
    ) -> Result<f64> {
        let units = match self {
            MemoryLimit::Units(u) => u,
            MemoryLimit::Times1F1B(x) => {
                let peak = one_f_one_b_peak()?;
                if peak <= 0.0 {
                    bail!(
                        "--memory-limit {x}x: 1F1B's peak is {peak} units (the stages hold no \
                         activation memory); give the limit in units"
                    );
                }
                x * peak
            }
            MemoryLimit::Bytes(b) => match activation_bytes {
                Some(unit) => b / unit,
                None => bail!(
                    "--memory-limit in bytes needs --activation-bytes (the bytes of one memory \
                     unit); or give the limit in units (e.g. 6.5) or as a multiple of 1F1B's \
                     peak (e.g. 0.5x)"
                ),
            },
        };
        if !(units > 0.0 && units.is_finite()) {
            bail!("--memory-limit comes to {units:e} memory units, out of range (> 0, finite)");
        }
        Ok(units)
    }
}

/// `--recompute`: a mode for every stage, or (with `--auto`) only where a worker would
/// overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecomputeArg {
    Every(Recompute),
    WhereNeeded,
}

/// Parses `--recompute`.
fn parse_recompute(text: &str) -> std::result::Result<RecomputeArg, String> {
    if text.trim().eq_ignore_ascii_case("auto") {
        return Ok(RecomputeArg::WhereNeeded);
    }
    text.parse::<Recompute>()
        .map(RecomputeArg::Every)
        .map_err(|e| format!("{e}, or auto (with --auto)"))
}

/// Parses `--memory-limit`: units, `0.5x`, or bytes with a unit.
pub(crate) fn parse_memory_limit(text: &str) -> std::result::Result<MemoryLimit, String> {
    let t = text.trim();
    // NaN and infinity are numbers of units (refused as such), not byte counts.
    let special = ["nan", "inf", "infinity"].contains(
        &t.trim_start_matches(['+', '-'])
            .to_ascii_lowercase()
            .as_str(),
    );
    Ok(if let Some(x) = t.strip_suffix(['x', 'X']) {
        MemoryLimit::Times1F1B(positive(x, "memory limit")?)
    } else if t.ends_with(|c: char| c.is_ascii_alphabetic()) && !t.ends_with('e') && !special {
        // A unit (24GB, 24GiB, or Kubernetes' 24Gi): bytes.
        MemoryLimit::Bytes(parse_bytes(t)?)
    } else {
        MemoryLimit::Units(positive(t, "memory limit")?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits_must_be_positive_with_one_message() {
        for bad in ["-1", "0", "0x", "-2x", "inf", "NaN"] {
            let e = parse_memory_limit(bad).expect_err(bad);
            assert!(
                e.contains("greater than 0") || e.contains("not a number"),
                "{bad}: {e}"
            );
        }
        assert_eq!(parse_memory_limit("0.5x"), Ok(MemoryLimit::Times1F1B(0.5)));
        // Any byte unit, Kubernetes' included, makes the limit a byte count.
        let gib = 1024.0f64.powi(3);
        assert_eq!(
            parse_memory_limit("24Gi"),
            Ok(MemoryLimit::Bytes(24.0 * gib))
        );
        assert_eq!(
            parse_memory_limit("24GiB"),
            Ok(MemoryLimit::Bytes(24.0 * gib))
        );
        assert_eq!(parse_memory_limit("6.5"), Ok(MemoryLimit::Units(6.5)));
        assert!(parse_memory_limit("2e").is_err());
        assert_eq!(parse_memory_limit("1E"), Ok(MemoryLimit::Bytes(1e18)));
        assert!(parse_memory_limit("1e").is_err());
        assert!(parse_memory_limit("24parsecs").is_err_and(|e| e.contains("unknown unit")));
        // Finite as typed, infinite once converted: named, not passed on.
        let e = MemoryLimit::Times1F1B(1e308)
            .units(|| Ok(16.0), None)
            .expect_err("overflows");
        assert!(e.to_string().contains("--memory-limit"), "{e}");
        // Stages without memory: no multiple of a zero peak is a limit.
        let e = MemoryLimit::Times1F1B(0.5)
            .units(|| Ok(0.0), None)
            .expect_err("zero peak");
        assert!(e.to_string().contains("1F1B's peak is 0"), "{e}");
    }
}
