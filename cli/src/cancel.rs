//! `pipewise cancel JOB`: asks a coordinator to stop a job at its next step boundary.

use anyhow::Result;
use pipewise_proto::v1 as pb;

use crate::connection::{JobArgs, client, status_error};
use crate::progress::print_status;
use crate::runtime::runtime;

/// `pipewise cancel JOB`.
pub(crate) fn run(args: &JobArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        let status = c
            .cancel_job(pb::JobId { id: args.job })
            .await
            .map_err(status_error)?
            .into_inner();
        print_status(&status);
        if status.state == pb::JobState::Running as i32 {
            outln!(
                "cancelling: its workers stop after the current step (`pipewise status {}` \
                 says when it is cancelled)",
                status.id
            );
        }
        Ok(())
    })
}
