//! The Prometheus exporter of the `coordinator`, `worker` and `local` commands.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::MetricKindMask;

/// Step-duration histogram buckets (seconds).
const STEP_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// The metrics options of `pipewise coordinator` and `pipewise worker`.
#[derive(Debug, clap::Args)]
pub(crate) struct MetricsArgs {
    /// Serve Prometheus metrics on this address (`/metrics`).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_listen: Option<SocketAddr>,
    /// Drop a gauge series from the metrics when it has not been set for this many seconds
    /// (those of finished jobs and forgotten workers; live ones are set every step or
    /// heartbeat).
    #[arg(long, value_name = "SECONDS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..=86_400 * 365))]
    pub(crate) metrics_expiry: u64,
}

impl MetricsArgs {
    /// `--metrics-expiry`.
    pub(crate) fn expiry(&self) -> Duration {
        Duration::from_secs(self.metrics_expiry)
    }
}

/// Serves every metric recorded in this process on `http://ADDR/metrics` (call inside a
/// tokio runtime). Durations are histograms with fixed buckets (so Grafana can draw
/// heatmaps and `histogram_quantile` works). With `expiry`, a gauge series not set for
/// that long is dropped (a finished job's, a forgotten worker's: the `metrics` facade has
/// no call that removes a series); counters and histograms stay.
pub(crate) fn serve(addr: SocketAddr, expiry: Option<Duration>) -> Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .idle_timeout(MetricKindMask::GAUGE, expiry)
        .set_buckets_for_metric(
            Matcher::Full("pipewise_pass_duration_seconds".into()),
            &pipewise_worker::metrics::PASS_BUCKETS,
        )
        .context("pass-duration buckets")?
        .set_buckets_for_metric(
            Matcher::Full("pipewise_step_duration_seconds".into()),
            &STEP_BUCKETS,
        )
        .context("step-duration buckets")?
        .install()
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    Ok(())
}
