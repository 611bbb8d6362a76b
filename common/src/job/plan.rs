//! Planning a job: its fields checked and its schedule generated ([`plan_job`]).

use super::spec::JobSpec;
use crate::error::{Error, Result};
use crate::generate::{ScheduleKind, generate};
use crate::schedule::{Recompute, Schedule};

/// The schedule a valid job runs.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPlan {
    /// The schedule kind (`auto` resolved by the caller's planner; here the named kind).
    pub kind: ScheduleKind,
    /// Microbatches per step.
    pub microbatches: u32,
    /// The schedule.
    pub schedule: Schedule,
    /// Each stage's recomputation, in stage order (`[activation_checkpoint]`'s modes, or
    /// auto's choice).
    pub recompute: Vec<Recompute>,
}

impl JobPlan {
    /// Whether any stage recomputes.
    pub fn recomputes(&self) -> bool {
        self.recompute.iter().any(|m| *m != Recompute::None)
    }
}

/// Checks every field of `spec` and plans its schedule; the first problem found is
/// returned, naming its field (`section.key`).
pub fn plan_job(spec: &JobSpec) -> Result<JobPlan> {
    let request = spec.schedule_request()?;
    let kind = request.kind;
    let schedule = generate(&request).map_err(|e| match e {
        Error::MemoryLimit { smallest, .. } => Error::invalid(
            "parallelism.memory_limit",
            format!("no {kind} schedule fits; the smallest limit that fits is {smallest}"),
        ),
        Error::Unsupported { reason, .. } => Error::invalid(
            "parallelism.pipeline_parallel_schedule",
            format!("{kind} does not support {reason}"),
        ),
        other => other,
    })?;
    spec.check_outputs()?;
    let stages = schedule.placement.stages() as usize;
    // Auto's modes come with its plan; until then it is held as planned without them.
    let recompute = if spec.is_auto() {
        vec![Recompute::None; stages]
    } else {
        spec.activation_checkpoint.modes(stages)?
    };
    Ok(JobPlan {
        kind,
        microbatches: request.microbatches,
        schedule,
        recompute,
    })
}

impl JobSpec {
    /// Checks every field and plans the schedule: [`plan_job`].
    pub fn validate(&self) -> Result<JobPlan> {
        plan_job(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::example;

    /// The shipped example job validates, and so does its commented layer split.
    #[test]
    #[allow(clippy::unwrap_used)]
    fn the_example_job_file_validates_with_its_layer_split() {
        let text = include_str!("../../../deploy/job.toml");
        let spec = JobSpec::from_toml(text).unwrap();
        spec.validate().unwrap();
        let uncommented = text.replace("# pipeline_parallel_", "pipeline_parallel_");
        assert_ne!(uncommented, text);
        let split = JobSpec::from_toml(&uncommented).unwrap();
        assert_eq!(
            split.parallelism.pipeline_parallel_layers_per_stage,
            Some(2)
        );
        let plan = split.validate().unwrap();
        let ranges = split.stage_ranges(&plan.schedule.placement).unwrap();
        let held: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
        // 16 block slots in 8 stages of 2; one fewer block on each end, which also holds
        // the embedding or the head.
        assert_eq!(held, vec![2; 8]);
    }

    #[test]
    fn smallest_memory_limit_is_reported() {
        let mut spec = example(4, "adaptive-v");
        spec.parallelism.memory_limit = Some(0.25);
        match spec.validate() {
            Err(Error::InvalidArgument { reason, .. }) => {
                assert!(reason.contains("smallest limit that fits"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
}
