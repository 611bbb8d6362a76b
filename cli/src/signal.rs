//! Stopping a server process gracefully: SIGTERM (what Kubernetes and most supervisors
//! send) and SIGINT (Ctrl-C) both ask `pipewise coordinator` and `pipewise worker` to stop.

use anyhow::{Context as _, Result};

/// Listens for SIGTERM and SIGINT from now on; the future resolves with the name of the
/// first that comes. Call inside the async runtime.
#[cfg(unix)]
pub(crate) fn stop_signal() -> Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// Listens for Ctrl-C (there is no SIGTERM here).
#[cfg(not(unix))]
pub(crate) fn stop_signal() -> Result<impl Future<Output = &'static str>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    })
}
