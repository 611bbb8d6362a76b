//! The `ActivationService` server: frames from peers into the [`Inbox`].

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
        while let Some(frame) = frames.message().await? {
            let bytes = frame.data.len() as u64;
            self.inbox
                .accept(frame)
                .map_err(|rejection| Status::invalid_argument(rejection.to_string()))?;
            ack.frames += 1;
            ack.bytes += bytes;
        }
        Ok(Response::new(ack))
    }
}
