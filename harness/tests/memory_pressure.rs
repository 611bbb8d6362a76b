//! Memory pressure on the harness: a job predicted, or measured, to overflow a worker's
//! memory moves to a schedule that fits, at a step the job alone fixes; training stays
//! exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_common::job::JobSpec;
use pipewise_harness::reference::reference;
use pipewise_harness::{Cluster, spec};

const STEPS: u32 = 8;

/// A 2-worker GPipe job with checkpoints, and worker 0's bytes: its parameters, gradients
/// and AdamW moments (f32) and the activations GPipe and 1F1B are predicted to hold there.
fn pressure_job(name: &str) -> (JobSpec, u64, u64, u64) {
    let mut spec = spec(2, "gpipe", STEPS);
    spec.job.name = name.into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1000;
    let plan = spec.validate().unwrap();
    let ranges = spec.stage_ranges(&plan.schedule.placement).unwrap();
    let fixed = plan.predicted_state_bytes_over(&spec, &ranges).unwrap()[0];
    let gpipe = plan.predicted_peak_bytes(&spec).unwrap()[0];
    let mut one = spec.clone();
    one.parallelism.pipeline_parallel_schedule = "1f1b".into();
    let one_f_one_b = one.validate().unwrap().predicted_peak_bytes(&one).unwrap()[0];
    assert!(one_f_one_b < gpipe);
    (spec, fixed, gpipe, one_f_one_b)
}

/// Worker 0 registers less memory than GPipe is predicted to need there (GPipe holds every
/// microbatch's activations): the coordinator moves the job to the fastest schedule
/// predicted to fit before its first step, every step runs once within the budget on
/// worker 0, and training stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_pressure_moves_the_job_to_a_schedule_that_fits() {
    let (spec, fixed, gpipe, one_f_one_b) = pressure_job("pressure");
    let budget = fixed + (gpipe + one_f_one_b) / 2;
    let (ref_losses, ref_params) = reference(&spec);
    let mut cluster = Cluster::builder("pressure")
        .memory(0, budget, 0)
        .start()
        .await;
    let job = cluster.submit(spec.clone()).await;
    let ended = cluster.ended(job).await;
    cluster.assert_params(job, &ref_params, 1e-5);
    let peaks = worker_0_peaks(&cluster, job);
    cluster.shutdown().await;
    ended.assert_exact(&(1..=u64::from(STEPS)).collect::<Vec<_>>(), &ref_losses);
    // At d = 2 V-Min's and V-Half's classes are both 2 units and the named V schedules are
    // the best of their class, so they tie and the first in order is taken.
    let moved = "worker 0 (w0) is predicted to hold 3.63 MiB of its 2.96 MiB (gpipe planned); \
                 moved to v-min, predicted 2.51 MiB there; before step 1";
    assert_eq!(ended.replans, [(1, moved.to_string())]);
    // Worker 0's parameters, gradients and AdamW moments on V-Min: stages 0 and 3.
    let mut v_min = spec.clone();
    v_min.parallelism.pipeline_parallel_schedule = "v-min".into();
    let plan = v_min.validate().unwrap();
    let ranges = v_min.stage_ranges(&plan.schedule.placement).unwrap();
    let fixed_after = plan.predicted_state_bytes_over(&v_min, &ranges).unwrap()[0];
    assert!(fixed_after > 0);
    assert_eq!(peaks.len(), STEPS as usize);
    for (step, peak) in peaks {
        assert!(
            peak + fixed_after <= budget,
            "step {step}: {peak} + {fixed_after} > {budget}"
        );
    }
}

/// An overflow no plan predicted (worker 0 reports 4 KiB more than its stages hold, with a
/// budget of exactly GPipe's prediction): seen after step 1, every worker stops after step
/// 3, the job goes on from the workers' memory on a schedule that fits, no step
/// runs twice and training stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_measured_overflow_stops_the_run_and_moves_it() {
    let (spec, fixed, gpipe, _) = pressure_job("pressure-measured");
    let budget = fixed + gpipe;
    let (ref_losses, ref_params) = reference(&spec);
    let mut cluster = Cluster::builder("pressure-measured")
        .memory(0, budget, 4096)
        .start()
        .await;
    let job = cluster.submit(spec).await;
    let ended = cluster.ended(job).await;
    cluster.assert_params(job, &ref_params, 1e-5);
    cluster.shutdown().await;
    ended.assert_exact(&(1..=u64::from(STEPS)).collect::<Vec<_>>(), &ref_losses);
    // Seen on step 1's reports: the stop reaches worker 0 with step 2's answer, and every
    // worker stops after step 3.
    let moved = "worker 0 (w0) held 3.63 MiB of its 3.63 MiB (gpipe planned); moved to v-min, \
                 predicted 2.51 MiB there; going on after step 3 from the workers' memory";
    assert_eq!(ended.replans, [(4, moved.to_string())]);
}

/// Worker 0's peak activation bytes of every step of `job`, by step.
fn worker_0_peaks(cluster: &Cluster, job: u64) -> Vec<(u64, u64)> {
    cluster
        .events(job)
        .iter()
        .map(|e| {
            let peak = e.peaks.iter().find(|p| p.worker == 0);
            (e.step, peak.expect("worker 0's peak").peak_activation_bytes)
        })
        .collect()
}
