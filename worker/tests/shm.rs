//! The shared-memory tier between two transports of one process (and one of a child
//! process): frames of every kind, dtype and size, bit-exact, larger ones streamed through a
//! small ring; a job trained over shared memory has the losses it has over gRPC; a peer's
//! death fails `recv` at once.

#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pipewise_common::generate::ScheduleKind;
use pipewise_worker::net::{Delivery, GrpcConfig, GrpcTransport, Tier};
use pipewise_worker::runtime::{
    Buffer, Frame, FrameKind, LocalOptions, MemoryTransport, Payload, Transport, run_local,
};
use pipewise_worker::{CandleDType, Device, Result as WorkerResult, Tensor};

use common::reference::{SEED, adamw};

const JOB: u64 = 7;
const WAIT: Duration = Duration::from_secs(30);

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Two transports of job [`JOB`] whose peers are each other over `tier` (worker 0 holds
/// stages 0 and 3, worker 1 stages 1 and 2), with rings of `ring_bytes`.
fn pair(
    tier: Tier,
    ring_bytes: usize,
) -> Result<(GrpcTransport, GrpcTransport), Box<dyn std::error::Error>> {
    let start = |stages: [u32; 2]| {
        let mut config = GrpcConfig::new(JOB, stages);
        config.shm_ring_bytes = ring_bytes;
        GrpcTransport::start(config)
    };
    let (a, b) = (start([0, 3])?, start([1, 2])?);
    let (at_a, at_b) = (a.local_addr().to_string(), b.local_addr().to_string());
    let peers = [(0, at_a.as_str(), tier), (1, at_b.as_str(), tier)];
    a.set_peers_with_tiers(JOB, 0, peers)?;
    b.set_peers_with_tiers(JOB, 1, peers)?;
    Ok((a, b))
}

/// Deterministic values with signs, zeros of both signs, subnormals and infinities.
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
            match i % 11 {
                0 => -0.0,
                1 => f32::MIN_POSITIVE / 8.0,
                2 => f32::NEG_INFINITY,
                3 => f32::NAN,
                _ => (x as f32 / u32::MAX as f32 - 0.5) * 1e3,
            }
        })
        .collect()
}

/// The bytes of a tensor's elements as they are stored.
fn raw(t: &Tensor) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    Ok(match t.dtype() {
        CandleDType::F32 => t
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        CandleDType::F16 => t
            .flatten_all()?
            .to_vec1::<half::f16>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        _ => t
            .flatten_all()?
            .to_vec1::<half::bf16>()?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    })
}

fn frame(step: u64, stage: u32, mb: u32, kind: FrameKind, payload: Payload) -> Frame {
    Frame {
        job: JOB,
        step,
        stage,
        mb,
        kind,
        payload,
    }
}

#[test]
fn frames_of_every_kind_dtype_and_size_cross_bit_exactly() -> TestResult {
    // A 64 KiB ring: the 1 MiB tensors stream through it in many pieces.
    let (a, b) = pair(Tier::Shm, 64 << 10)?;
    assert_eq!(
        (a.tier_of(1), b.tier_of(0)),
        (Some(Tier::Shm), Some(Tier::Shm))
    );
    let shapes: [&[usize]; 7] = [
        &[],
        &[0, 4],
        &[5],
        &[3, 1, 7],
        &[2, 3, 4, 8],
        &[64, 257],
        &[256, 1024],
    ];
    let dtypes = [CandleDType::F32, CandleDType::F16, CandleDType::BF16];
    let mut sent = Vec::new();
    for (mb, (shape, dtype)) in shapes
        .iter()
        .flat_map(|s| dtypes.iter().map(move |d| (*s, *d)))
        .enumerate()
    {
        let mb = mb as u32;
        let n = shape.iter().product::<usize>();
        let t = Tensor::from_vec(values(n, mb), shape, &Device::Cpu)?.to_dtype(dtype)?;
        // Forward: worker 0 → stage 1 on worker 1; backward: worker 1 → stage 0 on worker 0.
        a.send(
            1,
            frame(3, 1, mb, FrameKind::Activation, Payload::Tensor(t.clone())),
        )?;
        b.send(
            0,
            frame(3, 0, mb, FrameKind::Gradient, Payload::Tensor(t.clone())),
        )?;
        sent.push((mb, t));
    }
    for (mb, t) in sent.iter().rev() {
        let at_b = b.recv(JOB, 3, 1, *mb, FrameKind::Activation, WAIT)?;
        let at_a = a.recv(JOB, 3, 0, *mb, FrameKind::Gradient, WAIT)?;
        for got in [at_b, at_a] {
            let Payload::Tensor(got) = got else {
                panic!("mb {mb}: a buffer from a transport that delivers tensors");
            };
            assert_eq!((got.dims(), got.dtype()), (t.dims(), t.dtype()), "mb {mb}");
            assert_eq!(raw(&got)?, raw(t)?, "mb {mb}");
        }
    }
    let stats = b.stats();
    assert_eq!(
        (stats.accepted_frames, stats.rejected_frames, stats.queued),
        (sent.len() as u64, 0, 0)
    );
    assert!(a.take_errors().is_empty() && b.take_errors().is_empty());
    Ok(())
}

#[test]
fn buffers_cross_as_bytes_and_foreign_frames_are_refused() -> TestResult {
    let (a, b) = pair(Tier::Shm, 4096)?;
    b.assign(JOB, [1, 2], Delivery::Buffers);
    let bytes: Vec<u8> = (0..100_003u32 * 2).map(|i| (i * 7 + 1) as u8).collect();
    let buffer = Buffer {
        dtype: CandleDType::BF16,
        shape: vec![100_003],
        bytes: bytes.clone().into(),
    };
    a.send(
        1,
        frame(0, 1, 0, FrameKind::Activation, Payload::Buffer(buffer)),
    )?;
    // Stage 0 is not worker 1's: refused, and `recv` of it fails at once.
    let small = Buffer::filled(CandleDType::F32, &[4], 1);
    a.send(
        1,
        frame(
            0,
            0,
            1,
            FrameKind::Activation,
            Payload::Buffer(small.clone()),
        ),
    )?;
    // A frame after the refused one still arrives: the ring stays in step.
    a.send(
        1,
        frame(0, 2, 2, FrameKind::Gradient, Payload::Buffer(small)),
    )?;
    let Payload::Buffer(got) = b.recv(JOB, 0, 1, 0, FrameKind::Activation, WAIT)? else {
        panic!("a tensor from a transport that delivers buffers");
    };
    assert_eq!(
        (got.dtype, got.shape.as_slice()),
        (CandleDType::BF16, &[100_003][..])
    );
    assert!(got.bytes == bytes);
    assert!(matches!(
        b.recv(JOB, 0, 2, 2, FrameKind::Gradient, WAIT)?,
        Payload::Buffer(b) if b.bytes.len() == 16
    ));
    let started = Instant::now();
    let refused = b.recv(JOB, 0, 0, 1, FrameKind::Activation, WAIT);
    let message = format!("{:?}", refused.err());
    assert!(message.contains("TensorFrame.stage"), "{message}");
    assert!(started.elapsed() < WAIT / 2);
    Ok(())
}

#[test]
fn each_pair_gets_its_own_tier() -> TestResult {
    let (a, b) = pair(Tier::Grpc, 4096)?;
    assert_eq!(
        (a.tier_of(1), b.tier_of(0)),
        (Some(Tier::Grpc), Some(Tier::Grpc))
    );
    // This worker itself is never sent to over shared memory.
    let at_a = a.local_addr().to_string();
    a.set_peers_with_tiers(JOB + 1, 0, [(0, at_a.as_str(), Tier::Shm)])?;
    assert_eq!(a.tier_of(0), Some(Tier::Grpc));
    assert_eq!(a.tier_of(1), None);
    drop(b);
    Ok(())
}

/// Worker `w`'s transport as `run_local` takes it.
struct Shared(Arc<GrpcTransport>);

impl Transport for Shared {
    fn send(&self, to_worker: u32, frame: Frame) -> WorkerResult<()> {
        self.0.send(to_worker, frame)
    }

    fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: FrameKind,
        timeout: Duration,
    ) -> WorkerResult<Payload> {
        self.0.recv(job, step, stage, mb, kind, timeout)
    }
}

/// The losses of 3 steps of 1F1B on 3 workers whose frames travel over `tier` (`None`: the
/// in-process mailboxes).
fn losses_over(tier: Option<Tier>) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let spec = common::small_spec(3);
    let data = common::step_batches(&spec, 3, 4)?;
    let schedule = common::reference::schedule(ScheduleKind::OneFOneB, 3, 1, 4);
    let transports = match tier {
        Some(tier) => {
            let transports = (0..3u32)
                .map(|w| {
                    let mut config = GrpcConfig::new(JOB, schedule.placement.stages_of(w));
                    config.shm_ring_bytes = 64 << 10;
                    GrpcTransport::start(config).map(Arc::new)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let addresses: Vec<String> = transports
                .iter()
                .map(|t| t.local_addr().to_string())
                .collect();
            for (w, t) in transports.iter().enumerate() {
                let peers = addresses
                    .iter()
                    .enumerate()
                    .map(|(p, a)| (p as u32, a.as_str(), tier));
                t.set_peers_with_tiers(JOB, w as u32, peers)?;
            }
            transports
        }
        None => Vec::new(),
    };
    let handles = transports.clone();
    let wrap = move |w: u32, inner: MemoryTransport| -> Box<dyn Transport> {
        match handles.get(w as usize) {
            Some(t) => Box::new(Shared(Arc::clone(t))),
            None => Box::new(inner),
        }
    };
    let options = LocalOptions {
        job: JOB,
        wrap: Some(&wrap),
        ..LocalOptions::default()
    };
    let run = run_local(
        &schedule,
        &spec,
        SEED,
        adamw(),
        &Device::Cpu,
        &data,
        options,
    )?;
    for t in &transports {
        assert!(t.take_errors().is_empty());
        assert!(
            t.stats().accepted_frames > 0,
            "frames went through the transport"
        );
    }
    Ok(run.losses)
}

#[test]
fn a_job_over_shared_memory_has_the_losses_it_has_over_grpc() -> TestResult {
    let over_shm = losses_over(Some(Tier::Shm))?;
    let over_grpc = losses_over(Some(Tier::Grpc))?;
    let in_memory = losses_over(None)?;
    assert_eq!(over_shm.len(), 3);
    // Every transport carries the bits unchanged, so the losses are equal, not close.
    assert_eq!(over_shm, over_grpc);
    assert_eq!(over_shm, in_memory);
    Ok(())
}

/// The child process of [`a_dead_peer_process_fails_recv_at_once`]: sends one frame to the
/// parent over shared memory and aborts (no destructor runs, the ring is not closed).
#[test]
fn child_sender_that_dies() -> TestResult {
    let Ok(parent) = std::env::var("PIPEWISE_SHM_TEST_PARENT") else {
        return Ok(()); // Run as a test of its own: nothing to do.
    };
    let a = GrpcTransport::start(GrpcConfig::new(JOB, [0]))?;
    let own = a.local_addr().to_string();
    a.set_peers_with_tiers(
        JOB,
        0,
        [
            (0, own.as_str(), Tier::Shm),
            (1, parent.as_str(), Tier::Shm),
        ],
    )?;
    let t = Tensor::from_vec(values(1000, 1), &[1000], &Device::Cpu)?;
    a.send(1, frame(0, 1, 0, FrameKind::Activation, Payload::Tensor(t)))?;
    // The sender thread has written the frame once the parent has it; the parent says so by
    // removing the file it named.
    let flag = std::env::var("PIPEWISE_SHM_TEST_FLAG")?;
    let deadline = Instant::now() + WAIT;
    while std::path::Path::new(&flag).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::process::abort();
}

/// Whether a file named `prefix…` in `/dev/shm` is a ring whose consumer is gone.
fn stale_from_dead_consumers(prefix: &str) -> Result<bool, Box<dyn std::error::Error>> {
    for entry in std::fs::read_dir("/dev/shm")?.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let bytes = std::fs::read(entry.path()).unwrap_or_default();
        let Some(pid) = bytes.get(136..140) else {
            continue;
        };
        let pid = u32::from_le_bytes(pid.try_into()?);
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Ok(true);
        }
    }
    Ok(false)
}

#[test]
fn a_dead_peer_process_fails_recv_at_once() -> TestResult {
    let b = GrpcTransport::start(GrpcConfig::new(JOB, [1]))?;
    let own = b.local_addr().to_string();
    // The child's address is never dialled: this side sends nothing.
    b.set_peers_with_tiers(
        JOB,
        1,
        [(0, "127.0.0.1:9", Tier::Shm), (1, own.as_str(), Tier::Shm)],
    )?;
    let flag = std::env::temp_dir().join(format!("pipewise-shm-test-{}", std::process::id()));
    std::fs::write(&flag, b"")?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "child_sender_that_dies",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PIPEWISE_SHM_TEST_PARENT", &own)
        .env("PIPEWISE_SHM_TEST_FLAG", &flag)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let got = b.recv(JOB, 0, 1, 0, FrameKind::Activation, WAIT);
    std::fs::remove_file(&flag)?;
    assert!(got.is_ok(), "the child's frame: {:?}", got.err());
    let status = child.wait()?;
    assert!(!status.success(), "the child aborts");
    // Its next frame cannot come: `recv` fails once the ring sees the pid gone, long before
    // the timeout.
    let started = Instant::now();
    let next = b.recv(JOB, 0, 1, 1, FrameKind::Activation, WAIT);
    let message = format!("{:?}", next.err());
    assert!(message.contains("died"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The child's ring from this side (never mapped here) outlived it: the next ring
    // created removes it.
    let _fresh = pair(Tier::Shm, 4096)?;
    if std::path::Path::new("/dev/shm").is_dir() {
        let childs = format!("pipewise-{JOB:x}-1-to-0-");
        assert!(!stale_from_dead_consumers(&childs)?);
    }
    Ok(())
}
