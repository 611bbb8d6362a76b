//! `schedule = "auto"` measures where its prediction cannot tell plans apart: when the
//! first choice has rivals predicted within [`TRIAL_BAND`] of it, and the job can move
//! between steps (checkpoints on, real compute, two workers or more), each of them runs
//! [`TRIAL_STEPS`] steps in turn, and the job goes on with the fastest measured. Every
//! step of a trial is a training step like any other (each move resumes from the
//! checkpoint of the step it stopped after), so only the moves cost time.

use super::Supervisor;
use super::following::Run;
use super::io::{Action, Move};
use crate::auto::job::{JobChoice, PlanOption};

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
    /// Measuring `current`, then `pending`; `tried` with their measured seconds a step.
    Trying {
        pending: Vec<PlanOption>,
        tried: Vec<(PlanOption, f64)>,
        current: Box<PlanOption>,
    },
    /// Measured, or nothing to measure: later runs take the search's choice.
    Done,
}

impl Supervisor {
    /// The plans a trial measures for `choice` with `steps_left` steps to go (best first),
    /// or just the best when nothing is to be measured: rivals within the band, as many as
    /// leave at least half of the steps after the trial.
    pub(super) fn trial_plans(
        &self,
        choice: JobChoice,
        steps_left: u64,
        d: usize,
    ) -> Vec<PlanOption> {
        let can_move = self.spec.checkpoint.enable_checkpoint
            && !self.spec.compute.is_emulated()
            && d >= 2
            && matches!(self.trial, Trial::NotYet);
        let fit = (steps_left / (2 * TRIAL_STEPS)) as usize;
        let take = if can_move { TRIAL_PLANS.min(fit) } else { 1 };
        let mut plans: Vec<PlanOption> = choice
            .within(TRIAL_BAND)
            .into_iter()
            .take(take.max(1))
            .cloned()
            .collect();
        if plans.len() < 2 {
            plans.truncate(1);
        }
        plans
    }

    /// After each step of `run` (its measured seconds): whether an auto trial stops the
    /// run to measure the next plan or to go on with the fastest measured.
    pub(super) fn trial_step(&mut self, run: &mut Run, measured: f64) -> bool {
        let Trial::Trying { current, .. } = &self.trial else {
            return false;
        };
        if run.moving.is_some() {
            // Steps a run finishes after it was asked to stop for the trial's move: the
            // trial already measures the next plan.
            return false;
        }
        let name = current.shown.text();
        run.step_secs.push(measured);
        if run.completed < TRIAL_STEPS {
            return false;
        }
        if !run.may_stop() || run.out.watch.is_none() {
            // No step left to move after, or no checkpoint to move with: the trial ends
            // on the plan that runs.
            self.trial = Trial::Done;
            return false;
        }
        let secs = median(&run.step_secs[1..]);
        let Trial::Trying {
            mut pending,
            mut tried,
            current,
        } = std::mem::replace(&mut self.trial, Trial::Done)
        else {
            return false;
        };
        tried.push((*current, secs));
        let measured = format!("auto trial: {name} measured {:.1} ms a step", 1e3 * secs);
        let (next, reason) = if pending.is_empty() {
            let (i, _) = tried
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.1.total_cmp(&b.1.1))
                .unwrap_or((tried.len() - 1, &tried[tried.len() - 1]));
            let summary: Vec<String> = tried
                .iter()
                .map(|(p, s)| format!("{} {:.1} ms", p.shown.schedule, 1e3 * s))
                .collect();
            if i + 1 == tried.len() {
                self.out.push(Action::Info(format!(
                    "{measured}; fastest measured of {}, it stays",
                    summary.join(", ")
                )));
                return false;
            }
            let (fastest, _) = tried.swap_remove(i);
            let reason = format!(
                "{measured}; going on with the fastest measured of {}: {}",
                summary.join(", "),
                fastest.shown.schedule
            );
            (fastest, reason)
        } else {
            let next = pending.remove(0);
            let reason = format!("{measured}; trying {}", next.shown.text());
            self.trial = Trial::Trying {
                pending,
                tried,
                current: Box::new(next.clone()),
            };
            (next, reason)
        };
        self.out.push(Action::Stop(run.out.id));
        run.moving = Some((reason, Move::Trial(Box::new(next))));
        true
    }
}

/// The median of `xs` (the mean of the middle two for an even count); 0 when empty.
fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => 0.5 * (xs[n / 2 - 1] + xs[n / 2]),
    }
}
