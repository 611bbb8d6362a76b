//! Workers joining on the harness: a job waits for the workers it needs (and says so), and
//! a job re-planned onto fewer workers grows back when one joins; training stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::reference::reference;
use pipewise_harness::{Cluster, spec};
use pipewise_proto::v1 as pb;

/// A job waiting for more workers than are registered says so in its status, with the
/// count as it changes, and stops saying so once it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_waiting_for_workers_says_so() {
    let mut spec = spec(3, "1f1b", 2);
    spec.job.name = "waiting".into();
    let mut cluster = Cluster::builder("waiting").workers(1).start().await;
    let job = cluster.submit(spec).await;
    let waiting =
        |n: usize| move |s: &pb::JobStatus| s.waiting == format!("workers: {n} of 3 ready");
    let status = cluster.wait_for(job, "1 of 3 ready", waiting(1)).await;
    assert_eq!(
        (status.state, status.step, status.steps),
        (pb::JobState::Running as i32, 0, 2),
        "{status:?}"
    );
    cluster.add_worker().await;
    cluster.wait_for(job, "2 of 3 ready", waiting(2)).await;
    cluster.add_worker().await;
    let ended = cluster.finish(job).await;
    assert_eq!(
        (ended.status.state, ended.status.waiting.as_str()),
        (pb::JobState::Succeeded as i32, ""),
        "{:?}",
        ended.status
    );
}

/// Worker w2 of three, each with its own data directory, dies before step 4 (1-based): the
/// job is re-planned onto w0 and w1 from the seeded model (the coordinator sees no
/// checkpoint). Worker w3 joins while they wait before step 6 of that run: the run stops
/// after a step, the job is planned on three workers again and goes on from the stages the
/// workers hold (no step runs again), and training ends exactly where the single device
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replanned_job_grows_back_when_a_worker_joins() {
    let mut spec = spec(3, "1f1b", 14);
    spec.job.name = "grow".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 10;
    let (ref_losses, ref_params) = reference(&spec);
    let mut cluster = Cluster::builder("grow")
        .workers(3)
        .own_data_dirs()
        .start()
        .await;
    cluster.hold_before(3);
    let job = cluster.submit(spec).await;
    cluster.wait_held(&["w0", "w1", "w2"], 3).await;
    cluster.kill(2).await;
    cluster.expire().await;
    cluster.wait_lost("w2").await;
    cluster.hold_before(5);
    cluster.wait_held(&["w0", "w1"], 5).await;
    assert_eq!(cluster.add_worker().await, 3);
    // The supervisor looks for workers to grow onto once a logical second passed.
    cluster.advance(1_000).await;
    cluster.release();
    let ended = cluster.ended(job).await;
    cluster.assert_params(job, &ref_params, 1e-5);
    // The last run is on three workers, the new one among them.
    assert_eq!(cluster.final_files(job), 3);
    cluster.shutdown().await;
    let lost = "worker 2 (w2) stopped heartbeating; re-planned onto 2 workers (1f1b, 2 \
                stages), resuming from the start (no checkpoint)";
    // Seen while w0 and w1 wait before step 6: the stop reaches them with step 6's answers.
    let grew = "workers joined (3 live); grew from 2 onto 3 workers (1f1b, 3 stages); going on \
                after step 7 from the workers' memory";
    assert_eq!(
        ended.replans,
        [(1, lost.to_string()), (8, grew.to_string())]
    );
    let steps: Vec<u64> = (1..=3).chain(1..=14).collect();
    ended.assert_exact(&steps, &ref_losses);
}
