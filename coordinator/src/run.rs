//! The run actor: one per job running on worker processes, the thin shell of the job's
//! [`Supervisor`]. It feeds the supervisor what the membership actor pushes
//! (registrations, assignment streams, heartbeats, losses, the runs' step reports), a
//! cancel, and the time (a 200 ms timer), and carries out the actions it returns:
//! assignments, stops and aborts through the membership actor, checkpoint folders on disk
//! ([`crate::checkpoints`]), step events and the end of the job to the job manager.
//!
//! Every decision — which workers a run takes, when a run ends, the re-plans after a lost
//! worker and the moves off a straggler, on drift, under memory pressure or when workers
//! join, the hand-over from memory, the auto trial — is the supervisor's, and is described
//! once, in its module docs ([`pipewise_common::run::supervisor`]) and the modules they
//! link to; `docs/runtime.md` tells the story for operators.
//!
//! A run's id, which the workers see as the assignment's `job` (and which keys its frames,
//! collectives, reports and aborts), is the job id for the first run and `job + k · 2^48`
//! for its `k`-th run ([`RunId`](pipewise_common::run::RunId)); events and metrics carry
//! the job id.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use pipewise_common::job::{ActivationCheckpoint, JobPlan, JobSpec};
use pipewise_common::run::Start;
use pipewise_common::run::supervisor::{Action, Assignment, Config, Input, Supervisor};
use pipewise_proto::convert::program_to_proto;
use pipewise_proto::v1 as pb;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::checkpoints::{read, remove_after, settle_checkpoints};
use crate::error::{CoordinatorError, Result};
use crate::job_msg::JobMsg;
use crate::membership::{HEARTBEAT_INTERVAL, MISSED_HEARTBEATS, MembershipMsg};
pub use crate::run_msg::RunMsg;
use crate::step_event::event;

/// How often the supervisor is told the time.
const TICK: Duration = Duration::from_millis(200);

/// The run actor of one job.
pub struct RunActor;

/// What a run actor starts with.
pub struct RunArgs {
    /// Job id.
    pub job: u64,
    /// The job's spec.
    pub spec: JobSpec,
    /// Its plan.
    pub plan: JobPlan,
    /// Where its runs start.
    pub start: Start,
    /// The job's output folder (checkpoints, final parameters).
    pub output: PathBuf,
    /// The membership actor.
    pub membership: ActorRef<MembershipMsg>,
    /// The job manager, told about every step and the end.
    pub manager: ActorRef<JobMsg>,
    /// The supervisor's time.
    pub clock: crate::clock::Clock,
}

/// A run actor's state.
pub struct RunState {
    sup: Supervisor,
    job: u64,
    spec: JobSpec,
    output: PathBuf,
    membership: ActorRef<MembershipMsg>,
    manager: ActorRef<JobMsg>,
    clock: crate::clock::Clock,
    cancelled: bool,
    tokens_per_step: f64,
    samples_per_step: f64,
}

/// The supervisor's timing, from the membership's.
pub fn config() -> Config {
    let lost_grace = HEARTBEAT_INTERVAL.as_millis() as u64 * (u64::from(MISSED_HEARTBEATS) + 2);
    Config {
        lost_grace_ms: lost_grace,
        ..Config::default()
    }
}

impl Actor for RunActor {
    type Msg = RunMsg;
    type State = RunState;
    type Arguments = RunArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RunMsg>,
        args: RunArgs,
    ) -> std::result::Result<RunState, ActorProcessingErr> {
        if let Ok(peaks) = args.plan.predicted_peak_bytes(&args.spec) {
            crate::metrics::record_predicted_peaks(args.job, &peaks);
        }
        let live = ractor::call!(
            args.membership,
            MembershipMsg::Follow,
            args.job,
            myself.clone()
        )?;
        let training = &args.spec.training;
        let state = RunState {
            tokens_per_step: f64::from(training.global_batch_size)
                * f64::from(args.spec.model.seq_len),
            samples_per_step: f64::from(training.global_batch_size),
            sup: Supervisor::new(
                args.job,
                args.spec.clone(),
                args.plan,
                args.start,
                config(),
                live,
            ),
            job: args.job,
            spec: args.spec,
            output: args.output,
            membership: args.membership,
            manager: args.manager,
            clock: args.clock,
            cancelled: false,
        };
        myself.send_interval(TICK, || RunMsg::Tick);
        myself.cast(RunMsg::Tick)?;
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<RunMsg>,
        msg: RunMsg,
        st: &mut RunState,
    ) -> std::result::Result<(), ActorProcessingErr> {
        let input = match msg {
            RunMsg::Input(input) => *input,
            RunMsg::Report(r) => Input::Report(r),
            RunMsg::Tick => Input::Tick,
        };
        if input == Input::Cancel {
            st.cancelled = true;
        }
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            let now = st.clock.now_ms();
            for action in st.sup.handle(now, input) {
                if let Err(e) = perform(&myself, st, action, &mut inputs).await {
                    finish(&myself, st, Err(e));
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// Performs one of the supervisor's actions; what it learns goes to `inputs`.
async fn perform(
    myself: &ActorRef<RunMsg>,
    st: &mut RunState,
    action: Action,
    inputs: &mut VecDeque<Input>,
) -> Result<()> {
    let job = st.job;
    match action {
        Action::Waiting(what) => st.manager.cast(JobMsg::Waiting(job, what))?,
        Action::Info(line) => tracing::info!(job, "{line}"),
        Action::Warn(line) => tracing::warn!(job, "{line}"),
        Action::Claim(ids) => {
            let answer = ractor::call!(st.membership, MembershipMsg::Claim, job, ids.clone())?;
            if answer.is_ok() {
                st.manager.cast(JobMsg::Workers(job, ids))?;
            }
            // Through the mailbox: the claim changes the membership actor told every run
            // actor before it answered are taken first, so a refused claim is not asked
            // again for the same workers.
            myself.cast(RunMsg::Input(Box::new(Input::ClaimAnswer(answer))))?;
        }
        Action::Attach(run) => st
            .membership
            .cast(MembershipMsg::Attach(run.raw(), myself.clone()))?,
        Action::Assign(a) => {
            if let Some((worker, reason)) = assign(st, &a).await? {
                inputs.push_back(Input::Refused { worker, reason });
            }
        }
        Action::Stop(run) => {
            tracing::info!(job, run = %run, "asked the run's workers to stop after a step");
            st.membership.cast(MembershipMsg::Stop(run.raw()))?
        }
        Action::Abort(run) => st.membership.cast(MembershipMsg::Abort(run.raw()))?,
        Action::Detach(run) => st.membership.cast(MembershipMsg::Detach(run.raw()))?,
        Action::Step(done) => {
            let next = done.next;
            tracing::info!(
                job,
                "step {} planned: bubble {:.1}%, {:.1} ms (costs from the steps before it)",
                done.step + 2,
                100.0 * next.bubble,
                next.step_ms
            );
            let mut e = event(
                job,
                done.step,
                done.planned,
                &done.predicted_peaks,
                &done.reports,
            );
            if let Some((reason, schedule)) = done.replanned {
                e.replan_reason = reason;
                e.replanned = Some(schedule);
            }
            e.plan_choice = done.plan_choice.unwrap_or_default();
            e.checkpoint = settle_checkpoints(&st.output, &st.spec, e.step);
            crate::metrics::record_step(&e, st.tokens_per_step, st.samples_per_step);
            st.manager.cast(JobMsg::Progress(Box::new(e)))?;
        }
        Action::Replanned(reason) => crate::metrics::record_replan(reason.label()),
        Action::ReadCheckpoints => inputs.push_back(Input::Checkpoints(read(&st.output)?)),
        Action::ClearAfter(step) => remove_after(&st.output, step)?,
        // On a logical clock (the harness) a search's answer is taken before the next input:
        // the step a memory-pressure move or an auto trial's moves follow from must not hang
        // on how fast the search ran beside the workers' steps.
        Action::Search(search) if st.clock.is_logical() => {
            inputs.push_back(Input::Searched(search.run()));
        }
        Action::Search(search) => beside(myself, move || Input::Searched(search.run())),
        Action::Choose(choose) if st.clock.is_logical() => inputs.push_back(choose.answer()),
        Action::Choose(choose) => beside(myself, move || choose.answer()),
        Action::Finish(outcome) => finish(myself, st, outcome.map_err(CoordinatorError::from)),
    }
    Ok(())
}

/// Runs `search` (a few dozen plans: seconds for large models) beside the actor, which goes
/// on taking reports, and feeds its answer back.
fn beside(myself: &ActorRef<RunMsg>, search: impl FnOnce() -> Input + Send + 'static) {
    let me = myself.clone();
    tokio::task::spawn_blocking(move || {
        let _ = me.cast(RunMsg::Input(Box::new(search())));
    });
}

/// The spec a run of `plan` on `replicas` replicas follows: the job's, with the schedule and
/// microbatch size `schedule = "auto"` chose for it (the plan's microbatches, on every
/// replica, divide the global batch) and the plan's recomputation.
fn run_spec(spec: &JobSpec, plan: &JobPlan, replicas: u32) -> JobSpec {
    let mut spec = spec.clone();
    if spec.is_auto() {
        let per_replica = spec.training.global_batch_size / replicas.max(1);
        let p = &mut spec.parallelism;
        p.pipeline_parallel_schedule = plan.kind.name().to_string();
        p.pipeline_parallel_microbatch_size = per_replica / plan.microbatches.max(1);
        p.search_microbatch_size = false;
    }
    // The plan's modes, one per stage: auto's choice, or the job's for the plan's stages.
    spec.activation_checkpoint = ActivationCheckpoint::of_stages(&plan.recompute);
    spec
}

/// Hands every worker of the run its assignment, in index order: the first that does not
/// take it (e.g. it registered again since it was picked), with why.
async fn assign(st: &RunState, a: &Assignment) -> Result<Option<(usize, String)>> {
    let schedule = &a.plan.schedule;
    // Replica r's rank w is worker r · d + w; each replica's frames stay among its own
    // workers, and replica 0's worker 0 serves every collective.
    let d = schedule.num_workers().max(1) as usize;
    let replicas = (a.workers.len() / d) as u32;
    let spec = &run_spec(&st.spec, &a.plan, replicas);
    let toml = spec.to_toml()?;
    let peers: Vec<HashMap<u32, String>> = a
        .workers
        .chunks(d)
        .map(|replica| {
            replica
                .iter()
                .enumerate()
                .map(|(i, w)| (i as u32, w.address.clone()))
                .collect()
        })
        .collect();
    let root = a
        .workers
        .first()
        .map(|w| w.address.clone())
        .unwrap_or_default();
    // Rebuilt replicas copy their stages from replica 0's worker of their rank.
    let rebuilt_from = replicas.saturating_sub(a.rebuilt_replicas);
    let handover: Vec<pb::HeldStage> = a
        .handover
        .iter()
        .map(|h| pb::HeldStage {
            stage: h.stage,
            first_piece: h.pieces.start as u32,
            end_piece: h.pieces.end as u32,
            address: h.holder.address.clone(),
        })
        .collect();
    for (g, w) in a.workers.iter().enumerate() {
        let (replica, i) = (g / d, g % d);
        // Frames go only among a replica's workers: its same-host ones use shared memory.
        let same_host_peers = a.workers[replica * d..]
            .iter()
            .take(d)
            .enumerate()
            .filter(|&(j, p)| j != i && !w.host.is_empty() && p.host == w.host)
            .map(|(j, _)| j as u32)
            .collect();
        let rebuilt = replica as u32 >= rebuilt_from;
        let assignment = pb::Assignment {
            run: a.run.raw(),
            first_step: a.first_step,
            worker_index: i as u32,
            placement: Some((&schedule.placement).into()),
            program: program_to_proto(&schedule.workers[i]),
            peers: peers[replica].clone(),
            same_host_peers,
            microbatches: a.plan.microbatches,
            job_toml: toml.clone(),
            stage_pieces: a.stage_pieces.clone(),
            abandon: false,
            // The gRPC edge adds it when the coordinator takes tokens.
            run_secret: Vec::new(),
            replica: replica as u32,
            replicas,
            collective_root: root.clone(),
            resume_in_memory: a.resume_in_memory && !rebuilt,
            copy_from: if rebuilt {
                a.workers[i].address.clone()
            } else {
                String::new()
            },
            offer_copies: replica == 0 && a.rebuilt_replicas > 0,
            grad_chain: if replicas > 1 {
                a.workers
                    .chunks(d)
                    .map(|replica| replica[i].address.clone())
                    .collect()
            } else {
                Vec::new()
            },
            handover: handover.clone(),
            offer_held: a.handover.iter().any(|h| h.holder.id == w.id),
        };
        let sent = ractor::call!(
            st.membership,
            MembershipMsg::Assign,
            w.id.clone(),
            Box::new(assignment)
        )?;
        if let Err(e) = sent {
            return Ok(Some((g, e.to_string())));
        }
    }
    tracing::info!(
        job = st.job,
        run = %a.run,
        first_step = a.first_step,
        workers = ?a.workers.iter().map(|w| &w.id).collect::<Vec<_>>(),
        "assigned"
    );
    Ok(None)
}

/// The job is over: the manager learns how, and the actor stops.
fn finish(myself: &ActorRef<RunMsg>, st: &RunState, outcome: Result<()>) {
    let _ = st.membership.cast(MembershipMsg::Unfollow(st.job));
    let _ = st.manager.cast(JobMsg::Finished {
        job: st.job,
        outcome,
        cancelled: st.cancelled,
    });
    myself.stop(None);
}
