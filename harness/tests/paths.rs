//! The paths a job names stay in the data directories, on the harness: `checkpoint.folder`
//! and `data.path` that lead out (`..`, absolute elsewhere, a symlink) are refused at
//! submit, naming the field, and again by a worker whose own data directory holds a symlink
//! out, which fails the job with the field named and keeps serving; a checkpoint folder
//! swapped for a link mid-run fails its job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use pipewise_common::job::{Compute, JobSpec};
use pipewise_harness::{Cluster, LIMIT, spec};
use pipewise_proto::v1 as pb;

type Edit = fn(&mut JobSpec);

/// How many entries `dir` holds.
fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paths_leading_out_of_the_data_directories_are_refused() {
    // The worker's data directory differs from the coordinator's, with a link out in it.
    let mut cluster = Cluster::builder("paths")
        .workers(1)
        .own_data_dirs()
        .start()
        .await;
    let elsewhere = cluster.dir().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let [coordinator_data, worker_data] = &cluster.data_dirs()[..] else {
        panic!("not two data directories: {:?}", cluster.data_dirs());
    };
    symlink(&elsewhere, worker_data.join("ckpt")).unwrap();
    symlink(&elsewhere, coordinator_data.join("out")).unwrap();

    let mut job = spec(1, "1f1b", 2);
    job.compute = Compute::emulate(1.0, 1.0, 1.0);
    let edited = |edit: Edit| {
        let mut spec = job.clone();
        edit(&mut spec);
        spec
    };
    let refused: [(&str, Edit); 5] = [
        ("checkpoint.folder", |s| {
            s.checkpoint.folder = "../../escape_ckpt".into()
        }),
        ("checkpoint.folder", |s| s.checkpoint.folder = "/tmp".into()),
        ("checkpoint.folder", |s| {
            s.checkpoint.folder = "out/ckpt".into()
        }),
        ("data.path", |s| s.data.path = Some("../corpus.txt".into())),
        ("data.path", |s| s.data.path = Some("out/corpus.txt".into())),
    ];
    for (field, edit) in refused {
        let status = cluster.refused(&edited(edit)).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "{status:?}"
        );
    }

    // `ckpt` is nothing at the coordinator, a link out at the worker: the job fails there,
    // naming the field, and nothing is written outside.
    let linked = cluster
        .submit(edited(|s| s.checkpoint.folder = "ckpt".into()))
        .await;
    let status = cluster.wait_as_time_passes(linked).await;
    assert_eq!(status.state, pb::JobState::Failed as i32, "{status:?}");
    assert!(status.error.contains("checkpoint.folder"), "{status:?}");
    assert!(status.error.contains("symlink"), "{status:?}");
    assert_eq!(entries(&elsewhere), 0);
    // The worker still serves: a job inside its data directory runs (emulated: no loss).
    let job = cluster
        .submit(edited(|s| s.checkpoint.folder = "runs/a".into()))
        .await;
    let ended = cluster.finish(job).await;
    assert_eq!(
        ended.status.state,
        pb::JobState::Succeeded as i32,
        "{:?}",
        ended.status
    );
    let steps: Vec<u64> = ended.losses.iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, [1, 2]);
}

/// The job's checkpoint folder renamed away and replaced by a link to a directory outside
/// the data directory while the worker waits before step 3 (0-based), after the checkpoint
/// of step 2: the next checkpoint (step 4) is refused, the job fails naming
/// `checkpoint.folder` after its fourth step, and nothing is written outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_folder_swapped_for_a_link_mid_run_fails_the_job() {
    let mut cluster = Cluster::builder("paths-swap").workers(1).start().await;
    let data = cluster.data_dirs()[0].clone();
    let outside = cluster.dir().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let mut spec = spec(1, "1f1b", 100_000);
    spec.job.name = "swapped".into();
    spec.checkpoint.folder = "ckpt".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 2;
    cluster.hold_before(3);
    let job = cluster.submit(spec).await;
    cluster.wait_held(&["w0"], 3).await;
    let first = data.join(format!("ckpt/job-{job}/step-2"));
    // The worker wrote it before it waits; the directory may be named a little later.
    let deadline = Instant::now() + LIMIT;
    while !first.exists() {
        assert!(
            Instant::now() < deadline,
            "no checkpoint at {}",
            first.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let folder = data.join("ckpt");
    std::fs::rename(&folder, data.join("ckpt-moved")).unwrap();
    symlink(&outside, &folder).unwrap();
    cluster.release();

    let status = cluster.wait_as_time_passes(job).await;
    assert_eq!(status.state, pb::JobState::Failed as i32, "{status:?}");
    assert!(status.error.contains("checkpoint.folder"), "{status:?}");
    assert!(status.error.contains("is a symlink"), "{status:?}");
    let steps: Vec<u64> = cluster.losses(job).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    assert_eq!(entries(&outside), 0, "written outside: {status:?}");
    cluster.shutdown().await;
}
