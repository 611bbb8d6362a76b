//! The supervisor on logical time: every test feeds inputs at given milliseconds and
//! asserts the exact actions that come out.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::*;
use crate::StageCost;
use crate::job::example;
use crate::run::pressure::predicted_peaks;
use crate::run::respec::{replan_after_loss, spec_split};
use crate::run::straggler::{straggle_of, straggler};
use crate::run::worker::StepReport;

pub(super) const JOB: u64 = 1;

/// [`Supervisor::handle`], with a claim of workers answered at once as the membership
/// actor answers it when no other job holds them; the claim itself is left out of the
/// actions (`claim_tests.rs` follows it).
pub(super) trait Feed {
    fn feed(&mut self, now: u64, input: Input) -> Vec<Action>;
}

impl Feed for Supervisor {
    fn feed(&mut self, now: u64, input: Input) -> Vec<Action> {
        let mut out = self.handle(now, input);
        if let Some(Action::Claim(_)) = out.last() {
            out.pop();
            out.extend(self.handle(now, Input::ClaimAnswer(Ok(()))));
        }
        out
    }
}

pub(super) fn worker(i: usize) -> Worker {
    Worker {
        id: format!("w{i}"),
        address: format!("10.0.0.{i}:7000"),
        memory_bytes: 0,
        incarnation: i as u64 + 1,
        ..Worker::default()
    }
}

/// What a run's first step is shown with when no step was measured before: the cost
/// model's prior.
pub(super) fn first_shown(
    spec: &JobSpec,
    plan: &JobPlan,
    pieces: &[u32],
    workers: &[Worker],
) -> Shown {
    let (_, ranges) = in_use_ranges(spec, plan, pieces).unwrap();
    let mbs = spec.parallelism.pipeline_parallel_microbatch_size;
    let mut costs = CostModel::new(spec.model.clone(), mbs);
    let first = shown(spec, plan, &ranges, workers, &mut costs);
    assert!(
        first.step_ms > 0.0 && (0.0..1.0).contains(&first.bubble),
        "{first:?}"
    );
    first
}

pub(super) fn workers(d: usize) -> Vec<Worker> {
    (0..d).map(worker).collect()
}

/// A job on `d` workers of `steps` steps that saves a checkpoint after every step.
pub(super) fn spec(d: u32, kind: &str, steps: u32) -> JobSpec {
    let mut spec = example(d, kind);
    spec.training.steps = steps;
    spec.checkpoint.enable_checkpoint = true;
    spec.checkpoint.interval = 1;
    spec
}

/// A supervisor of job 1 with `live` workers streaming.
pub(super) fn supervisor(spec: &JobSpec, live: &[Worker], start: Start) -> Supervisor {
    let plan = spec.validate().unwrap();
    let live = live
        .iter()
        .map(|w| Member {
            worker: w.clone(),
            streaming: true,
            running: 0,
            claimed: 0,
        })
        .collect();
    Supervisor::new(JOB, spec.clone(), plan, start, Config::default(), live)
}

pub(super) fn report(workers: &[Worker], i: usize, step: u64) -> StepReport {
    StepReport {
        worker_index: i as u32,
        worker_id: workers[i].id.clone(),
        step,
        loss: 2.0,
        wall_secs: 1.0,
        busy_secs: 0.5,
        ..Default::default()
    }
}

pub(super) fn done(workers: &[Worker], i: usize) -> Input {
    Input::Report(Box::new(StepReport {
        done: true,
        ..report(workers, i, 0)
    }))
}

/// Every worker reports `step` at `now`; the actions of the last report.
pub(super) fn step(s: &mut Supervisor, now: u64, workers: &[Worker], step: u64) -> Vec<Action> {
    let mut last = Vec::new();
    for i in 0..workers.len() {
        last = s.feed(now, Input::Report(Box::new(report(workers, i, step))));
        if i + 1 < workers.len() {
            assert_eq!(last, [], "worker {i} of step {step}");
        }
    }
    last
}

pub(super) fn assign(
    run: RunId,
    first_step: u64,
    workers: &[Worker],
    plan: &JobPlan,
    pieces: &[u32],
) -> Action {
    Action::Assign(Box::new(Assignment {
        run,
        first_step,
        end_step: 6,
        workers: workers.to_vec(),
        plan: plan.clone(),
        stage_pieces: pieces.to_vec(),
        resume_in_memory: false,
        rebuilt_replicas: 0,
        handover: Vec::new(),
    }))
}

/// The stages of a run with one stage per worker of `ws`, of `counts` pieces each, as a
/// move hands them over.
pub(super) fn held(ws: &[Worker], counts: &[usize]) -> Vec<HeldStage> {
    let mut start = 0;
    counts
        .iter()
        .zip(ws)
        .enumerate()
        .map(|(stage, (&count, holder))| {
            start += count;
            HeldStage {
                stage: stage as u32,
                pieces: start - count..start,
                holder: holder.clone(),
            }
        })
        .collect()
}

/// `assign` (an [`Action::Assign`]) going on from `held`, the stages of the run before.
pub(super) fn handed_over(assign: Action, held: Vec<HeldStage>) -> Action {
    match assign {
        Action::Assign(mut a) => {
            a.handover = held;
            Action::Assign(a)
        }
        other => other,
    }
}

/// Checkpoint folders: (step, stages saved in it).
pub(super) fn saved(folders: &[(u64, u32)]) -> Input {
    let steps: BTreeMap<u64, BTreeSet<u32>> = folders
        .iter()
        .map(|&(k, stages)| (k, (0..stages).collect()))
        .collect();
    Input::Checkpoints(Checkpoints { steps })
}

pub(super) fn heartbeat(w: &Worker, run: RunId) -> Input {
    Input::Heartbeat {
        id: w.id.clone(),
        run: run.raw(),
    }
}

pub(super) fn idle(w: &Worker) -> Input {
    Input::Heartbeat {
        id: w.id.clone(),
        run: 0,
    }
}

/// A supervisor of a 1F1B job of 6 steps on `d` workers that handed out its first run.
fn started(d: usize) -> (JobSpec, Vec<Worker>, Supervisor, RunId) {
    let spec = spec(d as u32, "1f1b", 6);
    let plan = spec.validate().unwrap();
    let ws = workers(d);
    let mut s = supervisor(&spec, &ws, Start::default());
    let r0 = RunId::new(JOB, 0);
    assert_eq!(
        s.feed(0, Input::Tick),
        [Action::Attach(r0), assign(r0, 0, &ws, &plan, &[])]
    );
    (spec, ws, s, r0)
}

/// Feeds `listing` at `now` to a supervisor that re-plans job 1 onto worker 0 alone after
/// it lost the others (`how`): asserts the exact actions, with the warning `reason` and
/// the resume at `resume`; returns the spec and plan of the new run and its split.
fn replans_onto_one(
    s: &mut Supervisor,
    now: u64,
    spec: &JobSpec,
    listing: Input,
    resume: u64,
    reason: &str,
    how: Reason,
) -> (JobSpec, JobPlan, Vec<u32>) {
    let (current, one) = replan_after_loss(spec.clone(), spec, 1).unwrap();
    let r1 = RunId::new(JOB, 1);
    let pieces = spec_split(&current, &one);
    assert_eq!(
        s.feed(now, listing),
        [
            Action::ClearAfter(resume),
            Action::Warn(reason.into()),
            Action::Replanned(how),
            Action::Attach(r1),
            assign(r1, resume, &[worker(0)], &one, &pieces),
        ]
    );
    (current, one, pieces)
}

/// A worker lost in the middle of a step (one report of it in): the run is abandoned, and
/// once the survivor left it the job is re-planned onto it from the start; the next step
/// event says why.
#[test]
fn a_worker_lost_mid_step() {
    let (spec, ws, mut s, r0) = started(2);
    assert_eq!(s.feed(100, heartbeat(&ws[0], r0)), []);
    let half = Input::Report(Box::new(report(&ws, 0, 0)));
    assert_eq!(s.feed(200, half), []);
    assert_eq!(
        s.feed(300, Input::Lost("w1".into())),
        [Action::Detach(r0), Action::Abort(r0)]
    );
    // The survivor still runs the abandoned run, then leaves it.
    assert_eq!(s.feed(400, Input::Tick), []);
    assert_eq!(s.feed(500, idle(&ws[0])), [Action::ReadCheckpoints]);
    let reason = "worker 1 (w1) stopped heartbeating; re-planned onto 1 workers (1f1b, 1 \
                  stages), resuming from the start (no checkpoint)";
    let (current, one, pieces) = replans_onto_one(
        &mut s,
        600,
        &spec,
        saved(&[]),
        0,
        reason,
        Reason::WorkerLost,
    );
    let alone = &ws[..1];
    let first = first_shown(&current, &one, &pieces, alone);
    assert_eq!(
        step(&mut s, 700, alone, 0),
        [Action::Step(Box::new(StepDone {
            step: 0,
            reports: vec![report(alone, 0, 0)],
            planned: first.clone(),
            next: first,
            predicted_peaks: predicted_peaks(&current, &one, &pieces),
            replanned: Some((reason.into(), Arc::new(one.schedule.clone()))),
            plan_choice: None,
        }))]
    );
}

/// A worker that leaves mid-step (drained by SIGTERM): the run is abandoned when it says
/// so, with no wait for missed heartbeats, and once the survivor left the run the job is
/// re-planned from the last complete checkpoint, counted as `worker_left`.
#[test]
fn a_worker_leaving_mid_step() {
    let (spec, ws, mut s, r0) = started(2);
    let acts = step(&mut s, 100, &ws, 0);
    assert!(
        matches!(&acts[..], [Action::Step(d)] if d.step == 0),
        "{acts:?}"
    );
    assert_eq!(s.feed(150, heartbeat(&ws[0], r0)), []);
    let half = Input::Report(Box::new(report(&ws, 0, 1)));
    assert_eq!(s.feed(200, half), []);
    // Both workers heartbeat the run still; the leave alone ends it, at its time.
    assert_eq!(s.feed(201, heartbeat(&ws[1], r0)), []);
    assert_eq!(
        s.feed(210, Input::Left("w1".into())),
        [Action::Detach(r0), Action::Abort(r0)]
    );
    assert_eq!(s.feed(230, idle(&ws[0])), [Action::ReadCheckpoints]);
    let reason = "worker 1 (w1) left the cluster; re-planned onto 1 workers (1f1b, 1 stages), \
                  resuming from the checkpoint of step 1";
    let listing = saved(&[(1, 2)]);
    replans_onto_one(&mut s, 240, &spec, listing, 1, reason, Reason::WorkerLeft);
    assert_eq!(Reason::WorkerLeft.label(), "worker_left");
    // The first step of the new run says why.
    let alone = &ws[..1];
    let acts = step(&mut s, 300, alone, 1);
    assert!(
        matches!(&acts[..], [Action::Step(d)] if d.replanned.as_ref().is_some_and(|(r, _)| r == reason)),
        "{acts:?}"
    );
}

/// Two workers lost in the same step: one re-plan onto the survivor, from the last
/// checkpoint every stage finished (the last step's lacks a stage).
#[test]
fn two_lost_in_one_step() {
    let (spec, ws, mut s, r0) = started(3);
    for k in 0..2 {
        let acts = step(&mut s, 100 + k * 100, &ws, k);
        assert!(
            matches!(&acts[..], [Action::Step(d)] if d.step == k),
            "{acts:?}"
        );
    }
    assert_eq!(s.feed(300, heartbeat(&ws[0], r0)), []);
    assert_eq!(
        s.feed(400, Input::Lost("w1".into())),
        [Action::Detach(r0), Action::Abort(r0)]
    );
    assert_eq!(s.feed(400, Input::Lost("w2".into())), []);
    assert_eq!(s.feed(500, idle(&ws[0])), [Action::ReadCheckpoints]);
    let reason = "worker 1 (w1) stopped heartbeating; re-planned onto 1 workers (1f1b, 1 \
                  stages), resuming from the checkpoint of step 1";
    let listing = saved(&[(1, 3), (2, 2)]);
    replans_onto_one(&mut s, 600, &spec, listing, 1, reason, Reason::WorkerLost);
}

/// A restarted coordinator replays its store: the job waits until no worker runs the
/// earlier coordinator's run, resumes from the checkpoint the store named, under a run id
/// past any the earlier coordinator gave, and its first event says so.
#[test]
fn a_coordinator_restart_replays_the_store() {
    let spec = spec(2, "1f1b", 6);
    let plan = spec.validate().unwrap();
    let ws = workers(2);
    let start = Start {
        step: 4,
        restarts: 1,
        through: 5,
    };
    let mut s = supervisor(&spec, &ws, start);
    let earlier = RunId::new(JOB, 2);
    assert_eq!(s.feed(0, heartbeat(&ws[0], earlier)), []);
    assert_eq!(s.feed(500, heartbeat(&ws[0], earlier)), []);
    assert_eq!(s.feed(1_000, idle(&ws[0])), [Action::ReadCheckpoints]);
    let reason = "the coordinator restarted; resuming from the checkpoint of step 4";
    let run = RunId::new(JOB, Config::default().max_replans + 1 + TRIAL_PLANS as u64);
    assert_eq!(
        s.feed(1_100, saved(&[(2, 2), (4, 2), (5, 1)])),
        [
            Action::ClearAfter(4),
            Action::Warn(reason.into()),
            Action::Attach(run),
            assign(run, 4, &ws, &plan, &[]),
        ]
    );
    let first = first_shown(&spec, &plan, &[], &ws);
    assert_eq!(
        step(&mut s, 1_200, &ws, 4),
        [Action::Step(Box::new(StepDone {
            step: 4,
            reports: vec![report(&ws, 0, 4), report(&ws, 1, 4)],
            planned: first.clone(),
            next: first,
            predicted_peaks: predicted_peaks(&spec, &plan, &[]),
            replanned: Some((reason.into(), Arc::new(plan.schedule.clone()))),
            plan_choice: None,
        }))]
    );
}

/// A worker twice as slow per unit of work for three steps: every worker stops after the
/// same step, and the next run moves layers off it.
#[test]
fn a_straggler_move() {
    let spec = spec(2, "1f1b", 6);
    let plan = spec.validate().unwrap();
    let ws = workers(2);
    let mut s = supervisor(&spec, &ws, Start::default());
    let r0 = RunId::new(JOB, 0);
    s.feed(0, Input::Tick);
    let slow = |k: u64| -> Vec<StepReport> {
        (0..2)
            .map(|i| StepReport {
                busy_secs: if i == 1 { 0.9 } else { 0.3 },
                ..report(&ws, i, k)
            })
            .collect()
    };
    // The policy on its own, for the reason and the split it finds.
    let watch = straggle_of(&spec, &plan, &[]).unwrap();
    let flops = spec
        .model
        .piece_costs(spec.parallelism.pipeline_parallel_microbatch_size);
    let mut history = Vec::new();
    let mut moves: Vec<(String, Vec<u32>)> = (1..4)
        .filter_map(|k| {
            let reports = slow(k);
            straggler(
                &watch,
                &flops,
                &reports,
                &mut history,
                (k + 1, 6),
                &ws,
                |_| true,
            )
        })
        .collect();
    let found = moves.pop().unwrap();
    assert!(moves.is_empty(), "{moves:?}");
    for k in 0..4 {
        let [a, b] = <[StepReport; 2]>::try_from(slow(k)).unwrap();
        assert_eq!(s.feed(100 * k, Input::Report(Box::new(a))), []);
        let acts = s.feed(100 * k, Input::Report(Box::new(b)));
        match k {
            0..3 => assert!(matches!(&acts[..], [Action::Step(_)]), "{acts:?}"),
            _ => assert!(
                matches!(&acts[..], [Action::Step(_), Action::Stop(r)] if *r == r0),
                "{acts:?}"
            ),
        }
    }
    assert_eq!(s.feed(500, done(&ws, 0)), []);
    assert_eq!(
        s.feed(500, done(&ws, 1)),
        [Action::Detach(r0), Action::ReadCheckpoints]
    );
    let r1 = RunId::new(JOB, 1);
    assert_eq!(
        s.feed(600, saved(&[(3, 2), (4, 2)])),
        [
            Action::ClearAfter(4),
            Action::Warn(format!(
                "{}; going on after step 4 from the workers' memory",
                found.0
            )),
            Action::Replanned(Reason::Straggler),
            Action::Attach(r1),
            handed_over(assign(r1, 4, &ws, &plan, &found.1), held(&ws, &[5, 5])),
        ]
    );
    // Layers moved off worker 1.
    assert!(found.1[1] < found.1[0], "{:?}", found.1);
}

/// A step's report shows a worker holding more than the memory it registered: a search
/// for a plan that fits runs beside the run, every worker stops after the same step, and
/// the next run follows the plan found.
#[test]
fn a_memory_pressure_move() {
    let mut spec = spec(2, "gpipe", 6);
    spec.training.global_batch_size = 16;
    let plan = spec.validate().unwrap();
    let need = plan.predicted_bytes(&spec).unwrap();
    // Every worker holds what GPipe is predicted to need: no move before the run.
    let ws: Vec<Worker> = (0..2)
        .map(|i| Worker {
            memory_bytes: need[i],
            ..worker(i)
        })
        .collect();
    let mut s = supervisor(&spec, &ws, Start::default());
    let r0 = RunId::new(JOB, 0);
    assert_eq!(
        s.feed(0, Input::Tick),
        [Action::Attach(r0), assign(r0, 0, &ws, &plan, &[])]
    );
    // Worker 0 held more than that in step 0.
    let over = StepReport {
        peak_activation_bytes: need[0] + 1,
        ..report(&ws, 0, 0)
    };
    let reports = [over.clone(), report(&ws, 1, 0)];
    assert_eq!(s.feed(100, Input::Report(Box::new(over))), []);
    let acts = s.feed(100, Input::Report(Box::new(reports[1].clone())));
    let [Action::Step(_), Action::Search(search)] = &acts[..] else {
        panic!("{acts:?}");
    };
    let found = search.run().expect("a plan that fits");
    let (reason, fits) = (*found).clone();
    assert!(reason.starts_with("worker 0 (w0) held"), "{reason}");
    assert_eq!(
        s.feed(2_000, Input::Searched(Some(found))),
        [Action::Stop(r0)]
    );
    let acts = step(&mut s, 2_100, &ws, 1);
    assert!(
        matches!(&acts[..], [Action::Step(d)] if d.step == 1),
        "{acts:?}"
    );
    assert_eq!(s.feed(2_200, done(&ws, 0)), []);
    assert_eq!(
        s.feed(2_200, done(&ws, 1)),
        [Action::Detach(r0), Action::ReadCheckpoints]
    );
    let mut current = spec.clone();
    let moved = fits.adopt_into(&mut current);
    let r1 = RunId::new(JOB, 1);
    assert_eq!(
        s.feed(2_300, saved(&[(1, 2), (2, 2)])),
        [
            Action::ClearAfter(2),
            Action::Warn(format!(
                "{reason}; going on after step 2 from the workers' memory"
            )),
            Action::Replanned(Reason::MemoryPressure),
            Action::Attach(r1),
            handed_over(
                assign(r1, 2, &ws, &moved, &spec_split(&current, &moved)),
                held(&ws, &[5, 5])
            ),
        ]
    );
    assert_ne!(moved.schedule, plan.schedule);
}

/// A cancel while the job re-plans after a loss ends it at once; nothing follows.
#[test]
fn a_cancel_during_a_replan() {
    let spec = spec(2, "1f1b", 6);
    let ws = workers(2);
    let mut s = supervisor(&spec, &ws, Start::default());
    let r0 = RunId::new(JOB, 0);
    s.feed(0, Input::Tick);
    assert_eq!(s.feed(100, heartbeat(&ws[0], r0)), []);
    assert_eq!(
        s.feed(200, Input::Lost("w1".into())),
        [Action::Detach(r0), Action::Abort(r0)]
    );
    assert_eq!(s.feed(300, Input::Cancel), [Action::Finish(Ok(()))]);
    assert!(s.finished());
    assert_eq!(s.feed(400, idle(&ws[0])), []);
    assert_eq!(s.feed(500, saved(&[])), []);
}

/// A cancel while a run is out asks its workers to stop after the step; if they have not
/// within the grace, the run is aborted.
#[test]
fn a_cancelled_run_that_does_not_stop_is_aborted() {
    let spec = spec(2, "1f1b", 6);
    let ws = workers(2);
    let mut s = supervisor(&spec, &ws, Start::default());
    let r0 = RunId::new(JOB, 0);
    s.feed(0, Input::Tick);
    assert_eq!(s.feed(100, Input::Cancel), [Action::Stop(r0)]);
    assert_eq!(s.feed(30_100, Input::Tick), []);
    assert_eq!(
        s.feed(30_101, Input::Tick),
        [
            Action::Abort(r0),
            Action::Detach(r0),
            Action::Finish(Ok(()))
        ]
    );
}

/// A worker's error fails the job once the grace passed with every worker heartbeating;
/// a worker going silent within the grace makes it a loss instead.
#[test]
fn an_error_report_is_held_for_the_grace() {
    let spec = spec(2, "1f1b", 6);
    let ws = workers(2);
    let r0 = RunId::new(JOB, 0);
    let failed = Input::Report(Box::new(StepReport {
        error: "peer 1 closed the connection".into(),
        ..report(&ws, 0, 2)
    }));
    let failure = Failure::Worker {
        index: 0,
        id: "w0".into(),
        step: 3,
        starting: false,
        error: "peer 1 closed the connection".into(),
    };
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    assert_eq!(s.feed(100, failed.clone()), []);
    assert_eq!(s.feed(3_099, Input::Tick), []);
    assert_eq!(
        s.feed(3_100, Input::Tick),
        [
            Action::Abort(r0),
            Action::Detach(r0),
            Action::Finish(Err(failure.clone()))
        ]
    );
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    assert_eq!(s.feed(100, failed), []);
    assert_eq!(
        s.feed(2_000, Input::Lost("w1".into())),
        [
            Action::Detach(r0),
            Action::Abort(r0),
            Action::ReadCheckpoints
        ]
    );
    let acts = s.feed(2_200, saved(&[]));
    let Action::Warn(reason) = &acts[1] else {
        panic!("{acts:?}");
    };
    assert!(
        reason.starts_with(&format!("worker 1 (w1) stopped heartbeating ({failure})")),
        "{reason}"
    );
}

/// A step is shown with the plan made from the steps before it: the first from the cost
/// model's prior, the next from the first's measured pass times, never from its own.
#[test]
fn each_step_is_planned_from_the_steps_before_it() {
    let (spec, ws, mut s, _) = started(2);
    let plan = spec.validate().unwrap();
    let first = first_shown(&spec, &plan, &[], &ws);
    // Worker 1's stage takes three times worker 0's.
    let timed = |step: u64, scale: f64| -> Vec<StepReport> {
        (0..2)
            .map(|i| {
                let f = scale * 0.01 * (1.0 + 2.0 * i as f64);
                StepReport {
                    stage_times: vec![crate::run::StageTimes {
                        stage: i as u32,
                        f,
                        b: 2.0 * f,
                        w: 0.0,
                        edge: [0.0; 3],
                    }],
                    ..report(&ws, i, step)
                }
            })
            .collect()
    };
    let feed = |s: &mut Supervisor, now: u64, reports: Vec<StepReport>| -> StepDone {
        let mut acts = Vec::new();
        for r in reports {
            acts = s.feed(now, Input::Report(Box::new(r)));
        }
        match acts.as_slice() {
            [Action::Step(done)] => (**done).clone(),
            other => panic!("{other:?}"),
        }
    };
    let done = feed(&mut s, 100, timed(0, 1.0));
    assert_eq!(
        (done.planned.bubble, done.planned.step_ms),
        (first.bubble, first.step_ms)
    );
    // The next step's plan: step 0's stage times simulated.
    let (_, ranges) = in_use_ranges(&spec, &plan, &[]).unwrap();
    let measured: Vec<StageCost> = timed(0, 1.0)
        .iter()
        .map(|r| r.stage_times[0])
        .map(|t| StageCost {
            f: t.f,
            b: t.b,
            w: 0.0,
            mem: 1.0,
        })
        .collect();
    let costs = Costs::per_stage(&plan.schedule.placement, measured, 0.0).unwrap();
    let sim = simulate(&plan.schedule, &costs).unwrap();
    let next = done.next;
    assert!(
        (next.step_ms / (sim.makespan * 1e3) - 1.0).abs() < 0.02,
        "{next:?} {sim:?}"
    );
    assert!((next.bubble - sim.bubble).abs() < 0.02, "{next:?} {sim:?}");
    assert_ne!(next, first);
    assert_eq!(ranges.len(), 2);
    // Step 1 ran ten times slower: its event still shows the plan made before it.
    let done = feed(&mut s, 200, timed(1, 10.0));
    assert_eq!(
        (done.planned.bubble, done.planned.step_ms),
        (next.bubble, next.step_ms)
    );
    assert!(done.next.step_ms > 2.0 * next.step_ms, "{:?}", done.next);
}
