//! Killed and restarted workers on the harness: a lost worker's job is re-planned onto the
//! survivors from the last checkpoint, a worker restarted under its id counts as lost;
//! training stays exact every time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::{Cluster, reference_losses, spec};

const ALL: [&str; 3] = ["w0", "w1", "w2"];

/// Worker w2 dies while every worker waits before step 6 (1-based): once its heartbeats
/// are missed, the job is re-planned onto w0 and w1 from the checkpoint of step 3, runs
/// steps 4 and 5 again and ends exactly as the single device does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_worker_is_replanned_onto_the_survivors() {
    let mut spec = spec(3, "v-half", 10);
    spec.job.name = "lost".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 3;
    let reference = reference_losses(&spec);
    let mut cluster = Cluster::builder("lost").workers(3).start().await;
    cluster.hold_before(5);
    let job = cluster.submit(spec).await;
    cluster.wait_held(&ALL, 5).await;
    cluster.kill(2).await;
    // The loss is decided while the survivors wait: their failures on the dead peer come
    // after it.
    cluster.expire().await;
    cluster.wait_lost("w2").await;
    cluster.release();
    let ended = cluster.finish(job).await;
    ended.assert_exact(&[1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10], &reference);
    let lost = "worker 2 (w2) stopped heartbeating; re-planned onto 2 workers (v-half, 4 \
                stages), resuming from the checkpoint of step 3";
    assert_eq!(ended.replans, [(4, lost.to_string())]);
}

/// Worker w2 killed before step 6 (1-based) and started again at once under its id and
/// address registers before its heartbeats are missed: the run holding the dead process
/// has lost it all the same and is re-planned, and training stays exact. The re-plan waits
/// for the survivors to leave the lost run, and they are held in it until released, after
/// the restarted process opened its stream: that process is a streaming worker of the job
/// by then, and the next run takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_restarted_under_its_id_is_a_lost_one() {
    let mut spec = spec(3, "1f1b", 10);
    spec.job.name = "restart".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 3;
    let reference = reference_losses(&spec);
    let mut cluster = Cluster::builder("restart").workers(3).start().await;
    cluster.hold_before(5);
    let job = cluster.submit(spec).await;
    cluster.wait_held(&ALL, 5).await;
    // A survivor the coordinator has not yet heard running the run would look gone from it
    // already, and the re-plan would not wait for the restarted process's stream.
    cluster.wait_running(&ALL, job).await;
    cluster.kill(2).await;
    cluster.restart(2).await;
    let address = cluster.address(2).unwrap();
    cluster.release();
    let ended = cluster.finish(job).await;
    ended.assert_exact(&[1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10], &reference);
    let restarted = format!(
        "worker 2 (w2) restarted (registered again from {address}); re-planned onto 3 workers \
         (1f1b, 3 stages), resuming from the checkpoint of step 3"
    );
    assert_eq!(ended.replans, [(4, restarted)]);
}
