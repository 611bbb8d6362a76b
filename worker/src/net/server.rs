//! The `ActivationService` server: frames from peers, whole or in chunks, into the
//! [`Inbox`].

use std::sync::Arc;

use pipewise_proto::v1::activation_service_server::ActivationService;
use pipewise_proto::v1::{SendAck, TensorFrame};
use tonic::{Request, Response, Status, Streaming};

use super::inbox::Inbox;

/// Serves one worker's mailbox.
#[derive(Debug, Clone)]
pub(crate) struct ActivationServer {
    pub(crate) inbox: Arc<Inbox>,
}

#[tonic::async_trait]
impl ActivationService for ActivationServer {
    async fn send(
        &self,
        request: Request<Streaming<TensorFrame>>,
    ) -> Result<Response<SendAck>, Status> {
        let mut frames = request.into_inner();
        let mut ack = SendAck::default();
        // The tensor whose chunks are arriving on this stream.
        let mut pending = None;
        loop {
            let frame = match frames.message().await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(status) => {
                    if let Some(partial) = pending.take() {
                        self.inbox.abandon(partial, "the stream failed");
                    }
                    return Err(status);
                }
            };
            let bytes = frame.data.len() as u64;
            let done = self
                .inbox
                .accept(&mut pending, frame)
                .map_err(|rejection| Status::invalid_argument(rejection.to_string()))?;
            ack.frames += u64::from(done);
            ack.bytes += bytes;
        }
        if let Some(partial) = pending {
            let rejection = self.inbox.abandon(partial, "the stream ended");
            return Err(Status::invalid_argument(rejection.to_string()));
        }
        Ok(Response::new(ack))
    }
}
