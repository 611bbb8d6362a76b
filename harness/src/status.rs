//! What a job left, with the cluster still up.

use crate::{Cluster, Ended};

impl Cluster {
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
