//! Workers joining: a job waits for the workers it needs (and says so), and a job re-planned
//! onto fewer workers grows back when one joins; training stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::processes::*;

/// A job waiting for more workers than are registered says so in its status (not a bare
/// "running step 0/N"), with the count as it changes, and stops saying so once it runs.
#[test]
fn a_job_waiting_for_workers_says_so() {
    use pipewise_common::job::Compute;

    let dir = tempdir("waiting");
    let mut cluster = start(&dir, 1);
    let mut spec = spec(3, "1f1b", 2);
    spec.compute = Compute::emulate(1.0, 1.0, 1.0);
    let job = submit(&cluster, &write_spec(&dir, &spec));
    // The status line once it contains `needle`.
    let until = |cluster: &Cluster, needle: &str| {
        let started = Instant::now();
        loop {
            let line = status(cluster, job).2;
            if line.contains(needle) {
                return line;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{line}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let line = until(&cluster, "waiting for workers: 1 of 3 ready");
    assert!(
        line.contains("running") && line.contains("step 0/2"),
        "{line}"
    );
    add_worker(&mut cluster, &dir, "w1", &[]);
    until(&cluster, "waiting for workers: 2 of 3 ready");
    add_worker(&mut cluster, &dir, "w2", &[]);
    let line = ended(&cluster, job, Duration::from_secs(60));
    assert!(
        line.contains("succeeded") && !line.contains("waiting"),
        "{line}"
    );
}

/// A job re-planned onto the survivors grows back to its degree when a worker joins: the
/// run stops after a step, the job is planned on the larger set again and goes on after
/// that step from the stages the workers hold (no worker shares a data directory: the loss
/// before restarts from the seeded model, the grow from memory), and training still ends
/// exactly where it would have without the loss.
#[test]
fn a_replanned_job_grows_back_when_a_worker_joins() {
    const LONG: u32 = 120;
    let dir = tempdir("grow");
    let own: Vec<[String; 2]> = (0..4)
        .map(|w| own_data_dir(&dir, &format!("w{w}")))
        .collect();
    let args: Vec<[&str; 2]> = own.iter().map(|[a, b]| [a.as_str(), b.as_str()]).collect();
    let mut cluster = start_with(&dir, 3, &[(0, &args[0]), (1, &args[1]), (2, &args[2])]);
    let mut spec = spec(3, "1f1b", LONG);
    spec.job.name = "grow".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 10;
    let reference = reference(&spec);
    let job = submit(&cluster, &write_spec(&dir, &spec));
    wait_until(&cluster, job, Duration::from_secs(60), |s, step| {
        s == "running" && step >= 3
    });
    cluster.children[3].kill().unwrap();
    // The job goes on with two workers; then a new one joins.
    let started = Instant::now();
    while replans_counted(&cluster, "worker_lost") < 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no re-plan after the loss"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    add_worker(&mut cluster, &dir, "w3", &args[3]);
    let (_, joined_at, _) = status(&cluster, job);
    assert!(
        joined_at + 20 < u64::from(LONG),
        "the job ran too fast to grow mid-way ({joined_at} steps)"
    );
    let line = ended(&cluster, job, Duration::from_secs(180));
    assert!(line.contains("succeeded"), "{line}");

    let stdout = history(&cluster, job);
    assert_eq!(
        replans(&stdout, "stopped heartbeating").len(),
        1,
        "{stdout}"
    );
    let grew = replans(&stdout, "joined");
    assert_eq!(grew.len(), 1, "{stdout}");
    assert!(
        grew[0].contains("workers joined (3 live); grew from 2 onto 3 workers (1f1b, 3 stages)"),
        "{}",
        grew[0]
    );
    assert!(grew[0].contains("from the workers' memory"), "{}", grew[0]);
    // The loss before went back to a checkpoint; the grow ran no step again.
    assert_continues_after(&stdout, "joined");
    let (loss_diff, param_diff) = assert_exact(&cluster, job, &last_losses(&stdout), &reference);
    eprintln!(
        "grow: w3 joined at step {joined_at}; max |Δloss| {loss_diff:.2e}, max |Δparam| \
         {param_diff:.2e}"
    );
    // The last run is on three workers, the new one among them.
    assert_eq!(finals(&cluster, job), 3);
    assert_eq!(replans_counted(&cluster, "worker_joined"), 1.0);
}
