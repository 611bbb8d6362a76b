//! What the job commands print: a job's status line, and its step lines while following it
//! (`submit --wait`, `watch`), with `[validation]`'s loss before the first step as step 0's
//! line, and on a terminal a progress bar under them ([`crate::progress_bar`]). Outside
//! checks read the step line: its fields and their order stay, new ones go after
//! `peak KiB [...]`.

use std::time::Instant;

use anyhow::{Result, bail};
use pipewise_common::run::StepEvent;
use pipewise_proto::v1 as pb;
use tokio_stream::StreamExt as _;

use crate::connection::status_error;
use crate::progress_bar::Bar;

/// A job state's name.
pub(crate) fn state_name(state: i32) -> &'static str {
    match pb::JobState::try_from(state).unwrap_or(pb::JobState::Unspecified) {
        pb::JobState::Queued => "queued",
        pb::JobState::Running => "running",
        pb::JobState::Succeeded => "succeeded",
        pb::JobState::Failed => "failed",
        pb::JobState::Cancelled => "cancelled",
        pb::JobState::Unspecified => "unknown",
    }
}

/// Prints a job's status line.
pub(crate) fn print_status(s: &pb::JobStatus) {
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
    if running && !s.workers.is_empty() {
        line.push_str(&format!("  workers {}", s.workers.join(",")));
    }
    if !s.error.is_empty() {
        line.push_str(&format!("  error: {}", s.error));
    }
    outln!("{line}");
    if !s.plan_choice.is_empty() {
        outln!("  {}", s.plan_choice);
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
pub(crate) async fn follow(
    c: &mut crate::connection::JobClient,
    job: u64,
) -> Result<pb::JobStatus> {
    let mut events = c
        .watch_job(pb::JobId { id: job })
        .await
        .map_err(status_error)?
        .into_inner();
    // The bar needs the job's steps; its tokens a step are not in the status.
    let mut bar = match c.get_job(pb::JobId { id: job }).await {
        Ok(status) => Bar::on_terminal(status.into_inner().steps, 0.0),
        Err(_) => None,
    };
    while let Some(e) = events.next().await {
        // A stream cut by the coordinator going away says so, not "h2 protocol error".
        let e = e.map_err(|s| match s.code() {
            tonic::Code::Unavailable | tonic::Code::Cancelled => lost(job, &s),
            tonic::Code::Unknown if s.message().contains("h2 protocol error") => lost(job, &s),
            _ => status_error(s),
        })?;
        let e = StepEvent::from(e);
        if let Some(bar) = &mut bar {
            bar.clear();
        }
        if !e.replan_reason.is_empty() {
            outln!("re-planned: {}", e.replan_reason);
        }
        if !e.plan_choice.is_empty() {
            outln!("{}", e.plan_choice);
        }
        let peaks: Vec<String> = e
            .peaks
            .iter()
            .map(|&(_, bytes)| format!("{:.0}", bytes as f64 / 1024.0))
            .collect();
        if let Some(v) = e.initial_validation_loss {
            outln!("step {:>4}  val {v:.7}", 0);
        }
        outln!(
            "step {:>4}  loss {:.7}  {:>8.1} ms  bubble planned {:>5.1}% measured {:>5.1}%  peak KiB [{}]  predicted {:.1} ms{}",
            e.step,
            e.loss,
            e.step_time_ms,
            100.0 * e.planned_bubble,
            100.0 * e.measured_bubble,
            peaks.join(" "),
            e.predicted_step_time_ms,
            e.validation_loss
                .map_or(String::new(), |v| format!("  val {v:.7}"))
        );
        if let Some(bar) = &mut bar {
            if let Some(v) = e.initial_validation_loss {
                bar.validation(v);
            }
            let done = (e.step, e.loss, e.validation_loss);
            bar.step(done, e.step_time_ms / 1e3, Instant::now());
            bar.draw();
        }
    }
    drop(bar);
    let status = c
        .get_job(pb::JobId { id: job })
        .await
        .map_err(status_error)?
        .into_inner();
    print_status(&status);
    Ok(status)
}

/// Success when the job succeeded; otherwise an error naming its state and error.
pub(crate) fn succeeded(status: &pb::JobStatus) -> Result<()> {
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
