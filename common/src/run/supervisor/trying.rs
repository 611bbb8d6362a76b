//! The state of an auto job's trial ([`super::trial`]) and its numbers.

use crate::auto::job::PlanOption;

/// Plans predicted within this fraction of the best are measured.
pub(super) const TRIAL_BAND: f64 = 0.06;
/// At most this many plans are measured.
pub(super) const TRIAL_PLANS: usize = 3;
/// Steps each plan runs in a trial; the first of every run warms up and is left out.
pub(super) const TRIAL_STEPS: u64 = 3;

/// Where an auto job's trial is.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) enum Trial {
    /// The job has not chosen yet (or is not auto).
    #[default]
    NotYet,
    /// The first run's plan, measured until the costs are fitted to its steps.
    Measuring(Box<PlanOption>),
    /// The search runs again on the fitted costs while the first run's plan goes on.
    Rechoosing(Box<PlanOption>),
    /// Measuring `current`, then `pending`; `tried` with their measured seconds a step.
    Trying {
        pending: Vec<PlanOption>,
        tried: Vec<(PlanOption, f64)>,
        current: Box<PlanOption>,
    },
    /// Measured, or nothing to measure: later runs take the search's choice.
    Done,
}

/// The median of `xs` (the mean of the middle two for an even count); 0 when empty.
pub(super) fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => 0.5 * (xs[n / 2 - 1] + xs[n / 2]),
    }
}
