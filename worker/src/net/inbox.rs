//! The receiving side: validated frames in a mailbox keyed by `(step, stage, mb, kind)`,
//! with a condition variable that wakes `recv`.

use super::RunName;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use candle_core::Device;
use pipewise_proto::v1::TensorFrame;

use super::codec::{self, Assembly, Delivery, Rejection};
use crate::error::{Error, Result};
use crate::runtime::transport::{FrameKind, Payload};

/// `(step, stage, mb, kind)`: the consumer of a frame.
pub(crate) type Key = (u64, u32, u32, FrameKind);

/// How many steps past the one `recv` last asked for a frame may be.
const AHEAD: u64 = 2;

/// The most rejections kept for `recv` (each names a key a frame was refused for).
const MAX_REJECTED: usize = 4096;

#[derive(Debug, Default)]
struct State {
    /// The run whose frames are taken ([`RunName`]).
    run: u64,
    stages: BTreeSet<u32>,
    delivery: Delivery,
    frames: HashMap<Key, Payload>,
    /// Keys whose frame was rejected, with the reason; `recv` for them fails at once.
    rejected: HashMap<Key, String>,
    /// Keys already taken by `recv` (for duplicate detection), pruned to the last two steps.
    consumed: HashSet<Key>,
    /// The newest step `recv` was asked for (`None` before the first): frames of steps far
    /// from it are refused.
    current_step: Option<u64>,
    closed: Option<String>,
    accepted_frames: u64,
    accepted_bytes: u64,
    rejected_frames: u64,
}

/// What the receiving side has seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Frames accepted into the mailbox.
    pub accepted_frames: u64,
    /// Payload bytes of the accepted frames.
    pub accepted_bytes: u64,
    /// Frames rejected as malformed, foreign or duplicate.
    pub rejected_frames: u64,
    /// Frames waiting for `recv`.
    pub queued: usize,
}

#[derive(Debug)]
pub(crate) struct Inbox {
    state: Mutex<State>,
    arrived: Condvar,
    device: Device,
    /// The largest tensor accepted, in bytes.
    max_bytes: usize,
}

impl Inbox {
    pub(crate) fn new(
        run: u64,
        stages: impl IntoIterator<Item = u32>,
        delivery: Delivery,
        device: Device,
        max_bytes: usize,
    ) -> Self {
        Inbox {
            state: Mutex::new(State {
                run,
                stages: stages.into_iter().collect(),
                delivery,
                ..State::default()
            }),
            arrived: Condvar::new(),
            device,
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single insert or remove, so a poisoned lock is still consistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Switches to a new run and set of stages, whose frames are delivered as `delivery`
    /// says, dropping every queued frame and record.
    pub(crate) fn assign(
        &self,
        run: u64,
        stages: impl IntoIterator<Item = u32>,
        delivery: Delivery,
    ) {
        let mut state = self.lock();
        // A new assignment reopens a transport closed by an aborted job.
        *state = State {
            run,
            stages: stages.into_iter().collect(),
            delivery,
            ..State::default()
        };
        self.arrived.notify_all();
    }

    pub(crate) fn stats(&self) -> InboxStats {
        let state = self.lock();
        InboxStats {
            accepted_frames: state.accepted_frames,
            accepted_bytes: state.accepted_bytes,
            rejected_frames: state.rejected_frames,
            queued: state.frames.len(),
        }
    }

    /// Why the inbox was closed (the job abandoned), if it was.
    pub(crate) fn closed_reason(&self) -> Option<String> {
        self.lock().closed.clone()
    }

    /// Fails every pending and later `recv` with `reason`.
    pub(crate) fn close(&self, reason: &str) {
        let mut state = self.lock();
        if state.closed.is_none() {
            state.closed = Some(reason.to_string());
        }
        self.arrived.notify_all();
    }

    /// Fails every pending and later `recv` of run `run` with `reason`, if the inbox is
    /// still that run's (a later assignment is not failed by what happened to an earlier).
    pub(crate) fn close_run(&self, run: u64, reason: &str) {
        let mut state = self.lock();
        if state.run == run && state.closed.is_none() {
            state.closed = Some(reason.to_string());
        }
        self.arrived.notify_all();
    }

    /// Records a rejection under every key the frame names (both kinds if its kind is bad),
    /// except for a duplicate, whose first copy stays deliverable.
    fn reject(&self, frame: &TensorFrame, rejection: &Rejection) {
        let kinds = match codec::kind_from_proto(frame.kind) {
            Ok(kind) => vec![kind],
            Err(_) => vec![FrameKind::Activation, FrameKind::Gradient],
        };
        let mut state = self.lock();
        state.rejected_frames += 1;
        // Recorded for `recv` only when the frame was meant for this worker's run (a stray
        // frame of another run must not fail this run's key), and only so many.
        // A frame refused for its step is no frame the worker is waiting for either: a key
        // it names is one the worker is far from, and must not fail when it gets there.
        let ours = frame.run == state.run && rejection.field != "step";
        let kinds = if rejection.duplicate || !ours || state.rejected.len() >= MAX_REJECTED {
            Vec::new()
        } else {
            kinds
        };
        for kind in kinds {
            let key = (frame.step, frame.stage, frame.mb, kind);
            state
                .rejected
                .insert(key, format!("{}: {rejection}", RunName(frame.run)));
        }
        self.arrived.notify_all();
        tracing::warn!(
            run = frame.run,
            step = frame.step,
            stage = frame.stage,
            mb = frame.mb,
            "rejected frame: {rejection}"
        );
    }

    /// Takes one message of a stream: a whole frame or the next chunk of the tensor in
    /// `pending` (the stream's assembly, `None` between tensors). Returns whether a frame
    /// completed. A rejection is recorded for `recv` under the message's key and, when it
    /// breaks off a tensor in progress, under that tensor's key too.
    pub(crate) fn accept(
        &self,
        pending: &mut Option<Assembly>,
        frame: TensorFrame,
    ) -> Result<bool, Rejection> {
        let in_progress = pending.as_ref().map(|a| a.header().clone());
        match self.take(pending, &frame) {
            Ok(done) => Ok(done),
            Err(rejection) => {
                *pending = None;
                self.reject(&frame, &rejection);
                if let Some(header) = in_progress {
                    let (step, stage, mb) = (header.step, header.stage, header.mb);
                    if (frame.step, frame.stage, frame.mb) != (step, stage, mb) {
                        self.reject(&header, &rejection);
                    }
                }
                Err(rejection)
            }
        }
    }

    /// Records that a stream ended (or failed) with `pending` incomplete.
    pub(crate) fn abandon(&self, pending: Assembly, why: &str) -> Rejection {
        let (filled, total) = pending.progress();
        let rejection = Rejection::new(
            "data",
            format!("{why} after {filled} of the tensor's {total} bytes"),
        );
        self.reject(pending.header(), &rejection);
        rejection
    }

    fn take(&self, pending: &mut Option<Assembly>, frame: &TensorFrame) -> Result<bool, Rejection> {
        let mut assembly = match pending.take() {
            Some(assembly) => {
                assembly.check_continues(frame)?;
                assembly
            }
            None => self.start(frame, false)?,
        };
        assembly.append(&frame.data)?;
        if !assembly.is_complete() {
            *pending = Some(assembly);
            return Ok(false);
        }
        self.store(assembly)?;
        Ok(true)
    }

    /// Starts the frame announced by `frame`, checked against the run and its stages;
    /// `copied`: its data comes from memory that is reused ([`Assembly::start_copied`]).
    fn start(&self, frame: &TensorFrame, copied: bool) -> Result<Assembly, Rejection> {
        let key = Self::key_of(frame)?;
        let delivery = {
            let state = self.lock();
            Self::check_key(&state, frame, key)?;
            state.delivery
        };
        if copied {
            Assembly::start_copied(frame, self.max_bytes, delivery)
        } else {
            Assembly::start(frame, self.max_bytes, delivery)
        }
    }

    fn key_of(frame: &TensorFrame) -> Result<Key, Rejection> {
        Ok((
            frame.step,
            frame.stage,
            frame.mb,
            codec::kind_from_proto(frame.kind)?,
        ))
    }

    /// Queues a complete frame for `recv`.
    fn store(&self, assembly: Assembly) -> Result<(), Rejection> {
        let header = assembly.header().clone();
        let key = Self::key_of(&header)?;
        let bytes = assembly.progress().1 as u64;
        let payload = assembly.finish(&self.device)?;
        let mut state = self.lock();
        // The run or the key may have changed while the tensor arrived.
        Self::check_key(&state, &header, key)?;
        state.frames.insert(key, payload);
        state.accepted_frames += 1;
        state.accepted_bytes += bytes;
        self.arrived.notify_all();
        Ok(())
    }

    /// Starts a frame whose `data_len` bytes of data are added by
    /// [`Assembly::append_slice`] (a shared-memory ring's), then handed to
    /// [`Inbox::complete`]. A refusal is recorded for `recv`, as [`Inbox::accept`]'s are.
    pub(crate) fn begin(
        &self,
        frame: &TensorFrame,
        data_len: usize,
    ) -> Result<Assembly, Rejection> {
        let started = self.start(frame, true).and_then(|assembly| {
            let total = assembly.progress().1;
            if total == data_len {
                Ok(assembly)
            } else {
                Err(Rejection::new(
                    "data",
                    format!(
                        "{data_len} bytes follow, but the tensor's shape {:?} needs {total}",
                        frame.shape
                    ),
                ))
            }
        });
        started.inspect_err(|rejection| self.reject(frame, rejection))
    }

    /// Queues a frame started by [`Inbox::begin`] whose data is all there.
    pub(crate) fn complete(&self, assembly: Assembly) -> Result<(), Rejection> {
        let header = assembly.header().clone();
        self.store(assembly)
            .inspect_err(|rejection| self.reject(&header, rejection))
    }

    /// Records that a frame started by [`Inbox::begin`] was refused part way.
    pub(crate) fn refuse(&self, assembly: &Assembly, rejection: &Rejection) {
        self.reject(assembly.header(), rejection);
    }

    fn check_key(state: &State, frame: &TensorFrame, key: Key) -> Result<(), Rejection> {
        if frame.run != state.run {
            return Err(Rejection::new(
                "run",
                format!(
                    "{} is not this worker's {}",
                    RunName(frame.run),
                    RunName(state.run)
                ),
            ));
        }
        if !state.stages.contains(&frame.stage) {
            return Err(Rejection::new(
                "stage",
                format!(
                    "{} is not held by this worker (it holds {:?})",
                    frame.stage, state.stages
                ),
            ));
        }
        // A worker is at most a step behind or ahead of its peers; a frame of a step it
        // finished before the last, or well ahead of its own, is no frame it will take.
        if let Some(now) = state.current_step
            && (frame.step.saturating_add(1) < now || frame.step > now.saturating_add(AHEAD))
        {
            return Err(Rejection::new(
                "step",
                format!(
                    "{} is not near this worker's step {now} ({} to {})",
                    frame.step,
                    now.saturating_sub(1),
                    now.saturating_add(AHEAD)
                ),
            ));
        }
        if state.frames.contains_key(&key) || state.consumed.contains(&key) {
            let mut rejection = Rejection::new(
                "mb",
                format!(
                    "duplicate: the {} of step {} stage {} microbatch {} was already received",
                    key.3, key.0, key.1, key.2
                ),
            );
            rejection.duplicate = true;
            return Err(rejection);
        }
        Ok(())
    }

    /// The frame of `(job, step, stage, mb, kind)` if it is there (`recv` without waiting).
    pub(crate) fn take_ready(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: FrameKind,
    ) -> Result<Option<Payload>> {
        match self.recv(job, step, stage, mb, kind, Duration::ZERO) {
            Err(Error::Timeout { .. }) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Waits for the frame of `(job, step, stage, mb, kind)`.
    pub(crate) fn recv(
        &self,
        job: u64,
        step: u64,
        stage: u32,
        mb: u32,
        kind: FrameKind,
        timeout: Duration,
    ) -> Result<Payload> {
        let deadline = Instant::now() + timeout;
        let key = (step, stage, mb, kind);
        let mut state = self.lock();
        if job == state.run && state.current_step.is_none_or(|now| step > now) {
            state.current_step = Some(step);
            let keep_from = step.saturating_sub(1);
            state.consumed.retain(|k| k.0 >= keep_from);
            // Frames queued before the first `recv` that are far from it go too.
            state
                .frames
                .retain(|k, _| k.0 >= keep_from && k.0 <= step.saturating_add(AHEAD));
        }
        loop {
            if job != state.run {
                return Err(Error::invalid(
                    "frame",
                    format!(
                        "waiting for the {kind} of {} step {step} stage {stage} microbatch {mb}, \
                     but this worker is assigned {}",
                        RunName(job),
                        RunName(state.run)
                    ),
                ));
            }
            if let Some(reason) = state.rejected.remove(&key) {
                return Err(Error::invalid(
                    "frame",
                    format!(
                        "the {kind} of step {step} stage {stage} microbatch {mb} was rejected: \
                     {reason}"
                    ),
                ));
            }
            if let Some(payload) = state.frames.remove(&key) {
                state.consumed.insert(key);
                return Ok(payload);
            }
            if let Some(reason) = &state.closed {
                return Err(Error::Closed {
                    awaited: format!(
                        "waiting for the {kind} of step {step} stage {stage} microbatch {mb}"
                    ),
                    reason: format!("the transport is closed ({reason})"),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let other_steps: Vec<u64> = state
                    .frames
                    .keys()
                    .filter(|k| (k.1, k.2, k.3) == (stage, mb, kind))
                    .map(|k| k.0)
                    .collect();
                return Err(Error::Timeout {
                    awaited: format!(
                        "waiting for the {kind} of {} step {step} stage {stage} microbatch {mb} \
                         (queued for other steps: {other_steps:?})",
                        RunName(job)
                    ),
                    after: timeout,
                });
            }
            state = self
                .arrived
                .wait_timeout(state, deadline - now)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0);
        }
    }
}
