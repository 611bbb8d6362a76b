//! [`Pace`]: how an in-process test harness sets a worker's pace and its clock. A worker
//! started without one (every process, `pipewise local`) runs as fast as it can and
//! reports the pass times it measured.
//!
//! With a pace, the worker's decisions no longer depend on the wall clock or on how busy
//! the machine is:
//! - before each step the assignment thread waits until the coordinator answered every
//!   step report it sent (a stop asked after step `k` then reaches worker 0 before step
//!   `k + 2` starts), then until [`Pace::before_step`] lets it go on;
//! - the pass times it reports are the pace's logical ones ([`Pace::pass_secs`]), the step's
//!   time in passes their sum and its wall time the same (waits for peers are not modelled;
//!   core waits are 0), and its reports carry no spans (no trace; the cost model's sync, hop
//!   and gradient-sum costs stay at their priors); `--slowdown` stretches only those
//!   logical times (no pass sleeps);
//! - its start-up profile is the pace's [`Pace::flops_per_second`], not a measurement;
//! - it reports each step once [`Pace::before_report`] lets it.

use std::time::Duration;

use pipewise_common::pass::PassKind;

/// A test harness's pace of one worker (see the [module docs](self)).
pub trait Pace: Send + Sync + std::fmt::Debug {
    /// Blocks the assignment thread until step `step` of run `run` may start (every step,
    /// the run's first included).
    fn before_step(&self, run: u64, step: u64);

    /// Blocks the assignment thread before it reports step `step` of run `run` as a worker
    /// of replica `replica` (the cost model takes a step's first replica's reports and the
    /// others' in the order they come: a harness orders them).
    fn before_report(&self, _run: u64, _step: u64, _replica: u32) {}

    /// The logical seconds of a `kind` pass of a stage holding `pieces` pieces, in a step
    /// `slowdown` times slower than the worker's normal speed.
    fn pass_secs(&self, kind: PassKind, pieces: usize, slowdown: f64) -> f64;

    /// The speed the worker registers (FLOP/s).
    fn flops_per_second(&self) -> f64;

    /// The coordinator answered one of the worker's heartbeats (a harness that moves the
    /// coordinator's logical clock waits for them, so that no live worker expires).
    fn heartbeat_answered(&self) {}

    /// How often the worker sends heartbeats when the coordinator asks for one every
    /// `given`: a harness on the coordinator's logical clock has no use for the wall-clock
    /// cadence, only for the beats, and waits for them after every move of that clock.
    fn heartbeat_interval(&self, given: Duration) -> Duration {
        given
    }
}
