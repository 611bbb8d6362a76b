//! `schedule = "auto"` with checkpoints on: after its first steps it chooses again on the
//! fitted costs and measures the plans it cannot tell apart, moving the job between them;
//! training stays exact through every move.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::processes::*;

/// Two worker processes run an auto job of 48 steps with checkpoints on: its trial moves
/// the job to at least one other plan (resuming each time from the step every worker
/// stopped after, counted as `auto_trial`), and the losses and final parameters equal the
/// single-device reference. The trial's band is the whole range, so that which plans it
/// measures does not hang on the fitted costs of a loaded machine; the drift rule waits
/// for the trial, so a slow step cannot cut it short.
#[test]
fn an_auto_trial_moves_between_plans_and_training_stays_exact() {
    trial_stays_exact("auto-trial", 1);
}

/// The same with 2 data-parallel replicas × 2 workers: one plan for both replicas, each
/// trial move taking every replica with it.
#[test]
fn an_auto_trial_moves_every_replica_and_training_stays_exact() {
    trial_stays_exact("auto-trial-replicas", 2);
}

/// An auto job of 48 steps on `replicas` replicas of 2 worker processes, run as above.
fn trial_stays_exact(name: &str, replicas: u32) {
    let dir = tempdir(name);
    let cluster = start_with(&dir, 2 * replicas as usize, &[]);
    let mut spec = spec(2, "auto", 48);
    spec.parallelism.data_parallel_replicate_degree = replicas;
    spec.parallelism.auto_trial_band = 1.0;
    let (reference, job, stdout) = run_movable(&cluster, &dir, spec, name);
    assert!(
        stdout.contains("after 4 steps, chosen again on costs fitted to them"),
        "{stdout}"
    );
    if replicas > 1 {
        let chose = stdout
            .lines()
            .find(|l| l.contains("auto chose "))
            .unwrap_or_default();
        assert!(
            chose.contains(&format!("{replicas} replicas of ")),
            "{stdout}"
        );
    }
    let moves = replans(&stdout, "auto trial: ");
    assert!(!moves.is_empty(), "no trial move:\n{stdout}");
    for m in &moves {
        assert!(m.contains("from the workers' memory"), "{m}");
    }
    assert_no_step_repeated(&stdout);
    assert_eq!(replans_counted(&cluster, "auto_trial"), moves.len() as f64);
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    eprintln!(
        "{name}: {}\n  max |Δloss| {loss_diff:.2e}, max |Δparam| {param_diff:.2e}",
        moves.join("\n  ")
    );
}
