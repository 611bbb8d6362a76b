//! The state of an auto job's trial ([`super::auto_trial`]) and its numbers.

use crate::auto::job::PlanOption;

/// At most this many plans are measured.
pub(super) const TRIAL_PLANS: usize = 3;
/// Steps each plan runs in a trial; the first of every run warms up and is left out.
pub(super) const TRIAL_STEPS: u64 = 4;

/// Where an auto job's trial is.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) enum Trial {
    /// The job has not chosen yet (or is not auto).
    #[default]
    NotYet,
    /// The first run's plan, measured until the costs are fitted to its steps.
    Measuring(Box<PlanOption>),
    /// The search runs again on the fitted costs while the first run's plan goes on; where
    /// those costs came from when it was asked, in words (steps go on meanwhile).
    Rechoosing(Box<PlanOption>, String),
    /// Measuring `current`, then `pending`; `tried` with their measured seconds a step.
    Trying {
        pending: Vec<PlanOption>,
        tried: Vec<(PlanOption, f64)>,
        current: Box<PlanOption>,
    },
    /// Measured, or nothing to measure: later runs take the search's choice.
    Done,
}

impl Trial {
    /// Whether the trial is under way: the first run measured, the search re-run, or the
    /// plans within the band measured in turn.
    pub(super) fn measures(&self) -> bool {
        matches!(
            self,
            Trial::Measuring(_) | Trial::Rechoosing(..) | Trial::Trying { .. }
        )
    }
}

/// A plan's measured seconds a step from a run's `step_secs`: the fastest of its last
/// `TRIAL_STEPS − 1` steps (0 when none). The same count for every plan, and the fastest
/// rather than a mean: what a shared machine adds to a step is never negative, so the
/// fastest step is the least disturbed, and one disturbed step does not decide.
pub(super) fn plan_secs(step_secs: &[f64]) -> f64 {
    let kept = (TRIAL_STEPS - 1) as usize;
    // The warm-up (the first step) never counts.
    let from = step_secs
        .len()
        .saturating_sub(kept)
        .max(1)
        .min(step_secs.len());
    step_secs[from..]
        .iter()
        .copied()
        .min_by(f64::total_cmp)
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_measures_its_fastest_recent_step_after_the_warm_up() {
        assert_eq!(plan_secs(&[]), 0.0);
        // The warm-up alone: nothing else to go on.
        assert_eq!(plan_secs(&[9.0]), 0.0);
        assert_eq!(plan_secs(&[9.0, 1.2, 1.0, 1.4]), 1.0);
        // Only the last TRIAL_STEPS − 1 count (a first run measured for longer).
        assert_eq!(plan_secs(&[9.0, 0.5, 1.2, 1.3, 1.1, 1.4]), 1.1);
    }
}
