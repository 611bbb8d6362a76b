//! The paths a job names stay in the data directories: `checkpoint.folder` and `data.path`
//! that lead out (`..`, absolute elsewhere, a symlink) are refused at submit, naming the
//! field, and again by a worker whose own data directory holds a symlink out, which fails
//! the job with the field named and keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::symlink;

use common::processes::*;
use pipewise_common::job::{Compute, JobSpec};

type Edit = fn(&mut JobSpec);

#[test]
fn paths_leading_out_of_the_data_directories_are_refused() {
    let dir = tempdir("paths");
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    // The worker's data directory differs from the coordinator's, with a link out in it.
    let worker_data = dir.join("worker-data");
    std::fs::create_dir_all(&worker_data).unwrap();
    symlink(&elsewhere, worker_data.join("ckpt")).unwrap();
    let mut cluster = start(&dir, 0);
    add_worker(
        &mut cluster,
        &dir,
        "w0",
        &["--data-dir", worker_data.to_str().unwrap()],
    );
    std::fs::create_dir_all(&cluster.data).unwrap();
    symlink(&elsewhere, cluster.data.join("out")).unwrap();

    let mut job = spec(1, "1f1b", 2);
    job.compute = Compute::emulate(1.0, 1.0, 1.0);
    let submit = |edit: Edit, wait: bool| {
        let mut spec = job.clone();
        edit(&mut spec);
        let file = write_spec(&dir, &spec);
        let mut args = vec![
            "submit",
            file.to_str().unwrap(),
            "--coordinator",
            &cluster.url,
        ];
        if wait {
            args.push("--wait");
        }
        common::pipewise(&args)
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
        let out = submit(edit, false);
        let err = common::stderr(&out);
        assert!(!out.status.success(), "{field}: accepted");
        assert!(err.contains(&format!("InvalidArgument: {field}")), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }

    // `ckpt` is nothing at the coordinator, a link out at the worker: the job fails there,
    // naming the field, and nothing is written outside.
    let out = submit(|s| s.checkpoint.folder = "ckpt".into(), true);
    let text = format!("{}{}", common::stdout(&out), common::stderr(&out));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("checkpoint.folder"), "{text}");
    assert!(text.contains("symlink"), "{text}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // The worker still serves: a job inside its data directory runs.
    let out = submit(|s| s.checkpoint.folder = "runs/a".into(), true);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The job's checkpoint folder renamed away and replaced by a link to a directory outside
/// the data directory between two checkpoints of a running job: the next checkpoint is
/// refused, the job fails naming `checkpoint.folder`, and nothing is written outside.
#[test]
fn a_checkpoint_folder_swapped_for_a_link_mid_run_fails_the_job() {
    let dir = tempdir("paths-swap");
    let outside = dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let cluster = start(&dir, 1);
    let mut spec = spec(1, "1f1b", 100_000);
    spec.job.name = "swapped".into();
    spec.checkpoint.folder = "ckpt".into();
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 2;
    let job = submit(&cluster, &write_spec(&dir, &spec));
    let first = cluster.data.join(format!("ckpt/job-{job}/step-2"));
    let started = std::time::Instant::now();
    while !first.exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no first checkpoint: {}",
            status(&cluster, job).2
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let folder = cluster.data.join("ckpt");
    std::fs::rename(&folder, cluster.data.join("ckpt-moved")).unwrap();
    symlink(&outside, &folder).unwrap();

    let line = ended(&cluster, job, std::time::Duration::from_secs(60));
    let text = format!("{line}\n{}", history(&cluster, job));
    assert!(line.contains("failed"), "{text}");
    assert!(text.contains("checkpoint.folder"), "{text}");
    assert!(text.contains("is a symlink"), "{text}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "written outside: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
