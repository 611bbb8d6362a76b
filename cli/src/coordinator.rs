//! `pipewise coordinator`: the process that takes jobs (`JobService`) and the workers that
//! run them (`ClusterService`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;
use pipewise_coordinator::{Coordinator, Unfinished};

use crate::logging::{LogFormat, init_logs};
use crate::metrics::MetricsArgs;
use crate::runtime::runtime;

/// `pipewise coordinator` arguments.
#[derive(Debug, Args)]
pub(crate) struct CoordinatorArgs {
    /// Address of the gRPC server (port 0 picks a free one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub(crate) listen: SocketAddr,
    /// Directory of the job store and (by default) of checkpoints and final parameters.
    #[arg(long, value_name = "DIR", default_value = "pipewise-data")]
    pub(crate) data_dir: PathBuf,
    #[command(flatten)]
    pub(crate) security: crate::security::CoordinatorSecurity,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// Runs `pipewise coordinator` until SIGTERM or SIGINT, then stops gracefully (see
/// [`Coordinator::shutdown`]) and returns; fails when its actors end by themselves.
pub(crate) fn run(args: &CoordinatorArgs) -> Result<()> {
    init_logs(args.log_format);
    let data_dir = std::path::absolute(&args.data_dir)
        .with_context(|| format!("--data-dir {}", args.data_dir.display()))?;
    runtime()?.block_on(async {
        if let Some(addr) = args.metrics.metrics_listen {
            crate::metrics::serve(addr, Some(args.metrics.expiry()))?;
        }
        let stop = crate::signal::stop_signal()?;
        let security = args.security.load()?;
        let mut coordinator =
            Coordinator::start_secured(args.listen, &data_dir, Unfinished::Resume, &security)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("cannot start the coordinator")?;
        outln!(
            "coordinator listening on {} (data in {})",
            coordinator.addr,
            data_dir.display()
        );
        crate::security::log_start(&security);
        std::io::stdout().flush().ok();
        // A signal stops it gracefully; one of its actors ending stops it too, with an
        // error, so a supervisor (systemd, Kubernetes) restarts it and the jobs resume.
        let failed = tokio::select! {
            signal = stop => {
                tracing::info!(
                    "{signal}: shutting down (no new requests; jobs resume at the next start)"
                );
                None
            }
            why = coordinator.stopped() => Some(why),
        };
        coordinator.shutdown().await;
        tracing::info!("coordinator stopped; the job store is closed");
        match failed {
            None => Ok(()),
            Some(why) => Err(anyhow::anyhow!("the coordinator's actors stopped: {why}")),
        }
    })
}
