//! `pipewise trace`: writes a recent step's executed timeline next to its plan (a Chrome /
//! Perfetto trace and an SVG); `pipewise local --trace-dir` writes them the same way.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Args;
use pipewise_proto::v1 as pb;

use crate::connection::{Endpoint, client};
use crate::runtime::runtime;

/// `pipewise trace` arguments.
#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    /// The job id.
    pub(crate) job: u64,
    /// The step (1-based; default: the latest kept).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) step: Option<u64>,
    /// Where to write step-K.trace.json and step-K.svg.
    #[arg(long, default_value = ".")]
    pub(crate) out: PathBuf,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
}

/// Runs `pipewise trace`.
pub(crate) fn run(args: &TraceArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        let svg = write_trace(&mut c, args.job, args.step.unwrap_or(0), &args.out).await?;
        outln!(
            "wrote {} and {}",
            svg.with_extension("trace.json").display(),
            svg.display()
        );
        Ok(())
    })
}

/// Fetches one step's trace (`0`: the latest) and writes `step-K.trace.json` and
/// `step-K.svg` into `dir`; returns the SVG's path.
pub(crate) async fn write_trace(
    client: &mut crate::connection::JobClient,
    job: u64,
    step: u64,
    dir: &Path,
) -> Result<PathBuf> {
    let t = client
        .get_step_trace(pb::StepTraceRequest { job, step })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))
        .with_context(|| match step {
            0 => format!("no trace of job {job}'s latest step"),
            _ => format!("no trace of job {job} step {step}"),
        })?
        .into_inner();
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let json = dir.join(format!("step-{}.trace.json", t.step));
    std::fs::write(&json, &t.chrome_trace_json)
        .with_context(|| format!("cannot write {}", json.display()))?;
    let svg = dir.join(format!("step-{}.svg", t.step));
    std::fs::write(&svg, &t.svg).with_context(|| format!("cannot write {}", svg.display()))?;
    Ok(svg)
}
