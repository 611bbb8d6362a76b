//! The coordinator's Prometheus metrics, recorded through the `metrics` facade (the binary
//! installs the exporter). Labels stay bounded: job id, worker index or id, stage, kind.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `pipewise_bubble_ratio` | gauge | `source` = planned \| measured \| core_wait, `job_id`, (`replica`, `worker` for per-worker measured) |
//! | `pipewise_all_reduce_seconds` | gauge | `part` = summing \| exposed, `job_id`, `replica`, `worker` |
//! | `pipewise_step_duration_seconds` | histogram | `job_id` |
//! | `pipewise_step_time_seconds` | gauge | `source` = predicted \| measured, `job_id` |
//! | `pipewise_tokens_per_second`, `pipewise_samples_per_second` | gauge | `job_id` |
//! | `pipewise_activation_memory_bytes` | gauge | `kind` = current \| peak \| predicted_peak, `job_id`, `worker` (its rank in the pipeline), (`replica` for current) |
//! | `pipewise_steps_total` | counter | `job_id` |
//! | `pipewise_loss` | gauge | `job_id` |
//! | `pipewise_validation_loss` | gauge | `job_id` (jobs with `[validation]`) |
//! | `pipewise_workers_up` | gauge | |
//! | `pipewise_workers` | gauge | `state` = idle \| busy (a job's, from its claim until it ends) |
//! | `pipewise_heartbeat_age_seconds` | gauge | `worker` |
//! | `pipewise_jobs` | gauge | `state` |
//! | `pipewise_replans_total` | counter | `reason` |
//! | `pipewise_auth_refused_total` | counter | `reason` (see [`crate::audit::Refusal`]) |
//!
//! The binary drops gauge series nobody has set for a while (`--metrics-expiry`): a
//! finished job's, a forgotten worker's, a worker index past the running job's. So every
//! gauge that stays true is set again at least every step or every heartbeat tick: the
//! per-job ones and the peaks (predicted ones included) with each step, liveness and
//! current memory every tick, and the jobs by state every tick too ([`refresh`]).

use std::sync::Mutex;

use metrics::{
    Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

use crate::events::StepEvent;
use pipewise_common::run::Reason;

/// Job states (the label values of `pipewise_jobs`).
pub const JOB_STATES: [&str; 5] = ["queued", "running", "succeeded", "failed", "cancelled"];

/// Registers help text and units, and zeroes the counters and gauges that must exist from
/// the start (so dashboards and alerts see 0, not "no data").
pub fn describe() {
    describe_gauge!(
        "pipewise_bubble_ratio",
        Unit::Count,
        "Idle fraction of the pipeline in a step: planned (the schedule simulated with the job's cost model before the step) or measured (1 - time in passes / step wall time), and core_wait: the part of measured spent waiting for a core rather than for a peer"
    );
    describe_gauge!(
        "pipewise_all_reduce_seconds",
        Unit::Seconds,
        "A worker's gradient sums over the job's data-parallel replicas in the last step: summing (all of them, beside the passes) and exposed (how far they ran past its last pass); 0 without replicas"
    );
    describe_gauge!(
        "pipewise_worker_memory_limit_bytes",
        Unit::Bytes,
        "Memory a worker of a job registered (--memory-bytes), by job, replica and rank"
    );
    describe_gauge!(
        "pipewise_step_time_seconds",
        Unit::Seconds,
        "Step time: predicted (the cost model before the step) or measured (slowest worker)"
    );
    describe_histogram!(
        "pipewise_step_duration_seconds",
        Unit::Seconds,
        "Wall time of a training step (slowest worker)"
    );
    describe_gauge!(
        "pipewise_tokens_per_second",
        "Training throughput of the last step in tokens per second"
    );
    describe_gauge!(
        "pipewise_samples_per_second",
        "Training throughput of the last step in sequences per second"
    );
    describe_gauge!(
        "pipewise_activation_memory_bytes",
        Unit::Bytes,
        "Activation bytes held by a worker: current, peak in the last step, and the plan's predicted peak"
    );
    describe_counter!("pipewise_steps_total", "Training steps finished");
    describe_gauge!("pipewise_loss", "Mean training loss of the last step");
    describe_gauge!(
        "pipewise_validation_loss",
        "Mean token cross-entropy over the [validation] windows at the job's latest evaluation"
    );
    describe_gauge!(
        "pipewise_workers_up",
        "Workers whose heartbeats are current"
    );
    describe_gauge!(
        "pipewise_workers",
        "Live workers by state: idle, or busy (held by a job)"
    );
    describe_gauge!(
        "pipewise_heartbeat_age_seconds",
        Unit::Seconds,
        "Seconds since a worker's last heartbeat"
    );
    describe_gauge!("pipewise_jobs", "Jobs known to the coordinator, by state");
    describe_counter!(
        "pipewise_replans_total",
        "Re-plans of running jobs, by reason"
    );
    for reason in Reason::ALL.map(Reason::label) {
        counter!("pipewise_replans_total", "reason" => reason).absolute(0);
    }
    gauge!("pipewise_workers_up").set(0.0);
    record_workers(0, 0);
}

/// Describes `pipewise_auth_refused_total` and zeroes it for each of `reasons` (the
/// audit's labels, given by the caller so this file needs not know them).
pub fn describe_refusals(reasons: impl IntoIterator<Item = &'static str>) {
    describe_counter!(
        "pipewise_auth_refused_total",
        "Callers turned away at the coordinator's port, by reason: a missing, unknown or other role's token, a missing or refused client certificate, or a failed TLS handshake"
    );
    for reason in reasons {
        counter!("pipewise_auth_refused_total", "reason" => reason).absolute(0);
    }
}

/// Counts one refused caller; `reason` is a refusal's label.
pub fn record_refusal(reason: &'static str) {
    counter!("pipewise_auth_refused_total", "reason" => reason).increment(1);
}

/// Counts one re-plan of a running job; `reason` is a [`Reason`]'s label.
pub fn record_replan(reason: &'static str) {
    counter!("pipewise_replans_total", "reason" => reason).increment(1);
}

/// Records one finished step of a job: bubbles, step time, throughput, peaks.
pub fn record_step(e: &StepEvent, tokens_per_step: f64, samples_per_step: f64) {
    let job = e.job.to_string();
    gauge!("pipewise_bubble_ratio", "source" => "planned", "job_id" => job.clone())
        .set(e.planned_bubble);
    gauge!("pipewise_bubble_ratio", "source" => "measured", "job_id" => job.clone())
        .set(e.measured_bubble);
    // The part of the measured bubble that was waiting for a core, not for a peer.
    gauge!("pipewise_bubble_ratio", "source" => "core_wait", "job_id" => job.clone())
        .set(e.core_wait_bubble);
    let replica = e.replica.to_string();
    for (worker, bubble) in &e.worker_bubbles {
        gauge!("pipewise_bubble_ratio", "source" => "measured", "job_id" => job.clone(), "replica" => replica.clone(), "worker" => worker.to_string())
            .set(*bubble);
    }
    // The replicas' gradient sums: their time beside the passes, and past them.
    for (worker, summing, exposed) in &e.all_reduce {
        for (part, secs) in [("summing", summing), ("exposed", exposed)] {
            gauge!("pipewise_all_reduce_seconds", "part" => part, "job_id" => job.clone(), "replica" => replica.clone(), "worker" => worker.to_string())
                .set(*secs);
        }
    }
    if e.predicted_step_time_ms > 0.0 {
        gauge!("pipewise_step_time_seconds", "source" => "predicted", "job_id" => job.clone())
            .set(e.predicted_step_time_ms / 1e3);
    }
    let secs = e.step_time_ms / 1e3;
    gauge!("pipewise_step_time_seconds", "source" => "measured", "job_id" => job.clone()).set(secs);
    histogram!("pipewise_step_duration_seconds", "job_id" => job.clone()).record(secs);
    if secs > 0.0 {
        gauge!("pipewise_tokens_per_second", "job_id" => job.clone()).set(tokens_per_step / secs);
        gauge!("pipewise_samples_per_second", "job_id" => job.clone()).set(samples_per_step / secs);
    }
    counter!("pipewise_steps_total", "job_id" => job.clone()).increment(1);
    if e.loss.is_finite() {
        gauge!("pipewise_loss", "job_id" => job).set(e.loss);
    }
    // Step 1's evaluation, where it has one, is later than the one before it.
    record_validation(e.job, e.validation_loss.or(e.initial_validation_loss));
    for (worker, peak) in &e.peaks {
        gauge!("pipewise_activation_memory_bytes", "kind" => "peak", "job_id" => e.job.to_string(), "worker" => worker.to_string())
            .set(*peak as f64);
    }
    record_predicted_peaks(e.job, &e.predicted_peaks);
}

/// The latest validation loss of the jobs that evaluated lately (the most recent
/// [`VALIDATION_JOBS`]), set again with each of their steps: a job evaluates every few
/// steps, and the exporter drops a gauge left unset for a while.
static VALIDATION: Mutex<Vec<(u64, f64)>> = Mutex::new(Vec::new());

/// How many jobs' validation losses [`VALIDATION`] keeps.
const VALIDATION_JOBS: usize = 64;

/// Job `job`'s validation loss: `loss` where the step evaluated, else its latest again.
fn record_validation(job: u64, loss: Option<f64>) {
    let Ok(mut latest) = VALIDATION.lock() else {
        return;
    };
    if let Some(loss) = loss.filter(|l| l.is_finite()) {
        latest.retain(|&(j, _)| j != job);
        if latest.len() >= VALIDATION_JOBS {
            latest.remove(0);
        }
        latest.push((job, loss));
    }
    if let Some(&(_, loss)) = latest.iter().find(|&&(j, _)| j == job) {
        gauge!("pipewise_validation_loss", "job_id" => job.to_string()).set(loss);
    }
}

/// The plan's predicted peak activation bytes of each worker of job `job`.
pub fn record_predicted_peaks(job: u64, peaks: &[u64]) {
    for (worker, peak) in peaks.iter().enumerate() {
        gauge!("pipewise_activation_memory_bytes", "kind" => "predicted_peak", "job_id" => job.to_string(), "worker" => worker.to_string())
            .set(*peak as f64);
    }
}

/// Rank `worker` of replica `replica` in run `run` (jobs run side by side, each with its
/// own ranks): its current activation bytes, and the memory it registered (its whole
/// device's, `--memory-bytes`; the dashboard's limit line, nothing when it registered none).
pub fn record_worker_memory(run: u64, replica: u32, worker: u32, bytes: u64, limit: u64) {
    // Built once for both series: the limit's are the activations' less the kind.
    let labels = [
        ("kind", "current".to_string()),
        ("job_id", pipewise_common::job::job_of(run).to_string()),
        ("replica", replica.to_string()),
        ("worker", worker.to_string()),
    ];
    gauge!("pipewise_activation_memory_bytes", &labels[..]).set(bytes as f64);
    if limit > 0 {
        gauge!("pipewise_worker_memory_limit_bytes", &labels[1..]).set(limit as f64);
    }
}

/// Liveness: workers up and each one's heartbeat age.
pub fn record_liveness(ages: &[(String, f64)], up: usize) {
    gauge!("pipewise_workers_up").set(up as f64);
    for (worker, age) in ages {
        gauge!("pipewise_heartbeat_age_seconds", "worker" => worker.clone()).set(*age);
    }
}

/// Live workers by state: `idle` (no job's) and `busy` (a job's, from its claim until it
/// ends).
pub fn record_workers(idle: usize, busy: usize) {
    gauge!("pipewise_workers", "state" => "idle").set(idle as f64);
    gauge!("pipewise_workers", "state" => "busy").set(busy as f64);
}

/// The last job counts by state, set again by [`refresh`].
static JOB_COUNTS: Mutex<Vec<(&'static str, usize)>> = Mutex::new(Vec::new());

/// Jobs by state.
pub fn record_jobs(counts: &[(&'static str, usize)]) {
    if let Ok(mut last) = JOB_COUNTS.lock() {
        *last = counts.to_vec();
    }
    set_jobs(counts);
}

fn set_jobs(counts: &[(&'static str, usize)]) {
    for (state, n) in counts {
        gauge!("pipewise_jobs", "state" => *state).set(*n as f64);
    }
}

/// Sets again the gauges that change only now and then (jobs by state), so that the
/// exporter's expiry of idle series keeps them; called every heartbeat tick.
pub fn refresh() {
    if let Ok(last) = JOB_COUNTS.lock() {
        set_jobs(&last);
    }
}
