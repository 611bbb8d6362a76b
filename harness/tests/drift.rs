//! A drift on the harness: a worker slowed from a step in the middle of the run makes the
//! steps run over their prediction; the cost model is recalibrated, layers move off that
//! worker, and training stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::{Cluster, reference_losses, spec};

/// Worker w1 of three, each with its own data directory, reports its passes 3× slower from
/// step 7 (1-based) on: steps 7 to 9 take longer than predicted, the drift rule
/// recalibrates the costs from them and moves layers off w1, going on after step 11 from
/// the stages the workers hold; no step runs twice, and the losses are the single device's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_slowed_mid_run_has_its_layers_moved_by_the_recalibrated_costs() {
    let mut spec = spec(3, "1f1b", 16);
    spec.job.name = "drift".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 10;
    spec.checkpoint.keep_latest_k = 2;
    let reference = reference_losses(&spec);
    let mut cluster = Cluster::builder("drift")
        .workers(3)
        .own_data_dirs()
        .slow(1, 3.0, 6)
        .start()
        .await;
    let job = cluster.submit(spec).await;
    let ended = cluster.finish(job).await;
    let drifted = "steps 7 (114% over), 8 (91% over), 9 (67% over) took longer than planned; \
                   recalibrated, the new plan is predicted 80% faster: pieces per stage \
                   [6, 5, 5] → [7, 2, 7]; going on after step 11 from the workers' memory";
    ended.assert_exact(&(1..=16).collect::<Vec<u64>>(), &reference);
    assert_eq!(ended.replans, [(12, drifted.to_string())]);
}
