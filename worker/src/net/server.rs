//! The `ActivationService` server: frames from peers, whole or in chunks, into the
//! [`Inbox`].
//!
//! `Send` is served below tonic's codec: [`Messages`] reads the gRPC length-prefixed
//! messages straight from the HTTP/2 DATA frames and decodes each `TensorFrame` from slices
//! of the frames that carried it, so its `data` reaches the [`Inbox`]'s assembly without the
//! two copies tonic's decoder makes (into its buffer, and again when that buffer grows). The
//! data is a slice of one DATA frame whenever one frame holds all of it (as when the peer
//! sends the fields and the data as two DATA frames, see `client`); only data that itself
//! straddles frames is joined, with one copy. The wire protocol is plain gRPC: any gRPC
//! client can call it.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use pipewise_proto::v1::{SendAck, TensorFrame};
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;

use super::codec::PREFIX;
use super::inbox::Inbox;
use crate::error::Error;

/// The service's full name, as generated from the `.proto`.
pub(crate) use pipewise_proto::v1::activation_service_server::SERVICE_NAME as SERVICE;
/// The name of its only method.
#[cfg(test)]
pub(crate) const SEND: &str = "Send";
/// That method's path (checked against [`SERVICE`] and [`SEND`] in the tests).
pub(crate) const SEND_PATH: &str = "/pipewise.v1.ActivationService/Send";

/// Serves one worker's mailbox.
#[derive(Debug, Clone)]
pub(crate) struct ActivationServer {
    pub(crate) inbox: Arc<Inbox>,
    /// Largest message accepted.
    pub(crate) max_message_bytes: usize,
    /// The run's secret every frame must carry.
    pub(crate) secret: Arc<super::secret::RunSecret>,
}

impl ActivationServer {
    /// One `Send` call: every message into the inbox, then the acknowledgement.
    async fn send(&self, mut messages: Messages) -> Result<SendAck, Status> {
        let mut ack = SendAck::default();
        // The tensor whose chunks are arriving on this stream.
        let mut pending = None;
        loop {
            let frame = match messages.next().await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(status) => {
                    if let Some(partial) = pending.take() {
                        self.inbox.abandon(partial, "the stream failed");
                    }
                    return Err(status);
                }
            };
            if !self.secret.admits(&frame.run_secret) {
                // Not recorded for `recv`: a stranger must not fail the run's frames.
                if let Some(partial) = pending.take() {
                    self.inbox
                        .abandon(partial, "a frame without the run's secret came");
                }
                tracing::warn!(run = frame.run, "refused a frame without the run's secret");
                return Err(Error::RunSecret {
                    field: "TensorFrame.run_secret",
                }
                .into());
            }
            let bytes = frame.data.len() as u64;
            let done = self
                .inbox
                .accept(&mut pending, frame)
                .map_err(|rejection| Status::from(Error::from(rejection)))?;
            ack.frames += u64::from(done);
            ack.bytes += bytes;
        }
        if let Some(partial) = pending {
            let rejection = self.inbox.abandon(partial, "the stream ended");
            return Err(Error::from(rejection).into());
        }
        Ok(ack)
    }
}

impl NamedService for ActivationServer {
    const NAME: &'static str = SERVICE;
}

impl tower_service::Service<http::Request<Body>> for ActivationServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let server = self.clone();
        Box::pin(async move {
            if request.uri().path() != SEND_PATH {
                let status = Status::unimplemented(format!(
                    "{} is not a method of {SERVICE}",
                    request.uri().path()
                ));
                return Ok(status.into_http());
            }
            if let Some(encoding) = request.headers().get("grpc-encoding")
                && encoding.as_bytes() != b"identity"
            {
                let status = Status::unimplemented(format!(
                    "grpc-encoding {encoding:?}: only uncompressed messages are accepted"
                ));
                return Ok(status.into_http());
            }
            let messages = Messages::new(request.into_body(), server.max_message_bytes);
            Ok(match server.send(messages).await {
                Ok(ack) => reply(&ack),
                Err(status) => status.into_http(),
            })
        })
    }
}

/// A successful unary gRPC response: `message`, then `grpc-status: 0` in the trailers.
fn reply(message: &impl Message) -> http::Response<Body> {
    let encoded = message.encode_to_vec();
    let mut data = BytesMut::with_capacity(PREFIX + encoded.len());
    data.put_u8(0);
    data.put_u32(u32::try_from(encoded.len()).unwrap_or(u32::MAX));
    data.put_slice(&encoded);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let frames = [
        Ok::<_, Infallible>(http_body::Frame::data(data.freeze())),
        Ok(http_body::Frame::trailers(trailers)),
    ];
    let body = http_body_util::StreamBody::new(tokio_stream::iter(frames));
    let mut response = http::Response::new(Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// The `TensorFrame` messages of a request body, decoded from the HTTP/2 DATA frames.
pub(crate) struct Messages {
    body: Body,
    /// Received bytes not yet consumed, in order.
    segments: VecDeque<Bytes>,
    buffered: usize,
    ended: bool,
    max_message_bytes: usize,
}

impl Messages {
    pub(crate) fn new(body: Body, max_message_bytes: usize) -> Self {
        Messages {
            body,
            segments: VecDeque::new(),
            buffered: 0,
            ended: false,
            max_message_bytes,
        }
    }

    /// Reads DATA frames until `need` bytes are buffered; `false` if the body ends first.
    async fn fill(&mut self, need: usize) -> Result<bool, Status> {
        while self.buffered < need {
            if self.ended {
                return Ok(false);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    // Trailers from a client carry nothing for this call.
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        self.buffered += data.len();
                        self.segments.push_back(data);
                    }
                }
                Some(Err(status)) => return Err(status),
                None => self.ended = true,
            }
        }
        Ok(true)
    }

    /// The next `len` buffered bytes (call after [`Messages::fill`]), as the slices of the
    /// DATA frames that hold them (no copy).
    fn take(&mut self, len: usize) -> Segments {
        self.buffered -= len;
        let mut parts = VecDeque::new();
        let mut left = len;
        while left > 0 {
            let Some(front) = self.segments.front_mut() else {
                break;
            };
            if front.len() > left {
                parts.push_back(front.split_to(left));
                left = 0;
            } else {
                left -= front.len();
                parts.extend(self.segments.pop_front());
            }
        }
        Segments {
            parts,
            remaining: len - left,
        }
    }

    /// The next message, `None` at the end of a well-formed stream.
    pub(crate) async fn next(&mut self) -> Result<Option<TensorFrame>, Status> {
        if !self.fill(PREFIX).await? {
            if self.buffered == 0 {
                return Ok(None);
            }
            return Err(Status::internal(format!(
                "the stream ended inside a message prefix ({} of {PREFIX} bytes)",
                self.buffered
            )));
        }
        let mut prefix = self.take(PREFIX);
        let flag = prefix.get_u8();
        if flag != 0 {
            return Err(Status::unimplemented(format!(
                "message compression flag {flag}: only uncompressed messages are accepted"
            )));
        }
        let len = prefix.get_u32() as usize;
        if len > self.max_message_bytes {
            return Err(Status::out_of_range(format!(
                "a {len}-byte message is over the {}-byte limit",
                self.max_message_bytes
            )));
        }
        if !self.fill(len).await? {
            return Err(Status::internal(format!(
                "the stream ended inside a message ({} of {len} bytes)",
                self.buffered
            )));
        }
        TensorFrame::decode(self.take(len))
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("TensorFrame: {e}")))
    }
}

/// Bytes in consecutive slices of DATA frames: a [`Buf`] whose `copy_to_bytes` is a slice,
/// not a copy, when one slice holds the bytes asked for (prost takes `bytes` fields so).
#[derive(Debug)]
struct Segments {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Buf for Segments {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |part| &part[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advance past the end of the message");
        self.remaining -= cnt;
        while cnt > 0 {
            let Some(front) = self.parts.front_mut() else {
                break;
            };
            if front.len() > cnt {
                front.advance(cnt);
                cnt = 0;
            } else {
                cnt -= front.len();
                self.parts.pop_front();
            }
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(
            len <= self.remaining,
            "copy_to_bytes past the end of the message"
        );
        if let Some(front) = self.parts.front_mut()
            && front.len() >= len
        {
            let out = front.split_to(len);
            if front.is_empty() {
                self.parts.pop_front();
            }
            self.remaining -= len;
            return out;
        }
        let mut out = BytesMut::with_capacity(len);
        while out.len() < len {
            let n = self.chunk().len().min(len - out.len());
            if n == 0 {
                break; // no empty slices are kept, so this does not happen
            }
            out.put_slice(&self.chunk()[..n]);
            self.advance(n);
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn frame(mb: u32, data: &[u8]) -> TensorFrame {
        TensorFrame {
            run: 7,
            step: 3,
            stage: 1,
            mb,
            data: Bytes::copy_from_slice(data),
            ..TensorFrame::default()
        }
    }

    /// `message` with gRPC's prefix (flag, big-endian length).
    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    /// A request body delivering `wire` cut at `cuts` (as HTTP/2 DATA frames would).
    fn body(wire: &[u8], cuts: &[usize]) -> Body {
        let mut pieces = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain([wire.len()].iter()) {
            pieces.push(Ok::<_, Infallible>(http_body::Frame::data(
                Bytes::copy_from_slice(&wire[start..cut]),
            )));
            start = cut;
        }
        Body::new(http_body_util::StreamBody::new(tokio_stream::iter(pieces)))
    }

    fn read_all(wire: &[u8], cuts: &[usize], max: usize) -> Result<Vec<TensorFrame>, Status> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut messages = Messages::new(body(wire, cuts), max);
            let mut out = Vec::new();
            while let Some(m) = messages.next().await? {
                out.push(m);
            }
            Ok(out)
        })
    }

    /// The fields and the data in two DATA frames (as `client` sends them): the decoded data
    /// is the second frame's bytes themselves, not a copy.
    #[test]
    fn data_in_its_own_data_frame_is_not_copied() {
        let payload = vec![9u8; 4096];
        let wire = framed(0, &frame(5, &payload).encode_to_vec());
        let cut = wire.len() - payload.len();
        let (head, data) = (
            Bytes::copy_from_slice(&wire[..cut]),
            Bytes::copy_from_slice(&wire[cut..]),
        );
        let data_at = data.as_ptr();
        let pieces = [
            Ok::<_, Infallible>(http_body::Frame::data(head)),
            Ok(http_body::Frame::data(data)),
        ];
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = rt
            .block_on(async {
                let body = Body::new(http_body_util::StreamBody::new(tokio_stream::iter(pieces)));
                Messages::new(body, 1 << 20).next().await
            })
            .unwrap()
            .unwrap();
        assert_eq!(got.mb, 5);
        assert_eq!(&got.data[..], &payload[..]);
        assert_eq!(got.data.as_ptr(), data_at);
    }

    #[test]
    fn messages_split_anywhere_across_data_frames_decode_the_same() {
        let frames = [frame(0, &[1; 40]), frame(1, &[2; 3]), frame(2, &[])];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(framed(0, &f.encode_to_vec()));
        }
        // Whole, every single cut (inside prefixes and bodies), and one byte per frame.
        let mut cut_sets: Vec<Vec<usize>> = vec![vec![]];
        cut_sets.extend((1..wire.len()).map(|c| vec![c]));
        cut_sets.push((1..wire.len()).collect());
        for cuts in cut_sets {
            let got = read_all(&wire, &cuts, 1 << 20).unwrap();
            assert_eq!(got, frames, "cuts {cuts:?}");
        }
    }

    #[test]
    fn bad_streams_are_errors_not_panics() {
        let message = frame(0, &[9; 16]).encode_to_vec();
        let whole = framed(0, &message);
        // Truncated inside the prefix and inside the message.
        for end in [3, whole.len() - 1] {
            let err = read_all(&whole[..end], &[], 1 << 20).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
            assert!(err.message().contains("the stream ended"), "{err:?}");
        }
        // Compressed messages are refused.
        let err = read_all(&framed(1, &message), &[], 1 << 20).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
        // Over the size limit, before reading the body.
        let err = read_all(&whole, &[], message.len() - 1).unwrap_err();
        assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
        // Bytes that are not a TensorFrame.
        let err = read_all(&framed(0, &[0xff; 8]), &[], 1 << 20).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().starts_with("TensorFrame"), "{err:?}");
    }

    #[test]
    fn replies_carry_the_ack_and_grpc_status_zero() {
        let ack = SendAck {
            frames: 3,
            bytes: 12,
        };
        let response = reply(&ack);
        assert_eq!(
            response.headers()[http::header::CONTENT_TYPE],
            "application/grpc"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let collected = rt.block_on(response.into_body().collect()).unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        let data = collected.to_bytes();
        assert_eq!(data[0], 0);
        assert_eq!(SendAck::decode(&data[PREFIX..]).unwrap(), ack);
    }
}
