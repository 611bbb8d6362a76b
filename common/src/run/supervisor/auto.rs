//! `schedule = "auto"` in a run: before every run (the first, and after a loss, a join, a
//! drift or a memory-pressure move) the auto-planner chooses the schedule, chunks,
//! microbatch size and split for the run's workers with the costs the job's cost model has
//! then and the smallest registered memory as the budget ([`crate::auto::job::choose_for_job`]).
//! The search runs beside the supervisor ([`Action::Choose`]); the run starts when its choice
//! comes back.

use std::sync::Arc;

use super::io::{Action, Choose, Failure};
use super::trial_state::{TRIAL_STEPS, Trial};
use super::{Phase, Supervisor};
use crate::auto::job::{JobChoice, PlanOption};
use crate::run::respec::respec;
use crate::run::worker::Worker;

impl Supervisor {
    /// Asks for the plan of an auto job's run on `workers`, and waits for it.
    pub(super) fn ask_choice(&mut self, workers: Vec<Worker>) -> Phase {
        let (choose, source) = self.choose_request(&workers);
        self.out.push(Action::Choose(Box::new(choose)));
        Phase::Choosing { workers, source }
    }

    /// The search for a run on `workers` (the run's replicas one after another) with the
    /// costs as they stand, and where those costs come from, in words.
    pub(super) fn choose_request(&mut self, workers: &[Worker]) -> (Choose, String) {
        let replicas = self.current.replicas();
        let d = workers.len() as u32 / replicas;
        let spec = if d == self.spec.parallelism.pipeline_parallel_degree {
            self.spec.with_replicas(replicas)
        } else {
            respec(&self.spec.with_replicas(replicas), d)
        };
        let memory_per_worker = workers
            .iter()
            .map(|w| w.memory_bytes)
            .filter(|&b| b > 0)
            .min()
            .unwrap_or(u64::MAX);
        let (measured, overheads) = self.costs.measured(workers);
        let source = self.costs_source();
        self.asked += 1;
        let choose = Choose {
            ask: self.asked,
            spec,
            workers: d,
            memory_per_worker,
            measured,
            overheads,
        };
        (choose, source)
    }

    /// The search's answer for the run on `workers`: the run starts on the choice (the
    /// first plan of a trial, [`super::auto_trial`]), or waits for workers again when one of them
    /// stopped streaming meanwhile.
    pub(super) fn chosen(
        &mut self,
        workers: Vec<Worker>,
        source: &str,
        choice: crate::Result<JobChoice>,
    ) -> Phase {
        let choice = match choice {
            Ok(choice) => choice,
            Err(error) => {
                return self.finish(Err(Failure::Auto {
                    workers: workers.len() as u32,
                    error,
                }));
            }
        };
        let streaming = self.streaming();
        if !workers.iter().all(|w| streaming.contains(w)) {
            return self.waiting();
        }
        let mut text = choice.text(source);
        let steps_left = u64::from(self.spec.training.steps).saturating_sub(self.first_step);
        let first = choice.best;
        if self.may_try(&first, steps_left) {
            text.push_str(&format!(
                "; after {TRIAL_STEPS} steps, chosen again on costs fitted to them, and the plans \
                 predicted within {:.0} % measured",
                100.0 * self.spec.parallelism.auto_trial_band
            ));
            self.trial = Trial::Measuring(Box::new(first.clone()));
        } else if matches!(self.trial, Trial::NotYet) {
            self.trial = Trial::Done;
        }
        self.adopt(first);
        self.out.push(Action::Info(text.clone()));
        self.chose = Some(text);
        self.start_run(workers)
    }

    /// Where the cost model's costs come from, in words (for a choice's line).
    pub(super) fn costs_source(&self) -> String {
        if self.costs.calibrated() {
            format!("fitted to {} measured steps", self.costs.steps())
        } else {
            "from the start-up profile".to_string()
        }
    }

    /// Makes `option` the plan the next run follows.
    pub(super) fn adopt(&mut self, option: PlanOption) {
        self.costs
            .rescale(option.spec.parallelism.pipeline_parallel_microbatch_size);
        self.current = option.spec;
        self.plan = option.plan;
        self.stage_pieces = option.stage_pieces;
        // The next step event carries the schedule the job runs now (traces follow it).
        let schedule = Arc::new(self.plan.schedule.clone());
        self.replanned = Some(match self.replanned.take() {
            Some((reason, _)) => (reason, schedule),
            None => (String::new(), schedule),
        });
    }
}
