//! Following one run: handing out its assignments, collecting its workers' reports until
//! it ends, and deciding whether it stops for a move (a straggler, memory pressure, growth).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pipewise_common::Schedule;
use pipewise_common::job::{JobPlan, JobSpec, job_of};
use pipewise_proto::convert::program_to_proto;
use pipewise_proto::v1 as pb;

use super::checkpoints::settle_checkpoints;
use pipewise_common::run::Failure;
use pipewise_common::run::pressure::{Fitting, pressure};
use pipewise_common::run::reports::{StepReports, Taken};
use pipewise_common::run::respec::grown;
use pipewise_common::run::straggler::straggler;
use pipewise_common::run::worker::gone;

use super::step_event::{event, report_of};
use super::{Assigned, ClusterRunner, Ended, LEAVE_GRACE, LOST_GRACE, Move, STOP_GRACE};
use crate::error::CoordinatorError;
use crate::events::Report;
use crate::membership::{MembershipMsg, WorkerInfo};

impl ClusterRunner {
    /// Fails the job: its workers abandon it. Returns `reason` for the caller to return.
    pub(super) fn abort<E>(&self, job: u64, reason: E) -> E {
        let _ = self.membership.cast(MembershipMsg::Abort(job));
        reason
    }

    /// Sends every worker of the run its assignment.
    pub(super) fn assign(
        &self,
        run: &Assigned<'_>,
        spec: &JobSpec,
        plan: &JobPlan,
        output: &std::path::Path,
    ) -> Result<(), Ended> {
        let schedule = &plan.schedule;
        let toml = spec
            .to_toml()
            .map_err(|e| Ended::Failed(CoordinatorError::from(e)))?;
        let peers: HashMap<u32, String> = run
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (i as u32, w.address.clone()))
            .collect();
        for (i, w) in run.workers.iter().enumerate() {
            let assignment = pb::Assignment {
                job: run.run,
                first_step: run.first_step,
                end_step: run.steps,
                worker_index: i as u32,
                stages: schedule.placement.stages_of(i as u32),
                placement: Some((&schedule.placement).into()),
                model: Some((&spec.model).into()),
                program: program_to_proto(&schedule.workers[i]),
                peers: peers.clone(),
                microbatches: plan.microbatches,
                seed: spec.training.seed,
                microbatch_size: spec.parallelism.pipeline_parallel_microbatch_size,
                job_toml: toml.clone(),
                output_dir: output.display().to_string(),
                stage_count: schedule.placement.stages(),
                stage_pieces: run.stage_pieces.to_vec(),
            };
            let sent = self.runtime.block_on(async {
                ractor::call!(
                    self.membership,
                    MembershipMsg::Assign,
                    w.id.clone(),
                    Box::new(assignment)
                )
            });
            match sent {
                Ok(Ok(())) => {}
                // E.g. it registered again (a new process) since it was picked: as lost.
                Ok(Err(e)) => {
                    return Err(Ended::Lost {
                        reason: format!("worker {i} ({}) could not take its assignment: {e}", w.id),
                        through: run.first_step,
                    });
                }
                Err(e) => {
                    return Err(Ended::Failed(self.abort(run.run, e.into())));
                }
            }
        }
        tracing::info!(
            job = run.job,
            run = run.run,
            first_step = run.first_step,
            workers = ?run.workers.iter().map(|w| &w.id).collect::<Vec<_>>(),
            "assigned"
        );
        Ok(())
    }

    /// Waits (up to [`LEAVE_GRACE`]) until none of `workers` still says in its heartbeat
    /// that it runs the abandoned `run` (`None`: no live worker runs any run of `job`, an
    /// earlier coordinator's; a worker says which when it registers again).
    pub(super) fn wait_until_left(&self, run: Option<u64>, job: u64, workers: &[WorkerInfo]) {
        let started = Instant::now();
        // `run`, or (None) any run of `job`.
        let running = |l: &WorkerInfo| match run {
            Some(run) => l.job == run,
            None => l.job != 0 && job_of(l.job) == job,
        };
        while started.elapsed() < LEAVE_GRACE {
            let Ok(live) = self.live() else { return };
            // An earlier coordinator's run may hold workers this run does not.
            let staying = live
                .iter()
                .any(|l| running(l) && (run.is_none() || workers.iter().any(|w| w.id == l.id)));
            if !staying {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        tracing::warn!(
            job,
            ?run,
            "survivors still run the abandoned run; handing out the next"
        );
    }

    /// The first worker of the run (by index) that is no longer live, as a reason.
    fn first_lost(
        &self,
        workers: &[WorkerInfo],
        done: &[bool],
    ) -> std::result::Result<Option<String>, Ended> {
        let live = self.live().map_err(Ended::Failed)?;
        let workers = workers.iter().enumerate();
        Ok(workers.filter(|&(i, _)| !done[i]).find_map(|(i, w)| {
            let now = live.iter().find(|l| l.id == w.id).map(WorkerInfo::worker);
            gone(i, &w.worker(), now.as_ref())
        }))
    }

    /// When more streaming workers are live than the `d` of the run (and the live count
    /// differs from `tried`), the plan of `spec` (the schedule the job follows) on
    /// min(live, degree) of them and why.
    fn grow(&self, spec: &JobSpec, d: usize, tried: &mut usize) -> Option<(String, JobPlan)> {
        let live = self.live().ok()?.iter().filter(|w| w.streaming).count();
        if live <= d || live == *tried {
            return None;
        }
        *tried = live;
        grown(spec, d, live)
            .map_err(|(d2, e)| tracing::warn!("not growing onto {d2} workers: {e}"))
            .ok()
    }

    /// Collects the workers' reports until all are done, one fails or dies, or a cancel
    /// has run its course. `replanned` (why, and the new schedule) goes with the first event
    /// (it stays for the next run if none came).
    pub(super) fn follow(
        &self,
        run: &Assigned<'_>,
        report: &mut dyn FnMut(Report),
        cancelled: &AtomicBool,
        replanned: &mut Option<(String, std::sync::Arc<Schedule>)>,
    ) -> Result<(), Ended> {
        let Assigned {
            job,
            run: run_id,
            first_step,
            steps,
            planned,
            predicted_peaks,
            output,
            workers,
            reports: rx,
            watch,
            spec,
            plan,
            may_move,
            stage_pieces,
            members,
            ..
        } = *run;
        let d = workers.len();
        let mut steps_in = StepReports::new(d, first_step, steps);
        let mut done = vec![false; d];
        let mut stop_asked: Option<Instant> = None;
        let mut last_check = Instant::now();
        let mut completed = 0u64;
        let lost = |reason: String, completed: u64| Ended::Lost {
            reason,
            through: first_step + completed,
        };
        // Relative slowness of every worker in the last steps, and a pending move.
        let mut history: Vec<Vec<f64>> = Vec::new();
        let mut moving: Option<(String, Move)> = None;
        // Memory pressure is answered once per run: when nothing fits, planning the
        // candidates again every step would not change that.
        let mut pressure_tried = false;
        // Its search for a plan that fits (up to a few dozen plans), beside the reports.
        type Found = Option<(String, Fitting)>;
        let mut searching: Option<std::thread::JoinHandle<Found>> = None;
        // The live worker count a growth was last tried for (a plan that fails is not
        // tried again until the count changes).
        let mut grow_tried = d;
        while done.iter().any(|x| !x) {
            if searching.as_ref().is_some_and(|h| h.is_finished())
                && let Some((reason, fits)) = searching.take().and_then(|h| h.join().ok()).flatten()
                && moving.is_none()
                && stop_asked.is_none()
                && first_step + completed < steps
            {
                let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                moving = Some((reason, Move::Plan(Box::new(fits))));
            }
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(r) => {
                    let r = report_of(r);
                    let i = r.worker_index as usize;
                    if i >= d || workers[i].id != r.worker_id {
                        tracing::warn!(job, worker = %r.worker_id, "report from a worker not in the job");
                        continue;
                    }
                    if !r.error.is_empty() {
                        let failure = Failure::of_report(i, r);
                        // A vanished peer shows first as a failed send or receive: give
                        // its missing heartbeats the time to tell.
                        let started = Instant::now();
                        while started.elapsed() < LOST_GRACE {
                            if let Some(gone) = self.first_lost(workers, &done)? {
                                return Err(lost(format!("{gone} ({failure})"), completed));
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        return Err(Ended::Failed(self.abort(run_id, failure.into())));
                    }
                    if r.done {
                        done[i] = true;
                        continue;
                    }
                    // Each worker reports its steps in order: a repeat (e.g. a retry of a
                    // report that did arrive) or a step past the run is ignored (it would be
                    // counted twice or kept forever).
                    let step = r.step;
                    let reports = match steps_in.take(i, r) {
                        Taken::Ignored(r) => {
                            tracing::warn!(
                                job,
                                worker = %r.worker_id,
                                step,
                                "report of step {} ignored: out of order or past the run's {} \
                                 steps",
                                step.saturating_add(1),
                                steps
                            );
                            continue;
                        }
                        Taken::Pending => None,
                        Taken::Complete(reports) => Some(reports),
                    };
                    if let Some(reports) = reports {
                        let mut e = event(job, step, planned, predicted_peaks, &reports);
                        if let Some((reason, schedule)) = replanned.take() {
                            e.replan_reason = reason;
                            e.replanned = Some(schedule);
                        }
                        e.checkpoint = settle_checkpoints(output, spec, e.step);
                        report(Report::Step(Box::new(e)));
                        completed += 1;
                        let overflow = reports.iter().any(|r| {
                            workers.get(r.worker_index as usize).is_some_and(|w| {
                                w.memory_bytes > 0
                                    && r.peak_activation_bytes.saturating_add(r.static_bytes)
                                        > w.memory_bytes
                            })
                        });
                        if overflow
                            && may_move
                            && !pressure_tried
                            && moving.is_none()
                            && stop_asked.is_none()
                            && first_step + completed < steps
                        {
                            pressure_tried = true;
                            let (spec, plan) = (spec.clone(), plan.clone());
                            let (pieces, workers) = (stage_pieces.to_vec(), members.to_vec());
                            let measured = reports.clone();
                            searching = Some(std::thread::spawn(move || {
                                pressure(&spec, &plan, &pieces, Some(&measured), &workers)
                            }));
                        }
                        if let Some(watch) = watch
                            && may_move
                            && moving.is_none()
                            && stop_asked.is_none()
                            && completed > 1
                            && let Some(found) = straggler(
                                watch,
                                &reports,
                                &mut history,
                                first_step + completed,
                                steps,
                                members,
                            )
                        {
                            // Stop every worker after the same step (they save it), then
                            // the runner starts the next run on the new split.
                            let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                            moving = Some((found.0, Move::Split(found.1)));
                        }
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(Ended::Failed(self.abort(
                        run_id,
                        CoordinatorError::Actor("the report channel closed".into()),
                    )));
                }
            }
            if cancelled.load(Ordering::SeqCst) {
                match stop_asked {
                    None => {
                        let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                        stop_asked = Some(Instant::now());
                    }
                    Some(at) if at.elapsed() > STOP_GRACE => {
                        self.abort(run_id, ());
                        return Ok(());
                    }
                    Some(_) => {}
                }
            }
            if last_check.elapsed() >= Duration::from_secs(1) {
                last_check = Instant::now();
                if let Some(gone) = self.first_lost(workers, &done)? {
                    return Err(lost(gone, completed));
                }
                // A job running on fewer workers than its degree (after a loss) grows back
                // when workers join: only with checkpoints (the stop saves the step the
                // next run starts from) and with steps left after the next one.
                if may_move
                    && moving.is_none()
                    && stop_asked.is_none()
                    && spec.checkpoint.enable_checkpoint
                    && completed > 0
                    && first_step + completed + 1 < steps
                    && (d as u32) < spec.parallelism.pipeline_parallel_degree
                    && let Some(found) = self.grow(spec, d, &mut grow_tried)
                {
                    let _ = self.membership.cast(MembershipMsg::Stop(run_id));
                    moving = Some((found.0, Move::Grow(Box::new(found.1))));
                }
            }
        }
        if let Some((reason, to)) = moving
            && stop_asked.is_none()
            && first_step + completed < steps
        {
            return Err(Ended::Move {
                reason,
                through: first_step + completed,
                to,
            });
        }
        let expected = steps.saturating_sub(first_step);
        if completed < expected && stop_asked.is_none() {
            return Err(Ended::Failed(
                Failure::StoppedEarly {
                    through: first_step + completed,
                    steps,
                }
                .into(),
            ));
        }
        Ok(())
    }
}
