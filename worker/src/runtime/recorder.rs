//! What a worker did during a step, as it happened: [`Recorder`].

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use pipewise_common::trace::{Activity, Span};

use super::core_wait::CoreWait;

/// Records what a worker does during a step: [`StepReport::spans`] (in seconds of UNIX
/// time, from one reading of the system clock at the step's start plus monotonic offsets)
/// bytes sent to / received from each peer, and the time its waits spent waiting for a
/// core. Made on the thread that runs the step (whose waits it times).
#[derive(Debug)]
pub(crate) struct Recorder {
    started: Instant,
    epoch: f64,
    pub(crate) spans: Vec<Span>,
    pub(crate) sent: BTreeMap<u32, u64>,
    pub(crate) received: BTreeMap<u32, u64>,
    pub(crate) core_wait: CoreWait,
}

impl Recorder {
    /// A recorder for a step that started at `started`.
    pub(crate) fn start(started: Instant, capacity: usize) -> Recorder {
        let epoch = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
            - started.elapsed().as_secs_f64();
        Recorder {
            started,
            epoch,
            spans: Vec::with_capacity(capacity),
            sent: BTreeMap::new(),
            received: BTreeMap::new(),
            core_wait: CoreWait::start(),
        }
    }

    /// Records `activity` from `since` until now; returns its seconds.
    pub(crate) fn span(&mut self, activity: Activity, since: Instant) -> f64 {
        self.span_between(activity, since, Instant::now())
    }

    /// Records `activity` from `since` until `until`; returns its seconds.
    pub(crate) fn span_between(
        &mut self,
        activity: Activity,
        since: Instant,
        until: Instant,
    ) -> f64 {
        let at = |i: Instant| self.epoch + i.saturating_duration_since(self.started).as_secs_f64();
        self.spans.push(Span {
            activity,
            start: at(since),
            end: at(until),
        });
        until.saturating_duration_since(since).as_secs_f64()
    }
}
