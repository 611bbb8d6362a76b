//! The gRPC activation transport on loopback: bit-exact exchange of several dtypes and
//! shapes, whole and in chunks, rejection of malformed frames and chunk sequences (with
//! `recv` failing fast), and a 64 MiB frame.

use std::time::{Duration, Instant};

use pipewise_proto::v1::activation_service_client::ActivationServiceClient;
use pipewise_proto::v1::{self, TensorFrame};
use pipewise_worker::net::{Delivery, GrpcConfig, GrpcTransport};
use pipewise_worker::runtime::{Buffer, Frame, FrameKind, Payload, Replica, Transport};
use pipewise_worker::{CandleDType, Device, Tensor};

const JOB: u64 = 7;
const WAIT: Duration = Duration::from_secs(30);

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Worker 0 holds stages 0 and 3, worker 1 holds stages 1 and 2 (a V over two workers).
fn pair() -> Result<(GrpcTransport, GrpcTransport), Box<dyn std::error::Error>> {
    let a = GrpcTransport::start(GrpcConfig::new(JOB, [0, 3]))?;
    let b = GrpcTransport::start(GrpcConfig::new(JOB, [1, 2]))?;
    a.set_peer(1, b.local_addr().to_string())?;
    b.set_peer(0, a.local_addr().to_string())?;
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
                _ => (x as f32 / u32::MAX as f32 - 0.5) * 1e3,
            }
        })
        .collect()
}

fn bits(t: &Tensor) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    // f16 and bf16 widen to f32 exactly, so equal f32 bits mean equal bits.
    Ok(t.to_dtype(CandleDType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .map(|x| x.to_bits())
        .collect())
}

fn frame(step: u64, stage: u32, mb: u32, kind: FrameKind, tensor: Tensor) -> Frame {
    Frame {
        job: JOB,
        step,
        stage,
        mb,
        kind,
        payload: Payload::Tensor(tensor),
    }
}

/// The tensor of a payload the transport delivers as a tensor (its default).
fn tensor_of(payload: Payload) -> Tensor {
    match payload {
        Payload::Tensor(t) => t,
        Payload::Buffer(_) => panic!("a buffer from a transport that delivers tensors"),
    }
}

/// Polls `done` every 20 ms until it holds; fails the test, saying `what` it waited for,
/// after [`WAIT`].
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "waited in vain for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn exchanges_frames_bit_exactly() -> TestResult {
    let (a, b) = pair()?;
    let shapes: [&[usize]; 5] = [&[], &[5], &[2, 3], &[2, 4, 8], &[3, 1, 7, 2]];
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
        a.send(1, frame(3, 1, mb, FrameKind::Activation, t.clone()))?;
        b.send(0, frame(3, 0, mb, FrameKind::Gradient, t.clone()))?;
        sent.push((mb, t));
    }
    // Receive in reverse order: the mailbox is keyed, not a queue.
    for (mb, t) in sent.iter().rev() {
        let at_b = tensor_of(b.recv(JOB, 3, 1, *mb, FrameKind::Activation, WAIT)?);
        let at_a = tensor_of(a.recv(JOB, 3, 0, *mb, FrameKind::Gradient, WAIT)?);
        for got in [at_b, at_a] {
            assert_eq!(got.dims(), t.dims(), "mb {mb}");
            assert_eq!(got.dtype(), t.dtype(), "mb {mb}");
            assert_eq!(bits(&got)?, bits(t)?, "mb {mb}");
        }
    }
    assert_eq!(b.stats().accepted_frames, sent.len() as u64);
    assert_eq!(b.stats().queued, 0);
    assert!(a.take_errors().is_empty() && b.take_errors().is_empty());
    Ok(())
}

#[test]
fn chunked_frames_arrive_bit_exactly() -> TestResult {
    // Chunks of 1000 bytes: f32 chunks of 250 elements, f16/bf16 of 500, ragged ends.
    let mut config_a = GrpcConfig::new(JOB, [0, 3]);
    config_a.chunk_bytes = 1000;
    let a = GrpcTransport::start(config_a)?;
    let b = GrpcTransport::start(GrpcConfig::new(JOB, [1, 2]))?;
    a.set_peer(1, b.local_addr().to_string())?;
    let mut sent = Vec::new();
    for (mb, dtype) in [CandleDType::F32, CandleDType::F16, CandleDType::BF16]
        .into_iter()
        .enumerate()
    {
        for (i, n) in [0usize, 1, 250, 251, 4097].into_iter().enumerate() {
            let mb = (mb * 10 + i) as u32;
            let t = Tensor::from_vec(values(n, mb), n, &Device::Cpu)?.to_dtype(dtype)?;
            a.send(1, frame(0, 1, mb, FrameKind::Activation, t.clone()))?;
            sent.push((mb, t));
        }
    }
    for (mb, t) in &sent {
        let got = tensor_of(b.recv(JOB, 0, 1, *mb, FrameKind::Activation, WAIT)?);
        assert_eq!(got.dims(), t.dims(), "mb {mb}");
        assert_eq!(got.dtype(), t.dtype(), "mb {mb}");
        assert_eq!(bits(&got)?, bits(t)?, "mb {mb}");
    }
    let stats = b.stats();
    assert_eq!(stats.accepted_frames, sent.len() as u64);
    let bytes: usize = sent
        .iter()
        .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
        .sum();
    assert_eq!(stats.accepted_bytes, bytes as u64);
    assert!(a.take_errors().is_empty(), "{:?}", a.take_errors());
    Ok(())
}

#[test]
fn broken_chunk_sequences_are_rejected_and_recv_fails_fast() -> TestResult {
    let (_a, b) = pair()?;
    let rt = tokio::runtime::Runtime::new()?;
    let addr = b.local_addr();
    // A 4 x 4 f32 tensor (64 bytes) in chunks of 16 bytes.
    let chunk = |mb: u32, offset: u64| {
        let mut c = good_frame(0, 1, mb);
        c.shape = vec![4, 4];
        c.offset = offset;
        c
    };
    let cases: [(&str, Vec<TensorFrame>, &str); 4] = [
        (
            "ends mid-tensor",
            vec![chunk(0, 0), chunk(0, 16)],
            "TensorFrame.data",
        ),
        ("gap", vec![chunk(1, 0), chunk(1, 32)], "TensorFrame.offset"),
        ("no first chunk", vec![chunk(2, 16)], "TensorFrame.offset"),
        (
            "interleaved",
            vec![chunk(3, 0), chunk(4, 0)],
            "TensorFrame.data",
        ),
    ];
    for (what, frames, field) in cases {
        let mbs: std::collections::BTreeSet<u32> = frames.iter().map(|f| f.mb).collect();
        let (code, message) = raw_send(&rt, addr, frames)?;
        assert_eq!(code, tonic::Code::InvalidArgument, "{what}: {message}");
        assert!(message.contains(field), "{what}: {message}");
        // Every tensor the broken sequence named fails at once instead of waiting.
        for mb in mbs {
            let start = Instant::now();
            let err = b
                .recv(JOB, 0, 1, mb, FrameKind::Activation, WAIT)
                .expect_err("a broken tensor must not be delivered");
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{what}: recv waited"
            );
            assert!(err.to_string().contains("rejected"), "{what}: {err}");
        }
    }
    // The same chunks in order are accepted.
    let whole = (0..4).map(|i| chunk(9, 16 * i)).collect();
    let (code, message) = raw_send(&rt, addr, whole)?;
    assert_eq!(code, tonic::Code::Ok, "{message}");
    assert_eq!(
        b.recv(JOB, 0, 1, 9, FrameKind::Activation, WAIT)?.dims(),
        &[4, 4]
    );
    // A tensor larger than the receiver's limit is refused before it is allocated.
    let mut huge = good_frame(0, 1, 10);
    huge.shape = vec![1 << 40];
    let (code, message) = raw_send(&rt, addr, vec![huge])?;
    assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
    assert!(message.contains("TensorFrame.shape"), "{message}");
    Ok(())
}

#[test]
fn recv_times_out_with_a_clear_error() -> TestResult {
    let (_a, b) = pair()?;
    let start = Instant::now();
    let err = b
        .recv(
            JOB,
            0,
            1,
            0,
            FrameKind::Activation,
            Duration::from_millis(200),
        )
        .expect_err("nothing was sent");
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert!(err.to_string().contains("timed out"), "{err}");
    let err = b
        .recv(JOB + 1, 0, 1, 0, FrameKind::Activation, WAIT)
        .expect_err("wrong job");
    assert!(err.to_string().contains("job"), "{err}");
    Ok(())
}

fn good_frame(step: u64, stage: u32, mb: u32) -> TensorFrame {
    TensorFrame {
        run: JOB,
        step,
        stage,
        mb,
        kind: v1::FrameKind::Activation as i32,
        dtype: v1::Dtype::F32 as i32,
        shape: vec![2, 2],
        data: vec![0u8; 16].into(),
        offset: 0,
        run_secret: Default::default(),
    }
}

/// Sends `frames` on one raw client stream and returns the call's status code and message.
fn raw_send(
    rt: &tokio::runtime::Runtime,
    addr: std::net::SocketAddr,
    frames: Vec<TensorFrame>,
) -> Result<(tonic::Code, String), Box<dyn std::error::Error>> {
    rt.block_on(async move {
        let mut client = ActivationServiceClient::connect(format!("http://{addr}")).await?;
        let out = match client.send(tokio_stream::iter(frames)).await {
            Ok(ack) => (tonic::Code::Ok, format!("{:?}", ack.into_inner())),
            Err(status) => (status.code(), status.message().to_string()),
        };
        Ok(out)
    })
}

#[test]
fn malformed_frames_are_rejected_and_recv_fails_fast() -> TestResult {
    let (a, b) = pair()?;
    let rt = tokio::runtime::Runtime::new()?;
    let addr = b.local_addr();
    let mut short = good_frame(0, 1, 0);
    short.data = vec![0u8; 12].into();
    let mut wrong_job = good_frame(0, 1, 1);
    wrong_job.run = JOB + 1;
    let unknown_stage = good_frame(0, 5, 2);
    let mut no_dtype = good_frame(0, 1, 3);
    no_dtype.dtype = 0;
    let mut bad_kind = good_frame(0, 1, 4);
    bad_kind.kind = 9;
    let cases = [
        (short, "TensorFrame.data", FrameKind::Activation),
        (wrong_job, "TensorFrame.run", FrameKind::Activation),
        (unknown_stage, "TensorFrame.stage", FrameKind::Activation),
        (no_dtype, "TensorFrame.dtype", FrameKind::Activation),
        (bad_kind, "TensorFrame.kind", FrameKind::Gradient),
    ];
    for (bad, field, kind) in cases {
        let (step, stage, mb) = (bad.step, bad.stage, bad.mb);
        let foreign = bad.run != JOB;
        let (code, message) = raw_send(&rt, addr, vec![bad])?;
        assert_eq!(code, tonic::Code::InvalidArgument, "{field}: {message}");
        assert!(message.contains(field), "{field}: {message}");
        if foreign {
            // Another job's frame (e.g. a late one of the job before) does not fail this
            // job's key: the right frame for it is still delivered.
            let (code, message) = raw_send(&rt, addr, vec![good_frame(step, stage, mb)])?;
            assert_eq!(code, tonic::Code::Ok, "{message}");
            assert_eq!(b.recv(JOB, step, stage, mb, kind, WAIT)?.dims(), &[2, 2]);
            continue;
        }
        let start = Instant::now();
        let err = b
            .recv(JOB, step, stage, mb, kind, WAIT)
            .expect_err("a rejected frame must not be delivered");
        assert!(start.elapsed() < Duration::from_secs(2), "recv waited");
        assert!(err.to_string().contains(field), "{err}");
    }
    // A duplicate is rejected, and the first copy is still delivered.
    let (code, message) = raw_send(&rt, addr, vec![good_frame(1, 1, 0), good_frame(1, 1, 0)])?;
    assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
    assert!(message.contains("duplicate"), "{message}");
    let t = b.recv(JOB, 1, 1, 0, FrameKind::Activation, WAIT)?;
    assert_eq!(t.dims(), &[2, 2]);
    assert_eq!(b.stats().rejected_frames, 6);

    // Through the transport: a frame for a stage the receiver does not hold is reported
    // on the sending side, and the sender keeps working for later frames.
    let t = Tensor::zeros((2, 2), CandleDType::F32, &Device::Cpu)?;
    a.send(1, frame(2, 9, 0, FrameKind::Activation, t.clone()))?;
    let deadline = Instant::now() + WAIT;
    let errors = loop {
        let errors = a.take_errors();
        if !errors.is_empty() || Instant::now() > deadline {
            break errors;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        errors
            .iter()
            .any(|e| e.contains("InvalidArgument") && e.contains("TensorFrame.stage")),
        "{errors:?}"
    );
    a.send(1, frame(2, 1, 0, FrameKind::Activation, t))?;
    b.recv(JOB, 2, 1, 0, FrameKind::Activation, WAIT)?;

    // Frames of steps far from the one the receiver is at (2) are refused (a junk step such
    // as u64::MAX used to be queued, and to end duplicate detection for the real ones).
    for step in [u64::MAX, 5, 0] {
        let (code, message) = raw_send(&rt, addr, vec![good_frame(step, 1, 7)])?;
        assert_eq!(code, tonic::Code::InvalidArgument, "{message}");
        assert!(
            message.contains("not near this worker's step 2"),
            "{message}"
        );
    }
    // Refused unread, such a frame does not fail its key when the receiver gets there:
    // the right frame for it is still delivered.
    for step in [4, 5] {
        let (code, message) = raw_send(&rt, addr, vec![good_frame(step, 1, 7)])?;
        assert_eq!(code, tonic::Code::Ok, "step {step}: {message}");
        assert_eq!(
            b.recv(JOB, step, 1, 7, FrameKind::Activation, WAIT)?.dims(),
            &[2, 2]
        );
    }
    Ok(())
}

#[test]
fn sender_reconnects_to_a_late_peer() -> TestResult {
    let a = GrpcTransport::start(GrpcConfig::new(JOB, [0]))?;
    // Reserve a port, free it, and start the receiver there only after the first send.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    a.set_peer(1, port.to_string())?;
    let t = Tensor::from_vec(values(64, 1), (8, 8), &Device::Cpu)?;
    a.send(1, frame(0, 1, 0, FrameKind::Activation, t.clone()))?;
    // The receiver starts once a connection attempt has failed: the frame waits for it.
    let deadline = Instant::now() + WAIT;
    while a.take_errors().is_empty() {
        assert!(Instant::now() < deadline, "no connection attempt failed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut config = GrpcConfig::new(JOB, [1]);
    config.listen = port;
    let b = GrpcTransport::start(config)?;
    let got = tensor_of(b.recv(JOB, 0, 1, 0, FrameKind::Activation, WAIT)?);
    assert_eq!(bits(&got)?, bits(&t)?);
    Ok(())
}

/// A peer restarted at its address (a pod restarted in place) gets none of the frames queued
/// for it in the abandoned run: the next run's peers start afresh. Those frames used to go
/// first, were refused, and failed the call that carried the new run's frames too (CI saw a
/// re-planned run wait 60 s for an activation that was sent).
#[test]
fn a_peer_restarted_at_its_address_gets_only_the_new_runs_frames() -> TestResult {
    const NEXT: u64 = JOB + (1 << 48);
    let a = GrpcTransport::start(GrpcConfig::new(JOB, [0]))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    a.set_peers(JOB, [(1, port.to_string().as_str())])?;
    let t = Tensor::from_vec(values(64, 5), (8, 8), &Device::Cpu)?;
    // Nothing listens there: the run's frames stay queued.
    for mb in 0..4 {
        a.send(1, frame(3, 1, mb, FrameKind::Activation, t.clone()))?;
    }
    let deadline = Instant::now() + WAIT;
    while a.take_errors().is_empty() {
        assert!(Instant::now() < deadline, "no connection attempt failed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut config = GrpcConfig::new(NEXT, [1]);
    config.listen = port;
    let b = GrpcTransport::start(config)?;
    a.set_peers(NEXT, [(1, port.to_string().as_str())])?;
    for mb in 0..4 {
        let f = frame(3, 1, mb, FrameKind::Activation, (&t * f64::from(mb))?);
        a.send(1, Frame { job: NEXT, ..f })?;
    }
    for mb in 0..4 {
        let got = tensor_of(b.recv(NEXT, 3, 1, mb, FrameKind::Activation, WAIT)?);
        assert_eq!(bits(&got)?, bits(&(&t * f64::from(mb))?)?);
    }
    // The old run's task gives up after its back-off without sending: once it has ended,
    // only the next run's peer task runs, and no frame of the old run reached b.
    wait_until("the old run's peer task to end", || a.peer_tasks() == 1);
    assert_eq!(
        b.stats().rejected_frames,
        0,
        "the old run's frames reached it"
    );
    Ok(())
}

#[test]
fn sixty_four_mib_frame_passes() -> TestResult {
    let (a, b) = pair()?;
    let n = 16 << 20; // 16 Mi f32 = 64 MiB
    let t = Tensor::from_vec(values(n, 3), (16, 1024, 1024), &Device::Cpu)?;
    let start = Instant::now();
    a.send(1, frame(0, 1, 0, FrameKind::Activation, t.clone()))?;
    let got = tensor_of(b.recv(
        JOB,
        0,
        1,
        0,
        FrameKind::Activation,
        Duration::from_secs(120),
    )?);
    let elapsed = start.elapsed();
    assert_eq!(got.dims(), t.dims());
    assert_eq!(bits(&got)?, bits(&t)?);
    assert_eq!(b.stats().accepted_bytes, 64 << 20);
    println!("64 MiB frame in {:.1} ms", elapsed.as_secs_f64() * 1e3);
    Ok(())
}

/// Emulated compute's byte buffers cross gRPC as they are, in one chunk and in several, and
/// a transport assigned to deliver buffers hands a sent tensor over as its wire bytes.
#[test]
fn buffers_cross_as_bytes() -> TestResult {
    let a = GrpcTransport::start(GrpcConfig::new(JOB, [0]))?;
    let mut config = GrpcConfig::new(JOB, [1]);
    config.delivery = Delivery::Buffers;
    let b = GrpcTransport::start(config)?;
    a.set_peer(1, b.local_addr().to_string())?;
    // 16 KiB (one chunk, delivered as the slice that carried it) and 3 MiB (three 1 MiB
    // chunks, joined into one buffer).
    for (mb, elements) in [(0u32, 4096usize), (1, 3 << 18)] {
        let bytes: Vec<u8> = values(elements, mb)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let sent = Buffer {
            dtype: CandleDType::F32,
            shape: vec![1, elements],
            bytes: bytes.clone().into(),
        };
        a.send(
            1,
            Frame {
                job: JOB,
                step: 0,
                stage: 1,
                mb,
                kind: FrameKind::Activation,
                payload: Payload::Buffer(sent),
            },
        )?;
        let Payload::Buffer(got) = b.recv(JOB, 0, 1, mb, FrameKind::Activation, WAIT)? else {
            panic!("b delivers buffers");
        };
        assert_eq!(got.shape, vec![1, elements]);
        assert_eq!(got.dtype, CandleDType::F32);
        assert_eq!(&got.bytes[..], &bytes[..]);
    }
    let t = Tensor::from_vec(values(5000, 9), (5, 1000), &Device::Cpu)?;
    a.send(1, frame(0, 1, 7, FrameKind::Activation, t.clone()))?;
    let got = b.recv(JOB, 0, 1, 7, FrameKind::Activation, WAIT)?;
    assert!(matches!(got, Payload::Buffer(_)));
    let got = got.into_tensor(&Device::Cpu)?;
    assert_eq!(got.dims(), t.dims());
    assert_eq!(bits(&got)?, bits(&t)?);
    Ok(())
}

/// A peer that cannot be reached is retried only while the transport has it: once a new
/// assignment's peers leave it out, its connection attempts end (a dead worker's address
/// used to be retried every 2 s through every later job).
#[test]
fn a_dropped_peer_stops_being_retried() -> TestResult {
    let a = GrpcTransport::start(GrpcConfig::new(JOB, [0]))?;
    // Nothing listens on port 1: every connection attempt fails.
    a.set_peers(JOB, [(1, "127.0.0.1:1")])?;
    let t = Tensor::from_vec(values(4, 0), (1, 4), &Device::Cpu)?;
    a.send(1, frame(0, 1, 0, FrameKind::Activation, t))?;
    let deadline = Instant::now() + WAIT;
    while a.take_errors().is_empty() {
        assert!(Instant::now() < deadline, "no connection attempt failed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The next assignment has no peer 1: at most the attempt already under way (after a
    // back-off of up to 2 s; a refused connection fails at once) still fails, then its task
    // ends, and nothing is left to retry it.
    a.set_peers(JOB, std::iter::empty())?;
    wait_until("the dropped peer's task to end", || a.peer_tasks() == 0);
    Ok(())
}

/// A worker waiting at the start barrier for a peer that never joins leaves it once its
/// job is abandoned (the coordinator's cancel or a newer job), not at the barrier's timeout
/// (a cancelled job used to stay "running" for the whole 120 s).
#[test]
fn an_abandoned_job_leaves_the_start_barrier_at_once() -> TestResult {
    let (a, b) = pair()?;
    let timeout = Duration::from_secs(60);
    // Worker 0 (a) serves the collectives of a 2-worker job but never joins the barrier.
    a.collective()
        .configure(JOB, 2, Replica::default(), timeout);
    let sync = b.sync_to(&a.local_addr().to_string(), JOB, 1, timeout)?;
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            // The abort comes once b's barrier call is under way: the root holds its
            // contribution.
            wait_until("b's barrier call", || a.collective().waiting() == 1);
            b.abort("job 7 was aborted by the coordinator");
        });
        let err = sync.barrier().expect_err("worker 0 never joins");
        let text = err.to_string();
        assert!(text.contains("start barrier: Aborted"), "{text}");
        assert!(text.contains("aborted by the coordinator"), "{text}");
    });
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(10), "left after {waited:?}");
    Ok(())
}

/// With run secrets, a follower that takes up the next run before worker 0 (the root) does
/// waits at the start barrier until the root takes it up, then both pass: the root still
/// holding the previous run's secret is a state to wait out, not a refusal.
#[test]
fn a_follower_ahead_of_the_root_waits_for_it_at_the_start_barrier() -> TestResult {
    const NEXT: u64 = JOB + 1;
    let (a, b) = pair()?;
    let timeout = Duration::from_secs(30);
    let secret = |run: u64| bytes::Bytes::from(format!("the secret of run {run}").into_bytes());
    // Both ran job 7; worker 1 (b) has taken up job 8, the root (a) not yet.
    a.set_run_secret(JOB, secret(JOB));
    a.collective()
        .configure(JOB, 2, Replica::default(), timeout);
    b.set_run_secret(NEXT, secret(NEXT));
    let root_addr = a.local_addr().to_string();
    // Until the root takes up job 8, the follower's barrier is told "not yet", and retries:
    // with a short timeout it gives up on that answer, not on a refusal.
    let early = b.sync_to(&root_addr, NEXT, 1, Duration::from_millis(200))?;
    let text = early
        .barrier()
        .expect_err("the root is on job 7")
        .to_string();
    assert!(text.contains("FailedPrecondition"), "{text}");
    assert!(text.contains("not taken up here yet"), "{text}");
    let follower = b.sync_to(&root_addr, NEXT, 1, timeout)?;
    std::thread::scope(|s| -> TestResult {
        let waiting = s.spawn(move || follower.barrier());
        a.set_run_secret(NEXT, secret(NEXT));
        a.collective()
            .configure(NEXT, 2, Replica::default(), timeout);
        a.sync_at(&root_addr, NEXT, 0, timeout)?.barrier()?;
        waiting.join().map_err(|_| "the follower's thread")??;
        Ok(())
    })
}

/// With a run secret (a coordinator that takes tokens, even without TLS), a frame carrying
/// it is taken and one carrying another is refused with `PermissionDenied`, without
/// failing the key it names: a stranger cannot inject frames, nor make the run fail.
#[test]
fn frames_without_the_run_secret_are_refused_and_harm_nothing() -> TestResult {
    let (a, b) = pair()?;
    let stranger = GrpcTransport::start(GrpcConfig::new(JOB, [0]))?;
    let secret = bytes::Bytes::from_static(b"0123456789abcdef0123456789abcdef");
    a.set_run_secret(JOB, secret.clone());
    b.set_run_secret(JOB, secret);
    stranger.set_run_secret(JOB, bytes::Bytes::from_static(b"a guess"));
    stranger.set_peer(1, b.local_addr().to_string())?;
    let t = Tensor::new(values(8, 1), &Device::Cpu)?;
    stranger.send(1, frame(0, 1, 0, FrameKind::Activation, t.clone()))?;
    let deadline = Instant::now() + WAIT;
    let refused = loop {
        let errors = stranger.take_errors();
        if let Some(e) = errors.into_iter().find(|e| e.contains("PermissionDenied")) {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "the stranger's frame was not refused"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(refused.contains("TensorFrame.run_secret"), "{refused}");
    // The same key from a worker with the secret arrives, bit for bit.
    a.send(1, frame(0, 1, 0, FrameKind::Activation, t.clone()))?;
    let got = tensor_of(b.recv(JOB, 0, 1, 0, FrameKind::Activation, WAIT)?);
    assert_eq!(bits(&got)?, bits(&t)?);
    assert_eq!(b.stats().accepted_frames, 1);
    Ok(())
}
