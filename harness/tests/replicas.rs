//! Data-parallel replicas on the harness: `data_parallel_replicate_degree = R` runs R
//! copies of the pipeline, each on its own d workers and its share of every step's
//! microbatches, their stages' gradients summed over gRPC in replica order.
//!
//! Against what: the single-device trainer sums a step's microbatch gradients one after
//! another; replicas sum their own shares, then the shares. Gradients accumulate in f64,
//! where adding a step's f32 microbatch gradients is exact in practice, so both orders give
//! the same bits: the runs are checked bit for bit against the sequential reference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::reference::{max_param_diff, reference, reordered_floor, summed_by_shares};
use pipewise_harness::{Cluster, spec};

const STEPS: u32 = 20;
/// Sequences per step: 8 microbatches of 1 for each of the 2 replicas.
const GLOBAL_BATCH: u32 = 16;
const REPLICAS: u32 = 2;

/// R = 2 × d = 2 (4 workers) and R = 2 × d = 4 (8 workers), for 1f1b, zb-h1, v-half and
/// interleaved-1f1b: every step once, no re-plan, the losses the single device's and the
/// final parameters bit for bit those of the sequential single-device reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_match_the_single_device_reference() {
    let mut one = spec(1, "1f1b", STEPS);
    one.training.global_batch_size = GLOBAL_BATCH;
    let (ref_losses, ref_params) = reference(&one);
    // The single device summing share by share, or its microbatches' halves swapped: the
    // same bits as the sequential sum.
    let (_, share_params) = summed_by_shares(&one, REPLICAS as usize);
    let (_, swapped) = reordered_floor(&one);
    assert_eq!(
        (max_param_diff(&share_params, &ref_params), swapped),
        (0.0, 0.0)
    );
    let mut cluster = Cluster::builder("replicas").workers(8).start().await;
    let every: Vec<u64> = (1..=u64::from(STEPS)).collect();
    for d in [2, 4] {
        for schedule in ["1f1b", "zb-h1", "v-half", "interleaved-1f1b"] {
            let mut spec = spec(d, schedule, STEPS);
            spec.job.name = format!("{schedule}-2x{d}");
            spec.training.global_batch_size = GLOBAL_BATCH;
            spec.parallelism.data_parallel_replicate_degree = REPLICAS;
            let job = cluster.submit(spec).await;
            let ended = cluster.ended(job).await;
            ended.assert_exact(&every, &ref_losses);
            assert!(
                ended.replans.is_empty(),
                "{schedule} 2×{d}: {:?}",
                ended.replans
            );
            let diff = max_param_diff(&ref_params, &cluster.final_params(job));
            assert_eq!(diff, 0.0, "{schedule} 2×{d}: not bit-identical");
        }
    }
    cluster.shutdown().await;
}
