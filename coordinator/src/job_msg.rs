//! The job manager's messages: what the gRPC edge asks of it, what a running job's run
//! actor tells it, and the pool of workers the membership actor tells it of.

use pipewise_common::job::{JobPlan, JobSpec};
use pipewise_common::run::registry::Pool;
use ractor::RpcReplyPort;
use tokio::sync::broadcast;

use crate::error::Result;
use crate::events::StepEvent;
use crate::store::JobRecord;
use crate::traces::RenderedTrace;

/// Messages of the job manager.
pub enum JobMsg {
    /// Validate, plan, store and queue a job. Planning runs beside the manager (a large
    /// adaptive plan takes seconds), which goes on answering; `Planned` finishes it.
    Submit(Box<JobSpec>, RpcReplyPort<Result<JobRecord>>),
    /// A submitted job's plan (or why it has none): store and queue it.
    Planned(
        Box<JobSpec>,
        Box<Result<JobPlan>>,
        RpcReplyPort<Result<JobRecord>>,
    ),
    /// One job.
    Get(u64, RpcReplyPort<Result<JobRecord>>),
    /// Every job.
    List(RpcReplyPort<Vec<JobRecord>>),
    /// Cancel a queued or running job.
    Cancel(u64, RpcReplyPort<Result<JobRecord>>),
    /// Subscribe to a job's step events: the ones already kept (see [`crate::events::HISTORY_STEPS`]),
    /// then a live receiver (which ends when the job does).
    Watch(u64, RpcReplyPort<Result<Watch>>),
    /// A run's step event.
    Progress(Box<StepEvent>),
    /// What a running job waits for (empty: nothing any more).
    Waiting(u64, String),
    /// The workers a job holds now (its claim).
    Workers(u64, Vec<String>),
    /// The workers jobs may start on changed (the membership actor tells).
    Pool(Pool),
    /// Render a kept step's executed timeline (`step` 0: the latest).
    Trace(u64, u64, RpcReplyPort<Result<RenderedTrace>>),
    /// Plan again a job the coordinator had queued or running when it stopped (its stored
    /// spec, read when the manager started); `Resumed` queues it.
    Resume(u64, Box<JobSpec>),
    /// A resumed job's plan (or why it has none).
    Resumed(u64, Box<JobSpec>, Box<Result<JobPlan>>),
    /// A job's run actor finished.
    Finished {
        /// Job id.
        job: u64,
        /// Why it failed, if it did.
        outcome: Result<()>,
        /// Whether it stopped because of a cancel.
        cancelled: bool,
    },
}

/// What a watcher gets: the steps so far, then the live ones.
pub type Watch = (Vec<StepEvent>, broadcast::Receiver<StepEvent>);
