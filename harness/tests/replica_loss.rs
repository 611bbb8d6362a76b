//! Losing a data-parallel replica on the harness is not a restart: a worker of an R = 2,
//! d = 2 job killed mid-run takes its replica out of the job, and the other replica goes on
//! from the parameters and optimizer state it holds in memory, with the whole global batch,
//! from the step where it stopped. No checkpoint exists to load (checkpoints are off). The
//! worker started again rebuilds the replica: it and its replica's survivor copy their
//! stages' state from the kept replica's workers, peer to peer, and the last steps run on
//! both replicas. Against the single-device reference, bit for bit: gradients accumulate
//! in f64, so the shares the replicas sum give the sequential sum's bits (see
//! `replicas.rs`); a rebuilt replica that had not copied the kept one's state would break
//! that.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::reference::{max_param_diff, reference};
use pipewise_harness::{Cluster, spec};

const STEPS: u32 = 16;
const GLOBAL_BATCH: u32 = 16;
const ALL: [&str; 4] = ["w0", "w1", "w2", "w3"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_worker_takes_its_replica_out_and_a_restarted_one_rebuilds_it() {
    let went = "worker 3 (w3) closed its connection; replica 1 left the job: 1 replica of 2 \
                workers goes on after step 5 from memory (no checkpoint loaded)";
    replica_lost_and_rebuilt("1f1b", 3, went).await;
}

/// The same with `schedule = "auto"`: the rebuild keeps the plan auto chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_auto_job_loses_and_rebuilds_a_replica_the_same_way() {
    let went = "worker 3 (w3) closed its connection; replica 1 left the job: 1 replica of 2 \
                workers goes on after step 5 from memory (no checkpoint loaded)";
    replica_lost_and_rebuilt("auto", 3, went).await;
}

/// The same when the worker killed is replica 0's rank 1, where rank 1's chain of gradient
/// sums starts: replica 1 goes on as replica 0 and rebuilds the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn losing_a_worker_that_sums_a_ranks_gradients_is_the_same() {
    let went = "worker 1 (w1) closed its connection; replica 0 left the job: 1 replica of 2 \
                workers goes on after step 5 from memory (no checkpoint loaded)";
    replica_lost_and_rebuilt("1f1b", 1, went).await;
}

/// The rebuild seen by the supervisor's first look after the restarted worker registered,
/// while the kept replica waits before step 10: its stop reaches the workers with step
/// 10's answers, and they stop after step 11.
const REBUILT: &str = "workers joined (4 live); rebuilding from 1 to 2 replicas of 2 workers, \
                       the new ones copying their state from replica 0; going on after step \
                       11 (no checkpoint loaded)";

/// Worker `w{lost}` (replica `lost / 2`'s rank `lost % 2`) is killed while every worker
/// waits before step 6 (1-based), and started again while the kept replica waits before
/// step 10: every step runs once, the loss is seen from the killed worker's stream closing
/// (the coordinator's clock has not moved: no heartbeat was missed) and its re-plan
/// (`went`) and the rebuild are the only ones, and the final parameters are the single
/// device's, bit for bit.
async fn replica_lost_and_rebuilt(schedule: &str, lost: usize, went: &str) {
    let name = format!("replica-loss-{schedule}-{lost}");
    let kept = 2 * (1 - lost / 2);
    let mut spec = spec(2, schedule, STEPS);
    spec.job.name = name.clone();
    spec.training.global_batch_size = GLOBAL_BATCH;
    spec.parallelism.data_parallel_replicate_degree = 2;
    spec.checkpoint.enable_checkpoint = false;
    let (ref_losses, ref_params) = reference(&spec);
    let mut cluster = Cluster::builder(&name).workers(4).start().await;
    cluster.hold_before(5);
    let job = cluster.submit(spec).await;
    cluster.wait_held(&ALL, 5).await;
    cluster.kill(lost).await;
    cluster.hold_before(9);
    let survivors = [format!("w{kept}"), format!("w{}", kept + 1)];
    let survivors: Vec<&str> = survivors.iter().map(String::as_str).collect();
    cluster.wait_held(&survivors, 9).await;
    cluster.restart(lost).await;
    // The supervisor looks for workers to rebuild onto once a logical second passed.
    cluster.advance(1_000).await;
    cluster.release();
    let ended = cluster.ended(job).await;
    let diff = max_param_diff(&ref_params, &cluster.final_params(job));
    // The last run's first replica saves the final parameters: one file per rank.
    let finals = cluster.final_files(job);
    cluster.shutdown().await;
    assert_eq!(finals, 2, "{name}");
    ended.assert_exact(&(1..=u64::from(STEPS)).collect::<Vec<_>>(), &ref_losses);
    assert_eq!(diff, 0.0, "{name}: not bit-identical to the reference");
    let replans = [(6, went.to_string()), (12, REBUILT.to_string())];
    assert_eq!(ended.replans, replans, "{name}");
}
