//! What the connection actor, the reporter and the assignment thread share: the transport,
//! the heartbeat's statistics and the run being executed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use pipewise_common::job::{job_of, run_of};

use crate::net::GrpcTransport;

/// What the heartbeat reports.
#[derive(Debug, Default, Clone)]
pub(crate) struct NodeStats {
    pub(crate) step: u64,
    pub(crate) current_activation_bytes: u64,
    pub(crate) peak_activation_bytes: u64,
    pub(crate) stage_times: Vec<pipewise_common::run::StageTimes>,
}

/// The run being executed, if any.
#[derive(Debug, Default)]
pub(crate) struct Current {
    pub(crate) job: Option<u64>,
}

/// Shared between the connection actor, the reporter and the assignment thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) transport: Arc<GrpcTransport>,
    stats: Mutex<NodeStats>,
    current: Mutex<Current>,
    /// Set when the worker leaves: the run it abandons for that is no failure to report.
    draining: AtomicBool,
    /// Notified when the assignment loop ends a run, so the next heartbeat says so at once (a
    /// re-plan waits for the run's workers to have left it).
    pub(crate) ended: tokio::sync::Notify,
    /// Step reports queued for the reporter, and of them those it is done with (answered,
    /// or given up): a paced worker waits for the answers before its next step.
    reports: Mutex<(u64, u64)>,
    reported: Condvar,
    /// Killed (a test harness's kill): no more step reports leave.
    silenced: AtomicBool,
}

impl Shared {
    pub(crate) fn new(transport: Arc<GrpcTransport>) -> Self {
        Shared {
            transport,
            stats: Mutex::new(NodeStats::default()),
            current: Mutex::new(Current::default()),
            draining: AtomicBool::new(false),
            ended: tokio::sync::Notify::new(),
            reports: Mutex::new((0, 0)),
            reported: Condvar::new(),
            silenced: AtomicBool::new(false),
        }
    }

    /// From now on no step report leaves, as from a killed process.
    pub(crate) fn silence(&self) {
        self.silenced.store(true, Ordering::SeqCst);
    }

    /// Whether the worker was killed.
    pub(crate) fn silenced(&self) -> bool {
        self.silenced.load(Ordering::SeqCst)
    }

    /// Counts a report queued for the reporter.
    pub(crate) fn report_queued(&self) {
        self.reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0 += 1;
    }

    /// Counts a report the reporter is done with.
    pub(crate) fn report_done(&self) {
        self.reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1 += 1;
        self.reported.notify_all();
    }

    /// Waits until the reporter is done with every report queued, at most `within`
    /// (a reporter that is gone answers nothing more; the step's collectives then fail).
    pub(crate) fn wait_reported(&self, within: std::time::Duration) {
        let reports = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = self
            .reported
            .wait_timeout_while(reports, within, |(queued, done)| done < queued);
    }

    /// Marks the worker as leaving.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether the worker is leaving.
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub(crate) fn stats(&self) -> MutexGuard<'_, NodeStats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Aborts the running job if `which` picks it. The check and the abort happen under
    /// the lock the assignment loop takes to start a job, so a job started since is never hit.
    pub(crate) fn abort_if(&self, which: impl Fn(u64) -> bool, why: &str) {
        let current = self.current();
        if let Some(job) = current.job.filter(|j| which(*j)) {
            tracing::warn!(
                job = job_of(job),
                run = run_of(job),
                "abandoning the job: {why}"
            );
            self.transport.abort(&format!("job {job} was {why}"));
        }
    }

    pub(crate) fn current(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
