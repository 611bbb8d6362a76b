//! A run's id.

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
