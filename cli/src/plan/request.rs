//! The checked request `pipewise plan` runs (ripgrep's "high-level" arguments): where the
//! schedule comes from, with every combination of flags checked and `--stage-times` read.
//! Everything a user can get wrong is caught here, with a message naming the option.

use std::path::PathBuf;

use anyhow::{Result, bail};
use pipewise_common::auto::RecomputeSearch;
use pipewise_common::generate::MAX_STAGE_MICROBATCHES;
use pipewise_common::schedule::{Recompute, recomputing_schedule};
use pipewise_common::{ScheduleKind, Times};

use super::args::{Format, MemoryLimit, PlanArgs, RecomputeArg};
use super::stage_times::{StageTimes, read_stage_times};
use crate::schedule_name::parse_schedule;

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
        args: Box<super::auto::AutoArgs>,
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
    /// Every stage's recomputation (`--recompute`, or the schedule's name).
    pub(crate) recompute: Recompute,
    /// The name the schedule was asked by when it says its recomputation (`1f1b-r`).
    pub(crate) recomputing_name: Option<String>,
    /// `--auto`'s recomputation (`--recompute`, none by default).
    pub(crate) auto_recompute: RecomputeSearch,
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
        let (recompute, recomputing_name) = self.recompute(&source)?;
        let auto_recompute = match self.recompute {
            Some(RecomputeArg::Every(mode)) => RecomputeSearch::Every(mode),
            Some(RecomputeArg::WhereNeeded) => RecomputeSearch::WhereNeeded,
            None => RecomputeSearch::default(),
        };
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
            recompute,
            recomputing_name,
            auto_recompute,
        })
    }

    /// The recomputation of every stage: `--recompute`, or what the schedule's name says
    /// (`1f1b-r`), which `--recompute` may repeat but not contradict.
    fn recompute(&self, source: &Source) -> Result<(Recompute, Option<String>)> {
        let named = self.schedule.as_deref().and_then(|n| {
            recomputing_schedule(n).map(|(_, mode)| (n.trim().to_ascii_lowercase(), mode))
        });
        let asked = match self.recompute {
            // `--auto` weighs its own; the schedules it plans are not named here.
            _ if matches!(source, Source::Auto { .. }) => return Ok((Recompute::None, None)),
            Some(RecomputeArg::WhereNeeded) => {
                bail!("--recompute auto applies to --auto; name a mode for one schedule")
            }
            Some(RecomputeArg::Every(mode)) => Some(mode),
            None => None,
        };
        Ok(match (named, asked) {
            (Some((name, mode)), Some(asked)) if asked != mode => bail!(
                "--recompute {asked} contradicts --schedule {name}, which recomputes {mode}; \
                 drop --recompute or name the schedule without it"
            ),
            (Some((name, mode)), _) => (mode, Some(name)),
            (None, asked) => (asked.unwrap_or_default(), None),
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
        let kind = match recomputing_schedule(name) {
            Some((kind, _)) => kind,
            None => parse_schedule("--schedule", name, "; or 1f1b-r, or csv:PATH to import one")?,
        };
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
