//! The reporter: sends step reports to the coordinator in order, retrying transient
//! failures, so the assignment loop never waits on the coordinator within a step.

use std::sync::Arc;
use std::time::Duration;

use pipewise_common::job::{job_of, run_of};
use pipewise_common::run::StepReport;
use pipewise_proto::v1 as pb;
use tokio::sync::mpsc;
use tracing::Instrument as _;

use super::connection::CoordinatorClient;
use super::shared::Shared;

/// Sends step reports in order; a `cancel` answer asks the job's collectives to stop.
pub(crate) async fn reporter(
    mut client: CoordinatorClient,
    mut reports: mpsc::UnboundedReceiver<StepReport>,
    shared: Arc<Shared>,
) {
    while let Some(report) = reports.recv().await {
        // Its log lines carry the job, the re-plan and the step, as the assignment loop's do.
        let span = tracing::info_span!(
            "report",
            job = job_of(report.run),
            run = run_of(report.run),
            step = report.step
        );
        if !shared.silenced() {
            let report = pb::StepReport::from(report);
            deliver(&mut client, report, &shared).instrument(span).await;
        }
        shared.report_done();
    }
}

/// Sends one step report. A report lost on the way leaves its step incomplete on the
/// coordinator (it would count the job as stopped early): a failure the next try may not
/// meet is retried, the later reports waiting behind it so they stay in order.
async fn deliver(client: &mut CoordinatorClient, report: pb::StepReport, shared: &Shared) {
    let mut delay = REPORT_RETRY_DELAY;
    let mut tries = 1;
    loop {
        match client.report_step(report.clone()).await {
            Ok(ack) => {
                let ack = ack.into_inner();
                if ack.abort {
                    let job = report.run;
                    shared.abort_if(|j| j == job, "abandoned by the coordinator");
                } else if ack.cancel {
                    shared.transport.collective().request_stop(report.run);
                }
                return;
            }
            Err(status) if tries < REPORT_TRIES && transient(status.code()) => {
                tracing::debug!(tries, "step report to retry: {}", status.message());
                tokio::time::sleep(delay).await;
                delay *= 2;
                tries += 1;
            }
            Err(status) => {
                tracing::warn!(tries, "step report not delivered: {}", status.message());
                return;
            }
        }
    }
}

/// How many times a step report is sent before it is given up.
const REPORT_TRIES: u32 = 5;

/// The wait before a report's second try (doubling after each: 1.5 s of waiting in all).
const REPORT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// Whether a call that failed with `code` may succeed if made again unchanged.
fn transient(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable
            | tonic::Code::DeadlineExceeded
            | tonic::Code::ResourceExhausted
            | tonic::Code::Aborted
            | tonic::Code::Unknown
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_transient_failures_are_retried() {
        use tonic::Code;
        for code in [Code::Unavailable, Code::DeadlineExceeded, Code::Unknown] {
            assert!(super::transient(code), "{code:?}");
        }
        for code in [Code::InvalidArgument, Code::NotFound, Code::Internal] {
            assert!(!super::transient(code), "{code:?}");
        }
    }
}
