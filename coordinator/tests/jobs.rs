//! The coordinator over real gRPC on loopback: invalid job specs are refused with
//! `InvalidArgument` naming the field, jobs queue one after another on the workers and run
//! through the run actor on stand-in worker processes ([`stand_in`]), watchers see every
//! step, and a restarted coordinator lists the jobs it had and runs the unfinished ones.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pipewise_common::job::{Compute, JobSpec, example, job_of, run_of};
use pipewise_coordinator::{Coordinator, Unfinished};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::cluster_service_client::ClusterServiceClient;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use tokio_stream::StreamExt as _;

/// What a stand-in worker did, in the order the stand-ins did it.
#[derive(Debug, Clone, PartialEq)]
enum Did {
    /// Took worker `index` of run `run` from its step `first`.
    Took { run: u64, index: u32, first: u64 },
    /// Reported the end of its part of run `run`.
    Ended { run: u64 },
}

type Log = Arc<Mutex<Vec<Did>>>;

/// A stand-in for a worker process, speaking its side of the cluster protocol: it
/// registers as `id`, heartbeats the run it runs, and runs each assignment by reporting
/// every step at once (the loss falls with the step) and then its end. The coordinator's
/// membership, scheduler and run actors are the real ones.
async fn stand_in(addr: SocketAddr, id: String, port: u16, log: Log) {
    let mut cluster = ClusterServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let registered = cluster
        .register(pb::RegisterRequest {
            worker_id: id.clone(),
            address: format!("127.0.0.1:{port}"),
            device_kind: "cpu".into(),
            flops_per_second: 1e10,
            cores: 1.0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let interval = std::time::Duration::from_millis(registered.heartbeat_interval_ms);
    let mut assignments = cluster
        .assignments(pb::WorkerId { id: id.clone() })
        .await
        .unwrap()
        .into_inner();
    let running = Arc::new(AtomicU64::new(0));
    let beating = {
        let (mut cluster, id, running) = (cluster.clone(), id.clone(), running.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(interval);
            loop {
                every.tick().await;
                let beat = pb::HeartbeatRequest {
                    worker_id: id.clone(),
                    run: running.load(Ordering::SeqCst),
                    ..Default::default()
                };
                if cluster.heartbeat(beat).await.is_err() {
                    return;
                }
            }
        })
    };
    tokio::spawn(async move {
        while let Some(Ok(a)) = assignments.next().await {
            if a.abandon {
                continue;
            }
            let (run, index, first) = (a.run, a.worker_index, a.first_step);
            log.lock().unwrap().push(Did::Took { run, index, first });
            running.store(run, Ordering::SeqCst);
            let report = |step: u64| pb::StepReport {
                run,
                worker_id: id.clone(),
                worker_index: index,
                replica: a.replica,
                step,
                loss: 5.0 / (step + 1) as f64,
                busy_secs: 0.001,
                wall_secs: 0.002,
                peak_activation_bytes: 100,
                ..Default::default()
            };
            // The job's TOML is the one source of its steps.
            let end_step = u64::from(JobSpec::from_toml(&a.job_toml).unwrap().training.steps);
            for step in a.first_step..end_step {
                cluster.report_step(report(step)).await.unwrap();
            }
            log.lock().unwrap().push(Did::Ended { run });
            let done = pb::StepReport {
                done: true,
                ..report(end_step)
            };
            cluster.report_step(done).await.unwrap();
            running.store(0, Ordering::SeqCst);
        }
        beating.abort();
    });
}

/// `n` stand-in workers `w0`, `w1`, … of the coordinator at `addr`, logging to `log`.
async fn stand_ins(addr: SocketAddr, n: u16, log: &Log) {
    for i in 0..n {
        stand_in(addr, format!("w{i}"), 20_000 + i, log.clone()).await;
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

async fn coordinator(dir: &std::path::Path) -> Coordinator {
    Coordinator::start_cluster("127.0.0.1:0".parse().unwrap(), dir, Unfinished::Resume)
        .await
        .unwrap()
}

/// Waits until job `id` ends (its watch stream ends), and returns its status.
async fn ended(jobs: &mut JobServiceClient<tonic::transport::Channel>, id: u64) -> pb::JobStatus {
    let mut events = jobs.watch_job(pb::JobId { id }).await.unwrap().into_inner();
    while events.next().await.is_some() {}
    jobs.get_job(pb::JobId { id }).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_specs_are_invalid_argument_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path()).await;
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
        // Sharding and recomputation where they mean nothing or cannot split.
        ("parallelism.data_parallel_shard_degree", |s| {
            s.parallelism.data_parallel_shard_degree = 0
        }),
        ("parallelism.data_parallel_shard_degree", |s| {
            s.parallelism.data_parallel_shard_degree = 2;
            s.compute = Compute::emulate(1.0, 1.0, 1.0);
        }),
        ("parallelism.zero_stage", |s| {
            s.parallelism.data_parallel_shard_degree = 2;
            s.parallelism.zero_stage = 3;
        }),
        // 8 sequences do not split into 3 sharded copies of microbatches of 1.
        ("training.global_batch_size", |s| {
            s.parallelism.data_parallel_shard_degree = 3
        }),
        ("activation_checkpoint.mode", |s| {
            s.activation_checkpoint.mode = "full".into();
            s.compute = Compute::emulate(1.0, 1.0, 1.0);
        }),
        ("activation_checkpoint.per_stage", |s| {
            s.activation_checkpoint.per_stage = vec!["none".into(), "selective".into()];
            s.compute = Compute::emulate(1.0, 1.0, 1.0);
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

/// On 4 workers, a 2-worker job runs first and a 4-worker job submitted behind it waits for
/// all of its workers, then runs; a watcher sees every step of it, a late watcher every
/// step of the first, and cancelling a finished job changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_queue_in_order_and_watchers_see_every_step() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path()).await;
    let log = Log::default();
    stand_ins(c.addr, 4, &log).await;
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
    assert_eq!(
        ended(&mut jobs, a.id).await.state,
        pb::JobState::Succeeded as i32
    );
    let list = jobs.list_jobs(pb::Empty {}).await.unwrap().into_inner();
    for job in &list.jobs {
        assert_eq!(job.state, pb::JobState::Succeeded as i32, "{job:?}");
        assert_eq!(job.step, job.steps);
    }
    // Every worker of the first job ended its part before the second took any of them.
    let did = log.lock().unwrap().clone();
    let last_end = did.iter().rposition(|d| *d == Did::Ended { run: a.id });
    let second_took = did
        .iter()
        .position(|d| matches!(d, Did::Took { run, .. } if *run == b.id));
    assert!(last_end < second_took, "{did:?}");
    assert_eq!(
        did.iter().filter(|d| matches!(d, Did::Took { .. })).count(),
        6,
        "{did:?}"
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

/// A restarted coordinator lists the jobs it had, and runs again the ones it had queued or
/// running, in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_coordinator_lists_its_jobs_and_runs_the_unfinished() {
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path()).await;
    let mut jobs = client(&c).await;
    let mut names = Vec::new();
    for (i, schedule) in ["1f1b", "zb-h1", "v-min"].iter().enumerate() {
        let mut spec = example(4, schedule);
        spec.job.name = format!("job-{i}");
        names.push(spec.job.name.clone());
        jobs.submit_job(request(&spec)).await.unwrap();
    }
    // No workers: the first job started and waits for them, the others are queued; one of
    // those is cancelled.
    let cancelled = jobs
        .cancel_job(pb::JobId { id: 2 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);
    c.shutdown().await;

    // Restarted, with workers: the jobs that had not finished are planned again and run, in
    // id order, from the start (no checkpoints), under run ids of a restart.
    let c = coordinator(dir.path()).await;
    let log = Log::default();
    stand_ins(c.addr, 4, &log).await;
    let mut jobs = client(&c).await;
    let list = jobs.list_jobs(pb::Empty {}).await.unwrap().into_inner();
    let listed: Vec<String> = list.jobs.iter().map(|j| j.name.clone()).collect();
    assert_eq!(listed, names);
    assert_eq!(list.jobs[1].state, pb::JobState::Cancelled as i32);
    for id in [1, 3] {
        let status = ended(&mut jobs, id).await;
        assert_eq!(status.state, pb::JobState::Succeeded as i32, "{status:?}");
    }
    let did = log.lock().unwrap().clone();
    let took: Vec<(u64, u64)> = did
        .iter()
        .filter_map(|d| match d {
            Did::Took { run, first, .. } => Some((job_of(*run), *first)),
            Did::Ended { .. } => None,
        })
        .collect();
    assert_eq!(took, [[(1, 0); 4], [(3, 0); 4]].concat(), "{did:?}");
    for d in &did {
        if let Did::Took { run, .. } = d {
            assert!(run_of(*run) > 0, "run {run} is not a restart's");
        }
    }
    c.shutdown().await;
}

/// An actor of the coordinator that dies stops the coordinator, visibly: it says why, and
/// its port no longer answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_actor_stops_the_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = coordinator(dir.path()).await;
    let mut jobs = client(&c).await;
    assert!(jobs.list_jobs(pb::Empty {}).await.is_ok());
    c.membership.kill();
    let why = tokio::time::timeout(std::time::Duration::from_secs(60), c.stopped())
        .await
        .expect("the coordinator stops");
    assert!(why.contains("membership actor"), "{why}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while jobs.list_jobs(pb::Empty {}).await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "still answering");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    c.shutdown().await;
}

/// A worker registering with an id or address no host could have is refused with the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_with_bad_or_taken_ids_are_refused() {
    use pipewise_proto::v1::cluster_service_client::ClusterServiceClient;
    let dir = tempfile::tempdir().unwrap();
    let c = coordinator(dir.path()).await;
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
