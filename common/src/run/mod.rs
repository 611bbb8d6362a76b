//! Running a job on worker processes, without I/O: the [`Supervisor`] of one job's runs
//! (inputs in, [`Action`]s out, on logical time) and the policies it applies.
//!
//! A job runs as a sequence of *runs*: each hands every worker of a plan its assignment and
//! follows their step reports. A lost worker, a straggler, memory pressure or workers
//! joining end a run between steps, and the next one starts from a checkpoint on another
//! plan or split. The coordinator's run actor feeds the supervisor what happens (worker
//! registrations, losses, heartbeats and step reports, checkpoint listings, a cancel, the
//! time) and performs what it asks (assignments, stops, aborts, clearing checkpoints, step
//! events, re-plans).
//!
//! - [`id`]: a run's id.
//! - [`supervisor`]: the state machine of a job's runs.
//! - [`worker`]: workers and their step reports as a run sees them.
//! - [`step_event`]: a step's event, what watchers see of the step's reports.
//! - [`reports`]: gathering a run's reports per step.
//! - [`checkpoints`]: where a run resumes, from a listing of the job's checkpoint folders.
//! - [`respec`]: the job's spec rewritten for a re-plan (another worker count, a schedule).
//! - [`straggler`]: which worker is slow, and the split that moves layers off it.
//! - [`drift`]: when steps run over the plan's prediction long enough to re-plan.
//! - [`pressure`]: the fastest plan that fits the workers' memory.
//! - [`queue`]: which queued jobs start (in order, with backfill).
//! - [`registry`]: the worker processes: registrations, heartbeats and their expiry,
//!   assignment streams, claims (inputs in, actions out, on logical time).
//! - [`scheduler`]: which planned jobs start when, and when their progress is stored
//!   (inputs in, actions out, on logical time).

pub mod checkpoints;
pub mod drift;
pub mod id;
pub mod pressure;
pub mod queue;
pub mod registry;
pub mod reports;
pub mod respec;
pub mod scheduler;
pub mod step_event;
pub mod straggler;
pub mod supervisor;
pub mod worker;

pub use checkpoints::{Checkpoints, Start};
pub use id::RunId;
pub use step_event::StepEvent;
pub use supervisor::{
    Action, Assignment, Config, Failure, HeldStage, Input, Member, Reason, Supervisor, Taken,
};
pub use worker::{StageTimes, StepReport, Worker};
