//! `pipewise status [JOB]`: one job's status line, or every job's.

use anyhow::Result;
use clap::Args;
use pipewise_proto::v1 as pb;

use crate::connection::{Endpoint, client, status_error};
use crate::progress::print_status;
use crate::runtime::runtime;

/// `pipewise status` arguments.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Job id (without one, every job is listed).
    pub(crate) job: Option<u64>,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
}

/// `pipewise status [JOB]`.
pub(crate) fn run(args: &StatusArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        match args.job {
            Some(id) => print_status(
                &c.get_job(pb::JobId { id })
                    .await
                    .map_err(status_error)?
                    .into_inner(),
            ),
            None => {
                let list = c
                    .list_jobs(pb::Empty {})
                    .await
                    .map_err(status_error)?
                    .into_inner();
                if list.jobs.is_empty() {
                    outln!("no jobs");
                }
                for s in &list.jobs {
                    print_status(s);
                }
            }
        }
        Ok(())
    })
}
