//! The pipeline runtime: a worker's stages executing its program of a schedule, with
//! frames between workers through a [`Transport`] and the end-of-step collectives through a
//! [`StepSync`].
//!
//! - [`executor`]: [`WorkerRuntime`] (one worker's step), [`StepSync`] and its in-process
//!   [`LocalSync`], and [`run_local`] (every worker of a schedule on threads).
//! - [`emulate`]: [`EmulatedRuntime`], a worker's program with emulated compute (each
//!   pass sleeps for its cost-model time, frames are real buffers of the true size), and
//!   [`run_emulated_local`] (every worker on threads).
//! - [`transport`]: [`Frame`], the [`Transport`] trait and the in-process
//!   [`MemoryTransport`].
//! - `exchange`: a pass's input and output between stages (kept in memory when both stages
//!   are on the worker, else through the transport), shared by both runtimes.

pub mod emulate;
mod exchange;
pub mod executor;
pub mod transport;

pub use emulate::{EmulatedRuntime, run_emulated_local};
pub use executor::{
    DEFAULT_TIMEOUT, LocalOptions, LocalRun, LocalSync, StepReport, StepSync, WorkerRuntime,
    WrapTransport, run_local, run_local_with,
};
pub use transport::{Buffer, Frame, FrameKind, MemoryTransport, Payload, Transport};
