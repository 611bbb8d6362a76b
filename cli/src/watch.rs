//! `pipewise watch JOB`: follows a job's steps until it ends.

use anyhow::Result;

use crate::connection::{JobArgs, client};
use crate::progress::{follow, succeeded};
use crate::runtime::runtime;

/// `pipewise watch JOB`.
pub(crate) fn run(args: &JobArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        succeeded(&follow(&mut c, args.job).await?)
    })
}
