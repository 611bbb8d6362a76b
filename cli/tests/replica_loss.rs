//! Losing a data-parallel replica is not a restart: a worker of an R = 2, d = 2 job killed
//! mid-run takes its replica out of the job, and the other replica goes on from the
//! parameters and optimizer state it holds in memory, with the whole global batch, from the
//! step where it stopped. No checkpoint exists to load (checkpoints are off). The worker
//! started again rebuilds the replica: it and its replica's survivor copy their stages'
//! state from replica 0's workers, peer to peer, and the last steps run on both replicas.
//! Against the single-device reference, bit for bit: gradients accumulate in f64, so the
//! shares the replicas sum give the sequential sum's bits (see `replicas.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::processes::*;

const GLOBAL_BATCH: u32 = 16;

#[test]
fn a_killed_worker_takes_its_replica_out_and_a_restarted_one_rebuilds_it() {
    replica_lost_and_rebuilt("1f1b", 3);
}

/// The same with `schedule = "auto"`: the rebuild keeps the plan auto chose.
#[test]
fn an_auto_job_loses_and_rebuilds_a_replica_the_same_way() {
    replica_lost_and_rebuilt("auto", 3);
}

/// The same when the worker killed is replica 0's rank 1, which sums rank 1's gradients of
/// both replicas: replica 1 goes on as replica 0 and rebuilds the other.
#[test]
fn losing_a_worker_that_sums_a_ranks_gradients_is_the_same() {
    replica_lost_and_rebuilt("1f1b", 1);
}

/// Worker `w{lost}` (replica `lost / 2`'s rank `lost % 2`) is killed mid-run.
fn replica_lost_and_rebuilt(schedule: &str, lost: usize) {
    const LONG: u32 = 60;
    // One job at a time: the timings asserted below are a lone job's on a small machine.
    let _one = common::one_at_a_time();
    let (replica, kept) = (lost / 2, 2 * (1 - lost / 2));
    let dir = tempdir(&format!("replica-loss-{schedule}-{lost}"));
    let mut cluster = start(&dir, 4);
    let mut spec = spec(2, schedule, LONG);
    spec.job.name = format!("replica-loss-{schedule}-{lost}");
    spec.training.global_batch_size = GLOBAL_BATCH;
    spec.parallelism.data_parallel_replicate_degree = 2;
    spec.checkpoint.enable_checkpoint = false;
    let job = submit(&cluster, &write_spec(&dir, &spec));
    wait_until(&cluster, job, Duration::from_secs(60), |s, step| {
        s == "running" && step >= 5
    });
    // The process after the coordinator's dies without a word.
    cluster.children[1 + lost].kill().unwrap();
    let killed = Instant::now();
    // The survivors log when they take up their stages again for the next step.
    let log = dir.join(format!("w{kept}.log"));
    let went_on = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("going on from the stages held in memory") {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "w{kept} never went on from memory; see {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // It starts again: the job rebuilds its replica, copying the kept replica's state.
    add_worker(&mut cluster, &dir, &format!("w{lost}"), &[]);
    let (stdout, why) = succeeded_replanned_once(&cluster, job, "from memory");
    let rebuilt = replans(&stdout, "rebuilding from 1 to 2 replicas");
    assert_eq!(rebuilt.len(), 1, "{stdout}");
    let back: u64 = rebuilt[0]
        .split("going on after step ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no step in {}", rebuilt[0]));
    assert!(
        rebuilt[0].contains("(no checkpoint loaded)"),
        "{}",
        rebuilt[0]
    );
    let copied = [2 * replica, 2 * replica + 1].map(|w| {
        std::fs::read_to_string(dir.join(format!("w{w}.log")))
            .unwrap_or_default()
            .contains("copied the stages' state from a live replica")
    });
    assert_eq!(copied, [true, true]);
    assert!(
        why.contains(&format!("worker {lost} (w{lost}) "))
            && why.contains(&format!("replica {replica} left the job")),
        "{why}"
    );
    assert!(why.contains("(no checkpoint loaded)"), "{why}");
    let after: u64 = why
        .split("after step ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no step in {why}"));
    // One line per step, every step once.
    let steps: Vec<u64> = stdout
        .lines()
        .filter(|l| l.starts_with("step"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert_eq!(steps, (1..=u64::from(LONG)).collect::<Vec<_>>(), "{stdout}");
    assert!(after < back && back < u64::from(LONG), "{after} {back}");
    let params = final_params(&cluster, job);
    let losses = last_losses(&stdout);
    let (ref_losses, ref_params) = reference(&spec);
    let loss_diff = losses
        .iter()
        .map(|(step, l)| (l - ref_losses[*step as usize - 1]).abs())
        .fold(0.0, f64::max);
    let param_diff = common::max_param_diff(&ref_params, &params);
    eprintln!(
        "replica loss ({schedule}, w{lost}): killed after step {after}, the next step's stages taken up {:.2} s \
         after the kill, rebuilt after step {back}; vs the single-device reference \
         |Δparam| {param_diff:.2e}, |Δloss| {loss_diff:.2e}",
        went_on.as_secs_f64()
    );
    // Two shares a step, then one, then two again: the same bits as one device's sum.
    assert_eq!(param_diff, 0.0, "not bit-identical to the reference");
    assert!(loss_diff <= TOLERANCE, "{loss_diff}");
    // Seen at once: the killed worker's stream closing (the coordinator looks every
    // second), not its heartbeats missed; the bound only guards a hang on a loaded machine.
    assert!(why.contains("closed its connection"), "{why}");
    assert!(went_on < Duration::from_secs(5), "{went_on:?}");
    assert!(after >= 5 && after < u64::from(LONG), "{why}");
    assert_eq!(replans_counted(&cluster, "worker_lost"), 1.0);
    assert_eq!(replans_counted(&cluster, "worker_joined"), 1.0);
    assert_eq!(finals(&cluster, job), 2);
}
