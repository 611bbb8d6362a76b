//! Following one run: its workers' reports, losses and the moves decided between steps.

use super::super::reports::Taken;
use super::super::respec::grown;
use super::super::straggler::straggler;
use super::handover::held_stages;
use super::io::{Action, Ended, Failure, Input, Move, Reason, Search, StepDone};
use super::tracked_run::Run;
use super::{Phase, Supervisor, shown, tightest};
use crate::calibration::Replica;
use crate::run::worker::{StepReport, Worker};

impl Supervisor {
    /// Takes `input` while `run` is out.
    pub(super) fn follow(&mut self, mut run: Run, input: Input) -> Phase {
        // While a failure is held, where the others leave the run counts if a replica is
        // shed.
        if run.failing.is_some()
            && let Input::Report(r) = &input
        {
            run.note_end(r);
        }
        if let Some((failure, until)) = &run.failing {
            // A worker failed: only a loss (or the grace running out) ends the run now.
            if let Some((gone, how)) = self.first_lost(&run) {
                let reason = format!("{gone} ({failure})");
                return self.lost(run, reason, how);
            }
            if self.now >= *until {
                let failure = failure.clone();
                self.out.push(Action::Abort(run.out.id));
                self.out.push(Action::Detach(run.out.id));
                return self.finish(Err(failure));
            }
            return Phase::Running(Box::new(run));
        }
        match input {
            Input::Report(r) => return self.take(run, *r),
            Input::Refused { worker, reason } => {
                let id = run.out.all().nth(worker).map(|w| w.id.clone());
                let reason = format!(
                    "worker {worker} ({}) could not take its assignment: {reason}",
                    id.unwrap_or_default()
                );
                // Its replica is not known to be the one to shed: from the checkpoints.
                return self.restart(run, reason, Reason::WorkerLost);
            }
            Input::Searched(Some(found))
                if run.moving.is_none()
                    && run.stop_asked.is_none()
                    && run.out.first_step + run.completed < run.out.steps =>
            {
                let (reason, fits) = *found;
                self.out.push(Action::Stop(run.out.id));
                run.moving = Some((reason, Move::Plan(Box::new(fits))));
            }
            Input::Chosen { ask, choice } if ask == self.asked => {
                self.rechosen(&mut run, *choice);
            }
            Input::Cancel if run.stop_asked.is_none() => {
                self.out.push(Action::Stop(run.out.id));
                run.stop_asked = Some(self.now);
            }
            Input::Registered(_) | Input::Lost(_) | Input::Left(_) | Input::StreamClosed(_) => {
                if let Some((gone, how)) = self.first_lost(&run) {
                    return self.lost(run, gone, how);
                }
            }
            _ => {}
        }
        if let Some(at) = run.stop_asked
            && self.now.saturating_sub(at) > self.cfg.stop_grace_ms
        {
            self.out.push(Action::Abort(run.out.id));
            self.out.push(Action::Detach(run.out.id));
            return self.finish(Ok(()));
        }
        if self.now.saturating_sub(run.last_check) >= self.cfg.check_every_ms {
            run.last_check = self.now;
            if let Some((gone, how)) = self.first_lost(&run) {
                return self.lost(run, gone, how);
            }
            self.grow(&mut run);
            self.regrow(&mut run);
        }
        Phase::Running(Box::new(run))
    }

    /// Takes a report of the run.
    fn take(&mut self, mut run: Run, r: StepReport) -> Phase {
        let Some(i) = run.out.index_of(&r) else {
            self.out.push(Action::Warn(format!(
                "report from a worker not in the job: {}",
                r.worker_id
            )));
            return Phase::Running(Box::new(run));
        };
        run.note_end(&r);
        if !r.error.is_empty() {
            let failure = Failure::of_report(i, r);
            // A vanished peer shows first as a failed send or receive: its missing
            // heartbeats get the time to tell.
            if let Some((gone, how)) = self.first_lost(&run) {
                return self.lost(run, format!("{gone} ({failure})"), how);
            }
            run.failing = Some((failure, self.now + self.cfg.lost_grace_ms));
            return Phase::Running(Box::new(run));
        }
        if r.done {
            if run.done.iter().all(|&d| d) {
                return self.end(run);
            }
            return Phase::Running(Box::new(run));
        }
        self.gather(&mut run, r);
        Phase::Running(Box::new(run))
    }

    /// Gathers a step report: every replica's step is the same step (their collectives
    /// meet), and the events replica's reports make its event.
    pub(super) fn gather(&mut self, run: &mut Run, r: StepReport) {
        let (replica, rank, step) = (r.replica as usize, r.worker_index as usize, r.step);
        let Some(gathered) = run.reports.get_mut(replica) else {
            return;
        };
        match gathered.take(rank, r) {
            Taken::Ignored(r) if replica == run.events_from => {
                self.out.push(Action::Warn(format!(
                    "report of step {} from {} ignored: out of order or past the run's {} steps",
                    step.saturating_add(1),
                    r.worker_id,
                    run.out.steps
                )));
            }
            Taken::Ignored(_) | Taken::Pending => {}
            Taken::Complete(reports) => {
                if replica != run.events_from {
                    self.replica_pass_times(run, replica, step, &reports);
                }
                // A step the replica before it made already is not made again.
                let made = step < run.out.first_step + run.completed;
                if !made && replica == run.events_from {
                    self.complete(run, step, reports);
                } else if !made {
                    run.spare.entry(step).or_insert(reports);
                }
            }
        }
    }

    /// Another replica's complete step: its workers' pass times go to the cost model (not
    /// the run's first step, which warms up), so that a plan for every replica knows each
    /// one's speed.
    fn replica_pass_times(&mut self, run: &Run, replica: usize, step: u64, reports: &[StepReport]) {
        if step > run.out.first_step {
            let workers: Vec<Worker> = run.out.replica(replica).map(|(_, w)| w.clone()).collect();
            let (schedule, ranges) = (&self.plan.schedule, &run.out.ranges);
            self.costs
                .observe(Replica::Other, schedule, ranges, &workers, reports);
        }
    }

    /// Every worker reported `step`: its event, then whether the run should move.
    pub(super) fn complete(&mut self, run: &mut Run, step: u64, reports: Vec<StepReport>) {
        run.spare.retain(|&s, _| s > step);
        // Step `step` was planned before its reports came; they refine the next step's.
        let planned = std::mem::take(&mut run.out.planned);
        // Only a prediction from measured costs can drift: one from the start-up profile's
        // FLOPs (the first step of a job) starts the drift rule's count again.
        let planned_secs = if self.costs.calibrated() {
            planned.step_ms / 1e3
        } else {
            0.0
        };
        let schedule = &self.plan.schedule;
        self.costs.observe(
            Replica::Leading,
            schedule,
            &run.out.ranges,
            &run.out.workers,
            &reports,
        );
        self.plan_next(run);
        self.out.push(Action::Step(Box::new(StepDone {
            step,
            reports: reports.clone(),
            planned,
            next: run.out.planned.clone(),
            predicted_peaks: run.out.predicted_peaks.clone(),
            replanned: self.replanned.take(),
            plan_choice: self.chose.take(),
        })));
        run.completed += 1;
        let overflow = reports.iter().any(|r| {
            run.out
                .workers
                .get(r.worker_index as usize)
                .is_some_and(|w| w.memory_bytes > 0 && r.held_bytes() > w.memory_bytes)
        });
        if overflow && !run.pressure_tried && run.may_stop() {
            run.pressure_tried = true;
            self.out.push(Action::Search(Box::new(Search {
                spec: self.current.clone(),
                plan: self.plan.clone(),
                pieces: self.stage_pieces.clone(),
                measured: reports.clone(),
                workers: run.out.workers.clone(),
            })));
        }
        // Measured over predicted first: a straggler shows there too, and the recalibrated
        // costs move its layers by what they measured rather than by FLOPs.
        let measured = reports.iter().map(|r| r.wall_secs).fold(0.0, f64::max);
        if self.trial_step(run, measured) {
            return;
        }
        let times = (planned_secs, measured);
        // An auto trial re-fits the costs and measures the plans itself, so the drift
        // rule (steps over a prediction those costs made) waits until it has ended.
        if !self.trial.measures() && self.drifted(run, step, times, &reports) {
            return;
        }
        // Each rank's tightest memory, taken only when a straggler move is weighed.
        let tight = std::cell::OnceCell::new();
        let (workers, others) = (&run.out.workers, &run.out.others);
        let fits = |c: &[u32]| self.fits(tight.get_or_init(|| tightest(workers, others)), c);
        if run.out.may_move
            && run.moving.is_none()
            && run.stop_asked.is_none()
            && run.completed > 1
            && let Some(watch) = &run.out.watch
            && let Some((reason, counts)) = straggler(
                watch,
                &self.straggler_costs(),
                &reports,
                &mut run.history,
                (run.out.first_step + run.completed, run.out.steps),
                &run.out.workers,
                fits,
            )
            // A worker slowed mid-run makes the steps drift too: the drift rule, counting
            // them, decides first (a load spike on that worker just before can complete
            // the straggler's window a step or two earlier). It is checked again at the
            // latest when the drift rule has decided, in the same step.
            && !run.drift.pending()
        {
            // Every worker stops after the same step (they save it); the next run starts
            // there on the new split.
            self.out.push(Action::Stop(run.out.id));
            run.moving = Some((reason, Move::Split(counts)));
        }
    }

    /// The run's next step as shown: its plan simulated on the costs as they stand.
    pub(super) fn plan_next(&mut self, run: &mut Run) {
        run.out.planned = shown(
            &self.current,
            &self.plan,
            &run.out.ranges,
            &run.out.all_workers(),
            &mut self.costs,
        );
    }

    /// A job running on fewer workers than its degree (after a loss) grows back when
    /// workers join: only with checkpoints (the stop saves the step the next run starts
    /// from) and with steps left after the next one.
    fn grow(&mut self, run: &mut Run) {
        let d = run.out.workers.len();
        if !(run.may_stop()
            && run.out.others.is_empty()
            && self.current.checkpoint.enable_checkpoint
            && run.completed > 0
            && run.out.first_step + run.completed + 1 < run.out.steps
            && (d as u32) < self.current.parallelism.pipeline_parallel_degree)
        {
            return;
        }
        let live = self.streaming().len();
        if live <= d || live == run.grow_tried {
            return;
        }
        run.grow_tried = live;
        match grown(&self.current, d, live) {
            Ok((reason, plan)) => {
                self.out.push(Action::Stop(run.out.id));
                run.moving = Some((reason, Move::Grow(Box::new(plan))));
            }
            Err((d2, e)) => {
                let warning = format!("not growing onto {d2} workers: {e}");
                self.out.push(Action::Warn(warning));
            }
        }
    }

    /// The first worker of the run (by index) that is no longer live, as a reason, and
    /// whether it left or was lost.
    fn first_lost(&self, run: &Run) -> Option<(String, Reason)> {
        let workers = run.out.all().enumerate();
        workers
            .filter(|&(i, _)| !run.done[i])
            .find_map(|(i, w)| self.worker_gone(run, i, w))
    }

    /// A worker of the run is gone: its replica is shed when others can go on from
    /// memory; else the run is abandoned, and the job re-planned once its workers left it.
    fn lost(&mut self, run: Run, reason: String, how: Reason) -> Phase {
        if self.cancelled || self.counted_replans() >= self.cfg.max_replans {
            return self.restart(run, reason, how);
        }
        match self.keep(&run) {
            Some(keep) => self.shed(run, keep, reason, how),
            None => self.restart(run, reason, how),
        }
    }

    /// The run is abandoned, and the job re-planned from its checkpoints once the run's
    /// workers left it.
    pub(super) fn restart(&mut self, run: Run, reason: String, how: Reason) -> Phase {
        self.out.push(Action::Detach(run.out.id));
        self.out.push(Action::Abort(run.out.id));
        if self.cancelled {
            return self.finish(Ok(()));
        }
        if self.counted_replans() >= self.cfg.max_replans {
            return self.finish(Err(Failure::Replans {
                lost: reason,
                max: self.cfg.max_replans,
            }));
        }
        let through = run.out.first_step + run.completed;
        let until = self.now + self.cfg.leave_grace_ms;
        self.leave(
            run.out.id,
            run.out.all_workers(),
            until,
            Ended::Lost {
                reason,
                through,
                how,
            },
        )
    }

    /// Every worker of the run is done.
    fn end(&mut self, run: Run) -> Phase {
        self.out.push(Action::Detach(run.out.id));
        let through = run.out.first_step + run.completed;
        if let Some((reason, Move::Rebuild(replicas))) = &run.moving
            && run.stop_asked.is_none()
            && through < run.out.steps
            && !self.cancelled
            && run
                .out
                .all()
                .enumerate()
                .all(|(i, _)| run.ended.get(&i) == Some(&through))
        {
            let (reason, replicas) = (reason.clone(), *replicas);
            return self.rebuild(run, replicas, reason, through);
        }
        if let Some((reason, to)) = run.moving
            && run.stop_asked.is_none()
            && through < run.out.steps
        {
            if self.cancelled {
                return self.finish(Ok(()));
            }
            let held = held_stages(&self.plan, &run.out);
            // Every worker reported the run done, which it does once it has left it (its
            // stop's checkpoint written): no heartbeat needs to say so before the next run.
            self.out.push(Action::ReadCheckpoints);
            return Phase::Reading {
                then: Box::new(Ended::Move {
                    reason,
                    through,
                    to,
                    held,
                }),
            };
        }
        let expected = run.out.steps.saturating_sub(run.out.first_step);
        if run.completed < expected && run.stop_asked.is_none() {
            return self.finish(Err(Failure::StoppedEarly {
                through,
                steps: run.out.steps,
            }));
        }
        self.finish(Ok(()))
    }
}
