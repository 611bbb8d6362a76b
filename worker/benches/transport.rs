//! Activation transport throughput: 4, 16 and 64 MiB f32 frames between two
//! `GrpcTransport`s on loopback, against raw loopback TCP moving the same bytes
//! (tokio `write_all` / `read_exact`) in the same run.
//!
//! `cargo bench -p pipewise-worker --bench transport`; `PIPEWISE_BENCH_QUICK=1` runs tiny
//! frames for a smoke test; `PIPEWISE_BENCH_SIZES=1,4,64` picks the frame sizes in MiB;
//! `PIPEWISE_BENCH_CHUNK=256` sets the sender's chunk size in KiB (default: the
//! transport's, 1 MiB). A second table gives the median round trip of one frame each way
//! (32 KiB, 512 KiB, 4 MiB) over gRPC and over raw TCP: the latency a pipeline hop pays.
//!
//! - gRPC: worker 0 sends `k` frames (distinct microbatches) to worker 1, which receives
//!   them all; the time covers tensor → bytes, the stream, validation and bytes → tensor.
//! - gRPC buffers (`grpc-buf`, `r-buf` = grpc-buf / tcp): the same with emulated compute's
//!   byte buffers, which neither side copies in user space (the receiver is assigned
//!   `Delivery::Buffers`): the transport's own cost, without the tensor copies.
//! - gRPC over mutual TLS (`grpc-tls`, `r-tls` = grpc-tls / tcp): the tensor run between
//!   two transports with certificates from `net::certs` (rustls, ring): TLS's cost.
//! - shared memory (`shm`, `r-shm` = shm / tcp): the tensor run between two transports whose
//!   peers are each other over the shared-memory tier (`Tier::Shm`, 8 MiB rings): what
//!   workers on one host pay.
//! - raw TCP: one connection, the writer sends `k` buffers, the reader reads each into a
//!   buffer (reused: the ideal; and fresh per frame, as a receiver that hands each frame
//!   on must).

use std::time::{Duration, Instant};

use pipewise_worker::net::{Delivery, GrpcConfig, GrpcTransport, Tier, TlsSettings};
use pipewise_worker::runtime::{Buffer, Frame, FrameKind, Payload, Transport};
use pipewise_worker::{Device, Tensor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: usize = 1 << 20;

fn grpc_run(
    a: &GrpcTransport,
    b: &GrpcTransport,
    payload: &Payload,
    step: u64,
    frames: u32,
) -> BenchResult<Duration> {
    // The receiver hands over what the sender sent: tensors, or (emulated compute) buffers.
    let delivery = match payload {
        Payload::Tensor(_) => Delivery::Tensors,
        Payload::Buffer(_) => Delivery::Buffers,
    };
    b.assign(1, [1], delivery);
    let start = Instant::now();
    for mb in 0..frames {
        a.send(
            1,
            Frame {
                job: 1,
                step,
                stage: 1,
                mb,
                kind: FrameKind::Activation,
                payload: payload.clone(),
            },
        )?;
    }
    for mb in 0..frames {
        b.recv(
            1,
            step,
            1,
            mb,
            FrameKind::Activation,
            Duration::from_secs(120),
        )?;
    }
    Ok(start.elapsed())
}

/// A connected loopback TCP pair (writer side, reader side), both without Nagle's delay.
async fn tcp_pair() -> std::io::Result<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (near, far) = tokio::join!(
        tokio::net::TcpStream::connect(listener.local_addr()?),
        listener.accept()
    );
    let (near, (far, _)) = (near?, far?);
    near.set_nodelay(true)?;
    far.set_nodelay(true)?;
    Ok((near, far))
}

/// The median of `times`.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn tcp_run(
    rt: &tokio::runtime::Runtime,
    bytes: usize,
    frames: u32,
    fresh: bool,
) -> BenchResult<Duration> {
    rt.block_on(async move {
        let (mut socket, mut far) = tcp_pair().await?;
        let reader = tokio::spawn(async move {
            let socket = &mut far;
            let mut buf = vec![0u8; bytes];
            let mut total = 0usize;
            for _ in 0..frames {
                if fresh {
                    let mut own = vec![0u8; bytes];
                    socket.read_exact(&mut own).await?;
                    total += own.len();
                } else {
                    socket.read_exact(&mut buf).await?;
                    total += buf.len();
                }
            }
            Ok::<usize, std::io::Error>(total)
        });
        let data = vec![0x5au8; bytes];
        let start = Instant::now();
        for _ in 0..frames {
            socket.write_all(&data).await?;
        }
        socket.flush().await?;
        let total = reader.await??;
        let elapsed = start.elapsed();
        if total != bytes * frames as usize {
            return Err("short read".into());
        }
        Ok(elapsed)
    })
}

/// Round trips of one frame each way (an activation to worker 1, its gradient back), as a
/// pipeline hop sees them; the median of `rounds`.
fn grpc_round_trip(
    a: &GrpcTransport,
    b: &GrpcTransport,
    tensor: &Tensor,
    step: u64,
    rounds: u32,
) -> BenchResult<Duration> {
    let wait = Duration::from_secs(30);
    let mut times = Vec::with_capacity(rounds as usize);
    for mb in 0..rounds {
        let start = Instant::now();
        let frame = |stage, kind| Frame {
            job: 1,
            step,
            stage,
            mb,
            kind,
            payload: Payload::Tensor(tensor.clone()),
        };
        a.send(1, frame(1, FrameKind::Activation))?;
        b.recv(1, step, 1, mb, FrameKind::Activation, wait)?;
        b.send(0, frame(0, FrameKind::Gradient))?;
        a.recv(1, step, 0, mb, FrameKind::Gradient, wait)?;
        times.push(start.elapsed());
    }
    Ok(median(times))
}

/// The same round trips over one raw TCP connection (the echo side reads the whole frame
/// before writing it back); the median of `rounds`.
fn tcp_round_trip(
    rt: &tokio::runtime::Runtime,
    bytes: usize,
    rounds: u32,
) -> BenchResult<Duration> {
    rt.block_on(async move {
        let (mut socket, mut far) = tcp_pair().await?;
        let echo = tokio::spawn(async move {
            let socket = &mut far;
            let mut buf = vec![0u8; bytes];
            for _ in 0..rounds {
                socket.read_exact(&mut buf).await?;
                socket.write_all(&buf).await?;
            }
            Ok::<_, std::io::Error>(())
        });
        let out = vec![7u8; bytes];
        let mut back = vec![0u8; bytes];
        let mut times = Vec::with_capacity(rounds as usize);
        for _ in 0..rounds {
            let start = Instant::now();
            socket.write_all(&out).await?;
            socket.read_exact(&mut back).await?;
            times.push(start.elapsed());
        }
        echo.await??;
        Ok(median(times))
    })
}

fn mib_per_s(bytes: usize, frames: u32, t: Duration) -> f64 {
    (bytes as f64 * f64::from(frames)) / MIB as f64 / t.as_secs_f64()
}

fn main() -> BenchResult<()> {
    // Before any thread starts, as the `pipewise` binary does.
    let heap = pipewise_worker::alloc::policy_from_env();
    let quick = std::env::var("PIPEWISE_BENCH_QUICK").is_ok_and(|v| v == "1");
    // PIPEWISE_BENCH_SIZES=1,4,64 picks other frame sizes (MiB).
    let sizes: Vec<usize> = match std::env::var("PIPEWISE_BENCH_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|s| s.trim().parse::<usize>().map(|m| m * MIB))
            .collect::<Result<_, _>>()?,
        Err(_) if quick => vec![64 << 10, 256 << 10],
        Err(_) => vec![4 * MIB, 16 * MIB, 64 * MIB],
    };
    let reps = if quick { 1 } else { 5 };
    let adaptive = std::env::var("PIPEWISE_BENCH_ADAPTIVE").is_ok_and(|v| v == "1");

    let mut config_a = GrpcConfig::new(1, [0]);
    let mut config_b = GrpcConfig::new(1, [1]);
    config_a.adaptive_window = adaptive;
    config_b.adaptive_window = adaptive;
    if let Ok(kib) = std::env::var("PIPEWISE_BENCH_CHUNK") {
        config_a.chunk_bytes = kib.trim().parse::<usize>()? << 10;
    }
    let chunk_kib = config_a.chunk_bytes >> 10;
    // The same pair over mutual TLS.
    let issued = pipewise_worker::net::certs::issue(&[], 1)?;
    let tls = TlsSettings {
        ca: Some(tonic::transport::Certificate::from_pem(&issued.ca.cert)),
        identity: Some(issued.worker.identity()),
    };
    let (config_a_shm, config_b_shm) = (config_a.clone(), config_b.clone());
    let (mut tls_a, mut tls_b) = (config_a.clone(), config_b.clone());
    (tls_a.tls, tls_b.tls) = (tls.clone(), tls);
    let a = GrpcTransport::start(config_a)?;
    let b = GrpcTransport::start(config_b)?;
    a.set_peer(1, b.local_addr().to_string())?;
    let (ta, tb) = (GrpcTransport::start(tls_a)?, GrpcTransport::start(tls_b)?);
    ta.set_peer(1, tb.local_addr().to_string())?;
    // The same pair on the shared-memory tier (both ways, for the round trips).
    let (sa, sb) = (
        GrpcTransport::start(config_a_shm)?,
        GrpcTransport::start(config_b_shm)?,
    );
    let (at_sa, at_sb) = (sa.local_addr().to_string(), sb.local_addr().to_string());
    let shm_peers = [
        (0, at_sa.as_str(), Tier::Shm),
        (1, at_sb.as_str(), Tier::Shm),
    ];
    sa.set_peers_with_tiers(1, 0, shm_peers)?;
    sb.set_peers_with_tiers(1, 1, shm_peers)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    println!(
        "activation transport, loopback, f32 frames in {chunk_kib} KiB chunks, best of {reps} interleaved rounds \
         (adaptive window: {adaptive}; heap: {heap})"
    );
    println!(
        "{:>9} {:>6} {:>11} {:>13} {:>13} {:>8} {:>8} {:>10} {:>8} {:>9} {:>6} {:>9} {:>6}",
        "frame",
        "frames",
        "grpc MiB/s",
        "tcp MiB/s",
        "tcp-fresh",
        "ratio",
        "r-fresh",
        "grpc-buf",
        "r-buf",
        "grpc-tls",
        "r-tls",
        "shm",
        "r-shm"
    );
    let mut step = 0u64; // the last step used
    for bytes in sizes {
        // About 512 MiB per measurement (256 frames of the quick sizes at most).
        let frames = ((512 * MIB) / bytes).clamp(4, 256) as u32;
        let frames = if quick { frames.min(16) } else { frames };
        let tensor = Payload::Tensor(
            Tensor::zeros(bytes / 4, candle_core::DType::F32, &Device::Cpu)?.affine(1.0, 0.25)?,
        );
        let buffer = Payload::Buffer(Buffer::filled(candle_core::DType::F32, &[bytes / 4], 7));
        // Warm up the connection and allocator. Every run uses a fresh step: the receiver
        // rejects a repeated (step, stage, mb, kind) as a duplicate.
        step += 1;
        grpc_run(&a, &b, &tensor, step, 1)?;
        grpc_run(&ta, &tb, &tensor, step, 1)?;
        grpc_run(&sa, &sb, &tensor, step, 1)?;
        tcp_run(&rt, bytes, 1, false)?;
        // The transports take turns, so a burst of load on this shared machine hits all of
        // them; each keeps its best round.
        let mut best = [Duration::MAX; 6];
        for _ in 0..reps {
            step += 1;
            best[0] = best[0].min(grpc_run(&a, &b, &tensor, step, frames)?);
            best[1] = best[1].min(tcp_run(&rt, bytes, frames, false)?);
            best[2] = best[2].min(tcp_run(&rt, bytes, frames, true)?);
            step += 1;
            best[3] = best[3].min(grpc_run(&a, &b, &buffer, step, frames)?);
            best[4] = best[4].min(grpc_run(&ta, &tb, &tensor, step, frames)?);
            best[5] = best[5].min(grpc_run(&sa, &sb, &tensor, step, frames)?);
        }
        let [g, t, f, gb, gt, sh] = best.map(|time| mib_per_s(bytes, frames, time));
        let label = if bytes >= MIB {
            format!("{} MiB", bytes / MIB)
        } else {
            format!("{} KiB", bytes >> 10)
        };
        println!(
            "{label:>9} {frames:>6} {g:>11.0} {t:>13.0} {f:>13.0} {:>8.2} {:>8.2} {gb:>10.0} {:>8.2} {gt:>9.0} {:>6.2} {sh:>9.0} {:>6.2}",
            g / t,
            g / f,
            gb / t,
            gt / t,
            sh / t
        );
    }
    // Latency: what one pipeline hop costs, which a throughput figure hides.
    b.set_peer(0, a.local_addr().to_string())?;
    tb.set_peer(0, ta.local_addr().to_string())?;
    let rounds = if quick { 5 } else { 50 };
    println!(
        "round trip (activation out, gradient back): median of {} medians of {}, sides taking turns",
        rounds / rounds.min(10),
        rounds.min(10)
    );
    println!(
        "{:>9} {:>9} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7}",
        "frame", "tcp ms", "grpc ms", "ratio", "tls ms", "ratio", "shm ms", "ratio"
    );
    b.assign(1, [1], Delivery::Tensors);
    tb.assign(1, [1], Delivery::Tensors);
    sb.assign(1, [1], Delivery::Tensors);
    let pairs = [(&a, &b), (&ta, &tb), (&sa, &sb)];
    for bytes in [32 << 10, 512 << 10, 4 * MIB] {
        let tensor = Tensor::zeros(bytes / 4, candle_core::DType::F32, &Device::Cpu)?;
        step += 1;
        for (x, y) in pairs {
            grpc_round_trip(x, y, &tensor, step, 2)?;
        }
        // Rounds of 10 taking turns, so a burst of load hits every side.
        let per = rounds.min(10);
        let mut times: [Vec<Duration>; 4] = Default::default();
        for _ in 0..rounds / per {
            step += 1;
            times[0].push(tcp_round_trip(&rt, bytes, per)?);
            for (i, (x, y)) in pairs.iter().enumerate() {
                times[i + 1].push(grpc_round_trip(x, y, &tensor, step, per)?);
            }
        }
        let [tcp, grpc, tls, shm] = times.map(|t| median(t).as_secs_f64() * 1e3);
        println!(
            "{:>9} {tcp:>9.3} {grpc:>9.3} {:>7.2} {tls:>9.3} {:>7.2} {shm:>9.3} {:>7.2}",
            format!("{} KiB", bytes >> 10),
            grpc / tcp,
            tls / tcp,
            shm / tcp
        );
    }
    let errors = [
        a.take_errors(),
        ta.take_errors(),
        sa.take_errors(),
        sb.take_errors(),
    ]
    .concat();
    if !errors.is_empty() {
        return Err(format!("sender errors: {errors:?}").into());
    }
    Ok(())
}
