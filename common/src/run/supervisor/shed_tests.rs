//! The supervisor on logical time losing a worker of a job with replicas: the replica
//! leaves and the others go on from memory, or, when they cannot, the job re-plans from its
//! checkpoints.

#![allow(clippy::unwrap_used)]

use super::replica_tests::{replica_report, replicated};
use super::tests::{Feed, JOB, assign, saved, supervisor, workers};
use super::*;
use crate::run::respec::{replan_after_loss, spec_split};
use crate::run::worker::StepReport;

/// Run index `i` (replica `i / 2`, rank `i % 2`) left the run in `step`: aborted.
fn aborted(ws: &[Worker], i: usize, step: u64) -> Input {
    let Input::Report(r) = replica_report(ws, i / 2, i % 2, step) else {
        unreachable!()
    };
    Input::Report(Box::new(StepReport {
        error: "the run was aborted".into(),
        ..*r
    }))
}

/// Run index `i` (replica `i / 2`, rank `i % 2`) ended the run after step `step`: done.
fn finished(ws: &[Worker], i: usize, step: u64) -> Input {
    let Input::Report(r) = replica_report(ws, i / 2, i % 2, step) else {
        unreachable!()
    };
    Input::Report(Box::new(StepReport { done: true, ..*r }))
}

/// The job on 2 replicas × 2 workers (`w0`..`w3`), every replica through step `through`.
fn running(through: u64) -> (JobSpec, Vec<Worker>, Supervisor) {
    let spec = replicated();
    let ws = workers(4);
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    for step in 0..through {
        for i in 0..4 {
            s.feed(10 * step + 1, replica_report(&ws, i / 2, i % 2, step));
        }
    }
    (spec, ws, s)
}

/// The run on one replica that goes on from memory after `step` steps on `workers`.
fn in_memory(spec: &JobSpec, run: RunId, step: u64, ws: &[Worker]) -> Action {
    let mut one = spec.clone();
    one.parallelism.data_parallel_replicate_degree = 1;
    let plan = one.validate().unwrap();
    assert_eq!(plan.microbatches, 8);
    let Action::Assign(mut a) = assign(run, step, ws, &plan, &spec_split(spec, &plan)) else {
        unreachable!()
    };
    a.resume_in_memory = true;
    Action::Assign(a)
}

/// Replica 1's `w3` is lost in step 3: the run is aborted, and once replica 0's workers
/// left it after 2 steps, they go on from memory with the whole global batch, no
/// checkpoint read.
#[test]
fn a_lost_replica_leaves_and_the_other_goes_on_from_memory() {
    let (spec, ws, mut s) = running(2);
    let r0 = RunId::new(JOB, 0);
    assert_eq!(s.feed(100, Input::Lost("w3".into())), [Action::Abort(r0)]);
    // The lost replica's survivor leaving counts for nothing.
    assert_eq!(s.feed(110, aborted(&ws, 2, 2)), []);
    assert_eq!(s.feed(120, aborted(&ws, 0, 2)), []);
    let r1 = RunId::new(JOB, 1);
    let reason = "worker 3 (w3) stopped heartbeating; replica 1 left the job: 1 replica of 2 \
                  workers goes on after step 2 from memory (no checkpoint loaded)";
    assert_eq!(
        s.feed(130, aborted(&ws, 1, 2)),
        [
            Action::Detach(r0),
            Action::ClearAfter(2),
            Action::Warn(reason.into()),
            Action::Replanned(Reason::WorkerLost),
            Action::Attach(r1),
            in_memory(&spec, r1, 2, &ws[..2]),
        ]
    );
    // Its first step event says why.
    s.feed(200, replica_report(&ws, 0, 0, 2));
    let acts = s.feed(200, replica_report(&ws, 0, 1, 2));
    let [Action::Step(step)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert_eq!(
        step.replanned.as_ref().map(|(r, _)| r.as_str()),
        Some(reason)
    );
}

/// Replica 0's `w1` closes its connection after replica 1 completed step 2 and replica 0
/// had not: replica 1's reports make step 2's event, and it goes on after step 3 where its
/// workers stopped, as the first replica of the next run.
#[test]
fn losing_replica_zero_hands_the_events_to_the_next() {
    let (spec, ws, mut s) = running(2);
    let r0 = RunId::new(JOB, 0);
    s.feed(50, replica_report(&ws, 0, 0, 2));
    s.feed(50, replica_report(&ws, 1, 0, 2));
    s.feed(50, replica_report(&ws, 1, 1, 2));
    let acts = s.feed(100, Input::StreamClosed("w1".into()));
    let [Action::Abort(r), Action::Step(step)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert_eq!((*r, step.step), (r0, 2));
    assert_eq!(step.reports[1].worker_id, "w3");
    assert_eq!(s.feed(110, aborted(&ws, 2, 3)), []);
    let acts = s.feed(120, aborted(&ws, 3, 3));
    let r1 = RunId::new(JOB, 1);
    assert!(matches!(&acts[2], Action::Warn(w) if w.starts_with(
        "worker 1 (w1) closed its connection; replica 0 left the job")));
    assert_eq!(acts.last(), Some(&in_memory(&spec, r1, 3, &ws[2..])));
}

/// Survivors that stopped at different steps (the collectives' root lost between two
/// answers) cannot go on from memory: the job re-plans from its last checkpoint.
#[test]
fn survivors_at_different_steps_restart_from_a_checkpoint() {
    let (spec, ws, mut s) = running(2);
    let r0 = RunId::new(JOB, 0);
    assert_eq!(s.feed(100, Input::Lost("w3".into())), [Action::Abort(r0)]);
    assert_eq!(s.feed(110, aborted(&ws, 0, 2)), []);
    assert_eq!(
        s.feed(120, aborted(&ws, 1, 3)),
        [
            Action::Detach(r0),
            Action::Abort(r0),
            Action::ReadCheckpoints
        ]
    );
    let mut one = spec.clone();
    one.parallelism.data_parallel_replicate_degree = 1;
    let (current, plan) = replan_after_loss(one.clone(), &one, 2).unwrap();
    let r1 = RunId::new(JOB, 1);
    let reason = "worker 3 (w3) stopped heartbeating; the replicas left stopped at different \
                  steps ([2, 3]); re-planned onto 2 workers (1f1b, 2 stages), resuming from \
                  the checkpoint of step 2";
    assert_eq!(
        s.feed(300, saved(&[(1, 2), (2, 2)])),
        [
            Action::ClearAfter(2),
            Action::Warn(reason.into()),
            Action::Replanned(Reason::WorkerLost),
            Action::Attach(r1),
            assign(r1, 2, &ws[..2], &plan, &spec_split(&current, &plan)),
        ]
    );
}

/// Kept workers that do not leave the run within the grace, or a kept worker lost too,
/// send the job to its checkpoints; replicas the global batch does not split into are
/// shed too.
#[test]
fn survivors_that_cannot_go_on_restart_from_a_checkpoint() {
    let (_, _, mut s) = running(2);
    let r0 = RunId::new(JOB, 0);
    assert_eq!(s.feed(100, Input::Lost("w3".into())), [Action::Abort(r0)]);
    assert_eq!(s.feed(20_000, Input::Tick), []);
    assert_eq!(
        s.feed(30_100, Input::Tick),
        [
            Action::Detach(r0),
            Action::Abort(r0),
            Action::ReadCheckpoints
        ]
    );

    let (_, _, mut s) = running(2);
    assert_eq!(s.feed(100, Input::Lost("w3".into())), [Action::Abort(r0)]);
    assert_eq!(
        s.feed(110, Input::Lost("w0".into())),
        [
            Action::Detach(r0),
            Action::Abort(r0),
            Action::ReadCheckpoints
        ]
    );

    // 3 replicas of a batch of 9: 2 cannot split it, 1 can.
    let mut spec = replicated();
    spec.parallelism.data_parallel_replicate_degree = 3;
    spec.training.global_batch_size = 9;
    let ws = workers(6);
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    assert_eq!(s.feed(100, Input::Lost("w5".into())), [Action::Abort(r0)]);
    assert_eq!(s.feed(110, aborted(&ws, 0, 0)), []);
    let acts = s.feed(120, aborted(&ws, 1, 0));
    let Some(Action::Assign(a)) = acts.last() else {
        panic!("{acts:?}")
    };
    assert!(a.resume_in_memory);
    assert_eq!((a.workers.len(), a.plan.microbatches), (2, 9));
}

/// After the shed, `w3` comes back: at the next check the run stops after the step in
/// progress, and the next run keeps replica 0 on its stages in memory and rebuilds replica 1
/// on `w2` and `w3`, which copy their state from replica 0 (claimed first).
#[test]
fn a_worker_back_rebuilds_the_replica() {
    let (spec, ws, mut s) = shed_after_two();
    let acts = back_after_shedding(&mut s, &ws);
    let r1 = RunId::new(JOB, 1);
    let reason = "workers joined (4 live); rebuilding from 1 to 2 replicas of 2 workers, the new \
                  ones copying their state from replica 0; going on after step 4 (no \
                  checkpoint loaded)";
    assert_eq!(
        acts,
        [
            Action::Detach(r1),
            Action::ClearAfter(4),
            Action::Warn(reason.into()),
            Action::Replanned(Reason::WorkerJoined),
            Action::Claim(ws.iter().map(|w| w.id.clone()).collect()),
        ]
    );
    let r2 = RunId::new(JOB, 2);
    let plan = spec.validate().unwrap();
    let Action::Assign(mut a) = assign(r2, 4, &ws, &plan, &spec_split(&spec, &plan)) else {
        unreachable!()
    };
    (a.resume_in_memory, a.rebuilt_replicas) = (true, 1);
    assert_eq!(
        s.handle(1_420, Input::ClaimAnswer(Ok(()))),
        [Action::Attach(r2), Action::Assign(a)]
    );
}

/// Replica 1 lost after 2 steps and shed; the `w0`, `w1` run at step 2 from memory.
fn shed_after_two() -> (JobSpec, Vec<Worker>, Supervisor) {
    let (spec, ws, mut s) = running(2);
    s.feed(100, Input::Lost("w3".into()));
    s.feed(110, aborted(&ws, 0, 2));
    let acts = s.feed(120, aborted(&ws, 1, 2));
    assert!(matches!(acts.last(), Some(Action::Assign(a)) if a.resume_in_memory));
    (spec, ws, s)
}

/// After replica 1 was shed (`w0`, `w1` on from memory after step 2): they run step 3,
/// `w3` comes back, the run is stopped to rebuild, and both leave it after step 4: the
/// actions of the last leaving.
fn back_after_shedding(s: &mut Supervisor, ws: &[Worker]) -> Vec<Action> {
    s.feed(200, replica_report(ws, 0, 0, 2));
    s.feed(200, replica_report(ws, 0, 1, 2));
    assert_eq!(s.feed(300, Input::Registered(ws[3].clone())), []);
    assert_eq!(s.feed(310, Input::StreamOpened("w3".into())), []);
    assert_eq!(
        s.feed(1_200, Input::Tick),
        [Action::Stop(RunId::new(JOB, 1))]
    );
    s.feed(1_300, replica_report(ws, 0, 0, 3));
    s.feed(1_300, replica_report(ws, 0, 1, 3));
    assert_eq!(s.feed(1_400, finished(ws, 0, 3)), []);
    s.handle(1_410, finished(ws, 1, 3))
}

/// A loss after going on from memory, with no checkpoint written since: the re-plan starts
/// from the start (the last run not from memory), not from the step no checkpoint holds.
#[test]
fn a_later_restart_does_not_count_on_the_in_memory_step() {
    let (_, _, mut s) = shed_after_two();
    let r1 = RunId::new(JOB, 1);
    assert_eq!(
        s.feed(200, Input::Lost("w1".into())),
        [
            Action::Detach(r1),
            Action::Abort(r1),
            Action::ReadCheckpoints
        ]
    );
    let acts = s.feed(300, saved(&[]));
    assert_eq!(acts[0], Action::ClearAfter(0));
    assert!(
        matches!(&acts[1], Action::Warn(w) if w.ends_with("resuming from the start (no checkpoint)")),
        "{acts:?}"
    );
}

/// The claim of a rebuild's workers is refused (another job took `w3`): the replica kept
/// goes on from memory alone.
#[test]
fn a_refused_rebuild_goes_on_without_the_new_replica() {
    let (spec, ws, mut s) = shed_after_two();
    back_after_shedding(&mut s, &ws);
    let acts = s.handle(
        1_415,
        Input::ClaimAnswer(Err(Taken(vec![("w3".into(), 2)]))),
    );
    assert_eq!(
        acts[1..],
        [Action::Claim(vec!["w0".into(), "w1".into()])],
        "{acts:?}"
    );
    let r2 = RunId::new(JOB, 2);
    let acts = s.handle(1_416, Input::ClaimAnswer(Ok(())));
    assert_eq!(acts[0], Action::Attach(r2));
    let Some(Action::Assign(a)) = acts.last() else {
        panic!("{acts:?}")
    };
    assert_eq!((a.first_step, a.workers.len()), (4, 2));
    assert!(a.resume_in_memory && a.rebuilt_replicas == 0);
    assert_eq!(a.plan.microbatches, spec.microbatches());
}

/// A kept worker's error report held for the grace (its collective timed out before the
/// loss was seen) still counts as where it left the run.
#[test]
fn a_report_held_for_the_grace_counts_when_the_replica_is_shed() {
    let (_, ws, mut s) = running(2);
    let r0 = RunId::new(JOB, 0);
    assert_eq!(s.feed(100, aborted(&ws, 0, 2)), []);
    assert_eq!(s.feed(110, aborted(&ws, 1, 2)), []);
    let acts = s.feed(120, Input::Lost("w3".into()));
    assert_eq!(
        acts[..2],
        [Action::Abort(r0), Action::Detach(r0)],
        "{acts:?}"
    );
    assert!(
        matches!(acts.last(), Some(Action::Assign(a)) if a.resume_in_memory && a.first_step == 2)
    );
}

/// Workers whose registered memory fits a replica's share but not the whole batch (GPipe
/// holds every microbatch): losing a replica does not go on from memory on them; the job
/// re-plans from its checkpoints.
#[test]
fn survivors_predicted_to_overflow_with_the_larger_share_restart_from_a_checkpoint() {
    let mut spec = replicated();
    spec.parallelism.pipeline_parallel_schedule = "gpipe".into();
    let share = spec.validate().unwrap().predicted_bytes(&spec).unwrap();
    let mut one = spec.clone();
    one.parallelism.data_parallel_replicate_degree = 1;
    let whole = one.validate().unwrap().predicted_bytes(&one).unwrap();
    let room = *share.iter().max().unwrap();
    assert!(whole.iter().any(|&b| b > room), "{share:?} {whole:?}");
    let ws: Vec<Worker> = workers(4)
        .into_iter()
        .map(|w| Worker {
            memory_bytes: room,
            ..w
        })
        .collect();
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    for step in 0..2 {
        for i in 0..4 {
            s.feed(10 * step + 1, replica_report(&ws, i / 2, i % 2, step));
        }
    }
    let r0 = RunId::new(JOB, 0);
    assert_eq!(
        s.feed(100, Input::Lost("w3".into())),
        [
            Action::Detach(r0),
            Action::Abort(r0),
            Action::ReadCheckpoints
        ]
    );
}

/// An auto job of 2 replicas that shed one grows it back from memory on the plan it runs:
/// no new search (the kept replica's stages stay where they are), the rebuilt replica
/// copying its state from replica 0.
#[test]
fn an_auto_job_rebuilds_a_shed_replica_on_its_plan() {
    let mut spec = replicated();
    spec.parallelism.pipeline_parallel_schedule = crate::job::AUTO_SCHEDULE.into();
    let ws = workers(4);
    let mut s = supervisor(&spec, &ws, Start::default());
    let acts = s.feed(0, Input::Tick);
    let [Action::Choose(choose)] = &acts[..] else {
        panic!("{acts:?}")
    };
    let choice = choose.run().unwrap();
    let answer = Input::Chosen {
        ask: choose.ask,
        choice: Box::new(Ok(choice.clone())),
    };
    assert!(matches!(s.feed(1, answer).last(), Some(Action::Assign(_))));
    for step in 0..2 {
        for i in 0..4 {
            s.feed(10 * step + 2, replica_report(&ws, i / 2, i % 2, step));
        }
    }
    s.feed(100, Input::Lost("w3".into()));
    s.feed(110, aborted(&ws, 0, 2));
    let acts = s.feed(120, aborted(&ws, 1, 2));
    assert!(
        matches!(acts.last(), Some(Action::Assign(a)) if a.resume_in_memory),
        "{acts:?}"
    );
    let acts = back_after_shedding(&mut s, &ws);
    assert!(
        matches!(acts.last(), Some(Action::Claim(c)) if c.len() == 4),
        "{acts:?}"
    );
    let acts = s.handle(1_420, Input::ClaimAnswer(Ok(())));
    let [Action::Attach(r2), Action::Assign(a)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert_eq!(*r2, RunId::new(JOB, 2));
    assert_eq!((a.first_step, &a.workers), (4, &ws));
    assert!(a.resume_in_memory && a.rebuilt_replicas == 1);
    assert_eq!(a.plan.kind, choice.best.plan.kind);
    assert_eq!(a.stage_pieces, choice.best.stage_pieces);
}
