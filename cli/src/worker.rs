//! `pipewise worker`: a worker process that registers with a coordinator and runs the
//! stages it is assigned.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Args;
use pipewise_worker::node::config::DEFAULT_DATA_DIR;
use pipewise_worker::node::{NodeConfig, WorkerNode};
use pipewise_worker::runtime::Slowdown;

use crate::connection::{COORDINATOR_ENV, DEFAULT_COORDINATOR};
use crate::device::{DeviceArg, parse_device};
use crate::logging::{LogFormat, init_logs};
use crate::metrics::MetricsArgs;
use crate::runtime::runtime;
use crate::values::parse_memory_bytes;

/// `pipewise worker` arguments.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The coordinator's URL.
    #[arg(long, env = COORDINATOR_ENV, default_value = DEFAULT_COORDINATOR)]
    pub(crate) coordinator: String,
    /// Address of this worker's activation service (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub(crate) listen: SocketAddr,
    /// The address peers reach this worker at (default: the bound address).
    #[arg(long)]
    pub(crate) advertise: Option<String>,
    /// The worker's unique name (default: worker-PID, with the process id).
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// Seconds to wait for a peer's frame or for the other workers at a step's end.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) timeout: u64,
    /// Make every pass take this many times as long, `FACTOR` or from a step on,
    /// `FACTOR@STEP` (a stand-in for a slower device, to try the coordinator's straggler and
    /// drift handling).
    #[arg(long, value_name = "FACTOR[@STEP]", value_parser = parse_slowdown, hide = true)]
    pub(crate) slowdown: Option<Slowdown>,
    /// Device memory this worker may use (bytes, e.g. 80GiB): a job whose plan is
    /// predicted to overflow it (activations, parameters, gradients, optimizer state) is
    /// moved to a schedule predicted to fit before it starts, and one whose measured peak
    /// overflows it, after the step. Default: not watched.
    #[arg(long, value_name = "BYTES", value_parser = parse_memory_bytes)]
    pub(crate) memory_bytes: Option<u64>,
    /// Report this many bytes held beyond what the stages hold (a stand-in for memory no
    /// plan predicts, to try the coordinator's after-a-step memory check).
    #[arg(long, value_name = "BYTES", value_parser = parse_memory_bytes, hide = true)]
    pub(crate) unplanned_bytes: Option<u64>,
    /// Where stages run: `cpu`, or `cuda` / `cuda:N` (the N-th GPU; needs a pipewise built
    /// with `--features cuda`, see docs/cuda.md).
    #[arg(long, value_name = "DEVICE", default_value = "cpu", value_parser = parse_device)]
    pub(crate) device: DeviceArg,
    /// Directory a job's `checkpoint.folder` and `data.path` resolve under (the same
    /// files as the coordinator's `--data-dir`: one machine, or a shared volume); a path
    /// leading outside it is refused.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
    pub(crate) data_dir: PathBuf,
    /// Frames to and from workers on this host go over gRPC too, not through shared
    /// memory (`/dev/shm`).
    #[arg(long, env = "PIPEWISE_NO_SHM")]
    pub(crate) no_shm: bool,
    #[command(flatten)]
    pub(crate) auth: crate::security::ClientAuth,
    #[command(flatten)]
    pub(crate) tls: crate::security::WorkerTls,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// Parses the hidden `--slowdown`: a factor from 1 to 1000, optionally `@STEP`.
fn parse_slowdown(text: &str) -> std::result::Result<Slowdown, String> {
    text.parse::<Slowdown>().map_err(|e| e.to_string())
}

/// Runs `pipewise worker` until SIGTERM or SIGINT, then leaves the cluster (see
/// [`WorkerNode::drain`]) and returns.
pub(crate) fn run(args: &WorkerArgs) -> Result<()> {
    init_logs(args.log_format);
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let mut config = NodeConfig::new(args.coordinator.clone(), id);
    config.listen = args.listen;
    config.advertise = args.advertise.clone();
    config.timeout = Duration::from_secs(args.timeout);
    config.slowdown = args.slowdown.unwrap_or_default();
    config.memory_bytes = args.memory_bytes.unwrap_or(0);
    config.cores = crate::runtime::available_cores();
    if !args.no_shm {
        config.host = pipewise_worker::net::host_identity();
    }
    config.unplanned_bytes = args.unplanned_bytes.unwrap_or(0);
    config.device = args.device.open()?;
    config.tls = args.tls.settings(&args.auth)?;
    config.token = args.auth.token()?;
    config.data_dir = std::path::absolute(&args.data_dir)
        .with_context(|| format!("--data-dir {}", args.data_dir.display()))?;
    runtime()?.block_on(async {
        if let Some(addr) = args.metrics.metrics_listen {
            crate::metrics::serve(addr, Some(args.metrics.expiry()))?;
            pipewise_worker::metrics::describe();
        }
        let stop = crate::signal::stop_signal()?;
        let node = WorkerNode::start(config)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("cannot start the worker")?;
        outln!(
            "worker {} serving activations on {}, coordinator {}",
            node.id,
            node.address,
            args.coordinator
        );
        std::io::stdout().flush().ok();
        let signal = stop.await;
        let id = node.id.clone();
        tracing::info!(worker = %id, "{signal}: leaving the cluster");
        let run = node.drain().await;
        tracing::info!(worker = %id, run, "left the cluster");
        Ok(())
    })
}
