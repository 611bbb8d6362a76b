//! `schedule = "auto"` on the harness with checkpoints on: after its first steps it chooses
//! again on the fitted costs and measures the plans it cannot tell apart, moving the job
//! between them at steps the logical pass times fix; training stays exact through every
//! move.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::reference::reference;
use pipewise_harness::{Cluster, spec};

const STEPS: u32 = 48;

/// Two workers run an auto job of 48 steps: after 4 steps auto chooses again on the fitted
/// costs, its trial moves the job to each plan predicted within the band in turn and back
/// to the fastest measured (each time going on from the step every worker stopped after),
/// no step runs twice, and the losses and final parameters equal the single-device
/// reference. The trial's band is the whole range, so that it measures every plan it may
/// choose.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_auto_trial_moves_between_plans_and_training_stays_exact() {
    let (choices, moves) = trial_stays_exact("auto-trial", 1).await;
    let first = "adaptive-zb (1 chunk), 8 microbatches × 1, split emb+7 | 7+head";
    let interleaved =
        "interleaved-1f1b (2 chunks), 8 microbatches × 1, split emb+3 | 4 | 4 | 3+head";
    let zb_h2 = "zb-h2 (1 chunk), 8 microbatches × 1, split emb+7 | 7+head";
    let chose = format!(
        "1: auto chose {first}, predicted 8.1 ms; runner-up {zb_h2}, predicted 8.1 ms (+0.0 %); \
         fastest predicted of 11 plans fitting no memory registered, costs from the start-up \
         profile; after 4 steps, chosen again on costs fitted to them, and the plans predicted \
         within 100 % measured"
    );
    let rechecked = format!(
        "5: auto re-checked: auto chose {first}, predicted 264.0 ms; runner-up {interleaved}, \
         predicted 269.7 ms (+2.2 %); fastest predicted of 11 plans fitting no memory \
         registered, costs fitted to 4 measured steps; measuring interleaved-1f1b, zb-h2 after \
         the running plan ({first}, predicted 8.1 ms measured 256.0 ms a step), 4 steps each"
    );
    assert_eq!(choices, [chose, rechecked]);
    let trials = [
        format!(
            "7: auto trial: {first}, predicted 8.1 ms measured 256.0 ms a step; trying \
             {interleaved}, predicted 269.7 ms; going on after step 6 from the workers' memory"
        ),
        format!(
            "13: auto trial: {interleaved}, predicted 269.7 ms measured 256.0 ms a step; trying \
             {zb_h2}, predicted 272.0 ms; going on after step 12 from the workers' memory"
        ),
        format!(
            "19: auto trial: {zb_h2}, predicted 272.0 ms measured 256.0 ms a step; going on with \
             the fastest measured of adaptive-zb 256.0 ms, interleaved-1f1b 256.0 ms, zb-h2 \
             256.0 ms: adaptive-zb; going on after step 18 from the workers' memory"
        ),
    ];
    assert_eq!(moves, trials);
}

/// The same with 2 data-parallel replicas × 2 workers: one plan for both replicas, each
/// trial move taking every replica with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_auto_trial_moves_every_replica_and_training_stays_exact() {
    let (choices, moves) = trial_stays_exact("auto-trial-replicas", 2).await;
    let first = "interleaved-1f1b (2 chunks), 2 replicas of 4 microbatches × 1, split emb+3 | 4 | 4 | 3+head";
    let adaptive_v =
        "adaptive-v (2 chunks), 2 replicas of 4 microbatches × 1, split emb+3 | 4 | 4 | 3+head";
    let v_zb = "v-zb (2 chunks), 2 replicas of 4 microbatches × 1, split emb+3 | 4 | 4 | 3+head";
    let v_half =
        "v-half (2 chunks), 2 replicas of 4 microbatches × 1, split emb+3 | 4 | 4 | 3+head";
    let chose = format!(
        "1: auto chose {first}, predicted 5.3 ms; runner-up {v_half}, predicted 5.7 ms (+8.3 %); \
         fastest predicted of 11 plans fitting no memory registered, costs from the start-up \
         profile; after 4 steps, chosen again on costs fitted to them, and the plans predicted \
         within 100 % measured"
    );
    let rechecked = format!(
        "5: auto re-checked: auto chose {adaptive_v}, predicted 132.9 ms; runner-up {v_zb}, \
         predicted 136.8 ms (+2.9 %); fastest predicted of 11 plans fitting no memory registered, \
         costs fitted to 4 measured steps; measuring adaptive-v, v-zb after the running plan \
         ({first}, predicted 5.3 ms measured 128.0 ms a step), 4 steps each"
    );
    assert_eq!(choices, [chose, rechecked]);
    let trials = [
        format!(
            "7: auto trial: {first}, predicted 5.3 ms measured 128.0 ms a step; trying \
             {adaptive_v}, predicted 132.9 ms; going on after step 6 from the workers' memory"
        ),
        format!(
            "13: auto trial: {adaptive_v}, predicted 132.9 ms measured 128.0 ms a step; trying \
             {v_zb}, predicted 136.8 ms; going on after step 12 from the workers' memory"
        ),
        format!(
            "19: auto trial: {v_zb}, predicted 136.8 ms measured 128.0 ms a step; going on with the \
             fastest measured of interleaved-1f1b 128.0 ms, adaptive-v 128.0 ms, v-zb 128.0 \
             ms: interleaved-1f1b; going on after step 18 from the workers' memory"
        ),
    ];
    assert_eq!(moves, trials);
}

/// An auto job of 48 steps on `replicas` replicas of 2 workers, with checkpoints saved
/// only when a move stops its workers: asserts every step ran once and exactly; returns
/// what auto chose and the re-plans, each as "step: text".
async fn trial_stays_exact(name: &str, replicas: u32) -> (Vec<String>, Vec<String>) {
    let mut spec = spec(2, "auto", STEPS);
    spec.job.name = name.into();
    spec.parallelism.data_parallel_replicate_degree = replicas;
    spec.parallelism.auto_trial_band = 1.0;
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1000;
    let (ref_losses, ref_params) = reference(&spec);
    let mut cluster = Cluster::builder(name)
        .workers(2 * replicas as usize)
        .start()
        .await;
    let job = cluster.submit(spec).await;
    let ended = cluster.ended(job).await;
    cluster.assert_params(job, &ref_params, 1e-5);
    let choices = cluster
        .events(job)
        .into_iter()
        .filter(|e| !e.plan_choice.is_empty())
        .map(|e| format!("{}: {}", e.step, e.plan_choice))
        .collect();
    cluster.shutdown().await;
    ended.assert_exact(&(1..=u64::from(STEPS)).collect::<Vec<_>>(), &ref_losses);
    let moves = ended
        .replans
        .iter()
        .map(|(step, why)| format!("{step}: {why}"))
        .collect();
    (choices, moves)
}
