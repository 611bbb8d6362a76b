//! `schedule = "auto"` in the supervisor on logical time: its search beside the run, and
//! its trial of the plans the prediction cannot tell apart.

#![allow(clippy::unwrap_used)]

use super::tests::{Feed, JOB, done, heartbeat, report, saved, spec, supervisor, workers};
use super::*;
use crate::auto::job::{JobChoice, PlanOption};
use crate::run::worker::StepReport;
use trial_state::TRIAL_STEPS as T;

/// An auto job of `steps` steps on 2 workers and its supervisor, which asked for its first
/// run's plan: the search it asked for.
fn choosing(steps: u32) -> (Vec<Worker>, Supervisor, Choose) {
    let spec = spec(2, crate::job::AUTO_SCHEDULE, steps);
    let ws = workers(2);
    let mut s = supervisor(&spec, &ws, Start::default());
    let acts = s.feed(0, Input::Tick);
    let [Action::Choose(choose)] = &acts[..] else {
        panic!("{acts:?}")
    };
    (ws, s, (**choose).clone())
}

/// An auto job's search runs beside the supervisor: nothing is handed out until its choice
/// comes back, then the run starts on exactly that plan and split.
#[test]
fn an_auto_run_starts_on_the_choice_that_comes_back() {
    let (ws, mut s, choose) = choosing(6);
    assert_eq!(s.feed(100, Input::Tick), []);
    assert_eq!(s.feed(150, heartbeat(&ws[0], RunId::new(JOB, 0))), []);
    let choice = choose.run().unwrap();
    let acts = s.feed(200, chosen(&choose, Ok(choice.clone())));
    let r0 = RunId::new(JOB, 0);
    let [Action::Info(text), Action::Attach(id), Action::Assign(a)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(text.starts_with("auto chose "), "{text}");
    // Six steps leave no room for a trial.
    assert!(!text.contains("measured"), "{text}");
    assert_eq!(*id, r0);
    assert_eq!(a.plan, choice.best.plan);
    assert_eq!(a.stage_pieces, choice.best.stage_pieces);
    assert_eq!(a.workers, ws);
}

/// With data-parallel replicas the search plans one replica's pipeline (2 workers, the
/// job's 2 replicas, a speed factor for each of the 4 workers) and the run starts on all
/// four, replica by replica, on its choice.
#[test]
fn an_auto_job_with_replicas_chooses_one_pipeline_for_all() {
    let mut spec = spec(2, crate::job::AUTO_SCHEDULE, 6);
    spec.parallelism.data_parallel_replicate_degree = 2;
    let ws = workers(4);
    let mut s = supervisor(&spec, &ws, Start::default());
    let acts = s.feed(0, Input::Tick);
    let [Action::Choose(choose)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert_eq!((choose.workers, choose.spec.replicas()), (2, 2));
    assert_eq!(choose.measured.worker_factors.len(), 4);
    let choice = choose.run().unwrap();
    let acts = s.feed(100, chosen(choose, Ok(choice.clone())));
    let [Action::Info(text), Action::Attach(id), Action::Assign(a)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(text.contains("2 replicas of "), "{text}");
    assert_eq!(*id, RunId::new(JOB, 0));
    assert_eq!(a.workers, ws);
    assert_eq!(a.plan, choice.best.plan);
    assert_eq!(a.stage_pieces, choice.best.stage_pieces);
    assert_eq!(choice.best.spec.replicas(), 2);
}

/// A worker that stopped streaming while the search ran sends the job back to waiting; a
/// cancel while it runs ends the job at once; a failed search fails the job.
#[test]
fn an_auto_choice_waits_for_its_workers_and_yields_to_a_cancel() {
    let (ws, mut s, choose) = choosing(6);
    assert_eq!(s.feed(50, Input::StreamClosed(ws[1].id.clone())), []);
    let acts = s.feed(100, choose.answer());
    assert_eq!(
        acts,
        [
            Action::Waiting("workers: 1 of 2 ready".into()),
            Action::Info("waiting for workers: 1 of 2 ready".into())
        ]
    );
    let acts = s.feed(200, Input::StreamOpened(ws[1].id.clone()));
    assert!(matches!(&acts[..], [Action::Waiting(w), Action::Choose(_)] if w.is_empty()));

    let (_, mut s, _) = choosing(6);
    assert_eq!(s.feed(50, Input::Cancel), [Action::Finish(Ok(()))]);
    assert!(s.finished());

    let (_, mut s, choose) = choosing(6);
    let error = crate::Error::invalid("parallelism.pipeline_parallel_schedule", "none fits");
    let acts = s.feed(50, chosen(&choose, Err(error.clone())));
    assert_eq!(
        acts,
        [Action::Finish(Err(Failure::Auto { workers: 2, error }))]
    );
}

/// The answer `choice` to `choose`.
fn chosen(choose: &Choose, choice: crate::Result<JobChoice>) -> Input {
    Input::Chosen {
        ask: choose.ask,
        choice: Box::new(choice),
    }
}

/// Every worker reports `step` at `now`, each taking `secs`; the actions of the last report.
fn step_took(s: &mut Supervisor, now: u64, ws: &[Worker], step: u64, secs: f64) -> Vec<Action> {
    let mut last = Vec::new();
    for i in 0..ws.len() {
        let r = StepReport {
            wall_secs: secs,
            ..report(ws, i, step)
        };
        last = s.feed(now, Input::Report(Box::new(r)));
    }
    last
}

/// `steps` steps from `first`, each taking `secs`; the actions of the last (every earlier
/// one only a step event).
fn steps_took(s: &mut Supervisor, ws: &[Worker], first: u64, steps: u64, secs: f64) -> Vec<Action> {
    let mut acts = Vec::new();
    for k in first..first + steps {
        acts = step_took(s, 1_000 * (k + 1), ws, k, secs);
        if k + 1 < first + steps {
            assert!(matches!(&acts[..], [Action::Step(_)]), "step {k}: {acts:?}");
        }
    }
    acts
}

/// The workers of `run` end it after step `through` (which they saved: a checkpoint of
/// `stages` stages), and the job moves: the actions from the checkpoint listing on.
fn moved_after(
    s: &mut Supervisor,
    ws: &[Worker],
    (run, stages): (RunId, u32),
    through: u64,
) -> Vec<Action> {
    let now = 1_000 * (through + 1) + 500;
    assert_eq!(s.feed(now, done(ws, 0)), []);
    assert_eq!(
        s.feed(now, done(ws, 1)),
        [Action::Detach(run), Action::ReadCheckpoints]
    );
    s.feed(now + 100, saved(&[(through, stages)]))
}

/// A trial move's last actions: why (the warning), the new run and its assignment.
fn trial_move(acts: &[Action]) -> (&str, RunId, &Assignment) {
    match acts {
        [
            ..,
            Action::Warn(why),
            Action::Replanned(Reason::AutoTrial),
            Action::Attach(id),
            Action::Assign(a),
        ] => (why, *id, a),
        _ => panic!("not a trial move: {acts:?}"),
    }
}

/// The stages of `option`'s plan.
fn stages(option: &PlanOption) -> u32 {
    option.plan.schedule.placement.stages()
}

/// A 20-step auto job whose first run started on the search's best plan, and a choice
/// (for the search on fitted costs) whose runner-up is predicted 1 % slower than that plan
/// and every other plan twice as slow.
fn first_run() -> (Vec<Worker>, Supervisor, JobChoice) {
    first_run_of(20)
}

/// [`first_run`] of a job of `steps` steps.
fn first_run_of(steps: u32) -> (Vec<Worker>, Supervisor, JobChoice) {
    let (ws, mut s, choose) = choosing(steps);
    let mut choice = choose.run().unwrap();
    let best = choice.best.shown.predicted_ms;
    for (i, o) in choice.others.iter_mut().enumerate() {
        o.shown.predicted_ms = best * if i == 0 { 1.01 } else { 2.0 };
    }
    assert_ne!(choice.others[0].plan, choice.best.plan);
    let acts = s.feed(100, chosen(&choose, Ok(choice.clone())));
    let [Action::Info(text), Action::Attach(_), Action::Assign(a)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(
        text.contains(&format!(
            "after {T} steps, chosen again on costs fitted to them"
        )),
        "{text}"
    );
    assert_eq!(a.plan, choice.best.plan);
    (ws, s, choice)
}

/// The first run's `T`th step sends the search out again (on the fitted costs), and the
/// run goes on meanwhile; its answer starts the trial: the running plan is measured, the
/// runner-up within the band is tried next.
fn trial_started(ws: &[Worker], s: &mut Supervisor, choice: &JobChoice, secs: f64) -> Vec<Action> {
    let acts = steps_took(s, ws, 0, T, secs);
    let [Action::Step(_), Action::Choose(again)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(matches!(
        &step_took(s, 1_000 * (T + 1), ws, T, secs)[..],
        [Action::Step(_)]
    ));
    // An answer to an earlier search is not this one's.
    let earlier = Choose {
        ask: again.ask - 1,
        ..(**again).clone()
    };
    let now = 1_000 * (T + 1);
    assert_eq!(s.feed(now + 50, chosen(&earlier, Ok(choice.clone()))), []);
    s.feed(now + 100, chosen(again, Ok(choice.clone())))
}

/// [`trial_started`] on `choice` (the first run on plan `a`, 1 s a step) through the move
/// to the trial's second plan: that plan's assignment.
fn moved_to_second(
    ws: &[Worker],
    s: &mut Supervisor,
    choice: &JobChoice,
    a: &PlanOption,
) -> Assignment {
    trial_started(ws, s, choice, 1.0);
    step_took(s, 1_000 * (T + 1) + 500, ws, T + 1, 1.0);
    let acts = moved_after(s, ws, (RunId::new(JOB, 0), stages(a)), T + 2);
    trial_move(&acts).2.clone()
}

/// An auto trial measures the plans predicted within the band and goes on with the fastest
/// measured: here the first, so the job moves back to it. Trial moves resume from the step
/// they stopped after, are counted as `auto_trial`, and leave `max_replans` untouched.
#[test]
fn an_auto_trial_goes_on_with_the_fastest_measured() {
    let (ws, mut s, choice) = first_run();
    let (a, b) = (choice.best.clone(), choice.others[0].clone());
    let r0 = RunId::new(JOB, 0);
    let acts = trial_started(&ws, &mut s, &choice, 1.0);
    let [Action::Info(text), Action::Stop(r)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(text.starts_with("auto re-checked: auto chose"), "{text}");
    assert!(text.contains("measured 1000.0 ms a step"), "{text}");
    assert_eq!(*r, r0);
    // The step the workers were in when asked to stop is not the next plan's.
    assert!(matches!(
        &step_took(&mut s, 1_000 * (T + 1) + 500, &ws, T + 1, 1.0)[..],
        [Action::Step(_)]
    ));
    let acts = moved_after(&mut s, &ws, (r0, stages(&a)), T + 2);
    let r1 = RunId::new(JOB, 1);
    assert_eq!(acts[0], Action::ClearAfter(T + 2));
    let (why, id, second) = trial_move(&acts);
    assert!(why.contains("measured 1000.0 ms a step; trying"), "{why}");
    assert_eq!((id, &second.plan, second.first_step), (r1, &b.plan, T + 2));
    assert_eq!(second.stage_pieces, b.stage_pieces);
    // Plan b is slower: back to a, which then runs to the end unmeasured.
    let acts = steps_took(&mut s, &ws, T + 2, T, 1.2);
    assert!(
        matches!(&acts[..], [Action::Step(_), Action::Stop(r)] if *r == r1),
        "{acts:?}"
    );
    let acts = moved_after(&mut s, &ws, (r1, stages(&b)), 2 * T + 2);
    let r2 = RunId::new(JOB, 2);
    let (why, id, third) = trial_move(&acts);
    assert!(
        why.contains("going on with the fastest measured of"),
        "{why}"
    );
    assert_eq!(
        (id, &third.plan, third.first_step),
        (r2, &a.plan, 2 * T + 2)
    );
    let acts = steps_took(&mut s, &ws, 2 * T + 2, 4, 0.5);
    assert!(matches!(&acts[..], [Action::Step(_)]), "{acts:?}");
    assert_eq!(s.counted_replans(), 0);
}

/// The running plan's kind, microbatch size and split with another pass order (generated
/// again on the fitted costs) is not measured again: the trial's next plan is the next
/// kind within the band.
#[test]
fn an_auto_trial_does_not_measure_the_running_plan_again_in_another_order() {
    let (ws, mut s, mut choice) = first_run();
    let (a, b) = (choice.best.clone(), choice.others[0].clone());
    let mut reordered = a.clone();
    reordered.plan.schedule.name.push_str(" (fitted)");
    assert_ne!(reordered.plan, a.plan);
    choice.others.insert(0, reordered);
    let second = moved_to_second(&ws, &mut s, &choice, &a);
    assert_eq!(second.plan, b.plan);
    assert_eq!(second.stage_pieces, b.stage_pieces);
}

/// A plan is measured by its fastest step after its warm-up, so one disturbed step does
/// not decide: the rival's steps (after a 2 s warm-up) take 0.9, 1.5 and 1.5 s against the
/// running plan's steady 1.0 s, and the rival stays (a median would have moved back).
#[test]
fn an_auto_trial_measures_each_plan_by_its_fastest_step() {
    let (ws, mut s, choice) = first_run();
    let (a, b) = (choice.best.clone(), choice.others[0].clone());
    let second = moved_to_second(&ws, &mut s, &choice, &a);
    assert_eq!(second.plan, b.plan);
    let first = T + 2;
    let times = [2.0, 0.9, 1.5, 1.5];
    assert_eq!(times.len() as u64, T);
    let mut acts = Vec::new();
    for (k, secs) in (first..).zip(times) {
        acts = step_took(&mut s, 1_000 * (k + 1), &ws, k, secs);
    }
    let [Action::Step(_), Action::Info(kept)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(kept.contains("measured 900.0 ms a step"), "{kept}");
    assert!(kept.contains("it stays"), "{kept}");
}

/// A move decided while the re-check's search runs (here worker 1 straggling) ends the
/// run before any rival was measured: the search's late answer is dropped, and the next
/// run starts the trial again (it used to end the trial for good).
#[test]
fn a_move_during_the_re_check_restarts_the_trial() {
    let (ws, mut s, choice) = first_run_of(40);
    let acts = steps_took(&mut s, &ws, 0, T, 1.0);
    let [Action::Step(_), Action::Choose(again)] = &acts[..] else {
        panic!("{acts:?}")
    };
    let mut k = T;
    let through = loop {
        assert!(k < T + 8, "no straggler move");
        let mut acts = Vec::new();
        for i in 0..ws.len() {
            let r = StepReport {
                busy_secs: if i == 1 { 0.9 } else { 0.2 },
                ..report(&ws, i, k)
            };
            acts = s.feed(1_000 * (k + 1), Input::Report(Box::new(r)));
        }
        if acts.iter().any(|a| matches!(a, Action::Stop(_))) {
            break k + 1;
        }
        k += 1;
    };
    assert_eq!(
        s.feed(1_000 * (k + 1) + 50, chosen(again, Ok(choice.clone()))),
        []
    );
    let acts = moved_after(
        &mut s,
        &ws,
        (RunId::new(JOB, 0), stages(&choice.best)),
        through,
    );
    let Some(Action::Choose(next)) = acts.last() else {
        panic!("{acts:?}")
    };
    let acts = s.feed(1_000 * (through + 2), chosen(next, Ok(choice.clone())));
    let [Action::Info(text), Action::Attach(_), Action::Assign(_)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(
        text.contains("chosen again on costs fitted to them"),
        "{text}"
    );
    let acts = steps_took(&mut s, &ws, through, T, 1.0);
    assert!(
        matches!(&acts[..], [Action::Step(_), Action::Choose(_)]),
        "the next run re-checks after {T} steps: {acts:?}"
    );
}

/// The last plan measured stays when it is the fastest; a re-check that finds no rival
/// within the band keeps the running plan; a job without checkpoints (it cannot move
/// between steps) measures nothing.
#[test]
fn an_auto_trial_keeps_the_fastest_and_needs_checkpoints() {
    let (ws, mut s, choice) = first_run();
    let a = choice.best.clone();
    trial_started(&ws, &mut s, &choice, 1.0);
    moved_after(&mut s, &ws, (RunId::new(JOB, 0), stages(&a)), T + 1);
    let acts = steps_took(&mut s, &ws, T + 1, T, 0.8);
    let [Action::Step(_), Action::Info(kept)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(kept.contains("it stays"), "{kept}");
    assert!(matches!(
        &steps_took(&mut s, &ws, 2 * T + 1, 3, 0.8)[..],
        [Action::Step(_)]
    ));

    let (ws, mut s, mut alone) = first_run();
    alone.others.clear();
    let acts = trial_started(&ws, &mut s, &alone, 1.0);
    let [Action::Info(text)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(text.contains("the running plan stays"), "{text}");
    assert!(matches!(
        &steps_took(&mut s, &ws, T + 1, 6, 1.0)[..],
        [Action::Step(_)]
    ));

    // A rival on another placement is measured like any other: a move between placements
    // resumes exactly (schedules sum weight gradients in microbatch order).
    let (ws, mut s, mut elsewhere) = first_run();
    let looped = spec(2, "interleaved-1f1b", 20);
    let plan = looped.validate().unwrap();
    assert_ne!(
        plan.schedule.placement,
        elsewhere.best.plan.schedule.placement
    );
    let mut shown = elsewhere.best.shown.clone();
    shown.schedule = "interleaved-1f1b".into();
    elsewhere.others = vec![PlanOption {
        shown,
        stage_pieces: Vec::new(),
        spec: looped,
        plan,
    }];
    let acts = trial_started(&ws, &mut s, &elsewhere, 1.0);
    let Some(Action::Info(text)) = acts.first() else {
        panic!("{acts:?}")
    };
    assert!(text.contains("measuring interleaved-1f1b"), "{text}");

    let mut spec = spec(2, crate::job::AUTO_SCHEDULE, 20);
    spec.checkpoint.enable_checkpoint = false;
    let mut s = supervisor(&spec, &ws, Start::default());
    let acts = s.feed(0, Input::Tick);
    let [Action::Choose(choose)] = &acts[..] else {
        panic!("{acts:?}")
    };
    let acts = s.feed(100, choose.answer());
    let [Action::Info(text), Action::Attach(_), Action::Assign(_)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert!(!text.contains("measured"), "{text}");
    assert!(matches!(
        &steps_took(&mut s, &ws, 0, 6, 1.0)[..],
        [Action::Step(_)]
    ));
}

/// The re-check's line names the costs the search was asked with (fitted to the first `T`
/// steps), not the steps the run went on with while it searched.
#[test]
fn the_re_check_names_the_steps_its_costs_were_fitted_to() {
    let (ws, mut s, choice) = first_run();
    let placement = &choice.best.plan.schedule.placement;
    let step = |s: &mut Supervisor, k: u64| {
        let mut acts = Vec::new();
        for i in 0..ws.len() {
            let stage_times = (0..placement.stages())
                .filter(|&st| placement.worker_of(st) == i as u32)
                .map(|stage| crate::run::StageTimes {
                    stage,
                    f: 0.01,
                    b: 0.01,
                    w: 0.01,
                    edge: [0.0; 3],
                })
                .collect();
            let r = StepReport {
                wall_secs: 0.2,
                stage_times,
                ..report(&ws, i, k)
            };
            acts = s.feed(1_000 * (k + 1), Input::Report(Box::new(r)));
        }
        acts
    };
    let mut acts = Vec::new();
    for k in 0..T {
        acts = step(&mut s, k);
    }
    let [Action::Step(_), Action::Choose(again)] = &acts[..] else {
        panic!("{acts:?}")
    };
    // Two more steps while the search runs.
    for k in T..T + 2 {
        step(&mut s, k);
    }
    let acts = s.feed(1_000 * (T + 3), chosen(again, Ok(choice.clone())));
    let Some(text) = acts.iter().find_map(|a| match a {
        Action::Info(text) => Some(text),
        _ => None,
    }) else {
        panic!("{acts:?}")
    };
    assert!(text.starts_with("auto re-checked: "), "{text}");
    assert!(
        text.contains(&format!("fitted to {T} measured steps")),
        "{text}"
    );
}

/// While an auto trial measures, steps far over their prediction on a worker that became
/// 3× slower do not move the job: the drift rule waits for the trial, which re-fits the
/// costs itself. (Without the wait, the third such step stops the run for a drift move.)
#[test]
fn the_drift_rule_waits_for_an_auto_trial() {
    let (ws, mut s, choice) = first_run_of(40);
    // The V's four stages: worker 0 holds the first and the last.
    let pieces = &choice.best.stage_pieces;
    assert_eq!(pieces.len(), 4, "{pieces:?}");
    let holder = [0, 1, 1, 0];
    let mut predicted = choice.best.shown.predicted_ms / 1e3;
    for k in 0..2 * T {
        let (slow, over) = if k < T {
            ([1.0; 2], 1.0)
        } else {
            ([1.0, 3.0], 1.5)
        };
        let mut acts = Vec::new();
        for (i, w) in slow.iter().enumerate() {
            let stage_times = (0..4)
                .filter(|&j| holder[j] == i)
                .map(|j| {
                    let t = 0.01 * w * f64::from(pieces[j]);
                    crate::run::StageTimes {
                        stage: j as u32,
                        f: t,
                        b: t,
                        w: t,
                        edge: [0.01 * w; 3],
                    }
                })
                .collect();
            let r = StepReport {
                wall_secs: over * predicted,
                stage_times,
                ..report(&ws, i, k)
            };
            acts = s.feed(1_000 * (k + 1), Input::Report(Box::new(r)));
        }
        if let Some(Action::Step(done)) = acts.first() {
            predicted = done.next.step_ms / 1e3;
        }
        assert!(
            !acts.iter().any(|a| matches!(a, Action::Stop(_))),
            "step {k}: {acts:?}"
        );
    }
}
