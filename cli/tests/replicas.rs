//! Data-parallel replicas on worker processes: `data_parallel_replicate_degree = R` runs R
//! copies of the pipeline, each on its own d workers and its share of every step's
//! microbatches, their stages' gradients summed over gRPC in replica order.
//!
//! Against what: the single-device trainer sums a step's microbatch gradients one after
//! another; replicas sum their own shares, then the shares. Gradients accumulate in f64,
//! where adding a step's f32 microbatch gradients is exact in practice, so both orders give
//! the same bits: the runs are checked bit for bit against the sequential reference.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Instant;

use common::processes::*;

/// Sequences per step: 8 microbatches of 1 for each of the 2 replicas.
const GLOBAL_BATCH: u32 = 16;
const REPLICAS: usize = 2;

/// The largest difference of two loss lists.
fn loss_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// R = 2 × d = 2 (4 workers) and R = 2 × d = 4 (8 workers), for 1f1b, zb-h1, v-half and
/// interleaved-1f1b: one step line per step; final parameters bit for bit those of the
/// sequential single-device reference, whatever the schedule and worker count.
#[test]
fn replicas_on_worker_processes_match_the_single_device_reference() {
    let dir = tempdir("replicas");
    let cluster = start(&dir, 8);
    let mut one = spec(1, "1f1b", STEPS);
    one.training.global_batch_size = GLOBAL_BATCH;
    let (ref_losses, ref_params) = reference(&one);
    // The single device summing share by share, or its microbatches' halves swapped: the
    // same bits as the sequential sum.
    let (_, share_params) = summed_by_shares(&one, |_| REPLICAS);
    let shares_vs_ref = common::max_param_diff(&share_params, &ref_params);
    let (_, swapped) = reordered_floor(&one);
    eprintln!(
        "single device: summed by replica shares vs sequential |Δparam| {shares_vs_ref:.2e}; \
         halves swapped vs sequential {swapped:.2e}"
    );
    assert_eq!((shares_vs_ref, swapped), (0.0, 0.0));
    for d in [2, 4] {
        for schedule in ["1f1b", "zb-h1", "v-half", "interleaved-1f1b"] {
            let started = Instant::now();
            let mut spec = spec(d, schedule, STEPS);
            spec.job.name = format!("{schedule}-2x{d}");
            spec.training.global_batch_size = GLOBAL_BATCH;
            spec.parallelism.data_parallel_replicate_degree = REPLICAS as u32;
            let (job, losses) = submit_wait(&cluster, &write_spec(&dir, &spec));
            assert_eq!(losses.len(), STEPS as usize, "{schedule} 2×{d}");
            let params = final_params(&cluster, job);
            let (loss_ref, param_ref) = (
                loss_diff(&losses, &ref_losses),
                common::max_param_diff(&ref_params, &params),
            );
            eprintln!(
                "{schedule:>16} R=2 d={d}: vs the sequential reference max |Δparam| \
                 {param_ref:.2e}, |Δloss| {loss_ref:.2e}; {:.1} s",
                started.elapsed().as_secs_f64()
            );
            assert_eq!(param_ref, 0.0, "{schedule} 2×{d}: not bit-identical");
            // The printed losses have 7 decimals.
            assert!(loss_ref <= TOLERANCE, "{schedule} 2×{d}: Δloss {loss_ref}");
        }
    }
}
