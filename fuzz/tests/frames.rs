//! Fuzz target: activation frames, whole and split in chunks, sent to a worker's
//! `ActivationService` over gRPC on loopback (the server's own message reader, the inbox's
//! checks and the chunk assembly into a tensor or a buffer). Inputs: valid chunk sequences
//! of one to three tensors, then mutated (chunks dropped, repeated, swapped, re-offset,
//! lengthened or cut; header fields changed; the encoded message, its gRPC prefix or the
//! stream's bytes edited), cut into DATA frames anywhere; and raw bytes now and then.
//!
//! Properties: the call is answered (no hang, no panic in the server); a refusal is
//! `InvalidArgument` naming the `TensorFrame` field, or the framing error of a broken
//! stream; an unmutated valid sequence is accepted and every tensor is received bit for
//! bit; an unmutated invalid one is refused.

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use bytes::Bytes;
use candle_core::{DType, Tensor};
use http_body_util::BodyExt;
use pipewise_fuzz::arbitrary::{Result, Unstructured};
use pipewise_fuzz::{Error, Verdict, mutate, run};
use pipewise_proto::v1::{self, SendAck, TensorFrame};
use pipewise_worker::net::{Delivery, GrpcConfig, GrpcTransport};
use pipewise_worker::runtime::{FrameKind, Payload, Transport};
use prost::Message;
use tonic::Code;
use tonic::body::Body;
use tonic::transport::Channel;

/// Cases `cargo test` runs (a few seconds in a debug build, the same cases every run); longer
/// runs set `PIPEWISE_FUZZ_SECS` or `PIPEWISE_FUZZ_CASES` (docs/fuzzing.md).
const CASES: u64 = 2_000;

/// The run whose frames the worker takes.
const RUN: u64 = 0x5eed;
/// The stages the worker holds (2 and 4 are another worker's).
const HELD: [u32; 3] = [0, 1, 3];
/// The largest message and tensor accepted (small, so a case allocates little).
const MAX_BYTES: usize = 1 << 16;
const SEND_PATH: &str = "/pipewise.v1.ActivationService/Send";
/// A call not answered within this is a hang.
const ANSWER: Duration = Duration::from_secs(10);

struct Worker {
    runtime: tokio::runtime::Runtime,
    transport: GrpcTransport,
    channel: Channel,
    uri: String,
}

/// One worker's transport and a client channel to it, for every case of the binary.
fn worker() -> &'static Worker {
    static WORKER: OnceLock<Worker> = OnceLock::new();
    WORKER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let mut config = GrpcConfig::new(RUN, HELD);
        config.max_message_bytes = MAX_BYTES;
        let transport = GrpcTransport::start_on(runtime.handle().clone(), config).expect("starts");
        let uri = format!("http://{}", transport.local_addr());
        let channel = runtime
            .block_on(Channel::from_shared(uri.clone()).expect("a uri").connect())
            .expect("connects");
        Worker {
            runtime,
            transport,
            channel,
            uri,
        }
    })
}

/// A tensor as frames: the whole frame (its data all of it) and its chunks.
struct Sent {
    whole: TensorFrame,
    /// Whether a worker holding [`HELD`] of [`RUN`] takes it (duplicates aside).
    valid: bool,
    chunks: Vec<TensorFrame>,
}

fn tensor(u: &mut Unstructured<'_>, base_step: u64) -> Result<Sent> {
    let mut valid = true;
    let mut pick = |u: &mut Unstructured<'_>, good: i32, defined: i32| -> Result<i32> {
        if u.int_in_range(0..=7)? == 7 {
            let v = mutate::enum_value(u, defined)?;
            valid &= (1..=defined).contains(&v);
            Ok(v)
        } else {
            Ok(good)
        }
    };
    let good_kind = *u.choose(&[
        v1::FrameKind::Activation as i32,
        v1::FrameKind::Gradient as i32,
    ])?;
    let kind = pick(u, good_kind, 2)?;
    let good_dtype = u.int_in_range(1..=3)?;
    let dtype = pick(u, good_dtype, 3)?;
    let size = match v1::Dtype::try_from(dtype) {
        Ok(v1::Dtype::F32) => 4,
        Ok(v1::Dtype::F16 | v1::Dtype::Bf16) => 2,
        _ => 1,
    };
    let rank = u.int_in_range(0..=3)?;
    let mut shape = Vec::with_capacity(rank);
    for _ in 0..rank {
        shape.push(match u.int_in_range(0..=15)? {
            15 => mutate::number_u64(u)?,
            14 => 0,
            _ => u.int_in_range(1..=12)?,
        });
    }
    let elements = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    // The strides of an empty tensor multiply its other dimensions: they must fit too.
    valid &= shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d.max(1)))
        .is_some();
    let total = elements
        .and_then(|e| e.checked_mul(size))
        .filter(|&t| t <= MAX_BYTES as u64);
    valid &= total.is_some();
    // An oversized tensor still sends a little data: its first chunk is refused anyway.
    let total = total.unwrap_or(size * 4) as usize;
    let mut data = u.bytes(total.min(u.len()))?.to_vec();
    data.resize(total, 0xa5);
    let stage = match u.int_in_range(0..=9)? {
        9 => mutate::number_u32(u)?,
        8 => 2,
        _ => *u.choose(&HELD)?,
    };
    valid &= HELD.contains(&stage);
    let run = if u.int_in_range(0..=15)? == 15 {
        mutate::number_u64(u)?
    } else {
        RUN
    };
    valid &= run == RUN;
    let whole = TensorFrame {
        run,
        step: base_step + u.int_in_range(0..=2)?,
        stage,
        mb: u.int_in_range(0..=3)?,
        kind,
        dtype,
        shape,
        data: Bytes::from(data),
        offset: 0,
        run_secret: Bytes::new(),
    };
    let step = size as usize * u.int_in_range(1..=(total / size as usize).max(1))?;
    let mut chunks = Vec::new();
    let mut offset = 0;
    loop {
        let end = (offset + step).min(total);
        chunks.push(TensorFrame {
            data: whole.data.slice(offset..end),
            offset: offset as u64,
            ..whole.clone()
        });
        offset = end;
        if offset >= total {
            break;
        }
    }
    Ok(Sent {
        whole,
        valid,
        chunks,
    })
}

/// One edit of the chunk sequence.
fn mutate_chunks(u: &mut Unstructured<'_>, chunks: &mut Vec<TensorFrame>) -> Result<()> {
    if chunks.is_empty() {
        return Ok(());
    }
    let i = u.choose_index(chunks.len())?;
    let j = u.choose_index(chunks.len())?;
    let c = &mut chunks[i];
    match u.int_in_range(0..=10)? {
        0 => c.offset = mutate::number_u64(u)?,
        1 => c.offset = c.offset.wrapping_add(u.int_in_range(1..=4)?),
        2 => {
            chunks.remove(i);
        }
        3 => {
            let copy = chunks[i].clone();
            chunks.insert(j, copy);
        }
        4 => chunks.swap(i, j),
        5 => {
            let cut = u.int_in_range(0..=3)?.min(c.data.len());
            c.data = c.data.slice(..c.data.len() - cut);
        }
        6 => {
            let mut longer = c.data.to_vec();
            let extra: usize = u.int_in_range(1..=4)?;
            longer.extend_from_slice(u.bytes(extra.min(u.len()))?);
            c.data = Bytes::from(longer);
        }
        7 => c.step = mutate::number_u64(u)?,
        8 => c.mb = mutate::number_u32(u)?,
        9 => c.shape.push(u.int_in_range(0..=3)?),
        _ => c.dtype = mutate::enum_value(u, 3)?,
    }
    Ok(())
}

/// A request: the wire bytes (cut into DATA frames) and, when nothing was mutated, the
/// tensors and whether the worker must take them.
struct Case {
    pieces: Vec<Bytes>,
    delivery: Delivery,
    /// `None` when mutated: any answer within the properties is right.
    expect: Option<(bool, Vec<TensorFrame>)>,
}

fn case(u: &mut Unstructured<'_>) -> Result<Case> {
    let delivery = if u.arbitrary()? {
        Delivery::Tensors
    } else {
        Delivery::Buffers
    };
    let mut wire = Vec::new();
    let mut expect = None;
    if u.int_in_range(0..=15)? == 15 {
        // Raw bytes, no structure.
        wire = u.bytes(u.len().min(512))?.to_vec();
    } else {
        let base = if u.int_in_range(0..=7)? == 7 {
            mutate::number_u64(u)?.saturating_sub(2)
        } else {
            u.int_in_range(0..=5)?
        };
        let mut sent = Vec::new();
        for _ in 0..u.int_in_range(1..=3)? {
            sent.push(tensor(u, base)?);
        }
        let mut keys: Vec<_> = sent
            .iter()
            .map(|s| (s.whole.step, s.whole.stage, s.whole.mb, s.whole.kind))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let valid = keys.len() == sent.len() && sent.iter().all(|s| s.valid);
        let mut chunks: Vec<TensorFrame> = sent.iter().flat_map(|s| s.chunks.clone()).collect();
        let mutations = if !u.arbitrary::<bool>()? {
            0
        } else {
            u.int_in_range(1..=3)?
        };
        for _ in 0..mutations {
            mutate_chunks(u, &mut chunks)?;
        }
        let mut mutated = mutations > 0;
        for chunk in &chunks {
            let mut message = chunk.encode_to_vec();
            let (mut flag, mut len) = (0u8, message.len() as u32);
            match u.int_in_range(0..=40)? {
                40 => {
                    mutate::bytes(u, &mut message, 3)?;
                    len = message.len() as u32;
                    mutated = true;
                }
                39 => {
                    flag = u.arbitrary()?;
                    mutated |= flag != 0;
                }
                38 => {
                    len = mutate::number_u32(u)?;
                    mutated |= len as usize != message.len();
                }
                _ => {}
            }
            wire.push(flag);
            wire.extend_from_slice(&len.to_be_bytes());
            wire.extend_from_slice(&message);
        }
        if u.int_in_range(0..=20)? == 20 {
            let cut = u.choose_index(wire.len() + 1)?;
            wire.truncate(cut);
            mutated = true;
        }
        if !mutated {
            expect = Some((valid, sent.into_iter().map(|s| s.whole).collect()));
        }
    }
    let mut cuts: Vec<usize> = (0..u.int_in_range(0..=4)?)
        .map(|_| u.choose_index(wire.len() + 1))
        .collect::<Result<_>>()?;
    cuts.push(wire.len());
    cuts.sort_unstable();
    let wire = Bytes::from(wire);
    let mut pieces = Vec::new();
    let mut start = 0;
    // No empty DATA frames: HTTP/2 servers count them against a connection-wide budget
    // (h2 sends GOAWAY past it), which is a limit of the connection, not of the service.
    for cut in cuts {
        if cut > start {
            pieces.push(wire.slice(start..cut));
        }
        start = cut;
    }
    Ok(Case {
        pieces,
        delivery,
        expect,
    })
}

/// The call's gRPC status and, when it succeeded, its acknowledgement.
async fn call(
    w: &Worker,
    pieces: Vec<Bytes>,
) -> std::result::Result<(tonic::Status, Option<SendAck>), Error> {
    let mut channel = w.channel.clone();
    std::future::poll_fn(|cx| tower_service::Service::poll_ready(&mut channel, cx))
        .await
        .map_err(|e| format!("channel: {e}"))?;
    let frames = pieces
        .into_iter()
        .map(|p| Ok::<_, Infallible>(http_body::Frame::data(p)));
    let body = Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)));
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("{}{SEND_PATH}", w.uri))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .map_err(|e| format!("request: {e}"))?;
    let response = tower_service::Service::call(&mut channel, request)
        .await
        .map_err(|e| format!("the call failed without a status: {e:?}"))?;
    let (parts, body) = response.into_parts();
    let collected = body
        .collect()
        .await
        .map_err(|e| format!("the answer broke off: {e}"))?;
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    let status = tonic::Status::from_header_map(&parts.headers)
        .or_else(|| trailers.as_ref().and_then(tonic::Status::from_header_map))
        .ok_or_else(|| Error::from("the answer has no grpc-status"))?;
    let ack = (status.code() == Code::Ok)
        .then(|| SendAck::decode(data.get(5..).unwrap_or_default()))
        .transpose()
        .map_err(|e| format!("the acknowledgement does not decode: {e}"))?;
    Ok((status, ack))
}

/// The little-endian bytes of a received payload.
fn payload_bytes(payload: &Payload) -> std::result::Result<Vec<u8>, Error> {
    let bits = |t: &Tensor| -> candle_core::Result<Vec<u8>> {
        let t = t.flatten_all()?;
        Ok(match t.dtype() {
            DType::F32 => t
                .to_vec1::<f32>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            DType::F16 => t
                .to_vec1::<half::f16>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            _ => t
                .to_vec1::<half::bf16>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        })
    };
    match payload {
        Payload::Buffer(b) => Ok(b.bytes.to_vec()),
        Payload::Tensor(t) => bits(t).map_err(|e| Error::from(e.to_string())),
    }
}

/// The field a refusal names (`TensorFrame.<field>`), for counting outcomes.
fn field_named(message: &str) -> Option<&str> {
    let rest = &message[message.find("TensorFrame")? + "TensorFrame".len()..];
    Some(match rest.strip_prefix('.') {
        Some(field) => field
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .next()
            .unwrap_or(""),
        None => "(decode)",
    })
}

fn check(c: Case) -> Verdict {
    let w = worker();
    w.transport.assign(RUN, HELD, c.delivery);
    let answer = w
        .runtime
        .block_on(async { tokio::time::timeout(ANSWER, call(w, c.pieces)).await })
        .map_err(|_| format!("no answer in {ANSWER:?}"))??;
    let (status, ack) = answer;
    let message = status.message();
    let outcome = match status.code() {
        Code::Ok => format!("accepted {} frames", ack.as_ref().map_or(0, |a| a.frames)),
        Code::InvalidArgument => match field_named(message) {
            Some(field) => format!("refused TensorFrame.{field}"),
            None => {
                return Err(
                    format!("InvalidArgument naming no TensorFrame field: {message:?}").into(),
                );
            }
        },
        Code::OutOfRange if message.contains("limit") => "refused: over the message limit".into(),
        Code::Unimplemented if message.contains("compression") => "refused: compressed".into(),
        Code::Internal if message.contains("stream ended inside") => "refused: stream cut".into(),
        _ => return Err(format!("refused with {status:?}").into()),
    };
    let Some((valid, tensors)) = c.expect else {
        return Ok(outcome);
    };
    match (valid, ack) {
        (false, Some(_)) => {
            Err(format!("an invalid unmutated sequence was accepted: {tensors:?}").into())
        }
        (false, None) => Ok(outcome),
        (true, None) => Err(format!("a valid sequence was refused: {status:?}").into()),
        (true, Some(ack)) => {
            if ack.frames != tensors.len() as u64 {
                return Err(format!(
                    "{} tensors sent, {} acknowledged",
                    tensors.len(),
                    ack.frames
                )
                .into());
            }
            let mut tensors = tensors;
            tensors.sort_by_key(|t| t.step);
            for t in &tensors {
                let kind = if t.kind == v1::FrameKind::Gradient as i32 {
                    FrameKind::Gradient
                } else {
                    FrameKind::Activation
                };
                let got = w
                    .transport
                    .recv(RUN, t.step, t.stage, t.mb, kind, Duration::from_secs(5))
                    .map_err(|e| format!("an accepted tensor is not received: {e}"))?;
                let dims: Vec<u64> = got.dims().iter().map(|&d| d as u64).collect();
                if dims != t.shape || payload_bytes(&got)? != t.data {
                    return Err(
                        format!("received {dims:?} differs from the sent {:?}", t.shape).into(),
                    );
                }
            }
            Ok(format!("{outcome}, received bit for bit"))
        }
    }
}

#[test]
fn frames_are_assembled_or_refused_by_field() {
    let report = run("frames", CASES, |u| match case(u) {
        Ok(c) => check(c),
        Err(e) => Err(format!("generator: {e}").into()),
    });
    assert!(report.cases > 0);
}
