//! Data-parallel replicas on worker processes: `data_parallel_replicate_degree = R` runs R
//! copies of the pipeline, each on its own d workers and its share of every step's
//! microbatches, their stages' gradients summed over gRPC in replica order.
//!
//! Against what: the single-device trainer sums a step's microbatch gradients one after
//! another; replicas sum their own shares, then the shares. Both are exact math in a
//! different f32 order, and AdamW carries such rounding on (the single-device trainer fed
//! the same microbatches with its halves swapped ends 2e-5 away from itself after 20
//! steps). So the runs are checked bit for bit against the single-device model summing in
//! the replicas' order, and the sequential reference's difference is reported and bounded
//! by that reordering's own.

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
/// single-device model summing in the replicas' order, so the same whatever the schedule
/// and worker count; against the sequential reference within what reordering its own
/// microbatches moves it.
#[test]
fn replicas_on_worker_processes_match_the_single_device_reference() {
    let dir = tempdir("replicas");
    let cluster = start(&dir, 8);
    let mut one = spec(1, "1f1b", STEPS);
    one.training.global_batch_size = GLOBAL_BATCH;
    let (ref_losses, ref_params) = reference(&one);
    let (share_losses, share_params) = summed_by_shares(&one, |_| REPLICAS);
    // One share is the sequential sum: the helper is the trainer's step.
    assert_eq!(
        common::max_param_diff(&summed_by_shares(&one, |_| 1).1, &ref_params),
        0.0
    );
    // The sequential reference's own rounding floor: its microbatches' halves swapped.
    let (_, floor) = reordered_floor(&one);
    let shares_vs_ref = common::max_param_diff(&share_params, &ref_params);
    eprintln!(
        "single device: summed by replica shares vs sequential {shares_vs_ref:.2e}; halves \
         swapped vs sequential {floor:.2e}"
    );
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
            let exact = common::max_param_diff(&share_params, &params);
            let (loss_ref, param_ref) = (
                loss_diff(&losses, &ref_losses),
                common::max_param_diff(&ref_params, &params),
            );
            eprintln!(
                "{schedule:>16} R=2 d={d}: vs the replica-order single device max |Δparam| \
                 {exact:.2e}, |Δloss| {:.2e}; vs the sequential reference |Δparam| \
                 {param_ref:.2e}, |Δloss| {loss_ref:.2e}; {:.1} s",
                loss_diff(&losses, &share_losses),
                started.elapsed().as_secs_f64()
            );
            assert_eq!(exact, 0.0, "{schedule} 2×{d}: not bit-identical");
            // The printed losses have 7 decimals.
            assert!(loss_ref <= TOLERANCE, "{schedule} 2×{d}: Δloss {loss_ref}");
            assert!(
                param_ref <= floor,
                "{schedule} 2×{d}: Δparam {param_ref} > {floor}"
            );
        }
    }
}
