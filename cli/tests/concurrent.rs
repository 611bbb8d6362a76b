//! Jobs side by side on disjoint workers: a coordinator and 8 `pipewise worker` processes;
//! two 4-worker jobs submitted back to back run at the same time, a third waits for one of
//! them to end, and a small job behind a waiting big one starts only under the backfill
//! rule (predicted to end before the big one could start, or the big one needs more
//! workers than the cluster has). Every job stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::processes::*;

const LIMIT: Duration = Duration::from_secs(240);

/// The workers `pipewise status` says a job holds.
fn workers_of(line: &str) -> BTreeSet<String> {
    line.split("  workers ")
        .nth(1)
        .map(|w| w.split_whitespace().next().unwrap_or(""))
        .unwrap_or("")
        .split(',')
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

fn cancel(cluster: &Cluster, job: u64) {
    common::succeeds(pipewise().args(["cancel", &job.to_string(), "--coordinator", &cluster.url]));
}

#[test]
fn jobs_run_side_by_side_on_disjoint_workers() {
    let dir = tempdir("concurrent");
    let cluster = start(&dir, 8);
    const STEPS_LONG: u32 = 60;
    let four = |name: &str, steps: u32| {
        let mut s = spec(4, "1f1b", steps);
        s.job.name = name.into();
        s
    };
    let (a, b, c) = (
        four("a", STEPS_LONG),
        four("b", STEPS_LONG),
        four("c", STEPS),
    );
    let ids: Vec<u64> = [&a, &b, &c]
        .iter()
        .map(|s| submit(&cluster, &write_spec(&dir, s)))
        .collect();
    // A and B run together, each on its own four workers; C waits in the queue.
    let started = Instant::now();
    let (line_a, line_b) = loop {
        let (sa, ka, la) = status(&cluster, ids[0]);
        let (sb, kb, lb) = status(&cluster, ids[1]);
        if sa == "running" && sb == "running" && ka > 0 && kb > 0 {
            break (la, lb);
        }
        assert!(started.elapsed() < LIMIT, "not both running: {la} / {lb}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let (wa, wb) = (workers_of(&line_a), workers_of(&line_b));
    eprintln!("side by side:\n{line_a}\n{line_b}");
    assert_eq!((wa.len(), wb.len()), (4, 4), "{line_a} / {line_b}");
    assert!(wa.is_disjoint(&wb), "{wa:?} {wb:?}");
    let (state_c, _, line_c) = status(&cluster, ids[2]);
    assert_eq!(state_c, "queued", "{line_c}");
    // Their steps interleave: each advances while the other runs.
    let (_, ka, _) = status(&cluster, ids[0]);
    let (_, kb, _) = status(&cluster, ids[1]);
    wait_until(&cluster, ids[0], LIMIT, |s, k| s != "running" || k > ka + 2);
    let (sb, kb2, _) = status(&cluster, ids[1]);
    assert!(sb != "running" || kb2 > kb, "job b stood still while a ran");

    // C starts once A or B is done, and every job ends exact.
    for (id, spec) in ids.iter().zip([&a, &b, &c]) {
        let line = ended(&cluster, *id, LIMIT);
        assert!(line.contains("succeeded"), "{line}");
        let losses = last_losses(&history(&cluster, *id));
        let (dl, dp) = assert_exact(&cluster, *id, &losses, &reference(spec));
        eprintln!("job {id}: max |Δloss| {dl:.2e}, max |Δparam| {dp:.2e}");
    }

    // Backfill: f runs on four workers for long, so an 8-worker job waits for it. Behind
    // that job a 2-worker job predicted to run longer than f has left stays queued (it
    // could delay the 8-worker job), and a short one starts on the idle workers and ends
    // while f still runs.
    let with_degree = |name: &str, steps: u32, d: u32| {
        let mut s = four(name, steps);
        s.parallelism.pipeline_parallel_degree = d;
        s
    };
    let id_f = submit(&cluster, &write_spec(&dir, &four("f", 2000)));
    wait_until(&cluster, id_f, LIMIT, |s, k| s == "running" && k > 0);
    let [id_d, id_long, id_e] = [
        with_degree("d", STEPS, 8),
        with_degree("long", 1_000_000, 2),
        with_degree("e", STEPS, 2),
    ]
    .map(|s| submit(&cluster, &write_spec(&dir, &s)));
    let line = ended(&cluster, id_e, LIMIT);
    assert!(line.contains("succeeded"), "{line}");
    let (state_f, _, line_f) = status(&cluster, id_f);
    assert_eq!(
        state_f, "running",
        "f ended before the job behind: {line_f}"
    );
    // Each says what it waits for.
    let waits = [
        (
            id_d,
            "waiting for 8 idle workers (predicted free in about ".to_string(),
        ),
        (
            id_long,
            format!("waiting for job {id_d} to start: this job, predicted "),
        ),
    ];
    for (id, says) in waits {
        let (state, _, line) = status(&cluster, id);
        assert_eq!(state, "queued", "{line}");
        assert!(line.contains(&says), "{line}");
        eprintln!("{line}");
    }
    cancel(&cluster, id_long);
    cancel(&cluster, id_f);
    let line = ended(&cluster, id_d, LIMIT);
    assert!(line.contains("succeeded"), "{line}");

    // A 10-worker job can never start on 8 workers: the 2-worker job behind it backfills.
    let mut big = four("big", STEPS);
    big.parallelism.pipeline_parallel_degree = 10;
    big.model.layers = 18;
    let mut small = four("small", STEPS);
    small.parallelism.pipeline_parallel_degree = 2;
    let id_big = submit(&cluster, &write_spec(&dir, &big));
    let id_small = submit(&cluster, &write_spec(&dir, &small));
    let line = ended(&cluster, id_small, LIMIT);
    assert!(line.contains("succeeded"), "{line}");
    // It waits, and says so (the small job's workers are back).
    let started = Instant::now();
    loop {
        let (state_big, _, line_big) = status(&cluster, id_big);
        if state_big == "running" && line_big.contains("waiting for workers: 8 of 10 ready") {
            break;
        }
        assert!(started.elapsed() < LIMIT, "{line_big}");
        std::thread::sleep(Duration::from_millis(100));
    }
    cancel(&cluster, id_big);
}
