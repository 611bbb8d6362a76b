//! A killed and restarted coordinator process resumes its jobs; training stays exact. A
//! coordinator on a damaged job store does not start.
//! (Killed and restarted workers: `harness/tests/kill_restart.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::processes::*;
use pipewise_common::job::layout;

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

/// A coordinator whose job store was cut short refuses to start with one error naming the
/// file, and nothing of the storage library's assertion before it.
#[test]
fn a_damaged_job_store_is_one_clear_error() {
    let dir = tempdir("cut-store");
    drop(start(&dir, 0)); // kills the coordinator, which leaves an empty store
    let store = dir.join("data").join("jobs.redb");
    let bytes = std::fs::read(&store).unwrap();
    std::fs::write(&store, &bytes[..10_000]).unwrap();
    let out = pipewise()
        .args(["coordinator", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("jobs.redb: the job store is damaged"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
