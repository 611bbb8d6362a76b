//! The async runtime every `pipewise` command runs its gRPC on.

use anyhow::{Context as _, Result};

/// The async runtime of every `pipewise` command (two threads, see `pipewise_worker::sched`).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    pipewise_worker::sched::async_runtime(2, "pipewise").context("cannot start the async runtime")
}
