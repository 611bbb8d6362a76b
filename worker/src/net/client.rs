//! The sending side: one long-lived client-streaming `Send` call per peer, fed by an
//! unbounded queue so `Transport::send` never waits for the receiver.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pipewise_proto::v1::SendAck;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic::{GrpcMethod, Request, Response, Status};

use super::codec::{Chunk, FrameCodec, Outgoing};

use super::server::{SEND, SEND_PATH, SERVICE};

/// Errors seen by the peer tasks, newest last (bounded).
#[derive(Debug, Default)]
pub(crate) struct PeerErrors {
    list: Mutex<Vec<String>>,
}

const MAX_ERRORS: usize = 64;

impl PeerErrors {
    pub(crate) fn push(&self, error: String) {
        let mut list = self
            .list
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if list.len() == MAX_ERRORS {
            list.remove(0);
        }
        list.push(error);
    }

    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .list
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// The queue into one peer's task.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    pub(crate) address: String,
    pub(crate) queue: mpsc::UnboundedSender<Outgoing>,
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
}

/// Starts the task of the peer at `address` (no connection yet: it connects on the first
/// frame, and again after a failed call or connection attempt).
pub(crate) fn spawn_peer(
    runtime: &tokio::runtime::Handle,
    worker: u32,
    address: String,
    settings: &ClientSettings,
    errors: Arc<PeerErrors>,
) -> Result<Peer, String> {
    let uri = if address.contains("://") {
        address.clone()
    } else {
        format!("http://{address}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|e| format!("peer {worker} address {address:?}: {e}"))?
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
    runtime.spawn(drive(endpoint, max, chunk_bytes, frames, label, errors));
    Ok(Peer { address, queue })
}

/// Forwards queued frames, in chunks, into a `Send` call; after a failed call, connects
/// anew and starts another. A frame none of whose chunks could be handed to a call
/// (connection refused, call already over) is kept for the next one; frames handed to a
/// failed call, wholly or in part, are lost.
async fn drive(
    endpoint: Endpoint,
    max_message_bytes: usize,
    chunk_bytes: usize,
    mut frames: mpsc::UnboundedReceiver<Outgoing>,
    label: String,
    errors: Arc<PeerErrors>,
) {
    let mut carry: Option<Arc<Outgoing>> = None;
    let mut failures: u32 = 0;
    let mut channel: Option<Channel> = None;
    loop {
        let first = match carry.take() {
            Some(frame) => frame,
            None => match frames.recv().await {
                Some(frame) => Arc::new(frame),
                None => return,
            },
        };
        if failures > 0 {
            // Back off 50 ms, 100 ms, ... up to 2 s between attempts on a failing peer.
            let ms = 50u64 << failures.min(6);
            tokio::time::sleep(Duration::from_millis(ms.min(2_000))).await;
        }
        let connected = match channel.take() {
            Some(connected) => connected,
            None => match endpoint.connect().await {
                Ok(connected) => connected,
                Err(e) => {
                    // Keep the frame for the next attempt.
                    failures += 1;
                    let error = format!("{label}: connect: {e}");
                    tracing::warn!("{error}");
                    errors.push(error);
                    carry = Some(first);
                    continue;
                }
            },
        };
        let (stream_tx, stream_rx) = mpsc::channel::<Chunk>(2);
        let call = tokio::spawn(send_call(
            connected.clone(),
            max_message_bytes,
            ReceiverStream::new(stream_rx),
        ));
        let mut pending = Some(first);
        let mut input_closed = false;
        'frames: while let Some(frame) = pending.take() {
            for (index, chunk) in frame.chunks(chunk_bytes).enumerate() {
                if stream_tx.send(chunk).await.is_err() {
                    // The call ended; an untouched frame goes on the next one.
                    if index == 0 {
                        carry = Some(frame);
                    }
                    break 'frames;
                }
            }
            tokio::select! {
                next = frames.recv() => match next {
                    Some(frame) => pending = Some(Arc::new(frame)),
                    None => input_closed = true,
                },
                () = stream_tx.closed() => {}
            }
        }
        drop(stream_tx);
        match call.await {
            Ok(Ok(ack)) => {
                failures = 0;
                channel = Some(connected);
                let ack = ack.into_inner();
                tracing::debug!(
                    frames = ack.frames,
                    bytes = ack.bytes,
                    "{label}: stream closed"
                );
            }
            Ok(Err(status)) => {
                failures += 1;
                let error = format!("{label}: {:?}: {}", status.code(), status.message());
                tracing::warn!("{error}");
                errors.push(error);
            }
            Err(join) => {
                failures += 1;
                errors.push(format!("{label}: send task failed: {join}"));
            }
        }
        if input_closed && carry.is_none() {
            return;
        }
    }
}

/// One `ActivationService.Send` call carrying `frames`, written by [`FrameCodec`] (what the
/// generated client does, with a codec that copies each tensor only once).
async fn send_call(
    channel: Channel,
    max_message_bytes: usize,
    frames: ReceiverStream<Chunk>,
) -> Result<Response<SendAck>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("service was not ready: {e}")))?;
    let path = PathAndQuery::from_static(SEND_PATH);
    let mut request = Request::new(frames);
    request
        .extensions_mut()
        .insert(GrpcMethod::new(SERVICE, SEND));
    grpc.client_streaming(request, path, FrameCodec).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_is_the_generated_one() {
        assert_eq!(SEND_PATH, format!("/{SERVICE}/{SEND}"));
    }
}
