//! Running a job on worker processes, without I/O: the [`Supervisor`] of one job's runs
//! (inputs in, [`Action`]s out, on logical time) and the policies it applies.
//!
//! A job runs as a sequence of *runs*: each hands every worker of a plan its assignment and
//! follows their step reports. A lost worker, a straggler, memory pressure or workers
//! joining end a run between steps, and the next one starts from a checkpoint on another
//! plan or split. The coordinator's run actor feeds the supervisor what happens (worker
//! registrations, losses, heartbeats and step reports, checkpoint listings, a cancel, the
//! time) and performs what it asks (assignments, stops, aborts, clearing checkpoints, step
//! events, re-plans).
//!
//! - [`supervisor`]: the state machine of a job's runs.
//! - [`worker`]: workers and their step reports as a run sees them.
//! - [`reports`]: gathering a run's reports per step.
//! - [`checkpoints`]: where a run resumes, from a listing of the job's checkpoint folders.
//! - [`respec`]: the job's spec rewritten for a re-plan (another worker count, a schedule).
//! - [`straggler`]: which worker is slow, and the split that moves layers off it.
//! - [`pressure`]: the fastest plan that fits the workers' memory.

pub mod checkpoints;
pub mod pressure;
pub mod reports;
pub mod respec;
pub mod straggler;
pub mod supervisor;
pub mod worker;

pub use checkpoints::{Checkpoints, Start};
pub use supervisor::{Action, Assignment, Config, Failure, Input, Member, Reason, Supervisor};
pub use worker::{StepReport, Worker};

/// The id of one run of a job: the job id in the low 48 bits, the run's number above
/// ([`crate::job::run_id`]). Workers see it as their assignment's `job`; it keys a run's
/// frames, collectives, reports and aborts, so nothing of an abandoned run reaches the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(u64);

impl RunId {
    /// The `number`-th run of `job` (0: the first).
    pub fn new(job: u64, number: u64) -> RunId {
        RunId(crate::job::run_id(job, number))
    }

    /// A run id as it travels (e.g. on the wire).
    pub fn from_raw(raw: u64) -> RunId {
        RunId(raw)
    }

    /// The id as it travels.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The job this run belongs to.
    pub fn job(self) -> u64 {
        crate::job::job_of(self.0)
    }

    /// The run's number within its job.
    pub fn number(self) -> u64 {
        crate::job::run_of(self.0)
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_id_keeps_its_job_and_number() {
        let run = RunId::new(7, 3);
        assert_eq!((run.job(), run.number()), (7, 3));
        assert_eq!(RunId::from_raw(run.raw()), run);
        assert_eq!(RunId::new(7, 0).raw(), 7);
    }
}
