//! `pipewise submit`: sends a job file (TOML), with any overrides, to a coordinator.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;
use pipewise_proto::v1 as pb;

use crate::connection::{Endpoint, client, status_error};
use crate::progress::{follow, print_status, succeeded};
use crate::runtime::runtime;
use crate::schedule_name::check_job_schedule;
use crate::text_file::read_text;

/// `pipewise submit` arguments.
#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// The job file (TOML).
    pub(crate) file: PathBuf,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
    /// Override the schedule.
    #[arg(long)]
    pub(crate) schedule: Option<String>,
    /// Override the worker count.
    #[arg(long)]
    pub(crate) workers: Option<u32>,
    /// Override the step count.
    #[arg(long)]
    pub(crate) steps: Option<u64>,
    /// Override the microbatch count.
    #[arg(long)]
    pub(crate) microbatches: Option<u32>,
    /// Follow the job until it ends (like `watch`); exit status 1 unless it succeeds.
    #[arg(long)]
    pub(crate) wait: bool,
}

/// `pipewise submit`.
pub(crate) fn run(args: &SubmitArgs) -> Result<()> {
    if let Some(name) = &args.schedule {
        // A misspelt override is named (with the closest name) before the file is read.
        check_job_schedule("--schedule", name)?;
    }
    // The coordinator takes requests of up to 4 MiB (tonic's default), the file and the
    // overrides together.
    let toml = read_text(&args.file, (4 << 20) - (64 << 10))?;
    let request = pb::JobSpec {
        toml,
        schedule: args.schedule.clone(),
        workers: args.workers,
        steps: args.steps,
        microbatches: args.microbatches,
        ..Default::default()
    };
    // The file is read here as the coordinator will read it, so a malformed one is named
    // before any connection (the coordinator still validates and plans it).
    pipewise_coordinator::service::spec_of(&request).map_err(|e| match e {
        // An override that does not apply is the flag's fault, not the file's.
        pipewise_coordinator::error::CoordinatorError::BadRequest {
            field: field @ ("steps" | "microbatches"),
            reason,
        } => anyhow::anyhow!("--{field}: {reason}"),
        other => anyhow::Error::new(other)
            .context(format!("{} is not a valid job spec", args.file.display())),
    })?;
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        let status = c
            .submit_job(request)
            .await
            .map_err(status_error)
            .context("the coordinator refused the job")?
            .into_inner();
        print_status(&status);
        if args.wait {
            succeeded(&follow(&mut c, status.id).await?)?;
        }
        Ok(())
    })
}
