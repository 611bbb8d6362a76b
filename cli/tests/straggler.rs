//! A straggler: layers move off a worker much slower per pass; training stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::processes::*;

/// A worker six times slower per pass: the coordinator sees it in the step reports,
/// stops every worker after the same step, moves layers off it and goes on after that step
/// from the stages the workers hold, though no two workers share a data directory (the
/// coordinator sees no checkpoint); no step runs twice, and training stays exact. Either rule may move them first: the straggler
/// rule, or the drift rule that generalises it (steps over their prediction once the costs
/// are fitted) when the slow steps outrun the fit; both are counted by their reason.
#[test]
fn layers_move_off_a_straggler() {
    const LONG: u32 = 24;
    let dir = tempdir("straggler");
    let own = |id: &str| own_data_dir(&dir, id);
    let (w0, w1, w2) = (own("w0"), own("w1"), own("w2"));
    let slow = [w2[0].as_str(), &w2[1], "--slowdown", "6"];
    let cluster = start_with(
        &dir,
        3,
        &[(0, &[&w0[0], &w0[1]]), (1, &[&w1[0], &w1[1]]), (2, &slow)],
    );
    let mut spec = spec(3, "1f1b", LONG);
    spec.job.name = "straggler".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 10;
    let reference = reference(&spec);
    let (job, _) = submit_wait(&cluster, &write_spec(&dir, &spec));
    let stdout = history(&cluster, job);
    let moves = replans(&stdout, "pieces per stage");
    assert!(!moves.is_empty(), "{stdout}");
    let first = moves[0];
    let by_straggler = first.contains("worker 2 (w2) took");
    assert!(
        by_straggler || first.contains("took longer than planned; recalibrated"),
        "{first}"
    );
    let (before, after) = moved_pieces(first);
    assert!(
        after[2] < before[2],
        "the straggler keeps its layers: {first}"
    );
    assert!(first.contains("from the workers' memory"), "{first}");
    assert_no_step_repeated(&stdout);
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    // Step times of the reports' first and second halves (not asserted: a shared machine).
    let ms: Vec<f64> = stdout
        .lines()
        .filter(|l| l.starts_with("step"))
        .map(|l| l.split_whitespace().nth(4).unwrap().parse().unwrap())
        .collect();
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let cut = ms.len() / 2;
    eprintln!(
        "straggler: {first}\n  max |Δloss| {loss_diff:.2e}, max |Δparam| {param_diff:.2e}; \
         mean step {:.1} ms (first half of the reports) vs {:.1} ms (second half)",
        mean(&ms[..cut]),
        mean(&ms[cut..])
    );
    let reason = if by_straggler {
        "straggler"
    } else {
        "calibration"
    };
    assert!(replans_counted(&cluster, reason) >= 1.0);
}
