//! What a run actor is told: by the membership actor (workers, step reports), the job
//! manager (a cancel) and its timer.

use pipewise_common::run::StepReport;
use pipewise_common::run::supervisor::Input;

/// Messages of a run actor.
pub enum RunMsg {
    /// Something the supervisor takes (pushed by the membership actor, or a cancel).
    Input(Box<Input>),
    /// A worker's step report of the job's current run.
    Report(Box<StepReport>),
    /// Time passed.
    Tick,
}
