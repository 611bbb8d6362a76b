//! `schedule = "auto"` in a run: before every run (the first, and after a loss, a join, a
//! drift or a memory-pressure move) the auto-planner chooses the schedule, chunks,
//! microbatch size and split for the run's workers with the costs the job's cost model has
//! then and the smallest registered memory as the budget ([`choose_for_job`]).

use std::sync::Arc;

use super::Supervisor;
use super::io::Action;
use crate::auto::job::choose_for_job;
use crate::run::respec::respec;
use crate::run::worker::Worker;

impl Supervisor {
    /// Chooses the plan of an auto job for a run on `workers`: the spec, plan and split the
    /// run follows, and the choice in words for the next step event and the log.
    pub(super) fn choose(&mut self, workers: &[Worker]) -> crate::Result<()> {
        let d = workers.len() as u32;
        let respecced;
        let spec = if d == self.spec.parallelism.pipeline_parallel_degree {
            &self.spec
        } else {
            respecced = respec(&self.spec, d);
            &respecced
        };
        let memory = workers
            .iter()
            .map(|w| w.memory_bytes)
            .filter(|&b| b > 0)
            .min()
            .unwrap_or(u64::MAX);
        let (measured, sync_ms) = self.costs.measured(workers);
        let choice = choose_for_job(spec, d, memory, measured, sync_ms)?;
        let source = if self.costs.calibrated() {
            format!("fitted to {} measured steps", self.costs.steps())
        } else {
            "from the start-up profile".to_string()
        };
        let text = choice.text(&source);
        self.costs
            .rescale(choice.spec.parallelism.pipeline_parallel_microbatch_size);
        self.current = choice.spec;
        self.plan = choice.plan;
        self.stage_pieces = choice.stage_pieces;
        // The next step event carries the schedule the job runs now (traces follow it).
        let schedule = Arc::new(self.plan.schedule.clone());
        self.replanned = Some(match self.replanned.take() {
            Some((reason, _)) => (reason, schedule),
            None => (String::new(), schedule),
        });
        self.out.push(Action::Info(text.clone()));
        self.chose = Some(text);
        Ok(())
    }
}
