//! [`RunName`]: a run id as people read it.

use pipewise_common::job::{job_of, run_of};

/// A run id ([`pipewise_common::job::run_id`]) as people read it: `job 10`, or `job 10
/// (run 2)` for a later run (after a re-plan or a coordinator restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunName(pub u64);

impl std::fmt::Display for RunName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (job, run) = (job_of(self.0), run_of(self.0));
        if run == 0 {
            write!(f, "job {job}")
        } else {
            write!(f, "job {job} (run {run})")
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn run_ids_read_as_job_and_run() {
        assert_eq!(super::RunName(10).to_string(), "job 10");
        assert_eq!(super::RunName(10 + (2 << 48)).to_string(), "job 10 (run 2)");
    }
}
