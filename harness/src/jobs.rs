//! A cluster's jobs seen as a client sees them: their status, a submission the
//! coordinator refuses, a cancel, and waiting for a state (polled with a deadline).

use std::time::Instant;

use pipewise_common::job::JobSpec;
use pipewise_proto::v1 as pb;

use pipewise_coordinator::membership::HEARTBEAT_INTERVAL;

use crate::{Cluster, LIMIT, POLL};

/// Whether a job in `state` has ended.
fn ended(state: i32) -> bool {
    [
        pb::JobState::Succeeded,
        pb::JobState::Failed,
        pb::JobState::Cancelled,
    ]
    .iter()
    .any(|s| *s as i32 == state)
}

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

    /// Polls `job`'s status until `check` holds; that status. Fails the scenario, saying
    /// `what` it waited for, after [`LIMIT`].
    pub async fn wait_for(
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
                "job {job}: waited in vain for {what}: {status:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// [`Cluster::wait`] for a job that fails: a worker's error fails its job only once the
    /// coordinator's clock has passed the grace in which a silent peer would show, so the
    /// clock moves on a heartbeat at a time ([`Cluster::advance`]: the running workers stay
    /// live) until the job ended.
    pub async fn wait_as_time_passes(&mut self, job: u64) -> pb::JobStatus {
        let deadline = Instant::now() + LIMIT;
        let beat = HEARTBEAT_INTERVAL.as_millis() as u64;
        while !ended(self.status(job).await.state) {
            assert!(Instant::now() < deadline, "job {job} never ended");
            self.advance(beat).await;
        }
        self.wait(job).await
    }

    /// Submits `spec` as `pipewise submit` does (its TOML over gRPC) and expects it refused:
    /// the coordinator's answer.
    pub async fn refused(&self, spec: &JobSpec) -> tonic::Status {
        let request = pb::JobSpec {
            toml: spec.to_toml().expect("the spec as TOML"),
            ..Default::default()
        };
        match self.client.clone().submit_job(request).await {
            Ok(taken) => panic!("the job was taken: {:?}", taken.into_inner()),
            Err(status) => status,
        }
    }

    /// Cancels `job`: the coordinator's answer (still running while its workers finish
    /// the step they are in).
    pub async fn cancel(&self, job: u64) -> pb::JobStatus {
        self.client
            .clone()
            .cancel_job(pb::JobId { id: job })
            .await
            .expect("the job is cancelled")
            .into_inner()
    }
}
