//! The cluster commands: `pipewise coordinator` and `pipewise worker` run the two kinds of
//! process; `submit`, `status`, `watch` and `cancel` talk to a running coordinator's
//! `JobService`.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use pipewise_coordinator::{Coordinator, Unfinished};
use pipewise_proto::v1 as pb;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use pipewise_worker::node::{NodeConfig, WorkerNode};
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;

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
    pub(crate) metrics: crate::metrics::MetricsArgs,
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// `pipewise worker` arguments.
#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The coordinator's URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
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
    /// Make every pass take this many times as long (a stand-in for a slower device, to
    /// try the coordinator's straggler handling).
    #[arg(long, default_value_t = 1.0, value_parser = parse_slowdown, hide = true)]
    pub(crate) slowdown: f64,
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
    #[command(flatten)]
    pub(crate) metrics: crate::metrics::MetricsArgs,
    /// Log format on standard error.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// `pipewise worker --device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceArg {
    Cpu,
    /// A CUDA GPU by ordinal.
    Cuda(usize),
}

/// Parses `--device`: `cpu`, `cuda` or `cuda:N`. CUDA is refused here, with how to get it,
/// when this binary was built without the `cuda` feature.
pub(crate) fn parse_device(text: &str) -> std::result::Result<DeviceArg, String> {
    let text = text.trim().to_ascii_lowercase();
    let device = match text.as_str() {
        "cpu" => return Ok(DeviceArg::Cpu),
        "cuda" => DeviceArg::Cuda(0),
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => DeviceArg::Cuda(n),
            _ => return Err(format!("{text:?} is not a device; use cpu, cuda or cuda:N")),
        },
    };
    if cfg!(feature = "cuda") {
        Ok(device)
    } else {
        Err(format!(
            "{text}: this pipewise was built without CUDA; build it with `cargo build \
             --release -p pipewise-cli --features cuda` (docs/cuda.md)"
        ))
    }
}

impl DeviceArg {
    /// The candle device (opens the GPU).
    pub(crate) fn open(self) -> Result<candle_core::Device> {
        match self {
            DeviceArg::Cpu => Ok(candle_core::Device::Cpu),
            DeviceArg::Cuda(n) => candle_core::Device::new_cuda(n)
                .map_err(|e| anyhow::anyhow!("--device cuda:{n}: cannot open the GPU: {e}")),
        }
    }
}

/// Where a client command finds the coordinator.
#[derive(Debug, Args)]
pub(crate) struct Endpoint {
    /// The coordinator's URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub(crate) coordinator: String,
    /// Keep trying to reach the coordinator for up to this many seconds (e.g. while it
    /// starts); only connecting is retried, never a request, so nothing is sent twice.
    #[arg(long, value_name = "SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub(crate) wait_for_coordinator: u64,
}

/// `pipewise submit` arguments.
#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// The job file (TOML).
    pub(crate) file: PathBuf,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
    /// Override the schedule.
    #[arg(long)]
    pub(crate) schedule: Option<String>,
    /// Override the worker count.
    #[arg(long)]
    pub(crate) workers: Option<u32>,
    /// Override the step count.
    #[arg(long)]
    pub(crate) steps: Option<u64>,
    /// Override the microbatch count.
    #[arg(long)]
    pub(crate) microbatches: Option<u32>,
    /// Follow the job until it ends (like `watch`); exit status 1 unless it succeeds.
    #[arg(long)]
    pub(crate) wait: bool,
}

/// `pipewise status` arguments.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Job id (without one, every job is listed).
    pub(crate) job: Option<u64>,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
}

/// `pipewise watch` / `cancel` arguments.
#[derive(Debug, Args)]
pub(crate) struct JobArgs {
    /// Job id (as `submit` printed it; `status` lists every job).
    pub(crate) job: u64,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
}

/// The async runtime of every `pipewise` command (two threads, see `pipewise_worker::sched`).
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    pipewise_worker::sched::async_runtime(2, "pipewise").context("cannot start the async runtime")
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (with the job, step and worker of the enclosing spans).
    Json,
}

/// Logs to standard error, `info` and up unless `RUST_LOG` says otherwise.
pub(crate) fn init_logs(format: LogFormat) {
    init_logs_at(format, "info");
}

/// Logs to standard error, `default` (a level or filter) unless `RUST_LOG` says otherwise.
pub(crate) fn init_logs_at(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file or collector gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    // A second initialisation (none happens in one process) would only be ignored.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

/// Runs `pipewise coordinator` until the process is stopped.
pub(crate) fn coordinator(args: &CoordinatorArgs) -> Result<()> {
    init_logs(args.log_format);
    let data_dir = std::path::absolute(&args.data_dir)
        .with_context(|| format!("--data-dir {}", args.data_dir.display()))?;
    runtime()?.block_on(async {
        if let Some(addr) = args.metrics.metrics_listen {
            crate::metrics::serve(addr, Some(args.metrics.expiry()))?;
        }
        let coordinator = Coordinator::start_cluster(args.listen, &data_dir, Unfinished::Resume)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
            .context("cannot start the coordinator")?;
        outln!(
            "coordinator listening on {} (data in {})",
            coordinator.addr,
            data_dir.display()
        );
        std::io::stdout().flush().ok();
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// A byte count of at least one byte.
fn parse_memory_bytes(text: &str) -> std::result::Result<u64, String> {
    // parse_bytes keeps it positive and at most 2^60; a fraction of a byte is left.
    let bytes = crate::args::parse_bytes(text)?;
    if bytes >= 1.0 {
        Ok(bytes as u64)
    } else {
        Err(format!("{text:?} is less than one byte"))
    }
}

fn parse_slowdown(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(f) if f.is_finite() && (1.0..=1000.0).contains(&f) => Ok(f),
        _ => Err(format!("{text:?} is not a factor from 1 to 1000")),
    }
}

/// Runs `pipewise worker` until the process is stopped.
pub(crate) fn worker(args: &WorkerArgs) -> Result<()> {
    init_logs(args.log_format);
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let mut config = NodeConfig::new(args.coordinator.clone(), id);
    config.listen = args.listen;
    config.advertise = args.advertise.clone();
    config.timeout = Duration::from_secs(args.timeout);
    config.slowdown = args.slowdown;
    config.memory_bytes = args.memory_bytes.unwrap_or(0);
    config.unplanned_bytes = args.unplanned_bytes.unwrap_or(0);
    config.device = args.device.open()?;
    runtime()?.block_on(async {
        if let Some(addr) = args.metrics.metrics_listen {
            crate::metrics::serve(addr, Some(args.metrics.expiry()))?;
            pipewise_worker::metrics::describe();
        }
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
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// How long one attempt to reach the coordinator may take: a frozen one (stopped, or behind
/// a dead link) accepts the TCP connection and answers nothing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 pings on the client's connection, idle or not: a coordinator that answers none
/// for [`KEEPALIVE_TIMEOUT`] ends the call (a request or a watch would wait forever).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

async fn client(endpoint: &Endpoint) -> Result<JobServiceClient<Channel>> {
    let uri = pipewise_worker::net::http_uri(&endpoint.coordinator)
        .map_err(|e| anyhow::anyhow!("--coordinator {e}"))?;
    let channel = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|e| anyhow::anyhow!("--coordinator {:?}: {e}", endpoint.coordinator))?
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let deadline = Instant::now() + Duration::from_secs(endpoint.wait_for_coordinator);
    let mut said = false;
    loop {
        let attempt = match tokio::time::timeout(CONNECT_TIMEOUT, channel.connect()).await {
            Ok(connected) => connected.map_err(anyhow::Error::new),
            Err(_) => Err(anyhow::anyhow!(
                "no answer within {} s",
                CONNECT_TIMEOUT.as_secs()
            )),
        };
        match attempt {
            Ok(c) => return Ok(JobServiceClient::new(c)),
            Err(e) if Instant::now() < deadline => {
                if !said {
                    // Standard error may be closed; the wait goes on regardless.
                    let _ = writeln!(
                        std::io::stderr(),
                        "waiting up to {} s for the coordinator at {} ({e})",
                        endpoint.wait_for_coordinator,
                        endpoint.coordinator
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                return Err(e.context(format!(
                    "cannot reach the coordinator at {}",
                    endpoint.coordinator
                )));
            }
        }
    }
}

fn state_name(state: i32) -> &'static str {
    match pb::JobState::try_from(state).unwrap_or(pb::JobState::Unspecified) {
        pb::JobState::Queued => "queued",
        pb::JobState::Running => "running",
        pb::JobState::Succeeded => "succeeded",
        pb::JobState::Failed => "failed",
        pb::JobState::Cancelled => "cancelled",
        pb::JobState::Unspecified => "unknown",
    }
}

fn print_status(s: &pb::JobStatus) {
    let mut line = format!(
        "job {:<4} {:<24} {:<10} step {}/{}",
        s.id,
        s.name,
        state_name(s.state),
        s.step,
        s.steps
    );
    if !s.last_loss.is_nan() {
        line.push_str(&format!("  loss {:.4}", s.last_loss));
    }
    let running = matches!(
        pb::JobState::try_from(s.state),
        Ok(pb::JobState::Queued | pb::JobState::Running)
    );
    if running && !s.waiting.is_empty() {
        line.push_str(&format!("  waiting for {}", s.waiting));
    }
    if !s.error.is_empty() {
        line.push_str(&format!("  error: {}", s.error));
    }
    outln!("{line}");
}

fn status_error(s: tonic::Status) -> anyhow::Error {
    let e = anyhow::anyhow!("{:?}: {}", s.code(), s.message());
    if s.code() == tonic::Code::Unavailable {
        e.context("the coordinator went away or stopped answering")
    } else {
        e
    }
}

/// The error of a watch stream cut by the coordinator going away.
fn lost(job: u64, s: &tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(
        "lost the coordinator while following job {job} ({:?}: {}); `pipewise status {job}` \
         shows where it is once the coordinator is back",
        s.code(),
        s.message()
    )
}

/// Streams a job's steps until it ends; returns its final status.
async fn follow(c: &mut JobServiceClient<Channel>, job: u64) -> Result<pb::JobStatus> {
    let mut events = c
        .watch_job(pb::JobId { id: job })
        .await
        .map_err(status_error)?
        .into_inner();
    while let Some(e) = events.next().await {
        // A stream cut by the coordinator going away says so, not "h2 protocol error".
        let e = e.map_err(|s| match s.code() {
            tonic::Code::Unavailable | tonic::Code::Cancelled => lost(job, &s),
            tonic::Code::Unknown if s.message().contains("h2 protocol error") => lost(job, &s),
            _ => status_error(s),
        })?;
        if !e.replan_reason.is_empty() {
            outln!("re-planned: {}", e.replan_reason);
        }
        let peaks: Vec<String> = e
            .peaks
            .iter()
            .map(|p| format!("{:.0}", p.peak_activation_bytes as f64 / 1024.0))
            .collect();
        outln!(
            "step {:>4}  loss {:.7}  {:>8.1} ms  bubble planned {:>5.1}% measured {:>5.1}%  peak KiB [{}]",
            e.step,
            e.loss,
            e.step_time_ms,
            100.0 * e.planned_bubble,
            100.0 * e.measured_bubble,
            peaks.join(" ")
        );
    }
    let status = c
        .get_job(pb::JobId { id: job })
        .await
        .map_err(status_error)?
        .into_inner();
    print_status(&status);
    Ok(status)
}

fn succeeded(status: &pb::JobStatus) -> Result<()> {
    if status.state == pb::JobState::Succeeded as i32 {
        Ok(())
    } else if status.error.is_empty() {
        bail!("job {} {}", status.id, state_name(status.state))
    } else {
        bail!(
            "job {} {}: {}",
            status.id,
            state_name(status.state),
            status.error
        )
    }
}

/// `pipewise submit`.
pub(crate) fn submit(args: &SubmitArgs) -> Result<()> {
    // The coordinator takes requests of up to 4 MiB (tonic's default), the file and the
    // overrides together.
    let toml = crate::args::read_text(&args.file, (4 << 20) - (64 << 10))?;
    let request = pb::JobSpec {
        toml,
        schedule: args.schedule.clone(),
        workers: args.workers,
        steps: args.steps,
        microbatches: args.microbatches,
        ..Default::default()
    };
    // The file is read here as the coordinator will read it, so a malformed one is named
    // before any connection (the coordinator still validates and plans it).
    pipewise_coordinator::service::spec_of(&request).map_err(|e| match e {
        // An override that does not apply is the flag's fault, not the file's.
        pipewise_coordinator::error::CoordinatorError::BadRequest {
            field: field @ ("steps" | "microbatches"),
            reason,
        } => anyhow::anyhow!("--{field}: {reason}"),
        other => anyhow::Error::new(other)
            .context(format!("{} is not a valid job spec", args.file.display())),
    })?;
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        let status = c
            .submit_job(request)
            .await
            .map_err(status_error)
            .context("the coordinator refused the job")?
            .into_inner();
        print_status(&status);
        if args.wait {
            succeeded(&follow(&mut c, status.id).await?)?;
        }
        Ok(())
    })
}

/// `pipewise status [JOB]`.
pub(crate) fn status(args: &StatusArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        match args.job {
            Some(id) => print_status(
                &c.get_job(pb::JobId { id })
                    .await
                    .map_err(status_error)?
                    .into_inner(),
            ),
            None => {
                let list = c
                    .list_jobs(pb::Empty {})
                    .await
                    .map_err(status_error)?
                    .into_inner();
                if list.jobs.is_empty() {
                    outln!("no jobs");
                }
                for s in &list.jobs {
                    print_status(s);
                }
            }
        }
        Ok(())
    })
}

/// `pipewise watch JOB`.
pub(crate) fn watch(args: &JobArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        succeeded(&follow(&mut c, args.job).await?)
    })
}

/// `pipewise cancel JOB`.
pub(crate) fn cancel(args: &JobArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        let status = c
            .cancel_job(pb::JobId { id: args.job })
            .await
            .map_err(status_error)?
            .into_inner();
        print_status(&status);
        if status.state == pb::JobState::Running as i32 {
            outln!(
                "cancelling: its workers stop after the current step (`pipewise status {}` \
                 says when it is cancelled)",
                status.id
            );
        }
        Ok(())
    })
}

/// `pipewise trace` arguments.
#[derive(Debug, Args)]
pub(crate) struct TraceArgs {
    /// The job id.
    pub(crate) job: u64,
    /// The step (1-based; default: the latest kept).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) step: Option<u64>,
    /// Where to write step-K.trace.json and step-K.svg.
    #[arg(long, default_value = ".")]
    pub(crate) out: PathBuf,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
}

/// Runs `pipewise trace`.
pub(crate) fn trace(args: &TraceArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut c = client(&args.endpoint).await?;
        let svg =
            crate::local::write_trace(&mut c, args.job, args.step.unwrap_or(0), &args.out).await?;
        outln!(
            "wrote {} and {}",
            svg.with_extension("trace.json").display(),
            svg.display()
        );
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_devices() {
        assert_eq!(parse_device("cpu"), Ok(DeviceArg::Cpu));
        assert_eq!(parse_device(" CPU "), Ok(DeviceArg::Cpu));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let err = parse_device(bad).unwrap_err();
            assert!(err.contains("is not a device"), "{bad}: {err}");
        }
        if cfg!(feature = "cuda") {
            assert_eq!(parse_device("cuda"), Ok(DeviceArg::Cuda(0)));
            assert_eq!(parse_device("cuda:3"), Ok(DeviceArg::Cuda(3)));
        } else {
            for gpu in ["cuda", "cuda:1"] {
                let err = parse_device(gpu).unwrap_err();
                assert!(err.contains("built without CUDA"), "{gpu}: {err}");
                assert!(err.contains("--features cuda"), "{gpu}: {err}");
            }
        }
    }
}
