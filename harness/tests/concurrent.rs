//! Jobs side by side on disjoint workers, on the harness: a coordinator and 8 workers; two
//! 4-worker jobs submitted back to back run at the same time, a third waits for one of
//! them to end, and a small job behind a waiting big one starts only under the backfill
//! rule (predicted to end before the big one could start, or the big one needs more
//! workers than the cluster has). Every job stays exact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use pipewise_common::job::JobSpec;
use pipewise_harness::reference::{Params, max_param_diff, reference};
use pipewise_harness::{Cluster, spec};
use pipewise_proto::v1 as pb;

const STEPS: u32 = 20;
const STEPS_LONG: u32 = 60;

fn is(status: &pb::JobStatus, state: pb::JobState) -> bool {
    status.state == state as i32
}

/// A 4-worker 1F1B job named `name`.
fn four(name: &str, steps: u32) -> JobSpec {
    let mut s = spec(4, "1f1b", steps);
    s.job.name = name.into();
    s
}

/// [`four`] on `degree` workers.
fn with_degree(name: &str, steps: u32, degree: u32) -> JobSpec {
    let mut s = four(name, steps);
    s.parallelism.pipeline_parallel_degree = degree;
    s
}

/// Waits until `job` ended; asserts it succeeded, never re-planned, and every step's loss
/// and its final parameters are the single device's (`reference`).
async fn assert_succeeded_exactly(
    cluster: &mut Cluster,
    job: u64,
    (ref_losses, ref_params): &(Vec<f64>, Params),
) {
    let status = cluster.wait(job).await;
    assert!(is(&status, pb::JobState::Succeeded), "{status:?}");
    assert_eq!(cluster.replans(job), []);
    let losses = cluster.losses(job);
    let steps: Vec<u64> = losses.iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, (1..=ref_losses.len() as u64).collect::<Vec<_>>());
    for (step, loss) in losses {
        let want = ref_losses[step as usize - 1];
        assert!(
            (loss - want).abs() <= 1e-5,
            "job {job} step {step}: {loss} vs {want}"
        );
    }
    let diff = max_param_diff(ref_params, &cluster.final_params(job));
    assert!(diff <= 1e-5, "job {job}: Δparam {diff}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_run_side_by_side_on_disjoint_workers() {
    let (a, b, c) = (
        four("a", STEPS_LONG),
        four("b", STEPS_LONG),
        four("c", STEPS),
    );
    // A and B train alike (their names aside): one reference.
    let (long, short) = (reference(&a), reference(&c));
    let mut cluster = Cluster::builder("concurrent").workers(8).start().await;
    let mut ids = Vec::new();
    for spec in [&a, &b, &c] {
        ids.push(cluster.submit(spec.clone()).await);
    }
    // A and B run together, each on its own four workers; C waits in the queue.
    let running = |s: &pb::JobStatus| is(s, pb::JobState::Running) && s.step > 0;
    let sa = cluster.wait_for(ids[0], "a running", running).await;
    let sb = cluster.wait_for(ids[1], "b running", running).await;
    let workers = |s: &pb::JobStatus| s.workers.iter().cloned().collect::<BTreeSet<_>>();
    let (wa, wb) = (workers(&sa), workers(&sb));
    assert_eq!((wa.len(), wb.len()), (4, 4), "{sa:?} / {sb:?}");
    assert!(wa.is_disjoint(&wb), "{wa:?} {wb:?}");
    let sc = cluster.status(ids[2]).await;
    assert!(is(&sc, pb::JobState::Queued), "{sc:?}");
    // Their steps interleave: each advances while the other runs.
    let (ka, kb) = (
        cluster.status(ids[0]).await.step,
        cluster.status(ids[1]).await.step,
    );
    cluster
        .wait_for(ids[0], "a two steps on", |s| {
            !is(s, pb::JobState::Running) || s.step > ka + 2
        })
        .await;
    let sb = cluster.status(ids[1]).await;
    assert!(
        !is(&sb, pb::JobState::Running) || sb.step > kb,
        "job b stood still while a ran: {sb:?}"
    );

    // C starts once A or B is done, and every job ends exact.
    for (id, reference) in ids.iter().zip([&long, &long, &short]) {
        assert_succeeded_exactly(&mut cluster, *id, reference).await;
    }

    backfill(&mut cluster).await;
    cluster.shutdown().await;
}

/// F runs on four workers for long, so an 8-worker job waits for it. Behind that job a
/// 2-worker job predicted to run longer than f has left stays queued (it could delay the
/// 8-worker job), and a short one starts on the idle workers and ends while f still runs.
/// Then a 10-worker job, which can never start on 8 workers, lets the 2-worker job behind
/// it backfill.
async fn backfill(cluster: &mut Cluster) {
    let (d, e) = (with_degree("d", STEPS, 8), with_degree("e", STEPS, 2));
    let small = with_degree("small", STEPS, 2);
    let (ref_d, ref_e, ref_small) = (reference(&d), reference(&e), reference(&small));
    let id_f = cluster.submit(four("f", 2000)).await;
    cluster
        .wait_for(id_f, "f running", |s| {
            is(s, pb::JobState::Running) && s.step > 0
        })
        .await;
    let id_d = cluster.submit(d).await;
    let id_long = cluster.submit(with_degree("long", 1_000_000, 2)).await;
    let id_e = cluster.submit(e).await;
    assert_succeeded_exactly(cluster, id_e, &ref_e).await;
    let sf = cluster.status(id_f).await;
    assert!(
        is(&sf, pb::JobState::Running),
        "f ended before the job behind: {sf:?}"
    );
    // Each says what it waits for (`pipewise status` prints "waiting for" before it).
    let waits = [
        (id_d, "8 idle workers (predicted free in about ".to_string()),
        (
            id_long,
            format!("job {id_d} to start: this job, predicted "),
        ),
    ];
    for (id, says) in waits {
        let status = cluster.status(id).await;
        assert!(is(&status, pb::JobState::Queued), "{status:?}");
        assert!(status.waiting.contains(&says), "{status:?}");
    }
    cluster.cancel(id_long).await;
    cluster.cancel(id_f).await;
    for id in [id_long, id_f] {
        let status = cluster.wait(id).await;
        assert!(is(&status, pb::JobState::Cancelled), "{status:?}");
    }
    assert_succeeded_exactly(cluster, id_d, &ref_d).await;

    // A 10-worker job can never start on 8 workers: the 2-worker job behind it backfills.
    let mut big = four("big", STEPS);
    big.parallelism.pipeline_parallel_degree = 10;
    big.model.layers = 18;
    let id_big = cluster.submit(big).await;
    let id_small = cluster.submit(small).await;
    assert_succeeded_exactly(cluster, id_small, &ref_small).await;
    // It waits, and says so (the small job's workers are back).
    cluster
        .wait_for(id_big, "big waiting for 8 of 10", |s| {
            is(s, pb::JobState::Running) && s.waiting.contains("workers: 8 of 10 ready")
        })
        .await;
    cluster.cancel(id_big).await;
    let status = cluster.wait(id_big).await;
    assert!(is(&status, pb::JobState::Cancelled), "{status:?}");
}
