//! The async runtime every `pipewise` command runs its gRPC on.

use anyhow::{Context as _, Result};

/// The async runtime of every `pipewise` command (two threads, see `pipewise_worker::sched`).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    pipewise_worker::sched::async_runtime(2, "pipewise").context("cannot start the async runtime")
}

/// The cores this process may run on (its CPU affinity where the OS tells, else 1).
pub(crate) fn available_cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}
