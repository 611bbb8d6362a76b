//! A job's status while it runs, and what it left with the cluster still up.

use std::time::Instant;

use pipewise_proto::v1 as pb;

use crate::{Cluster, Ended, LIMIT, POLL};

impl Cluster {
    /// `job`'s status now.
    pub async fn status(&self, job: u64) -> pb::JobStatus {
        self.client
            .clone()
            .get_job(pb::JobId { id: job })
            .await
            .expect("the job's status")
            .into_inner()
    }

    /// Polls `job`'s status until `check` holds (failing after [`LIMIT`], naming `what`);
    /// that status.
    pub async fn wait_status(
        &self,
        job: u64,
        what: &str,
        check: impl Fn(&pb::JobStatus) -> bool,
    ) -> pb::JobStatus {
        let deadline = Instant::now() + LIMIT;
        loop {
            let status = self.status(job).await;
            if check(&status) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "waited in vain for {what}: {status:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for `job` to end, leaving the cluster up (its data directories still hold what
    /// the job saved): what the job left.
    pub async fn ended(&mut self, job: u64) -> Ended {
        let status = self.wait(job).await;
        Ended {
            status,
            replans: self.replans(job),
            losses: self.losses(job),
        }
    }
}
