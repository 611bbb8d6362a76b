//! The supervisor on logical time: a job growing back onto workers that join, and a
//! re-planned job that loses a worker it counted on before its next run starts.

#![allow(clippy::unwrap_used)]

use super::tests::{
    Feed, JOB, assign, done, handed_over, heartbeat, held, saved, spec, step, supervisor, worker,
    workers,
};
use super::*;
use crate::run::respec::{replan_after_loss, spec_split};

/// A job of degree 2 that lost worker 1 before its first step and ran steps 0 and 1 on
/// worker 0 alone (run 1), each step an event.
fn alone_after_a_loss() -> (JobSpec, Vec<Worker>, Supervisor) {
    let spec = spec(2, "1f1b", 6);
    let ws = workers(2);
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    s.feed(100, Input::Lost("w1".into()));
    s.feed(200, saved(&[]));
    for k in 0..2 {
        let acts = step(&mut s, 300 + k * 100, &ws[..1], k);
        assert!(
            matches!(&acts[..], [Action::Step(d)] if d.step == k),
            "{acts:?}"
        );
    }
    (spec, ws, s)
}

/// The job of [`alone_after_a_loss`], which stopped its run to grow back onto the returning
/// worker 1: the supervisor, waiting for the checkpoint listing.
fn growing_back() -> (JobSpec, Vec<Worker>, Supervisor) {
    let (spec, ws, mut s) = alone_after_a_loss();
    stopped_to_grow(&mut s, &ws[..1], &[worker(1)]);
    (spec, ws, s)
}

/// `joining` register and open their streams while run 1 runs on `alone`: the run stops
/// to grow onto them, and once its worker reported the run done (which says it left the
/// run: no heartbeat is waited for) the supervisor reads the checkpoints.
fn stopped_to_grow(s: &mut Supervisor, alone: &[Worker], joining: &[Worker]) {
    let r1 = RunId::new(JOB, 1);
    for w in joining {
        assert_eq!(s.feed(500, Input::Registered(w.clone())), []);
        assert_eq!(s.feed(600, Input::StreamOpened(w.id.clone())), []);
    }
    assert_eq!(s.feed(1_600, Input::Tick), [Action::Stop(r1)]);
    assert_eq!(s.feed(1_700, heartbeat(&alone[0], r1)), []);
    assert_eq!(
        s.feed(1_800, done(alone, 0)),
        [Action::Detach(r1), Action::ReadCheckpoints]
    );
}

/// The grow's actions on the listing of steps 1 and 2.
fn grew() -> [Action; 3] {
    [
        Action::ClearAfter(2),
        Action::Warn(
            "workers joined (2 live); grew from 1 onto 2 workers (1f1b, 2 stages); going on \
             after step 2 from the workers' memory"
                .into(),
        ),
        Action::Replanned(Reason::WorkerJoined),
    ]
}

/// The grow's actions on the listing, then a shrink back onto worker 0 because `why`
/// (`how`), resuming from step 2 in run 2.
fn grew_then_shrank(spec: &JobSpec, ws: &[Worker], why: &str, how: Reason) -> Vec<Action> {
    let (current, one) = replan_after_loss(spec.clone(), spec, 1).unwrap();
    let r2 = RunId::new(JOB, 2);
    let reason = format!(
        "{why} while the job waited; re-planned onto 1 workers (1f1b, 1 stages), resuming \
         from the checkpoint of step 2"
    );
    let mut want = grew().to_vec();
    want.extend([
        Action::Warn(reason),
        Action::Replanned(how),
        Action::Attach(r2),
        assign(r2, 2, &ws[..1], &one, &spec_split(&current, &one)),
    ]);
    want
}

/// The worker a move grew onto leaves during the hand-over, before the listing comes: the
/// job re-plans onto the survivor at once rather than waiting for a worker who is gone.
#[test]
fn a_worker_leaving_during_a_moves_hand_over() {
    let (spec, ws, mut s) = growing_back();
    assert_eq!(s.feed(2_000, Input::Left("w1".into())), []);
    let why = "worker w1 left the cluster";
    let want = grew_then_shrank(&spec, &ws, why, Reason::WorkerLeft);
    assert_eq!(s.feed(2_100, saved(&[(1, 1), (2, 1)])), want);
}

/// The worker a move grew onto closes its stream before the run starts, and the job waits
/// for it; it is then lost: the job re-plans onto the survivor. A worker only slow to open
/// its stream is waited for.
#[test]
fn a_worker_lost_while_a_regrown_job_waits() {
    let (spec, ws, mut s) = growing_back();
    assert_eq!(s.feed(2_000, Input::StreamClosed("w1".into())), []);
    let mut want = grew().to_vec();
    want.extend([
        Action::Waiting("workers: 1 of 2 ready".into()),
        Action::Info("waiting for workers: 1 of 2 ready".into()),
    ]);
    assert_eq!(s.feed(2_100, saved(&[(1, 1), (2, 1)])), want);
    assert_eq!(s.feed(5_000, Input::Tick), []);
    let (current, one) = replan_after_loss(spec.clone(), &spec, 1).unwrap();
    let r2 = RunId::new(JOB, 2);
    let reason = "worker w1 stopped heartbeating while the job waited; re-planned onto 1 \
                  workers (1f1b, 1 stages), resuming from the checkpoint of step 2";
    assert_eq!(
        s.feed(6_000, Input::Lost("w1".into())),
        [
            Action::Warn(reason.into()),
            Action::Replanned(Reason::WorkerLost),
            Action::Waiting(String::new()),
            Action::Attach(r2),
            assign(r2, 2, &ws[..1], &one, &spec_split(&current, &one)),
        ]
    );
}

/// A worker joins a job re-planned onto fewer workers: every worker stops after the same
/// step, and the job grows back from the stages its worker holds after that step, handed
/// over peer to peer; the checkpoint still being written then does not matter.
#[test]
fn a_worker_joining_while_a_checkpoint_is_written() {
    let (spec, ws, mut s) = alone_after_a_loss();
    let alone = &ws[..1];
    // The lost worker's pod comes back under its id.
    let back = Worker {
        incarnation: 3,
        address: "10.0.0.9:7000".into(),
        ..worker(1)
    };
    stopped_to_grow(&mut s, alone, std::slice::from_ref(&back));
    let two = replan(&spec, 2).unwrap();
    let r2 = RunId::new(JOB, 2);
    let both = [ws[0].clone(), back];
    // Step 2's checkpoint is still being written: its folder holds no stage yet.
    assert_eq!(
        s.feed(2_000, saved(&[(1, 1), (2, 0)])),
        [
            Action::ClearAfter(2),
            Action::Warn(
                "workers joined (2 live); grew from 1 onto 2 workers (1f1b, 2 stages); \
                 going on after step 2 from the workers' memory"
                    .into()
            ),
            Action::Replanned(Reason::WorkerJoined),
            Action::Attach(r2),
            handed_over(
                assign(r2, 2, &both, &two, &spec_split(&spec, &two)),
                held(alone, &[10])
            ),
        ]
    );
}

/// The worker holding the stages after a move's stop is lost before the next run starts,
/// which other workers fill: nothing can be handed over, and the run starts from the
/// checkpoint the stop saved.
#[test]
fn a_holder_lost_before_the_next_run_falls_back_to_the_checkpoint() {
    let (spec, ws, mut s) = alone_after_a_loss();
    let more = workers(3);
    stopped_to_grow(&mut s, &ws[..1], &more[1..]);
    assert_eq!(s.feed(2_000, Input::Lost("w0".into())), []);
    let two = replan(&spec, 2).unwrap();
    let r2 = RunId::new(JOB, 2);
    assert_eq!(
        s.feed(2_100, saved(&[(1, 1), (2, 1)])),
        [
            Action::ClearAfter(2),
            Action::Warn(
                "workers joined (3 live); grew from 1 onto 2 workers (1f1b, 2 stages); \
                 going on after step 2 from the workers' memory"
                    .into()
            ),
            Action::Replanned(Reason::WorkerJoined),
            Action::Warn(
                "worker w0, which held stages after step 2, is not in the next run; \
                 resuming from the checkpoint of step 2"
                    .into()
            ),
            Action::ClearAfter(2),
            Action::Attach(r2),
            assign(r2, 2, &more[1..], &two, &spec_split(&spec, &two)),
        ]
    );
}

/// Another job takes the worker a move grew onto before the run starts: the job shrinks
/// back onto the worker it holds rather than waiting for the other job to end (two jobs
/// each waiting for the other's workers would wait for ever).
#[test]
fn a_worker_taken_by_another_job_during_a_moves_hand_over() {
    let (spec, ws, mut s) = growing_back();
    let taken = Input::Claimed {
        id: "w1".into(),
        job: 7,
    };
    assert_eq!(s.feed(2_000, taken), []);
    let why = "workers went to other jobs";
    let want = grew_then_shrank(&spec, &ws, why, Reason::WorkerLost);
    assert_eq!(s.feed(2_100, saved(&[(1, 1), (2, 1)])), want);
}
