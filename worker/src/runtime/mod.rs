//! The pipeline runtime: a worker's stages executing its program of a schedule, with
//! frames between workers through a [`Transport`] and the end-of-step collectives through a
//! [`StepSync`].
//!
//! - [`step`]: the one pass loop of a step, over [`step::Passes`] (what computes a pass),
//!   and [`StepReport`]; `sync`: [`StepSync`], the step's collectives, and the replicas'
//!   terms.
//! - [`worker_runtime`]: [`WorkerRuntime`] (one worker's step with real stages).
//! - [`emulate`]: [`EmulatedRuntime`], a worker's program with emulated compute (each
//!   pass sleeps for its cost-model time, frames are real buffers of the true size), and
//!   [`run_emulated_local`] (every worker on threads).
//! - [`local`]: [`run_local`] (every worker of a schedule on threads) and its in-process
//!   [`LocalSync`].
//! - [`transport`]: [`Frame`], the [`Transport`] trait and the in-process
//!   [`MemoryTransport`].
//! - `real_passes`: the candle stages computing a step's passes.
//! - `one_worker_step`: the step of a worker holding every stage (a one-worker job) with
//!   its microbatches side by side on the CPU's threads.
//! - `exchange`: a pass's input and output between stages (kept in memory when both stages
//!   are on the worker, else through the transport); `recorder`: what happened when;
//!   `core_wait`: how much of the waiting was for a core; `program`: the checks of a
//!   worker's program and partition; `all_reduce`: the replicas' gradient sums beside the
//!   passes.
//! - [`validate`]: `[validation]`'s held-out loss, a forward-only program between steps.

mod all_reduce;
mod core_wait;
pub mod emulate;
mod exchange;
pub mod local;
mod one_worker_step;
mod program;
mod real_passes;
mod recorder;
pub mod step;
mod sync;
pub mod transport;
pub mod validate;
pub mod worker_runtime;

pub use emulate::{EmulatedRuntime, run_emulated_local};
pub use local::{LocalOptions, LocalRun, LocalSync, WrapTransport, run_local};
pub use program::DEFAULT_TIMEOUT;
pub use step::{
    Gathered, PassTime, Replica, ReplicaPart, ShardPart, StepReport, StepSync, TiedHolder, TiedPart,
};
pub(crate) use sync::{sum_in_replica_order, sum_in_window_order};
pub use transport::{Buffer, Frame, FrameKind, MemoryTransport, Payload, Transport};
pub use validate::{ValidationSet, hold_out};
pub use worker_runtime::{OptimizerBytes, Slowdown, WorkerRuntime};
