//! Emulated compute: a worker's program runs with sleeping passes and real frame buffers of
//! the model's activation size. These tests check the bookkeeping (passes, frames and their
//! bytes, stash peaks, failures), not timing: whether the measured bubble matches the
//! planned one is the `emulate` benchmark's question.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pipewise_common::job::{Compute, JobSpec, example};
use pipewise_common::model::DType as SpecDType;
use pipewise_common::pass::PassKind;
use pipewise_common::schedule::Schedule;
use pipewise_common::{Times, simulate};
use pipewise_worker::runtime::{
    EmulatedRuntime, Frame, LocalOptions, MemoryTransport, PassTime, Payload, Transport,
    run_emulated_local,
};
use pipewise_worker::{Error, Result};

/// 1 ms passes: fast tests, and long enough that a recorded pass time shorter than the
/// emulated one would be a bug, not noise.
const MS: f64 = 1e-3;

fn times() -> Times {
    Times {
        f: 2.0 * MS,
        b: 2.0 * MS,
        w: 1.0 * MS,
        comm: 0.0,
    }
}

fn job(workers: u32, schedule: &str, microbatch_size: u32) -> (JobSpec, Schedule) {
    let mut spec = example(workers, schedule);
    spec.parallelism.pipeline_parallel_microbatch_size = microbatch_size;
    spec.training.global_batch_size = 8 * microbatch_size;
    spec.compute = Compute::emulate(2.0, 2.0, 1.0);
    let plan = spec.validate().expect("valid job");
    (spec, plan.schedule)
}

/// Counts frames sent and their bytes, and checks each frame's size on the way.
struct Counting {
    inner: MemoryTransport,
    frames: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    wrong: Arc<AtomicU64>,
    expected_bytes: u64,
}

impl Transport for Counting {
    fn send(&self, to_worker: u32, frame: Frame) -> Result<()> {
        let bytes = frame.payload.byte_len();
        // Emulated compute sends byte buffers, never tensors.
        if !matches!(frame.payload, Payload::Buffer(_)) {
            self.wrong.fetch_add(1, Ordering::SeqCst);
        }
        self.frames.fetch_add(1, Ordering::SeqCst);
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        if bytes != self.expected_bytes {
            self.wrong.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.send(to_worker, frame)
    }

    fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: pipewise_worker::runtime::FrameKind,
        timeout: Duration,
    ) -> Result<Payload> {
        self.inner.recv(job, step, stage, mb, kind, timeout)
    }
}

/// Frames a schedule sends per step: every F whose next stage, and every B / BW whose
/// previous stage, is on another worker.
fn cross_worker_frames(schedule: &Schedule) -> u64 {
    let p = &schedule.placement;
    let last = p.stages() - 1;
    let mut n = 0;
    for (w, program) in schedule.workers.iter().enumerate() {
        for pass in program {
            let to = match pass.kind {
                PassKind::F if pass.stage < last => Some(pass.stage + 1),
                PassKind::B | PassKind::BW if pass.stage > 0 => Some(pass.stage - 1),
                _ => None,
            };
            if to.is_some_and(|s| p.worker_of(s) as usize != w) {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn emulated_steps_run_the_program_and_report_the_planned_peaks() {
    for schedule_name in ["v-half", "zb-h1", "1f1b"] {
        let (spec, schedule) = job(4, schedule_name, 1);
        let steps = 2;
        let reports = run_emulated_local(
            &schedule,
            &spec.model,
            1,
            spec.compute.times_secs(),
            steps,
            LocalOptions {
                timeout: Duration::from_secs(20),
                ..LocalOptions::default()
            },
        )
        .expect("emulated run");
        assert_eq!(reports.len(), steps as usize);
        let plan = spec.validate().unwrap();
        let predicted = plan.predicted_peak_bytes(&spec).unwrap();
        let rt = EmulatedRuntime::new(0, &schedule, &spec.model, 1, times()).unwrap();
        for step in &reports {
            assert_eq!(step.len(), 4);
            for (w, r) in step.iter().enumerate() {
                let program = &schedule.workers[w];
                let ran: Vec<_> = r.pass_times.iter().map(|t| t.pass).collect();
                assert_eq!(&ran, program, "{schedule_name} worker {w} ran its program");
                // A pass never ends early: each takes at least its emulated time.
                for &PassTime { pass, secs, .. } in &r.pass_times {
                    assert!(
                        secs >= rt.pass_secs(pass),
                        "{schedule_name}: {pass} took {secs} s, less than {}",
                        rt.pass_secs(pass)
                    );
                }
                let busy: f64 = r.pass_times.iter().map(|t| t.secs).sum();
                assert!((busy - r.busy_secs).abs() < 1e-9);
                let bubble = 1.0 - r.busy_secs / r.wall_secs;
                assert!(
                    (0.0..=1.0).contains(&bubble),
                    "{schedule_name} worker {w}: bubble {bubble}"
                );
                assert_eq!(r.loss, None, "nothing is learned");
                assert_eq!(
                    r.peak_stash_bytes, predicted[w],
                    "{schedule_name} worker {w}: the stash the real stages would hold"
                );
            }
        }
    }
}

#[test]
fn emulated_pass_times_follow_the_cost_model() {
    // V-Half has 2 chunks per worker: each chunk pass takes half the stage-of-1/d time.
    let (spec, schedule) = job(4, "v-half", 1);
    let rt = EmulatedRuntime::new(1, &schedule, &spec.model, 1, times()).unwrap();
    for &pass in rt.program() {
        let want = match pass.kind {
            PassKind::F => 1.0 * MS,
            PassKind::B => 1.0 * MS,
            PassKind::W => 0.5 * MS,
            PassKind::BW => 1.5 * MS,
        };
        assert!((rt.pass_secs(pass) - want).abs() < 1e-12, "{pass}");
    }
    let (spec, schedule) = job(4, "1f1b", 1);
    let rt = EmulatedRuntime::new(1, &schedule, &spec.model, 1, times()).unwrap();
    assert!(rt.program().iter().all(|&p| rt.pass_secs(p) >= 1.0 * MS));
    // The simulation the planner reports uses the same durations.
    let sim = simulate(
        &schedule,
        &pipewise_common::Costs::uniform(&schedule.placement, times()).unwrap(),
    )
    .unwrap();
    let busy: f64 = rt.program().iter().map(|&p| rt.pass_secs(p)).sum();
    assert!((sim.busy[1] - busy).abs() < 1e-12);
}

#[test]
fn frames_carry_the_true_activation_size() {
    for (dtype, microbatch_size) in [(SpecDType::F32, 1), (SpecDType::BF16, 2)] {
        let (mut spec, schedule) = job(4, "v-half", microbatch_size);
        spec.model.dtype = dtype;
        let m = &spec.model;
        let expected_bytes =
            u64::from(microbatch_size) * u64::from(m.seq_len) * u64::from(m.hidden) * dtype.bytes();
        let rt = EmulatedRuntime::new(0, &schedule, m, microbatch_size, times()).unwrap();
        assert_eq!(rt.frame_bytes(), expected_bytes);
        let frames = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let wrong = Arc::new(AtomicU64::new(0));
        let wrap = {
            let (frames, bytes, wrong) = (frames.clone(), bytes.clone(), wrong.clone());
            move |_w: u32, inner: MemoryTransport| -> Box<dyn Transport> {
                Box::new(Counting {
                    inner,
                    frames: frames.clone(),
                    bytes: bytes.clone(),
                    wrong: wrong.clone(),
                    expected_bytes,
                })
            }
        };
        let steps = 2;
        run_emulated_local(
            &schedule,
            m,
            microbatch_size,
            times(),
            steps,
            LocalOptions {
                timeout: Duration::from_secs(20),
                wrap: Some(&wrap),
                ..LocalOptions::default()
            },
        )
        .expect("emulated run");
        let per_step = cross_worker_frames(&schedule);
        assert!(per_step > 0);
        assert_eq!(frames.load(Ordering::SeqCst), steps * per_step);
        assert_eq!(
            wrong.load(Ordering::SeqCst),
            0,
            "{dtype:?}: a frame of another size"
        );
        assert_eq!(
            bytes.load(Ordering::SeqCst),
            steps * per_step * expected_bytes
        );
    }
}

/// Replaces every frame's buffer with one of the wrong shape.
struct Truncating(MemoryTransport);

impl Transport for Truncating {
    fn send(&self, to_worker: u32, mut frame: Frame) -> Result<()> {
        let Payload::Buffer(buffer) = &mut frame.payload else {
            panic!("emulated compute sends buffers");
        };
        let h = buffer.shape[2];
        buffer.shape[2] = 1;
        buffer.bytes = buffer.bytes.slice(..buffer.bytes.len() / h);
        self.0.send(to_worker, frame)
    }

    fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: pipewise_worker::runtime::FrameKind,
        timeout: Duration,
    ) -> Result<Payload> {
        self.0.recv(job, step, stage, mb, kind, timeout)
    }
}

#[test]
fn a_frame_of_the_wrong_size_fails_the_run_without_hanging() {
    let (spec, schedule) = job(4, "1f1b", 1);
    let wrap =
        |_w: u32, inner: MemoryTransport| -> Box<dyn Transport> { Box::new(Truncating(inner)) };
    let started = Instant::now();
    let err = run_emulated_local(
        &schedule,
        &spec.model,
        1,
        times(),
        2,
        LocalOptions {
            timeout: Duration::from_secs(30),
            wrap: Some(&wrap),
            ..LocalOptions::default()
        },
    )
    .expect_err("a truncated frame is refused");
    assert!(
        matches!(&err, Error::InvalidArgument { field: "frame", reason } if reason.contains("expected")),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopped at once"
    );
}

#[test]
fn a_program_that_is_not_the_workers_is_refused() {
    let (spec, schedule) = job(4, "1f1b", 1);
    let other = schedule.workers[1].clone();
    let partition = spec.model.even_split(4).unwrap();
    let err = EmulatedRuntime::from_program(
        0,
        &schedule.placement,
        schedule.microbatches,
        other,
        &spec.model,
        1,
        &partition,
        times(),
    )
    .expect_err("worker 1's program on worker 0");
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                field: "program",
                ..
            }
        ),
        "{err}"
    );
    let err = EmulatedRuntime::new(0, &schedule, &spec.model, 1, Times { f: -1.0, ..times() })
        .expect_err("negative times");
    assert!(matches!(err, Error::Spec(_)), "{err}");
}
