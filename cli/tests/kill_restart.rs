//! Killed and restarted processes: a lost worker's job is re-planned onto the survivors, a
//! worker restarted under its id counts as lost, a restarted coordinator resumes its jobs;
//! training stays exact every time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::processes::*;
use pipewise_common::job::layout;

/// A worker process killed mid-job: the coordinator re-plans onto the survivors, which
/// resume from the last complete checkpoint (written by another partition), and training
/// ends exactly where it would have without the loss.
#[test]
fn a_lost_worker_is_replanned_onto_the_survivors() {
    const LONG: u32 = 40;
    let (dir, mut cluster, _, reference, job) =
        running_checkpointed("replan", "v-half", LONG, 3, 5);
    // Worker w2 (the third process after the coordinator) dies without a word.
    cluster.children[3].kill().unwrap();
    let (_, killed_at, _) = status(&cluster, job);
    assert!(
        killed_at + 5 < u64::from(LONG),
        "the job ran too fast to lose a worker mid-way ({killed_at} steps)"
    );
    // The job's whole history: the re-plan, then the steps again from the checkpoint. (A
    // straggler move, on a busy machine, would be a second re-plan; it keeps training
    // exact too.)
    let (stdout, why) = succeeded_replanned_once(&cluster, job, "stopped heartbeating");
    let why = why.as_str();
    // A kill landing while a drift or straggler move waits to start its next run shrinks
    // the waiting job instead (as `drain.rs` saw in CI).
    let onto = "re-planned onto 2 workers (v-half, 4 stages)";
    assert!(
        replanned_without(why, (2, "w2"), "stopped heartbeating", onto),
        "{why}"
    );
    let resume: u64 = why
        .rsplit("checkpoint of step ")
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint step in {why}"));
    // The status read after the kill can lag the workers, whose checkpoint of a step is
    // written before the coordinator has that step's reports: by a checkpoint interval at
    // most. (This assertion, then `resume <= killed_at`, failed once in a full run of the
    // cluster tests and passed in the next runs; its figures were not kept.) A move before
    // the kill (drift or straggler, on a busy machine) checkpoints the step it stops at,
    // which need not be a multiple of the interval: the loss may resume there too.
    let moved_at = |step: u64| {
        why.matches(&format!("checkpoint of step {step}")).count() > 1
            || moved_to(&dir.join("coordinator.log"), step, "stopped heartbeating")
    };
    assert!(
        resume >= 3 && (resume.is_multiple_of(3) || moved_at(resume)) && resume <= killed_at + 3,
        "killed at step {killed_at} (status): {why}"
    );
    // The first step after the re-plan follows the checkpoint.
    let after: Option<u64> = stdout
        .split(why)
        .nth(1)
        .and_then(|rest| rest.lines().find(|l| l.starts_with("step")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok());
    assert_eq!(after, Some(resume + 1), "{stdout}");
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    eprintln!(
        "re-plan: killed at step {killed_at}, resumed from {resume}; max |Δloss| {loss_diff:.2e}, \
         max |Δparam| {param_diff:.2e}"
    );
    // Written by the two survivors only (the abandoned run's directories were cleared).
    assert_eq!(finals(&cluster, job), 2);
    assert_eq!(replans_counted(&cluster, "worker_lost"), 1.0);
}

/// A worker process killed and started again at once under its id and address (a pod
/// restarted in place) registers before its heartbeats are missed: the run holding the
/// dead process sees a lost worker all the same and is re-planned (it hung until the peers'
/// frame timeout, then failed), and training stays exact.
#[test]
fn a_worker_restarted_under_its_id_is_a_lost_one() {
    const LONG: u32 = 60;
    let (dir, mut cluster, _, reference, job) = running_checkpointed("restart", "1f1b", LONG, 3, 3);
    let address = cluster.workers["w2"].clone();
    let w2 = &mut cluster.children[3];
    w2.kill().unwrap();
    w2.wait().unwrap();
    add_worker(&mut cluster, &dir, "w2", &["--listen", &address]);
    let (_, restarted_at, _) = status(&cluster, job);
    assert!(
        restarted_at + 5 < u64::from(LONG),
        "the job ran too fast to restart a worker mid-way ({restarted_at} steps)"
    );
    let (stdout, restarted) = succeeded_replanned_once(&cluster, job, "restarted");
    assert!(
        restarted.contains(&format!(
            "worker 2 (w2) restarted (registered again from {address})"
        )),
        "{restarted}"
    );
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    eprintln!(
        "restart: w2 restarted at step {restarted_at}; max |Δloss| {loss_diff:.2e}, max \
         |Δparam| {param_diff:.2e}"
    );
}

/// A coordinator killed mid-job and started again on its address and store: its workers
/// register again and abandon the old run, the running job resumes from its last complete
/// checkpoint (it was failed, checkpoints or not), the job queued behind it runs next (it
/// was failed too), and training stays exact.
#[test]
fn a_restarted_coordinator_resumes_its_jobs() {
    const LONG: u32 = 60;
    let (dir, mut cluster, _, reference, job) =
        running_checkpointed("coordinator-restart", "1f1b", LONG, 3, 8);
    let mut behind = spec(3, "1f1b", 4);
    behind.job.name = "behind".into();
    let queued = submit(&cluster, &write_spec(&dir, &behind));
    let (_, killed_at, _) = status(&cluster, job);
    let coordinator = &mut cluster.children[0];
    coordinator.kill().unwrap();
    coordinator.wait().unwrap();
    restart_coordinator(&mut cluster, &dir.join("coordinator-again.log"));
    assert!(
        killed_at + 10 < u64::from(LONG),
        "the job ran too fast to restart the coordinator mid-way ({killed_at} steps)"
    );
    let (from, loss_diff, param_diff) =
        assert_resumed_exactly(&cluster, job, &reference, &dir.join("coordinator.log"));
    eprintln!(
        "coordinator restart at step {killed_at}: resumed from {from}; max |Δloss| \
         {loss_diff:.2e}, max |Δparam| {param_diff:.2e}"
    );
    let line = ended(&cluster, queued, Duration::from_secs(60));
    assert!(line.contains("succeeded"), "{line}");
    // keep_latest_k = 2: the two latest complete at the last report, and the last step's
    // (removals run beside the run: give them a moment).
    let output = layout::job_dir(&cluster.data.join("checkpoints"), job);
    let kept = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&output)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("step-"))
            .collect();
        names.sort();
        names
    };
    let started = Instant::now();
    while kept().len() > 3 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // (Step 54 and 57, unless a straggler move saved a step between.)
    let left = kept();
    assert_eq!(left.len(), 3, "{left:?}");
    assert_eq!(left[2], "step-60", "{left:?}");
}
