//! The sending side: one long-lived client-streaming `Send` call per peer, fed by an
//! unbounded queue so `Transport::send` never waits for the receiver.
//!
//! The call is made below tonic's codec (as the server serves it): its body, [`ChunkBody`],
//! takes frames straight from the peer's queue (no task in between) and hands each chunk
//! to HTTP/2 as its message prefix and fields, then its data as a slice of the frame's
//! bytes, so emulated compute's buffers reach the socket without a copy in user
//! space (tonic's encoder would copy every message into its buffer). The reply is read by
//! [`send_call`]: the `SendAck` and the `grpc-status` trailer, as any gRPC client would.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use pipewise_proto::v1::SendAck;
use prost::Message;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tower_service::Service;

use super::codec::{Chunk, Outgoing, PREFIX};
use super::peers::{Counted, PeerErrors, RunningPeers};
use super::server::SEND_PATH;

/// The queue into one peer's task.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub(crate) address: String,
    /// The run whose frames it sends (`None`: set by hand, for any run).
    pub(crate) run: Option<u64>,
    pub(crate) queue: mpsc::UnboundedSender<Outgoing>,
    /// How the frames travel.
    pub(crate) tier: super::tier::Tier,
    /// The shared-memory ring's sending end (the shared-memory tier), stopped with the
    /// last clone.
    pub(crate) shm: Option<Arc<super::shm::Sending>>,
}

/// Client settings shared by every peer.
#[derive(Debug, Clone)]
pub(crate) struct ClientSettings {
    pub(crate) max_message_bytes: usize,
    pub(crate) stream_window: u32,
    pub(crate) connection_window: u32,
    pub(crate) adaptive_window: bool,
    pub(crate) max_frame_size: u32,
    pub(crate) chunk_bytes: usize,
    pub(crate) connect_timeout: Duration,
    /// Mutual TLS with the peers when it has a certificate and a CA.
    pub(crate) tls: super::TlsSettings,
}

/// Starts the task of the peer at `address` (no connection yet: it connects on the first
/// frame, and again after a failed call or connection attempt).
pub(crate) fn spawn_peer(
    runtime: &tokio::runtime::Handle,
    worker: u32,
    address: String,
    settings: &ClientSettings,
    errors: Arc<PeerErrors>,
    running: &Arc<RunningPeers>,
) -> crate::error::Result<Peer> {
    let endpoint = super::tls::endpoint(
        &address,
        &settings.tls,
        super::Dial::Peer,
        &format!("peer {worker}"),
    )
    .map_err(|e| match e {
        crate::error::Error::Address { .. } => {
            crate::error::Error::invalid("peers", format!("peer {worker} address {e}"))
        }
        other => other,
    })?
    .connect_timeout(settings.connect_timeout)
    .tcp_nodelay(true)
    .initial_stream_window_size(settings.stream_window)
    .initial_connection_window_size(settings.connection_window)
    .http2_adaptive_window(settings.adaptive_window)
    .max_frame_size(settings.max_frame_size);
    let (queue, frames) = mpsc::unbounded_channel();
    let max = settings.max_message_bytes;
    let label = format!("peer {worker} ({address})");
    let chunk_bytes = settings.chunk_bytes;
    let counted = Counted::new(running);
    runtime.spawn(async move {
        let _counted = counted;
        drive(endpoint, max, chunk_bytes, frames, label, errors).await;
    });
    let tier = if settings.tls.mutual() {
        super::tier::Tier::GrpcTls
    } else {
        super::tier::Tier::Grpc
    };
    Ok(Peer {
        address,
        run: None,
        queue,
        tier,
        shm: None,
    })
}

/// A peer's queue, shared by the peer's task (between calls) and the body of its current
/// call (which takes frames straight from it, so a frame reaches HTTP/2 without another
/// task in between).
struct Queue {
    frames: mpsc::UnboundedReceiver<Outgoing>,
    /// A frame taken from `frames` but not yet handed to a call.
    next: Option<Arc<Outgoing>>,
    /// `frames` has ended: the transport was dropped.
    closed: bool,
}

impl Queue {
    /// Whether the transport dropped this peer; if so, drops every frame still held.
    fn retire(&mut self) -> bool {
        if self.frames.is_closed() {
            self.next = None;
            self.closed = true;
            self.frames.close();
            while self.frames.try_recv().is_ok() {}
        }
        self.closed
    }
}

type SharedQueue = Arc<Mutex<Queue>>;

fn lock(queue: &SharedQueue) -> std::sync::MutexGuard<'_, Queue> {
    // Every update is one assignment, so a poisoned lock is still consistent.
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Waits for the next frame (kept in `next`); `false` once the queue has ended.
async fn frame_waiting(queue: &SharedQueue) -> bool {
    std::future::poll_fn(|cx| {
        let mut q = lock(queue);
        // Frames are sent only while the transport still has this peer: a peer of an
        // earlier run (a dead worker, or one restarted at its address) is given up, with
        // what it still holds.
        if q.retire() {
            return Poll::Ready(false);
        }
        if q.next.is_some() {
            return Poll::Ready(true);
        }
        match q.frames.poll_recv(cx) {
            Poll::Ready(Some(frame)) => {
                q.next = Some(Arc::new(frame));
                Poll::Ready(true)
            }
            Poll::Ready(None) => {
                q.closed = true;
                Poll::Ready(false)
            }
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

/// Connects when a frame is queued and makes a `Send` call whose body drains the queue;
/// after a failed call, connects anew and makes another. A frame none of whose chunks were
/// handed to a call (connection refused, call already over) is kept for the next one;
/// frames handed to a failed call, wholly or in part, are lost.
async fn drive(
    endpoint: Endpoint,
    max_message_bytes: usize,
    chunk_bytes: usize,
    frames: mpsc::UnboundedReceiver<Outgoing>,
    label: String,
    errors: Arc<PeerErrors>,
) {
    let queue = Arc::new(Mutex::new(Queue {
        frames,
        next: None,
        closed: false,
    }));
    let mut failures: u32 = 0;
    let mut channel: Option<Channel> = None;
    while frame_waiting(&queue).await {
        if failures > 0 {
            // Back off 50 ms, 100 ms, ... up to 2 s between attempts on a failing peer.
            let ms = 50u64 << failures.min(6);
            tokio::time::sleep(Duration::from_millis(ms.min(2_000))).await;
            if lock(&queue).retire() {
                return;
            }
        }
        let connected = match channel.take() {
            Some(connected) => connected,
            None => match endpoint.connect().await {
                Ok(connected) => connected,
                Err(e) => {
                    // The frame stays queued for the next attempt.
                    failures += 1;
                    let error = format!("{label}: connect: {e}");
                    tracing::warn!("{error}");
                    errors.push(error);
                    continue;
                }
            },
        };
        let body = ChunkBody {
            queue: Arc::clone(&queue),
            chunks: None,
            data: None,
            chunk_bytes,
            max_message_bytes,
        };
        match send_call(connected.clone(), body).await {
            Ok(ack) => {
                failures = 0;
                channel = Some(connected);
                tracing::debug!(
                    frames = ack.frames,
                    bytes = ack.bytes,
                    "{label}: stream closed"
                );
            }
            Err(status) => {
                failures += 1;
                let error = format!("{label}: {:?}: {}", status.code(), status.message());
                tracing::warn!("{error}");
                errors.push(error);
            }
        }
        let q = lock(&queue);
        if q.closed && q.next.is_none() {
            return;
        }
    }
}

/// The request body of one `Send` call: the queue's frames, each chunk as DATA in two parts
/// (see [`Chunk::wire`]); it ends when the queue does.
struct ChunkBody {
    queue: SharedQueue,
    /// The chunks of the frame being sent that are still to go.
    chunks: Option<Box<dyn Iterator<Item = Chunk> + Send + Sync>>,
    /// The data part of the chunk whose first part went out last.
    data: Option<Bytes>,
    chunk_bytes: usize,
    max_message_bytes: usize,
}

impl http_body::Body for ChunkBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        loop {
            if let Some(chunk) = self.chunks.as_mut().and_then(Iterator::next) {
                let max = self.max_message_bytes;
                return Poll::Ready(Some(chunk.wire(max).map(|(head, data)| {
                    self.data = data;
                    http_body::Frame::data(head)
                })));
            }
            let frame = {
                let mut q = lock(&self.queue);
                if q.retire() {
                    return Poll::Ready(None);
                }
                match q.next.take() {
                    Some(frame) => frame,
                    None => match q.frames.poll_recv(cx) {
                        Poll::Ready(Some(frame)) => Arc::new(frame),
                        Poll::Ready(None) => {
                            q.closed = true;
                            return Poll::Ready(None);
                        }
                        Poll::Pending => return Poll::Pending,
                    },
                }
            };
            self.chunks = Some(Box::new(frame.chunks(self.chunk_bytes)));
        }
    }
}

/// A transport failure of the call, as tonic reports one.
fn unavailable(what: &str, e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("{what}: {e}"))
}

/// One `ActivationService.Send` call carrying `body`: sends it, then reads the reply (a
/// `SendAck` message and the `grpc-status` trailer, or a trailers-only error).
async fn send_call(mut channel: Channel, body: ChunkBody) -> Result<SendAck, Status> {
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| unavailable("connection", e))?;
    let request = http::Request::post(SEND_PATH)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(body))
        .map_err(|e| Status::internal(format!("request: {e}")))?;
    let response = channel
        .call(request)
        .await
        .map_err(|e| unavailable("call", e))?;
    // A trailers-only reply carries the status in its headers.
    let mut status = Status::from_header_map(response.headers());
    if let Some(status) = status.take_if(|s| s.code() != Code::Ok) {
        return Err(status);
    }
    if response.status() != http::StatusCode::OK {
        return Err(Status::unknown(format!(
            "HTTP status {} from the peer",
            response.status()
        )));
    }
    let mut body = response.into_body();
    let mut reply = BytesMut::new();
    while let Some(frame) = body.frame().await {
        match frame?.into_data() {
            Ok(data) => reply.extend_from_slice(&data),
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    status = Status::from_header_map(&trailers);
                }
            }
        }
    }
    match status {
        Some(status) if status.code() != Code::Ok => Err(status),
        Some(_) => ack_from(reply.freeze()),
        None => Err(Status::internal("the reply has no grpc-status")),
    }
}

/// The `SendAck` of a reply body: exactly one uncompressed length-prefixed message.
fn ack_from(mut reply: Bytes) -> Result<SendAck, Status> {
    if reply.len() < PREFIX || reply[0] != 0 {
        return Err(Status::internal(
            "the reply is not one uncompressed message",
        ));
    }
    reply.advance(1);
    let len = reply.get_u32() as usize;
    if len != reply.len() {
        return Err(Status::internal(format!(
            "the reply's message says {len} bytes, {} came",
            reply.len()
        )));
    }
    SendAck::decode(reply).map_err(|e| Status::internal(format!("SendAck: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::net::server::{SEND, SERVICE};

    #[test]
    fn path_is_the_generated_one() {
        assert_eq!(SEND_PATH, format!("/{SERVICE}/{SEND}"));
    }

    fn prefixed(flag: u8, message: &[u8], len: usize) -> Bytes {
        let mut out = vec![flag];
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend_from_slice(message);
        out.into()
    }

    #[test]
    fn reply_is_one_ack_or_an_error() {
        let ack = SendAck {
            frames: 3,
            bytes: 4096,
        };
        let message = ack.encode_to_vec();
        let got = ack_from(prefixed(0, &message, message.len()));
        assert_eq!(got.ok(), Some(ack));
        for bad in [
            prefixed(1, &message, message.len()),     // compressed
            prefixed(0, &message, message.len() + 1), // truncated
            prefixed(0, &message, message.len() - 1), // trailing bytes
            Bytes::from_static(&[0, 0, 0]),           // no whole prefix
        ] {
            let err = ack_from(bad).expect_err("not one plain message");
            assert_eq!(err.code(), Code::Internal);
        }
    }
}
