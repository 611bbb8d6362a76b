//! `schedule = "auto"` measures where its prediction cannot tell plans apart. The first
//! run takes the search's choice on the start-up profile. After [`TRIAL_STEPS`] steps the
//! search runs again, beside the run, on the costs fitted to them; the plans it predicts
//! within the job's band of its best
//! ([`auto_trial_band`](crate::job::Parallelism::auto_trial_band)), one per schedule kind,
//! microbatch size and split and at most [`TRIAL_PLANS`] (the running one among them with
//! its measured time), then run [`TRIAL_STEPS`] steps each in turn, and the job goes on
//! with the fastest measured (each plan's fastest step after its warm-up: [`plan_secs`]).
//! Only a job that can move between steps does this (checkpoints on, real compute, two
//! workers or more, steps to spare). Every step of a trial is a training step like any
//! other (each move hands the stages over from the workers' memory and goes on at the
//! next step, [`super::handover`]), so only the moves cost time.

use super::super::straggler::straggle_of;
use super::Supervisor;
use super::io::{Action, Move};
use super::tracked_run::Run;
use super::trial_state::{TRIAL_PLANS, TRIAL_STEPS, Trial, plan_secs};
use crate::auto::job::{JobChoice, PlanOption};

impl Supervisor {
    /// Whether an auto job's first run, on `first`, `steps_left` steps from its end, is
    /// measured: a run of it may move between steps (the straggler rule watches it: real
    /// compute, checkpoints, two workers or more), and a trial of two plans would take at
    /// most half of the steps.
    pub(super) fn may_try(&self, first: &PlanOption, steps_left: u64) -> bool {
        matches!(self.trial, Trial::NotYet)
            && self.spec.parallelism.auto_trial_band > 0.0
            && steps_left >= 4 * TRIAL_STEPS
            && straggle_of(&first.spec, &first.plan, &first.stage_pieces).is_some()
    }

    /// After each step of `run` (its measured seconds): whether an auto trial stops the
    /// run to measure the next plan or to go on with the fastest measured.
    pub(super) fn trial_step(&mut self, run: &mut Run, measured: f64) -> bool {
        if run.moving.is_some() || matches!(self.trial, Trial::NotYet | Trial::Done) {
            // Steps a run finishes after it was asked to stop for a move are not its plan's
            // to measure: the trial already measures the next plan.
            return false;
        }
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
        match std::mem::replace(&mut self.trial, Trial::Done) {
            Trial::Measuring(first) => {
                let (choose, source) = self.choose_request(&run.out.all_workers());
                self.out.push(Action::Choose(Box::new(choose)));
                self.trial = Trial::Rechoosing(first, source);
                false
            }
            Trial::Trying {
                pending,
                mut tried,
                current,
            } => {
                tried.push((*current, plan_secs(&run.step_secs)));
                self.next_trial(run, pending, tried)
            }
            other => {
                self.trial = other;
                false
            }
        }
    }

    /// The search's answer on the costs fitted to the first run's steps: the plans it
    /// predicts within the band are measured after the running one.
    pub(super) fn rechosen(&mut self, run: &mut Run, choice: crate::Result<JobChoice>) {
        let (first, source) = match std::mem::replace(&mut self.trial, Trial::Done) {
            Trial::Rechoosing(first, source) => (first, source),
            // An answer the trial no longer waits for.
            other => {
                self.trial = other;
                return;
            }
        };
        let choice = match choice {
            Ok(choice) => choice,
            Err(error) => {
                self.out.push(Action::Warn(format!(
                    "auto: the search on the fitted costs failed ({error}); the plan stays"
                )));
                return;
            }
        };
        if run.moving.is_some() {
            // A move decided while the search ran (a drift, a straggler) ends this run before
            // any rival was measured: the next run starts the trial again.
            self.trial = Trial::NotYet;
            return;
        }
        if !run.may_stop() {
            return;
        }
        // One plan per schedule kind, microbatch size and split: the running one's, its
        // pass order generated again on the fitted costs (ZB-H2's and the adaptive kinds'
        // depend on them), would take a slot another kind could use.
        let config = |o: &PlanOption| {
            (
                o.plan.kind,
                o.spec.parallelism.pipeline_parallel_microbatch_size,
                o.stage_pieces.clone(),
            )
        };
        let mut seen = vec![config(&first)];
        let pending: Vec<PlanOption> = choice
            .within(self.spec.parallelism.auto_trial_band)
            .into_iter()
            .filter(|o| {
                let c = config(o);
                let new = !seen.contains(&c);
                if new {
                    seen.push(c);
                }
                new
            })
            .take(TRIAL_PLANS - 1)
            .cloned()
            .collect();
        let secs = plan_secs(&run.step_secs);
        let running = format!(
            "{} measured {:.1} ms a step",
            first.shown.text(),
            1e3 * secs
        );
        // The next step event shows it too (`watch`, `summary.json`).
        if pending.is_empty() {
            let text = format!(
                "auto re-checked: {}; the running plan stays ({running})",
                choice.text(&source)
            );
            self.out.push(Action::Info(text.clone()));
            self.chose = Some(text);
            return;
        }
        let names: Vec<&str> = pending.iter().map(|p| p.shown.schedule.as_str()).collect();
        let text = format!(
            "auto re-checked: {}; measuring {} after the running plan ({running}), {TRIAL_STEPS} \
             steps each",
            choice.text(&source),
            names.join(", ")
        );
        self.out.push(Action::Info(text.clone()));
        self.chose = Some(text);
        self.next_trial(run, pending, vec![(*first, secs)]);
    }

    /// Moves `run` to the next plan to measure, or, when every plan was measured, to the
    /// fastest measured unless it is the running one (the last of `tried`): whether the
    /// run stops.
    fn next_trial(
        &mut self,
        run: &mut Run,
        mut pending: Vec<PlanOption>,
        mut tried: Vec<(PlanOption, f64)>,
    ) -> bool {
        let Some((last, secs)) = tried.last() else {
            return false;
        };
        let measured = format!(
            "auto trial: {} measured {:.1} ms a step",
            last.shown.text(),
            1e3 * secs
        );
        let (next, reason) = if pending.is_empty() {
            let fastest = (0..tried.len())
                .min_by(|&a, &b| tried[a].1.total_cmp(&tried[b].1))
                .unwrap_or(0);
            let summary: Vec<String> = tried
                .iter()
                .map(|(p, s)| format!("{} {:.1} ms", p.shown.schedule, 1e3 * s))
                .collect();
            if fastest + 1 == tried.len() {
                self.out.push(Action::Info(format!(
                    "{measured}; the fastest measured of {}, it stays",
                    summary.join(", ")
                )));
                return false;
            }
            let (fastest, _) = tried.swap_remove(fastest);
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
