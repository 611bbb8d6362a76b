//! A straggler on the harness: layers move off a worker six times slower per pass, at a
//! step and onto a split that the logical pass times fix; training stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::{Cluster, reference_losses, spec};

/// Worker 2 reports every pass six times as long: the straggler rule moves layers off it
/// after the same step every time (from the workers' memory: no data directory is shared,
/// so the coordinator sees no checkpoint); no step runs twice and the losses are the single
/// device's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layers_move_off_a_straggler() {
    let mut spec = spec(3, "1f1b", 12);
    spec.job.name = "straggler".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 10;
    let reference = reference_losses(&spec);
    let mut cluster = Cluster::builder("straggler")
        .workers(3)
        .own_data_dirs()
        .slow(2, 6.0, 0)
        .start()
        .await;
    let job = cluster.submit(spec).await;
    let ended = cluster.finish(job).await;
    // Steps 2 to 4 show it (the first step of a run is not counted); the stop asked after
    // step 4 reaches the workers with step 5's answers, so they stop after step 6.
    let moved = "worker 2 (w2) took 5.4× the median's time per unit of work over 3 steps; \
                 moved layers: pieces per stage [6, 5, 5] → [7, 8, 1] (predicted 73% less \
                 time on the busiest worker); going on after step 6 from the workers' memory";
    ended.assert_exact(&(1..=12).collect::<Vec<u64>>(), &reference);
    assert_eq!(ended.replans, [(7, moved.to_string())]);
}
