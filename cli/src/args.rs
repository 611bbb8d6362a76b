//! Command-line arguments: the clap definitions ([`Cli`], [`PlanArgs`], the "low-level"
//! arguments exactly as typed) and their resolution into a checked [`Plan`] (the "high-level"
//! arguments the command runs on), in the manner of ripgrep's `LowArgs` → `HiArgs`.
//!
//! Everything a user can get wrong is caught here, with a message naming the option.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use pipewise_common::generate::{
    MAX_CHUNKS, MAX_MICROBATCHES, MAX_STAGE_MICROBATCHES, MAX_WORKERS,
};
use pipewise_common::{ScheduleKind, Times};

const ABOUT: &str = "Pipeline-parallel training planner: generate, import, simulate and \
                     render pipeline schedules (1F1B, interleaved, zero-bubble, V-shape, \
                     DualPipeV, …).";

const LONG_ABOUT: &str = "\
Pipeline-parallel training planner.

pipewise generates pipeline-parallel training schedules (GPipe, 1F1B, interleaved 1F1B,
zero-bubble ZB-H1/ZB-H2, the V-shape family and DualPipeV) or imports them from the CSV
form torchtitan and torch.distributed.pipelining use, checks them, simulates them under a
cost model, and reports makespan, bubble rate and peak activation memory, or renders them
as a text grid, CSV, SVG figure or Chrome/Perfetto trace.";

const PLAN_AFTER_HELP: &str = "\
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
  pipewise plan -s csv:zb.csv --format grid";

/// The `pipewise` command line.
#[derive(Debug, Parser)]
#[command(
    name = "pipewise",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    arg_required_else_help = true,
    propagate_version = true
)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Generate or import a schedule, simulate it, and report or render it.
    ///
    /// Generates the schedule --schedule names for --workers and --microbatches
    /// (or imports one from a CSV file with --schedule csv:PATH), simulates it
    /// under --times or --stage-times, and writes a report (--format table or
    /// json) or a rendering (grid, csv, svg, chrome). With --compare, plans
    /// every known schedule for the same shape, one row per schedule.
    #[command(after_long_help = PLAN_AFTER_HELP, verbatim_doc_comment)]
    Plan(PlanArgs),
    /// Train on this machine: a coordinator and N workers, the job over gRPC.
    ///
    /// Starts the coordinator and N workers in this process (each worker
    /// with its own gRPC activation service, heartbeats and executor
    /// thread, all on loopback), submits the job, prints a line
    /// per step (loss, tokens/s, planned and measured bubble, peak
    /// activation memory per worker) and a summary. --output-dir DIR
    /// writes summary.json and the final parameters (params.safetensors,
    /// the same tensor names whatever the worker count).
    #[command(verbatim_doc_comment)]
    Local(crate::local::LocalArgs),
    /// Run a coordinator: the job API and the cluster API over gRPC.
    ///
    /// Jobs submitted to it run on the worker processes that register
    /// (`pipewise worker --coordinator URL`). Prints the bound address.
    #[command(verbatim_doc_comment)]
    Coordinator(crate::cluster::CoordinatorArgs),
    /// Run a worker process: register with a coordinator and run assignments.
    Worker(crate::cluster::WorkerArgs),
    /// Submit a job file (TOML) to a coordinator.
    Submit(crate::cluster::SubmitArgs),
    /// Show one job, or list every job, of a coordinator.
    Status(crate::cluster::StatusArgs),
    /// Follow a job's steps until it ends.
    Watch(crate::cluster::JobArgs),
    /// Cancel a job (workers stop at the next step boundary).
    Cancel(crate::cluster::JobArgs),
    /// Write a recent step's executed timeline next to its plan.
    ///
    /// Asks the coordinator for step K of JOB (default: the latest it
    /// keeps; it keeps the last 64 steps of its last 8 jobs) and writes
    /// OUT/step-K.trace.json (Chrome / Perfetto trace: process 0 planned,
    /// process 1 executed, one thread per worker) and OUT/step-K.svg
    /// (planned above executed on one time axis; waits for peers red,
    /// sends orange, end-of-step sync grey).
    #[command(verbatim_doc_comment)]
    Trace(crate::cluster::TraceArgs),
}

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

    /// Write the output to FILE instead of standard output.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,

    /// The auto-planner's options (`--auto` and the model spec).
    #[command(flatten)]
    pub(crate) auto: crate::auto::AutoArgs,
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

/// Where the schedule comes from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Source {
    /// A generator, with its shape.
    Generate {
        /// Which generator.
        kind: ScheduleKind,
        /// Worker count.
        workers: u32,
        /// Microbatch count.
        microbatches: u32,
        /// Chunks per worker.
        chunks: u32,
    },
    /// A CSV file, with the shape it must have when given.
    Csv {
        /// The file.
        path: PathBuf,
        /// `--workers`, if given.
        workers: Option<u32>,
        /// `--microbatches`, if given.
        microbatches: Option<u32>,
    },
    /// The auto-planner (`--auto`) on `workers` workers.
    Auto {
        /// Worker count.
        workers: u32,
        /// The model spec and budget flags.
        args: Box<crate::auto::AutoArgs>,
    },
    /// Every generator, on one shape.
    Compare {
        /// Worker count.
        workers: u32,
        /// Microbatch count.
        microbatches: u32,
        /// Chunks per worker for the looped schedules.
        chunks: u32,
    },
}

/// Times of one stage from `--stage-times`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StageTimes {
    /// Forward.
    pub(crate) f: f64,
    /// Input-gradient backward.
    pub(crate) b: f64,
    /// Weight-gradient backward.
    pub(crate) w: f64,
    /// Activation memory per microbatch, if given.
    pub(crate) mem: Option<f64>,
}

/// The checked request `pipewise plan` runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    /// What to plan.
    pub(crate) source: Source,
    /// Times from `--times` (compute times may be overridden by `stage_times`).
    pub(crate) times: Times,
    /// Per-stage times, and the file they came from.
    pub(crate) stage_times: Option<(PathBuf, Vec<StageTimes>)>,
    /// Bytes of one memory unit.
    pub(crate) activation_bytes: Option<f64>,
    /// Output format.
    pub(crate) format: Format,
    /// Output file; standard output when `None`.
    pub(crate) output: Option<PathBuf>,
    /// `--memory-limit`, as typed.
    pub(crate) memory_limit: Option<MemoryLimit>,
    /// `--sweep-memory`.
    pub(crate) sweep_memory: bool,
}

impl PlanArgs {
    /// Checks the arguments together and reads `--stage-times`.
    pub(crate) fn resolve(self) -> Result<Plan> {
        let source = self.source()?;
        if matches!(source, Source::Compare { .. })
            && !matches!(self.format, Format::Table | Format::Json)
        {
            bail!(
                "--format {} cannot show several schedules; with --compare use --format table \
                 or --format json",
                self.format
            );
        }
        let adaptive = match &source {
            Source::Generate { kind, .. } => kind.is_adaptive(),
            Source::Compare { .. } => true,
            Source::Csv { .. } | Source::Auto { .. } => false,
        };
        if self.memory_limit.is_some() && !adaptive {
            bail!(
                "--memory-limit applies to --schedule adaptive-v and adaptive-zb (and to their \
                 rows with --compare); the fixed schedules have a fixed memory class"
            );
        }
        if matches!(self.memory_limit, Some(MemoryLimit::Bytes(_)))
            && self.activation_bytes.is_none()
        {
            bail!(
                "--memory-limit in bytes needs --activation-bytes (the bytes of one memory \
                 unit); or give the limit in units (e.g. 6.5) or as a multiple of 1F1B's \
                 peak (e.g. 0.5x)"
            );
        }
        if self.sweep_memory {
            if !matches!(&source, Source::Generate { kind, .. } if kind.is_adaptive()) {
                bail!("--sweep-memory needs --schedule adaptive-v or --schedule adaptive-zb");
            }
            if !matches!(self.format, Format::Table | Format::Svg | Format::Json) {
                bail!(
                    "--format {} cannot show a sweep; use table, svg or json",
                    self.format
                );
            }
        }
        let stage_times = match &self.stage_times {
            Some(path) => Some((path.clone(), read_stage_times(path)?)),
            None => None,
        };
        Ok(Plan {
            source,
            times: self.times,
            stage_times,
            activation_bytes: self.activation_bytes,
            format: self.format,
            output: self.output,
            memory_limit: self.memory_limit,
            sweep_memory: self.sweep_memory,
        })
    }

    fn source(&self) -> Result<Source> {
        if self.auto.auto {
            if self.compare {
                bail!("--auto and --compare cannot be combined");
            }
            let Some(workers) = self.workers else {
                bail!("--workers is required with --auto");
            };
            if self.microbatches.is_some() || self.chunks.is_some() {
                bail!(
                    "--auto chooses the microbatch count and chunks itself; drop --microbatches \
                     and --chunks"
                );
            }
            if self.stage_times.is_some() || self.activation_bytes.is_some() {
                bail!(
                    "--stage-times and --activation-bytes do not apply to --auto: it derives \
                     stage costs and activation bytes from the model spec (measured times go \
                     in --layer-times)"
                );
            }
            let t = self.times;
            if (t.f, t.b, t.w) != (1.0, 1.0, 1.0) {
                bail!(
                    "--auto derives pass times from the model spec (measured times go in \
                     --layer-times); of --times it uses COMM alone, in ms: give --times \
                     1,1,1,COMM"
                );
            }
            if self.memory_limit.is_some() {
                bail!(
                    "--memory-limit does not apply to --auto: it plans every schedule to \
                     --memory-per-worker"
                );
            }
            if !matches!(self.format, Format::Table | Format::Json) {
                bail!("--auto prints a table or JSON; use --format table or --format json");
            }
            return Ok(Source::Auto {
                workers,
                args: Box::new(self.auto.clone()),
            });
        }
        let given = self.auto.given();
        if !given.is_empty() {
            bail!(
                "{} {} only with --auto (the model spec sizes an auto-planned job); add --auto \
                 or drop {}",
                given.join(", "),
                if given.len() == 1 { "applies" } else { "apply" },
                if given.len() == 1 { "it" } else { "them" },
            );
        }
        if self.compare {
            let (workers, microbatches) = self.shape("--compare")?;
            let chunks = self.chunks.unwrap_or(2);
            check_size(workers, microbatches, chunks.max(2))?;
            return Ok(Source::Compare {
                workers,
                microbatches,
                chunks,
            });
        }
        let Some(name) = self.schedule.as_deref() else {
            bail!("--schedule is required (or use --compare to plan every schedule)");
        };
        if let Some(path) = name.strip_prefix("csv:") {
            if path.trim().is_empty() {
                bail!("--schedule csv:PATH needs a file path after \"csv:\"");
            }
            if self.chunks.is_some() {
                bail!(
                    "--chunks does not apply to --schedule {name}: an imported schedule's \
                     placement comes from the file"
                );
            }
            return Ok(Source::Csv {
                path: PathBuf::from(path),
                workers: self.workers,
                microbatches: self.microbatches,
            });
        }
        let kind: ScheduleKind = name.parse().map_err(|_| {
            anyhow::anyhow!(
                "--schedule: unknown schedule {name:?}; known schedules: {}; or csv:PATH to \
                 import one",
                ScheduleKind::ALL.map(ScheduleKind::name).join(", ")
            )
        })?;
        let (workers, microbatches) = self.shape(&format!("--schedule {kind}"))?;
        if self.chunks.is_some() && !kind.uses_chunks() {
            bail!(
                "--chunks applies only to interleaved-1f1b and looped-bfs, not to {kind} \
                 (its chunks per worker are fixed)"
            );
        }
        let chunks = self.chunks.unwrap_or(2);
        check_size(
            workers,
            microbatches,
            kind.placement(workers, chunks).chunks(),
        )?;
        Ok(Source::Generate {
            kind,
            workers,
            microbatches,
            chunks,
        })
    }

    /// `--workers` and `--microbatches`, both required by `what`.
    fn shape(&self, what: &str) -> Result<(u32, u32)> {
        match (self.workers, self.microbatches) {
            (Some(d), Some(n)) => Ok((d, n)),
            (None, _) => bail!("--workers is required with {what}"),
            (_, None) => bail!("--microbatches is required with {what}"),
        }
    }
}

/// Rejects shapes too large to plan in reasonable time and memory.
fn check_size(workers: u32, microbatches: u32, chunks: u32) -> Result<()> {
    let size = u64::from(workers) * u64::from(chunks) * u64::from(microbatches);
    if size > MAX_STAGE_MICROBATCHES {
        let per_worker = if chunks == 1 {
            String::new()
        } else {
            format!(" (× {chunks} chunks per worker)")
        };
        bail!(
            "--workers {workers} × --microbatches {microbatches}{per_worker} is too large: \
             stages × microbatches must be at most {MAX_STAGE_MICROBATCHES}"
        );
    }
    Ok(())
}

/// Parses a number (any float, including inf and NaN); `what` names it in errors.
fn float(text: &str, what: &str) -> std::result::Result<f64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{what}: {:?} is not a number", text.trim()))
}

/// Parses a finite number greater than 0; `what` names it in errors.
fn positive(text: &str, what: &str) -> std::result::Result<f64, String> {
    let text = text.trim();
    let value = float(text, what)?;
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!(
            "{what}: {text} must be a finite number greater than 0"
        ));
    }
    Ok(value)
}

/// Parses a finite, non-negative number; `what` names it in errors.
fn number(text: &str, what: &str) -> std::result::Result<f64, String> {
    let text = text.trim();
    let value = float(text, what)?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{what}: {text} must be finite and ≥ 0"));
    }
    Ok(value)
}

/// Parses `--times F,B,W[,COMM]`.
pub(crate) fn parse_times(text: &str) -> std::result::Result<Times, String> {
    let parts: Vec<&str> = text.split(',').collect();
    if !(3..=4).contains(&parts.len()) {
        return Err(format!(
            "expected 3 or 4 comma-separated numbers F,B,W[,COMM], got {}",
            parts.len()
        ));
    }
    let times = Times {
        f: number(parts[0], "F")?,
        b: number(parts[1], "B")?,
        w: number(parts[2], "W")?,
        comm: match parts.get(3) {
            Some(c) => number(c, "COMM")?,
            None => 0.0,
        },
    };
    times.check().map_err(|e| e.to_string())?;
    Ok(times)
}

/// The largest byte count accepted (1 EiB): larger ones overflow the reports' sums.
const MAX_BYTES: f64 = 1_152_921_504_606_846_976.0;

/// Parses `--activation-bytes`: a positive number with an optional unit.
pub(crate) fn parse_bytes(text: &str) -> std::result::Result<f64, String> {
    let text = text.trim();
    // An `e` or `E` followed by a digit or a sign is an exponent (3.5e8); otherwise it
    // starts the unit (1EiB, Kubernetes' 1E).
    let bytes = text.as_bytes();
    let split = (0..bytes.len())
        .find(|&i| {
            let c = bytes[i];
            let exponent = matches!(c, b'e' | b'E')
                && i > 0
                && bytes
                    .get(i + 1)
                    .is_some_and(|n| n.is_ascii_digit() || matches!(n, b'+' | b'-'));
            c.is_ascii_alphabetic() && !exponent
        })
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.trim().is_empty() {
        return Err(format!(
            "{text:?} is not a number of bytes (e.g. 3.5e8, 512MiB)"
        ));
    }
    // Kubernetes' quantity suffixes (k, M, G, T and Ki, Mi, Gi, Ti) mean the same, so a
    // chart value such as 80Gi reads as it does in a pod's resources. A lone lower-case `m`
    // is Kubernetes' milli (512m is half a byte there), not mega: refused, not guessed.
    if unit.trim() == "m" {
        let digits = digits.trim();
        return Err(format!(
            "{text:?}: a lone \"m\" is Kubernetes' milli, not mega; write {digits}M, \
             {digits}MB or {digits}Mi"
        ));
    }
    // A lone lower-case `e` is an exponent cut short (1e), not Kubernetes' exa (1E).
    if unit.trim() == "e" {
        let digits = digits.trim();
        return Err(format!(
            "{text:?}: an exponent without digits; for exabytes write {digits}E, {digits}EB \
             or {digits}Ei"
        ));
    }
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" | "ki" => 1024.0,
        "mib" | "mi" => 1024.0 * 1024.0,
        "gib" | "gi" => 1024.0 * 1024.0 * 1024.0,
        "tib" | "ti" => 1024f64.powi(4),
        "pb" | "p" => 1e15,
        "eb" | "e" => 1e18,
        "pib" | "pi" => 1024f64.powi(5),
        "eib" | "ei" => 1024f64.powi(6),
        other => {
            return Err(format!(
                "unknown unit {other:?}; use B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, \
                 PiB or EiB (or Kubernetes' K, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei)"
            ));
        }
    };
    let value = positive(digits, "bytes")? * scale;
    if !(value.is_finite() && value <= MAX_BYTES) {
        return Err(format!("{text} is too large: at most 2^60 bytes (1 EiB)"));
    }
    Ok(value)
}

/// Reads a text file of at most `limit` bytes: a larger one (or an endless one such as
/// `/dev/zero`) is refused once `limit` bytes are read, and one not in UTF-8 is refused with
/// where its first bad byte is.
pub(crate) fn read_text(path: &Path, limit: u64) -> Result<String> {
    use std::io::Read as _;
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!(
            "{} is larger than {limit} bytes, more than such a file can sensibly hold",
            path.display()
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let utf16 = matches!(e.as_bytes(), [0xff, 0xfe, ..] | [0xfe, 0xff, ..]);
        anyhow::anyhow!(
            "{} is not UTF-8 text (byte {at} is not valid UTF-8{})",
            path.display(),
            if utf16 {
                "; the file starts with a UTF-16 byte-order mark: save it as UTF-8"
            } else {
                ""
            }
        )
    })
}

/// The largest `--stage-times` file read (4096 workers × 64 chunks of lines, with room).
const MAX_STAGE_TIMES_BYTES: u64 = 64 << 20;

/// Reads and parses a `--stage-times` file.
fn read_stage_times(path: &Path) -> Result<Vec<StageTimes>> {
    let text = read_text(path, MAX_STAGE_TIMES_BYTES).context("--stage-times")?;
    parse_stage_times(&text).map_err(|e| anyhow::anyhow!("--stage-times {}: {e}", path.display()))
}

/// The smallest positive `mem` of a `--stage-times` line, in memory units.
const MIN_STAGE_MEMORY: f64 = 1e-6;

/// Parses the text of a `--stage-times` file.
pub(crate) fn parse_stage_times(text: &str) -> std::result::Result<Vec<StageTimes>, String> {
    // A byte-order mark, as some editors write, like CSV schedules accept.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut stages = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let content = line.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", i + 1);
        let parts: Vec<&str> = content.split(',').collect();
        if !(3..=4).contains(&parts.len()) {
            return Err(at(format!(
                "expected f,b,w[,mem] (3 or 4 comma-separated numbers), got {content:?}"
            )));
        }
        let f = number(parts[0], "f").map_err(at)?;
        let b = number(parts[1], "b").map_err(at)?;
        let w = number(parts[2], "w").map_err(at)?;
        if f + b + w <= 0.0 {
            return Err(at("f + b + w must be greater than 0".into()));
        }
        let mem = match parts.get(3) {
            Some(m) => {
                let mem = number(m, "mem").map_err(at)?;
                // The planners compare memory with an absolute tolerance of 1e-9 units.
                if mem > 0.0 && mem < MIN_STAGE_MEMORY {
                    return Err(at(format!(
                        "mem {m} is below {MIN_STAGE_MEMORY:e}: it is in units of one \
                         microbatch's activation over 1/d of the model (1/v for a stage of \
                         a worker with v stages), not in bytes or GB; give 0 for none"
                    )));
                }
                Some(mem)
            }
            None => None,
        };
        stages.push(StageTimes { f, b, w, mem });
    }
    if stages.is_empty() {
        return Err("no stages (expected one line f,b,w[,mem] per stage)".into());
    }
    Ok(stages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_times() {
        assert_eq!(
            parse_times("1,2,1"),
            Ok(Times {
                f: 1.0,
                b: 2.0,
                w: 1.0,
                comm: 0.0
            })
        );
        assert_eq!(parse_times(" 1, 2 ,1,0.5").map(|t| t.comm), Ok(0.5));
        assert!(parse_times("1,2").is_err());
        assert!(parse_times("1,x,1").is_err_and(|e| e.contains("B")));
        assert!(parse_times("1,-1,1").is_err());
        assert!(parse_times("0,0,0").is_err());
        assert!(parse_times("1,1,inf").is_err());
    }

    #[test]
    fn parses_bytes() {
        assert_eq!(parse_bytes("1024"), Ok(1024.0));
        assert_eq!(parse_bytes("2KiB"), Ok(2048.0));
        assert_eq!(parse_bytes("1.5e3"), Ok(1500.0));
        assert_eq!(parse_bytes("3 GB"), Ok(3e9));
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
        // Huge finite values were accepted and printed as "inf PiB"; NaN blamed its unit.
        assert!(parse_bytes("1e308").is_err_and(|e| e.contains("too large")));
        assert!(parse_bytes("2EiB").is_err());
        assert_eq!(parse_bytes("1024TiB"), Ok(1024.0f64.powi(5)));
        // E is an exponent before a digit or a sign, a unit otherwise.
        assert_eq!(parse_bytes("1EiB"), Ok(1024.0f64.powi(6)));
        assert_eq!(parse_bytes("1E"), Ok(1e18));
        assert!(parse_bytes("1e").is_err_and(|e| e.contains("exponent without digits")));
        assert_eq!(parse_memory_limit("1E"), Ok(MemoryLimit::Bytes(1e18)));
        assert!(parse_memory_limit("1e").is_err());
        assert_eq!(parse_bytes("1e+3"), Ok(1e3));
        assert_eq!(parse_bytes("1.5e3KiB"), Ok(1.5e3 * 1024.0));
        assert_eq!(parse_bytes("2PB"), Ok(2e15));
        assert_eq!(parse_bytes("3Pi"), Ok(3.0 * 1024.0f64.powi(5)));
        for text in ["nan", "inf"] {
            assert!(parse_bytes(text).is_err_and(|e| e.contains("not a number of bytes")));
        }
        assert!(parse_bytes("1e308 TiB").is_err_and(|e| e.contains("too large")));
        // Kubernetes quantities, as a chart's values give them.
        assert_eq!(parse_bytes("80Gi"), Ok(80.0 * 1024.0f64.powi(3)));
        assert_eq!(parse_bytes("512Mi"), Ok(512.0 * 1024.0 * 1024.0));
        assert_eq!(parse_bytes("8G"), Ok(8e9));
        assert!(parse_bytes("8Gx").is_err_and(|e| e.contains("Gi")));
        // Kubernetes' m is milli: refused with the spellings that mean mega.
        assert!(parse_bytes("512m").is_err_and(|e| e.contains("milli") && e.contains("512Mi")));
        assert!(parse_bytes("512 m").is_err_and(|e| e.contains("write 512M,")));
        assert_eq!(parse_bytes("512M"), Ok(512e6));
        assert_eq!(parse_bytes("512mb"), Ok(512e6));
    }

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

    #[test]
    fn parses_stage_times() {
        let text = "# stage times\n1,2,1\n\n 0.5, 1, 0.5, 0.25 # last\n";
        let stages = parse_stage_times(text).expect("parses");
        assert_eq!(stages.len(), 2);
        assert_eq!(stages[1].mem, Some(0.25));
        assert!(parse_stage_times("1,2\n").is_err_and(|e| e.contains("line 1")));
        assert!(parse_stage_times("1,2,1\n1,x,1\n").is_err_and(|e| e.contains("line 2")));
        assert!(parse_stage_times("# nothing\n").is_err());
        // Memory below the planners' tolerance is refused, zero is none.
        assert!(parse_stage_times("1,1,1,1e-7\n").is_err_and(|e| e.contains("below 1e-6")));
        assert!(parse_stage_times("1,1,1,0\n1,1,1,1e-6\n").is_ok());
        let bom = parse_stage_times("\u{feff}1,2,1\n").expect("a byte-order mark is skipped");
        assert_eq!(bom.len(), 1);
    }

    #[test]
    fn clap_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
