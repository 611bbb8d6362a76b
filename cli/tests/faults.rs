//! Faults that end a job or a process cleanly: a malformed frame fails its job (naming the
//! field), a cancel stops one at a step boundary, the same workers then train the next job
//! and `pipewise trace` writes its timeline; a damaged job store is one clear error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use pipewise_proto::v1 as pb;
use pipewise_proto::v1::activation_service_client::ActivationServiceClient;

use common::processes::*;

#[test]
fn malformed_frame_and_cancel_end_jobs_cleanly() {
    let dir = tempdir("faults");
    let cluster = start(&dir, 2);

    // A long job; once it runs, a stranger sends worker 1 frames whose data does not match
    // their shape, for the stage it holds and the steps ahead.
    let job = submit(&cluster, &write_spec(&dir, &spec(2, "1f1b", 5000)));
    wait_until(&cluster, job, Duration::from_secs(60), |s, step| {
        s == "running" && step >= 2
    });
    let (_, now, _) = status(&cluster, job);
    let target = format!("http://{}", cluster.workers["w1"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let rejected = rt.block_on(async {
        let mut client = ActivationServiceClient::connect(target).await.unwrap();
        let mut rejected = Vec::new();
        // From the status's step (which lags the workers a little) on: the worker takes
        // frames of its own step and the two after, and refuses the others unread.
        for step in now..now + 60 {
            let frame = pb::TensorFrame {
                run: job,
                step,
                stage: 1,
                mb: 0,
                kind: pb::FrameKind::Activation as i32,
                dtype: pb::Dtype::F32 as i32,
                shape: vec![1, 16, 32],
                data: vec![0u8; 7].into(),
                offset: 0,
                run_secret: Default::default(),
            };
            let err = client
                .send(tokio_stream::iter(vec![frame]))
                .await
                .expect_err("a malformed frame is refused");
            rejected.push(err);
        }
        rejected
    });
    // A frame of a step the worker already took is refused as a duplicate, one far from
    // its step as such (both checked first); those near it are refused for their data.
    let mut malformed = 0;
    for e in &rejected {
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        if e.message().contains("TensorFrame.data") {
            malformed += 1;
        } else {
            assert!(
                e.message().contains("duplicate") || e.message().contains("not near"),
                "{e:?}"
            );
        }
    }
    assert!(malformed >= 1, "none of 60 refused for their data");
    let line = ended(&cluster, job, Duration::from_secs(60));
    assert!(line.contains("failed"), "{line}");
    assert!(
        line.contains("TensorFrame.data"),
        "the error names the field: {line}"
    );
    eprintln!("malformed frames: {line}");
    // The failing worker logged it as JSON, with the job and the worker from its spans.
    let log = std::fs::read_to_string(dir.join("w1.log")).unwrap();
    let failure: serde_json::Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["level"] == "ERROR")
        .expect("an ERROR line in JSON");
    assert_eq!(failure["span"]["job"], job, "{failure}");
    assert_eq!(failure["span"]["worker"], 1, "{failure}");

    // A cancelled job stops at a step boundary.
    let job = submit(&cluster, &write_spec(&dir, &spec(2, "v-half", 5000)));
    wait_until(&cluster, job, Duration::from_secs(60), |s, step| {
        s == "running" && step >= 1
    });
    let said = common::succeeds(pipewise().args([
        "cancel",
        &job.to_string(),
        "--coordinator",
        &cluster.url,
    ]));
    // It says the running job is being cancelled, not just that it runs.
    assert!(
        said.contains("cancelling: its workers stop after the current step"),
        "{said}"
    );
    let line = ended(&cluster, job, Duration::from_secs(60));
    assert!(line.contains("cancelled"), "{line}");
    eprintln!("cancel: {line}");

    // The same workers then train the next job to the end.
    let mut short = spec(2, "zb-h1", 3);
    short.job.name = "after-faults".into();
    let (job, losses) = submit_wait(&cluster, &write_spec(&dir, &short));
    assert_eq!(losses.len(), 3);

    // `pipewise trace` writes a kept step's timeline; a step that is not kept is refused
    // naming the field.
    let traces = dir.join("traces");
    common::succeeds(
        pipewise()
            .args(["trace", &job.to_string(), "--step", "2"])
            .args(["--coordinator", &cluster.url])
            .arg("--out")
            .arg(&traces),
    );
    let chrome: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(traces.join("step-2.trace.json")).unwrap())
            .unwrap();
    assert_eq!(chrome["otherData"]["job"], job);
    assert!(
        std::fs::read_to_string(traces.join("step-2.svg"))
            .unwrap()
            .starts_with("<svg")
    );
    let out = pipewise()
        .args([
            "trace",
            &job.to_string(),
            "--step",
            "9",
            "--coordinator",
            &cluster.url,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("step: step 9") && err.contains("1..=3"),
        "{err}"
    );

    // The coordinator's and a worker's metrics endpoints pass `promtool check metrics`.
    for port in cluster.metrics {
        common::promtool_accepts(port);
    }
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
