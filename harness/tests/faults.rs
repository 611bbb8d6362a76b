//! Faults that end a job cleanly on the harness: a stranger's malformed frames fail the job
//! they were sent into (naming the field, logged by the worker in its job's span), a cancel
//! stops a job at a step boundary, and the same workers then train the next job exactly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pipewise_harness::{Cluster, logs, reference_losses, spec};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::activation_service_client::ActivationServiceClient;

const BOTH: [&str; 2] = ["w0", "w1"];

/// A frame for stage 1's first activation of `step` (0-based) of `run` whose 7 bytes do not
/// match its shape.
fn malformed(run: u64, step: u64) -> pb::TensorFrame {
    pb::TensorFrame {
        run,
        step,
        stage: 1,
        mb: 0,
        kind: pb::FrameKind::Activation as i32,
        dtype: pb::Dtype::F32 as i32,
        shape: vec![1, 16, 32],
        data: vec![0u8; 7].into(),
        offset: 0,
        run_secret: Default::default(),
    }
}

/// Why worker `address` refuses a malformed frame of each of the steps `steps`: the frame's
/// field it names first.
async fn refusals(address: &str, job: u64, steps: std::ops::Range<u64>) -> Vec<(u64, String)> {
    let mut client = ActivationServiceClient::connect(format!("http://{address}"))
        .await
        .unwrap();
    let mut refused = Vec::new();
    for step in steps {
        let err = client
            .send(tokio_stream::iter(vec![malformed(job, step)]))
            .await
            .expect_err("a malformed frame is refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        let field = err
            .message()
            .split("TensorFrame.")
            .nth(1)
            .and_then(|rest| rest.split(':').next())
            .unwrap_or_else(|| panic!("no field named: {err:?}"));
        refused.push((step, field.to_string()));
    }
    refused
}

/// Both workers wait before step 5 (0-based; w1 has taken step 4's frames) when a stranger
/// sends w1 malformed frames for steps 0 to 9: those of steps 3 and 4 are refused as
/// duplicates, of steps 5 and 6 (the two after its own) for their data, the others as not
/// near its step. The first of the refused keys w1 waits for fails the job naming
/// `TensorFrame.data`; w1 logged the failure in its job's span.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_frames_fail_their_job_naming_the_field() {
    let logs = logs::capture();
    let mut cluster = Cluster::builder("faults-frames").start().await;
    cluster.hold_before(5);
    let job = cluster.submit(spec(2, "1f1b", 5000)).await;
    cluster.wait_held(&BOTH, 5).await;
    let refused = refusals(&cluster.address(1).unwrap(), job, 0..10).await;
    fn why(
        steps: std::ops::RangeInclusive<u64>,
        field: &'static str,
    ) -> impl Iterator<Item = (u64, String)> {
        steps.map(move |s| (s, field.to_string()))
    }
    let expected: Vec<(u64, String)> = why(0..=2, "step")
        .chain(why(3..=4, "mb"))
        .chain(why(5..=6, "data"))
        .chain(why(7..=9, "step"))
        .collect();
    assert_eq!(refused, expected);
    cluster.release();
    let status = cluster.wait_as_time_passes(job).await;
    assert_eq!(status.state, pb::JobState::Failed as i32, "{status:?}");
    assert!(
        status.error.contains("TensorFrame.data"),
        "{}",
        status.error
    );
    let steps: Vec<u64> = cluster.losses(job).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, [1, 2, 3, 4, 5]);
    cluster.shutdown().await;
    let failure = logs
        .of_job(job)
        .into_iter()
        .find(|l| l["level"] == "ERROR" && l["span"]["worker"] == 1)
        .expect("an ERROR line of w1 in the job's span");
    assert!(
        failure.to_string().contains("TensorFrame.data"),
        "{failure}"
    );
}

/// A job cancelled while its workers wait before step 3 (0-based) ends cancelled at a step
/// boundary, the same one on every run; the same workers then train a short job to the
/// end, exactly as the single device does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_stops_a_job_at_a_step_boundary_and_the_workers_train_on() {
    let mut cluster = Cluster::builder("faults-cancel").start().await;
    cluster.hold_before(3);
    let job = cluster.submit(spec(2, "v-half", 5000)).await;
    cluster.wait_held(&BOTH, 3).await;
    // Running while its workers stop: what `pipewise cancel` says "cancelling" on.
    let answer = cluster.cancel(job).await;
    assert_eq!(answer.state, pb::JobState::Running as i32, "{answer:?}");
    cluster.release();
    let status = cluster.wait(job).await;
    assert_eq!(status.state, pb::JobState::Cancelled as i32, "{status:?}");
    let steps: Vec<u64> = cluster.losses(job).iter().map(|(s, _)| *s).collect();
    // Decided after step 3, the stop reaches the workers with step 4's answers: they
    // stop after step 5, the lockstep's k + 2.
    assert_eq!(steps, [1, 2, 3, 4, 5]);

    let mut short = spec(2, "zb-h1", 3);
    short.job.name = "after-faults".into();
    let reference = reference_losses(&short);
    let next = cluster.submit(short).await;
    let ended = cluster.finish(next).await;
    ended.assert_exact(&[1, 2, 3], &reference);
    assert_eq!(ended.replans, Vec::<(u64, String)>::new());
}
