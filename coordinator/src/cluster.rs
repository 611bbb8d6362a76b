//! [`ClusterRunner`]: runs jobs on registered worker processes (`pipewise worker`).
//!
//! For a job on `d` workers it waits until `d` live workers have their assignment stream
//! open, takes the first `d` by id (worker index = rank in that order), and sends each its
//! assignment: the placement, its program, the peers' addresses, the job spec and the
//! output directory. From then on the workers talk only to each other; each sends a
//! `StepReport` after every step (without waiting for an answer), and the runner turns a
//! complete set of reports into a step event.
//!
//! Ends: every worker reports `done` → success. A worker reports an error, or stops
//! heartbeating → the job fails and the other workers are told (in their heartbeat reply)
//! to abandon it. A cancel → the workers are asked (in their step acks) to stop; worker 0
//! spreads that through the step's collective, so all stop after the same step.
//! Re-planning onto the survivors after a lost worker is not implemented yet: the job fails
//! with the reason.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pipewise_common::job::{JobPlan, JobSpec};
use pipewise_common::{Costs, simulate};
use pipewise_proto::convert::program_to_proto;
use pipewise_proto::v1 as pb;
use ractor::ActorRef;

use crate::driver::{JobRunner, StepEventData};
use crate::membership::{MembershipMsg, WorkerInfo};

/// How long a cancelled job's workers get to stop before they are told to abandon it.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// The planned bubble of a job's plan (what `StepEvent.planned_bubble` reports): its
/// schedule simulated under [`JobSpec::planning_times`], unit pass times for real compute
/// and the `[compute]` times for an emulated job.
pub fn planned_bubble(plan: &JobPlan, spec: &JobSpec) -> f64 {
    Costs::uniform(&plan.schedule.placement, spec.planning_times())
        .and_then(|c| simulate(&plan.schedule, &c))
        .map(|s| s.bubble)
        .unwrap_or(f64::NAN)
}

/// Runs jobs on the cluster's worker processes (see the [module docs](self)).
pub struct ClusterRunner {
    /// The membership actor.
    pub membership: ActorRef<MembershipMsg>,
    /// The coordinator's runtime (the runner blocks on it from the driver's thread).
    pub runtime: tokio::runtime::Handle,
    /// The coordinator's data directory (relative checkpoint folders are under it).
    pub data_dir: PathBuf,
}

impl ClusterRunner {
    fn live(&self) -> Result<Vec<WorkerInfo>, String> {
        self.runtime
            .block_on(async { ractor::call!(self.membership, MembershipMsg::Live) })
            .map_err(|e| format!("membership: {e}"))
    }

    /// Waits for `d` live, streaming workers; `None` if cancelled first.
    fn wait_for_workers(
        &self,
        job: u64,
        d: u32,
        cancelled: &AtomicBool,
    ) -> Result<Option<Vec<WorkerInfo>>, String> {
        let started = Instant::now();
        let mut told = Duration::ZERO;
        loop {
            let mut ready: Vec<WorkerInfo> =
                self.live()?.into_iter().filter(|w| w.streaming).collect();
            if ready.len() >= d as usize {
                ready.sort_by(|a, b| a.id.cmp(&b.id));
                ready.truncate(d as usize);
                return Ok(Some(ready));
            }
            if cancelled.load(Ordering::SeqCst) {
                return Ok(None);
            }
            if started.elapsed() >= told {
                tracing::info!(job, "waiting for workers: {} of {d} ready", ready.len());
                told += Duration::from_secs(10);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn output_dir(&self, job: u64, spec: &JobSpec) -> PathBuf {
        let folder = PathBuf::from(&spec.checkpoint.folder);
        let base = if folder.is_absolute() {
            folder
        } else {
            self.data_dir.join(folder)
        };
        base.join(format!("job-{job}"))
    }
}

/// A job handed to its workers.
#[derive(Clone, Copy)]
struct Assigned<'a> {
    job: u64,
    steps: u64,
    planned: f64,
    workers: &'a [WorkerInfo],
    reports: &'a std::sync::mpsc::Receiver<pb::StepReport>,
}

/// The reports of one step, by worker index.
type Pending = BTreeMap<u64, Vec<Option<pb::StepReport>>>;

impl JobRunner for ClusterRunner {
    fn run(
        &self,
        job: u64,
        spec: &JobSpec,
        plan: &JobPlan,
        report: &mut dyn FnMut(StepEventData),
        cancelled: &AtomicBool,
    ) -> Result<(), String> {
        let _span = tracing::info_span!("job", job).entered();
        let schedule = &plan.schedule;
        let d = schedule.num_workers();
        let Some(workers) = self.wait_for_workers(job, d, cancelled)? else {
            return Ok(());
        };
        let output = self.output_dir(job, spec);
        std::fs::create_dir_all(&output)
            .map_err(|e| format!("cannot create {}: {e}", output.display()))?;
        let toml = spec.to_toml().map_err(|e| e.to_string())?;
        let peers: HashMap<u32, String> = workers
            .iter()
            .enumerate()
            .map(|(i, w)| (i as u32, w.address.clone()))
            .collect();
        let (tx, rx) = std::sync::mpsc::channel::<pb::StepReport>();
        self.membership
            .cast(MembershipMsg::Attach(job, tx))
            .map_err(|e| format!("membership: {e}"))?;
        let steps = u64::from(spec.training.steps);
        for (i, w) in workers.iter().enumerate() {
            let assignment = pb::Assignment {
                job,
                first_step: 0,
                end_step: steps,
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
                Ok(Err(e)) => return Err(self.abort(job, e.to_string())),
                Err(e) => return Err(self.abort(job, format!("membership: {e}"))),
            }
        }
        tracing::info!(job, workers = ?workers.iter().map(|w| &w.id).collect::<Vec<_>>(), "assigned");
        let run = Assigned {
            job,
            steps,
            planned: planned_bubble(plan, spec),
            workers: &workers,
            reports: &rx,
        };
        let outcome = self.follow(&run, report, cancelled);
        let _ = self.membership.cast(MembershipMsg::Detach(job));
        outcome
    }
}

impl ClusterRunner {
    /// Fails the job: its workers abandon it. Returns `reason` for the caller to return.
    fn abort(&self, job: u64, reason: String) -> String {
        let _ = self.membership.cast(MembershipMsg::Abort(job));
        reason
    }

    /// Collects the workers' reports until all are done, one fails or dies, or a cancel
    /// has run its course.
    fn follow(
        &self,
        run: &Assigned<'_>,
        report: &mut dyn FnMut(StepEventData),
        cancelled: &AtomicBool,
    ) -> Result<(), String> {
        let Assigned {
            job,
            steps,
            planned,
            workers,
            reports: rx,
        } = *run;
        let d = workers.len();
        let mut pending: Pending = BTreeMap::new();
        let mut done = vec![false; d];
        let mut stop_asked: Option<Instant> = None;
        let mut last_check = Instant::now();
        let mut completed = 0u64;
        while done.iter().any(|x| !x) {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(r) => {
                    let i = r.worker_index as usize;
                    if i >= d || workers[i].id != r.worker_id {
                        tracing::warn!(job, worker = %r.worker_id, "report from a worker not in the job");
                        continue;
                    }
                    if !r.error.is_empty() {
                        return Err(self.abort(
                            job,
                            format!(
                                "worker {i} ({}) failed at step {}: {}",
                                r.worker_id,
                                r.step + 1,
                                r.error
                            ),
                        ));
                    }
                    if r.done {
                        done[i] = true;
                        continue;
                    }
                    let step = r.step;
                    let slot = pending.entry(step).or_insert_with(|| vec![None; d]);
                    slot[i] = Some(r);
                    if slot.iter().all(Option::is_some) {
                        let reports: Vec<pb::StepReport> = pending
                            .remove(&step)
                            .unwrap_or_default()
                            .into_iter()
                            .flatten()
                            .collect();
                        report(event(job, step, planned, &reports));
                        completed += 1;
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.abort(job, "the report channel closed".into()));
                }
            }
            if cancelled.load(Ordering::SeqCst) {
                match stop_asked {
                    None => {
                        let _ = self.membership.cast(MembershipMsg::Stop(job));
                        stop_asked = Some(Instant::now());
                    }
                    Some(at) if at.elapsed() > STOP_GRACE => {
                        let _ = self.abort(job, "cancelled".into());
                        return Ok(());
                    }
                    Some(_) => {}
                }
            }
            if last_check.elapsed() >= Duration::from_secs(1) {
                last_check = Instant::now();
                let live = self.live()?;
                for (i, w) in workers.iter().enumerate() {
                    if !done[i] && !live.iter().any(|l| l.id == w.id) {
                        return Err(self.abort(
                            job,
                            format!(
                                "worker {i} ({}) stopped heartbeating; re-planning onto the \
                                 survivors is not implemented, so the job fails",
                                w.id
                            ),
                        ));
                    }
                }
            }
        }
        if completed < steps && stop_asked.is_none() {
            return Err(format!(
                "the workers stopped after {completed} of {steps} steps without being asked to"
            ));
        }
        Ok(())
    }
}

/// One step's event from every worker's report.
fn event(job: u64, step: u64, planned: f64, reports: &[pb::StepReport]) -> StepEventData {
    let wall = reports.iter().map(|r| r.wall_secs).fold(0.0, f64::max);
    let busy: f64 = reports.iter().map(|r| r.busy_secs).sum();
    let loss = reports
        .iter()
        .map(|r| r.loss)
        .find(|l| !l.is_nan())
        .unwrap_or(f64::NAN);
    StepEventData {
        job,
        step: step + 1,
        loss,
        step_time_ms: wall * 1e3,
        planned_bubble: planned,
        measured_bubble: if wall > 0.0 {
            1.0 - busy / (reports.len() as f64 * wall)
        } else {
            0.0
        },
        peaks: reports
            .iter()
            .map(|r| (r.worker_index, r.peak_activation_bytes))
            .collect(),
        worker_bubbles: reports
            .iter()
            .map(|r| {
                (
                    r.worker_index,
                    1.0 - r.busy_secs / wall.max(f64::MIN_POSITIVE),
                )
            })
            .collect(),
        replan_reason: String::new(),
        trace: step_trace(job, step, reports),
    }
}

/// The step's executed timeline from every worker's spans (`None`, with a warning, when a
/// report carries none or a malformed one).
fn step_trace(
    job: u64,
    step: u64,
    reports: &[pb::StepReport],
) -> Option<std::sync::Arc<pipewise_common::trace::StepTrace>> {
    let mut workers = vec![Vec::new(); reports.len()];
    for r in reports {
        let slot = workers.get_mut(r.worker_index as usize)?;
        if r.spans.is_empty() {
            return None;
        }
        for span in &r.spans {
            match pipewise_common::trace::Span::try_from(*span) {
                Ok(s) => slot.push(s),
                Err(e) => {
                    tracing::warn!(job, step, worker = r.worker_index, "bad trace span: {e}");
                    return None;
                }
            }
        }
    }
    Some(std::sync::Arc::new(pipewise_common::trace::StepTrace {
        job,
        step: step + 1,
        workers,
    }))
}
