//! Losing a replica without a restart: when a worker of a job with data-parallel replicas
//! is lost, its replica leaves the job and the whole replicas left go on from the parameters
//! and optimizer state they hold in memory, at the step they all stopped at, taking over the
//! lost replica's microbatches (the same global batch). No checkpoint is loaded; a job of
//! one replica, or one whose survivors cannot go on so, re-plans from its checkpoints.
//!
//! A step changes the parameters only after every collective of it (the workers' gradient
//! sum, norm and loss), so the survivors all stop at the same step boundary; they say which
//! when they leave the run, and stopping at different ones (the collectives' root lost
//! between answering two of them) falls back to the checkpoints.

use super::super::pressure::predicted_overflow;
use super::super::respec::replan;
use super::super::worker::{StepReport, Worker, gone};
use super::io::{Action, Input, Move, Reason, Taken};
use super::tracked_run::Run;
use super::{Phase, Supervisor, tightest};
use crate::job::{JobPlan, JobSpec};

/// A job shedding a lost replica: the run is aborted, and the replicas kept leave it.
#[derive(Debug)]
pub(super) struct Shed {
    run: Run,
    keep: Keep,
    reason: String,
    how: Reason,
    /// When the kept workers must have left the run by.
    until: u64,
}

/// The replicas a job goes on with after a loss, and their plan.
#[derive(Debug)]
pub(super) struct Keep {
    /// The run's replicas kept (their indices).
    replicas: Vec<usize>,
    current: JobSpec,
    plan: JobPlan,
}

impl Supervisor {
    /// Why worker `i` (`w`) of `run` is gone, if it is: it left, stopped heartbeating or
    /// restarted, or (with replicas, where a replica can leave at once) its connection to
    /// the coordinator closed.
    pub(super) fn worker_gone(&self, run: &Run, i: usize, w: &Worker) -> Option<(String, Reason)> {
        let member = self.pool.get(&w.id);
        if member.is_none() && self.left.contains(&w.id) {
            let reason = format!("worker {i} ({}) left the cluster", w.id);
            return Some((reason, Reason::WorkerLeft));
        }
        if let Some(reason) = gone(i, w, member.map(|m| &m.worker)) {
            return Some((reason, Reason::WorkerLost));
        }
        if run.out.replicas() > 1 && member.is_some_and(|m| !m.streaming) {
            let reason = format!("worker {i} ({}) closed its connection", w.id);
            return Some((reason, Reason::WorkerLost));
        }
        None
    }

    /// Sheds the replicas of `run` that lost a worker: aborts the run, and the replicas
    /// `keep` says go on once they left it.
    pub(super) fn shed(&mut self, mut run: Run, keep: Keep, reason: String, how: Reason) -> Phase {
        self.out.push(Action::Abort(run.out.id));
        run.out.may_move = false;
        // The kept replica's complete steps make the events from now on, those the lost
        // one had not made first.
        let first = keep.replicas[0];
        if run.events_from != first {
            run.events_from = first;
            while let Some(reports) = run.spare.remove(&(run.out.first_step + run.completed)) {
                let step = run.out.first_step + run.completed;
                self.complete(&mut run, step, reports);
            }
        }
        let until = self.now + self.cfg.leave_grace_ms;
        let shed = Shed {
            run,
            keep,
            reason,
            how,
            until,
        };
        self.shedding(shed, Input::Tick)
    }

    /// The replicas `run` can go on with from memory: every one whose workers are all
    /// live and running, as many of them as the global batch splits into, when that leaves
    /// at least one and drops at least one, on the run's own placement.
    pub(super) fn keep(&self, run: &Run) -> Option<Keep> {
        let r = run.out.replicas();
        if r < 2 || run.moving.is_some() || run.stop_asked.is_some() {
            return None;
        }
        let whole: Vec<usize> = (0..r)
            .filter(|&k| {
                run.out
                    .replica(k)
                    .all(|(i, w)| !run.done[i] && self.worker_gone(run, i, w).is_none())
            })
            .collect();
        let n = self
            .current
            .splitting_replicas(1, whole.len().min(r - 1) as u32)? as usize;
        let current = self.current.with_replicas(n as u32);
        let plan = replan(&current, self.plan.schedule.num_workers()).ok()?;
        if plan.schedule.placement != self.plan.schedule.placement {
            return None;
        }
        // More microbatches per replica hold more activations: a plan predicted not to fit
        // the kept workers' memory goes through the checkpoints' re-plan instead.
        let mut kept = whole[..n]
            .iter()
            .flat_map(|&k| run.out.replica(k).map(|(_, w)| w.clone()));
        let first: Vec<Worker> = kept.by_ref().take(run.out.workers.len()).collect();
        let others: Vec<Worker> = kept.collect();
        let over = predicted_overflow(
            &current,
            &plan,
            &self.stage_pieces,
            &tightest(&first, &others),
        );
        over.is_none().then(|| Keep {
            replicas: whole[..n].to_vec(),
            current,
            plan,
        })
    }

    /// Takes `input` while the kept replicas leave the run.
    pub(super) fn shedding(&mut self, mut shed: Shed, input: Input) -> Phase {
        match input {
            Input::Report(r) => self.left_report(&mut shed.run, *r),
            Input::Cancel => {
                self.out.push(Action::Detach(shed.run.out.id));
                return self.finish(Ok(()));
            }
            _ => {}
        }
        let kept: Vec<(usize, Worker)> = shed
            .keep
            .replicas
            .iter()
            .flat_map(|&k| shed.run.out.replica(k).map(|(i, w)| (i, w.clone())))
            .collect();
        if let Some((gone, _)) = kept
            .iter()
            .find_map(|(i, w)| self.worker_gone(&shed.run, *i, w))
        {
            let reason = format!("{}; then {gone}", shed.reason);
            return self.restart(shed.run, reason, shed.how);
        }
        let steps: Vec<Option<u64>> = kept
            .iter()
            .map(|(i, _)| shed.run.ended.get(i).copied())
            .collect();
        match steps.iter().copied().collect::<Option<Vec<u64>>>() {
            Some(steps) if steps.windows(2).all(|p| p[0] == p[1]) => {
                let step = steps.first().copied().unwrap_or(self.first_step);
                if step >= shed.run.out.steps {
                    // The replicas kept ran the last step: replica 0 among them wrote the
                    // parameters; else the checkpoints' run writes them again.
                    if shed.keep.replicas.first() == Some(&0) {
                        self.out.push(Action::Detach(shed.run.out.id));
                        return self.finish(Ok(()));
                    }
                    return self.restart(shed.run, shed.reason, shed.how);
                }
                self.go_on(shed, step, kept.into_iter().map(|(_, w)| w).collect())
            }
            Some(steps) => {
                let reason = format!(
                    "{}; the replicas left stopped at different steps ({steps:?})",
                    shed.reason
                );
                self.restart(shed.run, reason, shed.how)
            }
            None if self.now >= shed.until => {
                let reason = format!("{}; the replicas left did not leave the run", shed.reason);
                self.restart(shed.run, reason, shed.how)
            }
            None => Phase::Shedding(Box::new(shed)),
        }
    }

    /// A report of the run being shed: where a worker left it, or a step it completed.
    fn left_report(&mut self, run: &mut Run, r: StepReport) {
        if r.error.is_empty() && !r.done {
            self.gather(run, r);
        } else {
            run.note_end(&r);
        }
    }

    /// The kept replicas (`workers`, replica by replica) all left the run after `step`
    /// steps: the next run starts there on them, from memory.
    fn go_on(&mut self, shed: Shed, step: u64, workers: Vec<Worker>) -> Phase {
        let Shed {
            run,
            keep,
            reason,
            how,
            ..
        } = shed;
        self.out.push(Action::Detach(run.out.id));
        self.replans += 1;
        self.end_trial();
        let lost: Vec<String> = (0..run.out.replicas())
            .filter(|k| !keep.replicas.contains(k))
            .map(|k| k.to_string())
            .collect();
        let n = keep.replicas.len();
        (self.current, self.plan) = (keep.current, keep.plan);
        self.first_step = step;
        self.out.push(Action::ClearAfter(step));
        let reason = format!(
            "{reason}; replica {} left the job: {n} replica{} of {} workers go{} on after step \
             {step} from memory (no checkpoint loaded)",
            lost.join(", "),
            if n == 1 { "" } else { "s" },
            self.plan.schedule.num_workers(),
            if n == 1 { "es" } else { "" },
        );
        self.out.push(Action::Warn(reason.clone()));
        self.out.push(Action::Replanned(how));
        self.tell(reason);
        self.in_memory = true;
        self.start_run(workers)
    }

    /// The spec the runs follow with `replicas` data-parallel replicas, and its plan on the
    /// run's worker count (kept when that does not plan).
    pub(super) fn with_replicas(&mut self, replicas: u32) {
        let current = self.current.with_replicas(replicas);
        if let Ok(plan) = replan(&current, self.plan.schedule.num_workers()) {
            (self.current, self.plan) = (current, plan);
        }
    }

    /// A run that shed replicas grows them back when enough workers joined: it stops after
    /// the step in progress, and the next run's new replicas copy their state from a live
    /// one ([`Supervisor::rebuild`]). Only with steps left after the next one, and on the
    /// run's own placement.
    pub(super) fn regrow(&mut self, run: &mut Run) {
        let (had, want) = (run.out.replicas() as u32, self.spec.replicas());
        let d = run.out.workers.len() as u32;
        if !(run.may_stop()
            && had < want
            && run.completed > 0
            && run.out.first_step + run.completed + 1 < run.out.steps)
        {
            return;
        }
        let live = self.streaming().len() as u32;
        if live <= had * d || live as usize == run.grow_tried {
            return;
        }
        run.grow_tried = live as usize;
        let Some(replicas) = self.current.splitting_replicas(had + 1, want.min(live / d)) else {
            return;
        };
        if replan(&self.current.with_replicas(replicas), d).map(|p| p.schedule.placement)
            != Ok(self.plan.schedule.placement.clone())
        {
            return;
        }
        let reason = format!(
            "workers joined ({live} live); rebuilding from {had} to {replicas} replicas of {d} \
             workers, the new ones copying their state from replica 0"
        );
        self.out.push(Action::Stop(run.out.id));
        run.moving = Some((reason, Move::Rebuild(replicas)));
    }

    /// Every worker of `run` stopped after `through` steps to rebuild replicas: the next run
    /// keeps them on their stages in memory and adds new replicas on the idle workers,
    /// claimed first, which copy their state from replica 0.
    pub(super) fn rebuild(
        &mut self,
        run: Run,
        replicas: u32,
        reason: String,
        through: u64,
    ) -> Phase {
        let had = run.out.replicas() as u32;
        let d = run.out.workers.len();
        let mut workers = run.out.all_workers();
        let joining: Vec<Worker> = self
            .streaming()
            .into_iter()
            .filter(|w| !workers.iter().any(|k| k.id == w.id))
            .take((replicas - had) as usize * d)
            .collect();
        if joining.len() < (replicas - had) as usize * d {
            let until = self.now + self.cfg.leave_grace_ms;
            let then = super::io::Ended::Move {
                reason,
                through,
                to: Move::Rebuild(replicas),
                held: Vec::new(),
            };
            return self.leave(run.out.id, run.out.all_workers(), until, then);
        }
        workers.extend(joining);
        self.replans += 1;
        self.end_trial();
        self.with_replicas(replicas);
        self.first_step = through;
        self.out.push(Action::ClearAfter(through));
        let reason = format!("{reason}; going on after step {through} (no checkpoint loaded)");
        self.out.push(Action::Warn(reason.clone()));
        self.out.push(Action::Replanned(Reason::WorkerJoined));
        self.tell(reason);
        self.in_memory = true;
        self.rebuilt = replicas - had;
        self.claim(workers)
    }

    /// The claim of a rebuild's workers was refused (another job took one first): the
    /// replicas kept go on from memory without the new ones.
    pub(super) fn not_rebuilt(&mut self, mut workers: Vec<Worker>, why: &Taken) -> Phase {
        let d = self.plan.schedule.num_workers() as usize;
        let had = self.current.replicas().saturating_sub(self.rebuilt).max(1);
        workers.truncate(had as usize * d);
        self.rebuilt = 0;
        self.with_replicas(had);
        self.out.push(Action::Warn(format!(
            "workers taken: {why}; {had} replica(s) go on from memory without the new ones"
        )));
        self.claim(workers)
    }
}
