//! Moving a pass's input and output between stages, shared by the real
//! ([`super::executor`]) and emulated ([`super::emulate`]) runtimes through
//! [`super::step`]'s pass loop: a value stays in this
//! worker's memory when both stages are here, else it goes through the [`Transport`], with
//! the time and bytes recorded.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pipewise_common::pass::Pass;
use pipewise_common::placement::Placement;
use pipewise_common::trace::Activity;

use super::recorder::Recorder;
use super::transport::{Frame, FrameKind, Payload, Transport};
use crate::error::{Error, Result};

/// Values handed between stages of the same worker, by (receiving stage, microbatch, kind).
pub(crate) type Local<T> = HashMap<(u32, u32, FrameKind), T>;

/// One worker's view of a step's exchanges.
pub(crate) struct Link<'a> {
    pub(crate) worker: u32,
    pub(crate) placement: &'a Placement,
    pub(crate) transport: &'a dyn Transport,
    pub(crate) job: u64,
    pub(crate) step: u64,
    pub(crate) timeout: Duration,
}

/// A pass's input: from this worker's memory, or received from a peer (to be checked and
/// converted by the runtime).
pub(crate) enum Input<T> {
    Local(T),
    Received(Payload),
}

impl Link<'_> {
    /// Takes the input of `pass` of kind `kind`: from `local` when the producing stage is on
    /// this worker, else from the transport.
    pub(crate) fn take<T>(
        &self,
        local: &mut Local<T>,
        rec: &mut Recorder,
        pass: Pass,
        kind: FrameKind,
    ) -> Result<Input<T>> {
        let (stage, mb) = (pass.stage, pass.mb);
        let producer = match kind {
            FrameKind::Activation => stage - 1,
            FrameKind::Gradient => stage + 1,
        };
        let peer = self.placement.worker_of(producer);
        if peer == self.worker {
            return local
                .remove(&(stage, mb, kind))
                .map(Input::Local)
                .ok_or_else(|| {
                    Error::invalid(
                        "schedule",
                        format!(
                            "worker {}: stage {stage} microbatch {mb} needs the {kind} of stage \
                         {producer} before this worker produced it",
                            self.worker
                        ),
                    )
                });
        }
        let t0 = Instant::now();
        let mark = rec.core_wait.mark();
        let payload = self
            .transport
            .recv(self.job, self.step, stage, mb, kind, self.timeout)?;
        rec.core_wait.add_since(mark);
        rec.span(Activity::Recv { pass, peer }, t0);
        *rec.received.entry(peer).or_default() += payload.byte_len();
        Ok(Input::Received(payload))
    }

    /// The error for a received `payload` of the wrong shape or type.
    pub(crate) fn bad_frame(
        &self,
        pass: Pass,
        kind: FrameKind,
        payload: &Payload,
        expected: (&[usize], candle_core::DType),
    ) -> Error {
        Error::invalid(
            "frame",
            format!(
                "worker {}: the {kind} for stage {} microbatch {} of step {} is {:?} {:?}, \
                 expected {:?} {:?}",
                self.worker,
                pass.stage,
                pass.mb,
                self.step,
                payload.dims(),
                payload.dtype(),
                expected.0,
                expected.1
            ),
        )
    }

    /// Hands `value`, the output of `pass`, to stage `stage`: into `local` when that stage is
    /// on this worker, else sent as `to_payload(value)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn deliver<T>(
        &self,
        local: &mut Local<T>,
        rec: &mut Recorder,
        pass: Pass,
        stage: u32,
        kind: FrameKind,
        value: T,
        to_payload: impl FnOnce(T) -> Payload,
    ) -> Result<()> {
        let mb = pass.mb;
        let to = self.placement.worker_of(stage);
        if to == self.worker {
            if local.insert((stage, mb, kind), value).is_some() {
                return Err(Error::invalid(
                    "schedule",
                    format!("the {kind} for stage {stage} microbatch {mb} was produced twice"),
                ));
            }
            return Ok(());
        }
        let payload = to_payload(value);
        let bytes = payload.byte_len();
        let t0 = Instant::now();
        self.transport.send(
            to,
            Frame {
                job: self.job,
                step: self.step,
                stage,
                mb,
                kind,
                payload,
            },
        )?;
        rec.span(Activity::Send { pass, peer: to }, t0);
        *rec.sent.entry(to).or_default() += bytes;
        Ok(())
    }
}
