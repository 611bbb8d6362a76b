//! Reaching a running coordinator's `JobService`: the `--coordinator` flags of the client
//! commands (`PIPEWISE_COORDINATOR` when not given), the connection with its timeouts and
//! keepalives, and how a refused request reads.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use pipewise_proto::auth::BearerToken;
use pipewise_proto::v1::job_service_client::JobServiceClient;
use pipewise_worker::net::tls_cause;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::security::ClientAuth;

/// The job API of a coordinator, every call carrying the client's token.
pub(crate) type JobClient = JobServiceClient<InterceptedService<Channel, BearerToken>>;

/// The environment variable every `--coordinator` flag falls back to.
pub(crate) const COORDINATOR_ENV: &str = "PIPEWISE_COORDINATOR";
/// The coordinator's URL when neither `--coordinator` nor [`COORDINATOR_ENV`] gives one.
pub(crate) const DEFAULT_COORDINATOR: &str = "http://127.0.0.1:50051";

/// Where a client command finds the coordinator.
#[derive(Debug, Args)]
pub(crate) struct Endpoint {
    /// The coordinator's URL.
    #[arg(long, env = COORDINATOR_ENV, default_value = DEFAULT_COORDINATOR)]
    pub(crate) coordinator: String,
    /// Keep trying to reach the coordinator for up to this many seconds (e.g. while it
    /// starts); only connecting is retried, never a request, so nothing is sent twice.
    #[arg(long, value_name = "SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub(crate) wait_for_coordinator: u64,
    /// Give up on a coordinator silent for this many seconds: an attempt to connect that
    /// gets no answer, or a call or watch whose HTTP/2 pings (every half of this, at most
    /// 10 s) go unanswered (a frozen process, a dead link).
    #[arg(long, env = ANSWER_TIMEOUT_ENV, value_name = "SECONDS",
          default_value_t = DEFAULT_ANSWER_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..=3_600))]
    pub(crate) answer_timeout: u64,
    #[command(flatten)]
    pub(crate) auth: ClientAuth,
}

/// One job of a coordinator: the arguments of `pipewise watch` and `pipewise cancel`.
#[derive(Debug, Args)]
pub(crate) struct JobArgs {
    /// Job id (as `submit` printed it; `status` lists every job).
    pub(crate) job: u64,
    #[command(flatten)]
    pub(crate) endpoint: Endpoint,
}

/// The environment variable `--answer-timeout` falls back to.
pub(crate) const ANSWER_TIMEOUT_ENV: &str = "PIPEWISE_ANSWER_TIMEOUT";
/// How long a coordinator may stay silent before a client command gives up, by default.
const DEFAULT_ANSWER_TIMEOUT_SECS: u64 = 20;

/// The timeouts a client command gives a silent coordinator, from `--answer-timeout`: a
/// frozen one (stopped, or behind a dead link) accepts the TCP connection and answers
/// nothing, and without them a request or a watch would wait forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Silence {
    /// One attempt to connect.
    connect: Duration,
    /// HTTP/2 pings on the connection, idle or not.
    ping_every: Duration,
    /// A ping unanswered this long ends the call.
    ping_answer: Duration,
}

impl Silence {
    fn of(answer_timeout_secs: u64) -> Silence {
        let answer = Duration::from_secs(answer_timeout_secs.max(1));
        Silence {
            connect: answer.min(Duration::from_secs(10)),
            ping_every: (answer / 2).clamp(Duration::from_millis(500), Duration::from_secs(10)),
            ping_answer: answer,
        }
    }
}

/// A client of the coordinator at `url` with no TLS and no token (the one `pipewise local`
/// starts for itself).
pub(crate) async fn local_client(url: &str) -> Result<JobClient> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())?
        .connect()
        .await?;
    Ok(JobServiceClient::with_interceptor(
        channel,
        BearerToken::none(),
    ))
}

pub(crate) async fn client(endpoint: &Endpoint) -> Result<JobClient> {
    let token = endpoint.auth.token()?;
    let silence = Silence::of(endpoint.answer_timeout);
    let channel = pipewise_worker::net::endpoint(
        &endpoint.coordinator,
        &endpoint.auth.tls()?,
        pipewise_worker::net::Dial::Coordinator,
        "the coordinator",
    )
    .map_err(|e| anyhow::anyhow!("--coordinator {e}"))?
    .connect_timeout(silence.connect)
    .http2_keep_alive_interval(silence.ping_every)
    .keep_alive_timeout(silence.ping_answer)
    .keep_alive_while_idle(true);
    let deadline = Instant::now() + Duration::from_secs(endpoint.wait_for_coordinator);
    let mut said = false;
    loop {
        let attempt = match tokio::time::timeout(silence.connect, channel.connect()).await {
            Ok(connected) => connected.map_err(|e| match tls_cause(&e) {
                Some(cause) => anyhow::Error::new(e).context(cause.explain("the coordinator")),
                None => anyhow::Error::new(e),
            }),
            Err(_) => Err(anyhow::anyhow!(
                "no answer within {} s",
                silence.connect.as_secs()
            )),
        };
        match attempt {
            Ok(c) => return Ok(JobServiceClient::with_interceptor(c, token)),
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

/// A refused request as an error; an unreachable coordinator says so, and a TLS failure
/// (which tonic reports as a transport error of any code) names its cause.
pub(crate) fn status_error(s: tonic::Status) -> anyhow::Error {
    let e = anyhow::anyhow!("{:?}: {}", s.code(), s.message());
    if let Some(cause) = tls_cause(&s) {
        e.context(cause.explain("the coordinator"))
    } else if s.code() == tonic::Code::Unavailable {
        e.context("the coordinator went away or stopped answering")
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_timeout_sets_the_connect_and_ping_timeouts() {
        let secs = Duration::from_secs;
        // The default: connect for 10 s, ping every 10 s, give up after 20 s unanswered.
        assert_eq!(
            Silence::of(DEFAULT_ANSWER_TIMEOUT_SECS),
            Silence {
                connect: secs(10),
                ping_every: secs(10),
                ping_answer: secs(20),
            }
        );
        assert_eq!(
            Silence::of(2),
            Silence {
                connect: secs(2),
                ping_every: secs(1),
                ping_answer: secs(2),
            }
        );
        let long = Silence::of(600);
        assert_eq!((long.connect, long.ping_every), (secs(10), secs(10)));
        assert_eq!(Silence::of(1).ping_every, Duration::from_millis(500));
    }
}
