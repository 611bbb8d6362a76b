//! Worker-to-worker transport: the [`Transport`] trait the executor talks to, and
//! [`MemoryTransport`], in-process mailboxes for workers running on threads.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FrameKind {
    /// The output of `F` of stage `s − 1`, the input of `F` of stage `s`.
    Activation,
    /// The input gradient from `B`/`BW` of stage `s + 1`, the output gradient of stage `s`.
    Gradient,
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Activation => "activation",
            FrameKind::Gradient => "gradient",
        })
    }
}

/// The little-endian bytes of a row-major `shape` tensor of `dtype`, as they travel: what
/// emulated compute sends and receives instead of tensors ("real byte buffers of the true
/// size"), and what the gRPC transport then moves without copying them in user space.
#[derive(Debug, Clone)]
pub struct Buffer {
    /// The element type.
    pub dtype: DType,
    /// The dimensions.
    pub shape: Vec<usize>,
    /// `shape`'s product × `dtype`'s size bytes.
    pub bytes: Bytes,
}

/// Bytes of the elements of a `shape` tensor of `dtype`.
fn data_bytes(shape: &[usize], dtype: DType) -> usize {
    shape.iter().product::<usize>() * dtype.size_in_bytes()
}

impl Buffer {
    /// A buffer of `shape` and `dtype` with every byte `fill`.
    pub fn filled(dtype: DType, shape: &[usize], fill: u8) -> Buffer {
        Buffer {
            dtype,
            shape: shape.to_vec(),
            bytes: Bytes::from(vec![fill; data_bytes(shape, dtype)]),
        }
    }

    /// Checks that the byte length matches the shape and dtype.
    pub fn check(&self) -> Result<()> {
        let expected = data_bytes(&self.shape, self.dtype);
        if self.bytes.len() == expected {
            Ok(())
        } else {
            Err(Error::invalid(
                "frame",
                format!(
                    "a {:?} {:?} buffer needs {expected} bytes, it has {}",
                    self.shape,
                    self.dtype,
                    self.bytes.len()
                ),
            ))
        }
    }
}

/// What a frame carries.
#[derive(Debug, Clone)]
pub enum Payload {
    /// A tensor (real compute).
    Tensor(Tensor),
    /// Its bytes (emulated compute).
    Buffer(Buffer),
}

impl Payload {
    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        match self {
            Payload::Tensor(t) => t.dims(),
            Payload::Buffer(b) => &b.shape,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Payload::Tensor(t) => t.dtype(),
            Payload::Buffer(b) => b.dtype,
        }
    }

    /// The size of the data in bytes.
    pub fn byte_len(&self) -> u64 {
        data_bytes(self.dims(), self.dtype()) as u64
    }

    /// The tensor; a buffer is decoded onto `device` (one copy).
    pub fn into_tensor(self, device: &Device) -> Result<Tensor> {
        match self {
            Payload::Tensor(t) => Ok(t),
            Payload::Buffer(b) => {
                b.check()?;
                if cfg!(target_endian = "big") {
                    return Err(Error::invalid(
                        "frame",
                        "buffers are little-endian; decoding them on a big-endian host is not \
                         supported"
                            .to_string(),
                    ));
                }
                Ok(Tensor::from_raw_buffer(
                    &b.bytes, b.dtype, &b.shape, device,
                )?)
            }
        }
    }
}

/// One tensor (or its bytes) travelling between workers, addressed to its consumer.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The training job.
    pub job: u64,
    /// The training step (0-based).
    pub step: u64,
    /// The stage that consumes the tensor.
    pub stage: u32,
    /// The microbatch.
    pub mb: u32,
    /// Activation or gradient.
    pub kind: FrameKind,
    /// Hidden states or their gradient, `[b, t, h]` in the model dtype.
    pub payload: Payload,
}

/// Worker-to-worker transport.
///
/// `send` must not block on the receiver's progress (it buffers); `recv` blocks until the
/// frame addressed to `(stage, mb, kind)` arrives or `timeout` passes (an error), and rejects
/// a frame whose `job` or `step` does not match the one asked for.
pub trait Transport: Send + Sync {
    /// Sends `frame` to worker `to_worker`.
    fn send(&self, to_worker: u32, frame: Frame) -> Result<()>;

    /// Waits for the frame of `(job, step, stage, mb, kind)` addressed to this worker and
    /// returns its payload (in the form it was sent in; the gRPC transport delivers the form
    /// its current assignment asks for).
    fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: FrameKind,
        timeout: Duration,
    ) -> Result<Payload>;
}

/// The mailbox key: who consumes the frame.
type Key = (u32, u32, FrameKind);

#[derive(Debug, Default)]
struct MailboxState {
    frames: HashMap<Key, VecDeque<Frame>>,
    aborted: Option<String>,
}

#[derive(Debug, Default)]
struct Mailbox {
    state: Mutex<MailboxState>,
    arrived: Condvar,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, MailboxState> {
        // A panic while holding the lock cannot leave the map half-updated (every update is
        // one insert or remove), so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// In-process mailboxes for `N` workers: one map of frames per worker behind a mutex, with
/// a condition variable to wake the receiver. [`MemoryTransport::network`] gives one handle
/// per worker; a handle sends to any worker and receives from its own mailbox.
#[derive(Debug, Clone)]
pub struct MemoryTransport {
    me: u32,
    boxes: Arc<Vec<Mailbox>>,
}

impl MemoryTransport {
    /// Handles for `workers` workers sharing one set of mailboxes; handle `w` is worker `w`'s.
    pub fn network(workers: u32) -> Vec<MemoryTransport> {
        let boxes: Arc<Vec<Mailbox>> = Arc::new((0..workers).map(|_| Mailbox::default()).collect());
        (0..workers)
            .map(|me| MemoryTransport {
                me,
                boxes: Arc::clone(&boxes),
            })
            .collect()
    }

    /// The worker whose mailbox this handle receives from.
    pub fn worker(&self) -> u32 {
        self.me
    }

    /// Worker count of the network.
    pub fn workers(&self) -> u32 {
        self.boxes.len() as u32
    }

    /// Frames waiting in this worker's mailbox.
    pub fn queued(&self) -> usize {
        self.boxes
            .get(self.me as usize)
            .map_or(0, |b| b.lock().frames.values().map(VecDeque::len).sum())
    }

    /// Stops the whole network: every pending and later `recv` on any handle fails at once
    /// with `reason` (used when one worker fails, so the others do not wait for it).
    pub fn abort(&self, reason: &str) {
        for b in self.boxes.iter() {
            let mut state = b.lock();
            if state.aborted.is_none() {
                state.aborted = Some(reason.to_string());
            }
            b.arrived.notify_all();
        }
    }

    fn mailbox(&self, worker: u32) -> Result<&Mailbox> {
        self.boxes.get(worker as usize).ok_or_else(|| {
            Error::invalid(
                "worker",
                format!(
                    "worker {worker} is not in this {}-worker network",
                    self.boxes.len()
                ),
            )
        })
    }
}

impl Transport for MemoryTransport {
    fn send(&self, to_worker: u32, frame: Frame) -> Result<()> {
        let mailbox = self.mailbox(to_worker)?;
        let mut state = mailbox.lock();
        if let Some(reason) = &state.aborted {
            return Err(Error::Closed {
                awaited: format!("send to worker {to_worker}"),
                reason: format!("the network was aborted ({reason})"),
            });
        }
        state
            .frames
            .entry((frame.stage, frame.mb, frame.kind))
            .or_default()
            .push_back(frame);
        mailbox.arrived.notify_all();
        Ok(())
    }

    fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: FrameKind,
        timeout: Duration,
    ) -> Result<Payload> {
        let mailbox = self.mailbox(self.me)?;
        let deadline = Instant::now() + timeout;
        let key = (stage, mb, kind);
        let mut state = mailbox.lock();
        loop {
            if let Some(reason) = &state.aborted {
                return Err(Error::Closed {
                    awaited: format!(
                        "worker {}: waiting for the {kind} of stage {stage} microbatch {mb}",
                        self.me
                    ),
                    reason: format!("the network was aborted ({reason})"),
                });
            }
            let queue = state.frames.get_mut(&key);
            if let Some(frame) = queue.and_then(VecDeque::pop_front) {
                if state.frames.get(&key).is_some_and(VecDeque::is_empty) {
                    state.frames.remove(&key);
                }
                if frame.job != job || frame.step != step {
                    return Err(Error::invalid(
                        "frame",
                        format!(
                            "worker {}: the {kind} of stage {stage} microbatch {mb} belongs to job \
                         {} step {}, expected job {job} step {step}",
                            self.me, frame.job, frame.step
                        ),
                    ));
                }
                return Ok(frame.payload);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    awaited: format!(
                        "worker {}: waiting for the {kind} of stage {stage} microbatch {mb} \
                         (job {job} step {step})",
                        self.me
                    ),
                    after: timeout,
                });
            }
            state = mailbox
                .arrived
                .wait_timeout(state, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }
}
