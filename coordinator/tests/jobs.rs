//! The coordinator over real gRPC on loopback: invalid job specs are refused with
//! `InvalidArgument` naming the field, jobs queue one after another, watchers see every step,
//! and a restarted coordinator lists the jobs it had.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use pipewise_common::job::{JobPlan, JobSpec, example};
use pipewise_coordinator::{Coordinator, JobRunner, Report, Start, StepEventData};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use tokio_stream::StreamExt as _;

/// A runner that "trains" by reporting a decreasing loss per step, and records how many
/// jobs run at once (a test double for the embedded workers).
struct CountingRunner {
    active: AtomicU32,
    overlap: AtomicBool,
    delay_ms: u64,
    /// (job, start) of every run, in order.
    starts: Mutex<Vec<(u64, Start)>>,
}

impl CountingRunner {
    fn new(delay_ms: u64) -> CountingRunner {
        CountingRunner {
            active: AtomicU32::new(0),
            overlap: AtomicBool::new(false),
            delay_ms,
            starts: Mutex::new(Vec::new()),
        }
    }
}

impl JobRunner for CountingRunner {
    fn run(
        &self,
        job: u64,
        spec: &JobSpec,
        plan: &JobPlan,
        start: Start,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
    ) -> pipewise_coordinator::Result<()> {
        self.starts.lock().unwrap().push((job, start));
        if self.active.fetch_add(1, Ordering::SeqCst) > 0 {
            self.overlap.store(true, Ordering::SeqCst);
        }
        for step in 1..=u64::from(spec.training.steps) {
            if cancelled.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(self.delay_ms));
            report(Report::Step(Box::new(StepEventData {
                job,
                step,
                loss: 5.0 / step as f64,
                validation_loss: None,
                initial_validation_loss: None,
                step_time_ms: self.delay_ms as f64,
                planned_bubble: 0.1,
                measured_bubble: 0.12,
                core_wait_bubble: 0.02,
                pass_core_wait: 0.0,
                predicted_step_time_ms: self.delay_ms as f64,
                peaks: (0..plan.schedule.num_workers()).map(|w| (w, 100)).collect(),
                worker_bubbles: Vec::new(),
                replica: 0,
                all_reduce: Vec::new(),
                predicted_peaks: Vec::new(),
                checkpoint: 0,
                replan_reason: String::new(),
                plan_choice: String::new(),
                replanned: None,
                trace: None,
                planned_costs: None,
            })));
        }
        self.active.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

fn toml_of(spec: &JobSpec) -> String {
    spec.to_toml().unwrap()
}

async fn client(c: &Coordinator) -> JobServiceClient<tonic::transport::Channel> {
    JobServiceClient::connect(format!("http://{}", c.addr))
        .await
        .unwrap()
}

fn request(spec: &JobSpec) -> pb::JobSpec {
    pb::JobSpec {
        toml: toml_of(spec),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_specs_are_invalid_argument_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let c = Coordinator::start("127.0.0.1:0".parse().unwrap(), dir.path(), None)
        .await
        .unwrap();
    let mut jobs = client(&c).await;
    type Edit = fn(&mut JobSpec);
    let cases: Vec<(&str, Edit)> = vec![
        ("job.name", |s| s.job.name = String::new()),
        ("model.heads", |s| s.model.heads = 5),
        ("model.vocab", |s| s.model.vocab = 0),
        ("training.steps", |s| s.training.steps = 0),
        ("training.global_batch_size", |s| {
            s.parallelism.pipeline_parallel_microbatch_size = 3
        }),
        ("optimizer.lr", |s| s.optimizer.lr = -1.0),
        ("parallelism.pipeline_parallel_degree", |s| {
            s.parallelism.pipeline_parallel_degree = 0
        }),
        ("parallelism.pipeline_parallel_schedule", |s| {
            s.parallelism.pipeline_parallel_schedule = "nope".into()
        }),
        ("parallelism.memory_limit", |s| {
            s.parallelism.pipeline_parallel_schedule = "adaptive-v".into();
            s.parallelism.memory_limit = Some(0.1);
        }),
        ("model.layers", |s| {
            s.parallelism.pipeline_parallel_degree = 16
        }),
        ("checkpoint.interval", |s| {
            s.checkpoint.enable_checkpoint = true;
            s.checkpoint.interval = 0;
        }),
    ];
    for (field, edit) in cases {
        let mut spec = example(4, "v-half");
        edit(&mut spec);
        let status = jobs.submit_job(request(&spec)).await.unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{field}: {status:?}"
        );
        assert!(
            status.message().starts_with(field),
            "{field}: {}",
            status.message()
        );
    }
    // Malformed TOML and bad overrides.
    let status = jobs
        .submit_job(pb::JobSpec {
            toml: "[job]\nname = 3".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("toml"), "{}", status.message());
    let status = jobs
        .submit_job(pb::JobSpec {
            microbatches: Some(3),
            ..request(&example(4, "1f1b"))
        })
        .await
        .unwrap_err();
    assert!(
        status.message().starts_with("microbatches"),
        "{}",
        status.message()
    );
    // Nothing invalid was stored.
    let list = jobs.list_jobs(pb::Empty {}).await.unwrap().into_inner();
    assert!(list.jobs.is_empty());
    // Unknown job ids are NotFound.
    let status = jobs.get_job(pb::JobId { id: 99 }).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_queue_in_order_and_watchers_see_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Arc::new(CountingRunner::new(20));
    let c = Coordinator::start(
        "127.0.0.1:0".parse().unwrap(),
        dir.path(),
        Some(runner.clone()),
    )
    .await
    .unwrap();
    let mut jobs = client(&c).await;
    let mut first = example(2, "1f1b");
    first.training.steps = 10;
    let mut second = example(4, "v-half");
    second.job.name = "second".into();
    second.training.steps = 5;
    let a = jobs.submit_job(request(&first)).await.unwrap().into_inner();
    let b = jobs
        .submit_job(request(&second))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(a.id, b.id);
    let mut watch = jobs
        .watch_job(pb::JobId { id: b.id })
        .await
        .unwrap()
        .into_inner();
    let mut steps = Vec::new();
    while let Some(event) = watch.next().await {
        let event = event.unwrap();
        assert_eq!(event.job, b.id);
        assert_eq!(event.peaks.len(), 4);
        steps.push(event.step);
    }
    assert_eq!(steps, vec![1, 2, 3, 4, 5]);
    let list = jobs.list_jobs(pb::Empty {}).await.unwrap().into_inner();
    for job in &list.jobs {
        assert_eq!(job.state, pb::JobState::Succeeded as i32, "{job:?}");
        assert_eq!(job.step, job.steps);
    }
    assert!(
        !runner.overlap.load(Ordering::SeqCst),
        "two jobs ran at once"
    );
    // Cancelling a finished job changes nothing.
    let again = jobs
        .cancel_job(pb::JobId { id: a.id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.state, pb::JobState::Succeeded as i32);
    // A watcher that comes after the job ended still gets every step, then the end.
    let mut late = jobs
        .watch_job(pb::JobId { id: a.id })
        .await
        .unwrap()
        .into_inner();
    let mut replayed = Vec::new();
    while let Some(event) = late.next().await {
        replayed.push(event.unwrap().step);
    }
    assert_eq!(replayed, (1..=a.steps).collect::<Vec<_>>());
    c.shutdown().await;
}

/// A restarted coordinator lists the jobs it had, and runs again the ones it had queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_lists_its_jobs_and_runs_the_unfinished() {
    let dir = tempfile::tempdir().unwrap();
    let c = Coordinator::start("127.0.0.1:0".parse().unwrap(), dir.path(), None)
        .await
        .unwrap();
    let mut jobs = client(&c).await;
    let mut names = Vec::new();
    for (i, schedule) in ["1f1b", "zb-h1", "v-min"].iter().enumerate() {
        let mut spec = example(4, schedule);
        spec.job.name = format!("job-{i}");
        names.push(spec.job.name.clone());
        jobs.submit_job(request(&spec)).await.unwrap();
    }
    // Cancel one while it is queued (no runner: every job waits).
    let cancelled = jobs
        .cancel_job(pb::JobId { id: 2 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);
    c.shutdown().await;

    // Restarted with a runner: the jobs that had not finished are planned again and run,
    // in id order, from the start (no checkpoints), under run ids of a restart.
    let runner = Arc::new(CountingRunner::new(5));
    let c = Coordinator::start(
        "127.0.0.1:0".parse().unwrap(),
        dir.path(),
        Some(runner.clone() as Arc<dyn JobRunner>),
    )
    .await
    .unwrap();
    let mut jobs = client(&c).await;
    let list = jobs.list_jobs(pb::Empty {}).await.unwrap().into_inner();
    let listed: Vec<String> = list.jobs.iter().map(|j| j.name.clone()).collect();
    assert_eq!(listed, names);
    assert_eq!(list.jobs[1].state, pb::JobState::Cancelled as i32);
    for id in [1, 3] {
        let mut events = jobs.watch_job(pb::JobId { id }).await.unwrap().into_inner();
        while events.next().await.is_some() {}
        let status = jobs.get_job(pb::JobId { id }).await.unwrap().into_inner();
        assert_eq!(status.state, pb::JobState::Succeeded as i32, "{status:?}");
    }
    let resumed = Start {
        step: 0,
        restarts: 1,
        through: 0,
    };
    assert_eq!(*runner.starts.lock().unwrap(), [(1, resumed), (3, resumed)]);
    c.shutdown().await;
}

/// A worker registering with an id or address no host could have is refused with the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_with_bad_or_taken_ids_are_refused() {
    use pipewise_proto::v1::cluster_service_client::ClusterServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let c = Coordinator::start("127.0.0.1:0".parse().unwrap(), dir.path(), None)
        .await
        .unwrap();
    let mut cluster = ClusterServiceClient::connect(format!("http://{}", c.addr))
        .await
        .unwrap();
    let register = |id: &str, address: &str| pb::RegisterRequest {
        worker_id: id.into(),
        address: address.into(),
        ..Default::default()
    };
    let long = "w".repeat(254);
    for (request, field) in [
        (register(&long, "127.0.0.1:1"), "worker_id"),
        (register("a\nb", "127.0.0.1:1"), "worker_id"),
        (register("ok", &"w".repeat(1025)), "address"),
        (register("ok", "10.91.0.2:0"), "address: peers cannot dial"),
        (
            register("ok", "0.0.0.0:50052"),
            "address: peers cannot dial",
        ),
        (register("ok", "worker-0"), "address: peers cannot dial"),
    ] {
        let err = cluster.register(request).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with(field), "{err:?}");
    }
    let reply = cluster
        .register(register(&"w".repeat(253), "127.0.0.1:1"))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.accepted);

    // An id a live worker holds (registered, heartbeating, stream open) is refused to a
    // process at another address; it used to take over the id and the live worker's
    // assignments went to it.
    let id = |id: &str| pb::WorkerId { id: id.into() };
    assert!(
        cluster
            .register(register("w1", "127.0.0.1:1"))
            .await
            .is_ok()
    );
    let stream = cluster.assignments(id("w1")).await.unwrap().into_inner();
    let err = cluster
        .register(register("w1", "127.0.0.1:2"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists, "{err:?}");
    assert!(
        err.message()
            .contains("in use by the worker at 127.0.0.1:1"),
        "{err:?}"
    );
    // A worker still running a run this coordinator never started (it started before a
    // restart, which failed its job) is told to abandon it; an idle one (job 0) is not.
    for (job, cancel) in [(0u64, false), (12_345, true)] {
        let reply = cluster
            .heartbeat(pb::HeartbeatRequest {
                worker_id: "w1".into(),
                run: job,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(reply.known);
        assert_eq!(
            (reply.cancel, reply.run),
            (cancel, if cancel { job } else { 0 })
        );
    }
    // The holder itself registers again (as after a coordinator restart).
    assert!(
        cluster
            .register(register("w1", "127.0.0.1:1"))
            .await
            .is_ok()
    );
    // Once the holder's stream is gone (the process ended), the id is free.
    drop(stream);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // The holder keeps heartbeating: only its closed stream frees the id.
        cluster
            .heartbeat(pb::HeartbeatRequest {
                worker_id: "w1".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        match cluster.register(register("w1", "127.0.0.1:2")).await {
            Ok(_) => break,
            Err(e) if e.code() == tonic::Code::AlreadyExists => {
                assert!(std::time::Instant::now() < deadline, "still refused: {e:?}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    c.shutdown().await;
}
