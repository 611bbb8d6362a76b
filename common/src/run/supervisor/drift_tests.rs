//! The supervisor on logical time with steps that run over their prediction: the drift
//! rule's recalibration and move, and the straggler rule waiting for it.

#![allow(clippy::unwrap_used)]

use super::tests::{Feed, JOB, done, first_shown, report, saved, spec, supervisor, workers};
use super::*;
use crate::run::straggler::{BOUNDED, straggle_of, straggler};
use crate::run::worker::StepReport;

/// Reports of step `k` by two workers whose passes take `slow[i]` times a mean worker's
/// (10 ms per piece and pass kind, the embedding's and the head's share timed alone), each
/// step `wall` seconds long.
fn timed(
    ws: &[Worker],
    ranges: &[std::ops::Range<usize>],
    k: u64,
    slow: [f64; 2],
    wall: f64,
) -> Vec<StepReport> {
    (0..2)
        .map(|i| {
            let t = 0.01 * slow[i] * ranges[i].len() as f64;
            StepReport {
                wall_secs: wall,
                stage_times: vec![crate::run::StageTimes {
                    stage: i as u32,
                    f: t,
                    b: t,
                    w: t,
                    edge: [0.01 * slow[i]; 3],
                }],
                ..report(ws, i, k)
            }
        })
        .collect()
}

/// `reports` busy for their passes' time (what the straggler rule reads; [`timed`] leaves
/// every worker equally busy).
fn busy(reports: Vec<StepReport>) -> Vec<StepReport> {
    let busy = |r: &StepReport| r.stage_times.iter().map(|t| t.f + t.b + t.w).sum();
    reports
        .into_iter()
        .map(|r| StepReport {
            busy_secs: busy(&r),
            ..r
        })
        .collect()
}

/// Runs the steps of a 2-worker 1F1B job of `job_steps` steps, at most `fed` of them,
/// until a stop, the workers registering `memory` bytes (0: none): step `k`'s workers are
/// `step(k).0` times slower and it runs `step(k).1` times its prediction; with
/// `busy_passes` the reports show the workers busy for their passes ([`busy`]), else
/// equally busy (the straggler rule sees nothing). The actions of every step's last
/// report, the run's pieces per stage and the supervisor.
fn run_steps(
    (job_steps, fed): (u32, u64),
    busy_passes: bool,
    memory: [u64; 2],
    step: impl Fn(u64) -> ([f64; 2], f64),
) -> (Vec<Vec<Action>>, Vec<usize>, Supervisor) {
    let spec = spec(2, "1f1b", job_steps);
    let plan = spec.validate().unwrap();
    let mut ws = workers(2);
    for (w, bytes) in ws.iter_mut().zip(memory) {
        w.memory_bytes = bytes;
    }
    let (_, ranges) = in_use_ranges(&spec, &plan, &[]).unwrap();
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    let mut predicted = first_shown(&spec, &plan, &[], &ws).step_ms / 1e3;
    let mut all = Vec::new();
    for k in 0..fed {
        let (factors, over) = step(k);
        let mut reports = timed(&ws, &ranges, k, factors, over * predicted);
        if busy_passes {
            reports = busy(reports);
        }
        let mut acts = Vec::new();
        for r in reports {
            acts = s.feed(100 * k, Input::Report(Box::new(r)));
        }
        if let Some(Action::Step(done)) = acts.first() {
            predicted = done.next.step_ms / 1e3;
        }
        let stopped = acts.iter().any(|a| matches!(a, Action::Stop(_)));
        all.push(acts);
        if stopped {
            break;
        }
    }
    (all, ranges.iter().map(|r| r.len()).collect(), s)
}

/// Runs steps of a 2-worker 1F1B job of 8 steps, worker `i` `slow[i]` times slower from
/// step 3 on and every step `over` times its prediction from there ([`run_steps`], every
/// worker equally busy).
fn drifting(slow: [f64; 2], over: f64) -> (Vec<Vec<Action>>, Vec<usize>, Supervisor) {
    run_steps((8, 6), false, [0, 0], |k| {
        if k < 3 { ([1.0; 2], 1.0) } else { (slow, over) }
    })
}

/// Steps that run 10 % or more over their prediction for three steps in a row, on a run
/// whose worker 1 became 3× slower: the costs are recalibrated from those steps, every
/// worker stops after the third, and the next run moves layers off worker 1, counted as a
/// calibration re-plan.
#[test]
fn a_drift_moves_layers_for_the_recalibrated_costs() {
    let (steps, before, mut s) = drifting([1.0, 3.0], 1.5);
    let r0 = RunId::new(JOB, 0);
    assert_eq!(steps.len(), 6, "{steps:?}");
    for acts in &steps[..5] {
        assert!(matches!(&acts[..], [Action::Step(_)]), "{acts:?}");
    }
    assert!(
        matches!(&steps[5][..], [Action::Step(_), Action::Stop(r)] if *r == r0),
        "{:?}",
        steps[5]
    );
    let ws = workers(2);
    assert_eq!(s.feed(700, done(&ws, 0)), []);
    assert_eq!(
        s.feed(700, done(&ws, 1)),
        [Action::Detach(r0), Action::ReadCheckpoints]
    );
    let acts = s.feed(800, saved(&[(5, 2), (6, 2)]));
    let why = "steps 4 (50% over), 5 (50% over), 6 (50% over) took longer than planned";
    assert_moved_off_worker_1(&acts, 6, why, &before);
}

/// `acts`, those of a drift move's checkpoints read, resume the job after step `after` on a
/// split with fewer pieces on worker 1 than `before`, as a calibration re-plan whose reason
/// starts with `why`.
fn assert_moved_off_worker_1(acts: &[Action], after: u64, why: &str, before: &[usize]) {
    let (cleared, reason, counted, pieces) = replanned(acts);
    assert_eq!(counted, Reason::Calibration, "{reason}");
    assert_eq!(cleared, after);
    assert!(reason.starts_with(why), "{reason}");
    assert!(pieces[1] < before[1] as u32, "{before:?} → {pieces:?}");
}

/// A move's re-plan, the actions of its checkpoints read: the step cleared after, the
/// reason, how it is counted and the new pieces per stage.
fn replanned(acts: &[Action]) -> (u64, String, Reason, Vec<u32>) {
    let [
        Action::ClearAfter(cleared),
        Action::Warn(reason),
        Action::Replanned(why),
        Action::Attach(_),
        Action::Assign(a),
    ] = acts
    else {
        panic!("{acts:?}");
    };
    (*cleared, reason.clone(), *why, a.stage_pieces.clone())
}

/// Every one of the six steps of [`drifting`] gave a step event and nothing else.
fn no_move(slow: [f64; 2], over: f64) {
    let (steps, _, _) = drifting(slow, over);
    assert_eq!(steps.len(), 6);
    for acts in &steps {
        assert!(matches!(&acts[..], [Action::Step(_)]), "{acts:?}");
    }
}

/// Both workers slowed alike: the steps drift, but no split is predicted faster, so the
/// run goes on (and its next predictions stand on the recalibrated costs).
#[test]
fn a_drift_without_a_faster_split_does_not_move() {
    no_move([3.0, 3.0], 1.5);
}

/// Steps 9 % over their prediction are on time: no re-plan however slow worker 1 is.
#[test]
fn steps_under_ten_percent_over_do_not_drift() {
    no_move([1.0, 3.0], 1.09);
}

/// Worker 1 slow per unit of work on a step that ran on time (a load spike on it), then
/// 3× slower from the next step on, every step from there 50 % over its prediction: the
/// straggler rule's three steps are complete a step before the drift rule's, but it waits
/// for the drift rule, which moves layers off worker 1 by the recalibrated costs.
#[test]
fn the_straggler_rule_waits_for_a_drift_being_counted() {
    let (steps, before, mut s) = run_steps((10, 8), true, [0, 0], |k| match k {
        0..3 => ([1.0, 1.0], 1.0),
        3 => ([1.0, 3.0], 1.0),
        _ => ([1.0, 3.0], 1.5),
    });
    let stopped_at = steps
        .iter()
        .position(|acts| acts.iter().any(|a| matches!(a, Action::Stop(_))));
    let spec = spec(2, "1f1b", 10);
    let plan = spec.validate().unwrap();
    let ws = workers(2);
    let (_, ranges) = in_use_ranges(&spec, &plan, &[]).unwrap();
    // The straggler rule alone would have stopped the run after step 5 (steps 3–5).
    let watch = straggle_of(&spec, &plan, &[]).unwrap();
    let flops = spec
        .model
        .piece_costs(spec.parallelism.pipeline_parallel_microbatch_size);
    let mut history = Vec::new();
    let straggler_at = (1..8).find(|&k| {
        let factors = if k < 3 { [1.0, 1.0] } else { [1.0, 3.0] };
        let reports = busy(timed(&ws, &ranges, k, factors, 1.0));
        straggler(
            &watch,
            &flops,
            &reports,
            &mut history,
            (k + 1, 10),
            &ws,
            |_| true,
        )
        .is_some()
    });
    assert_eq!(straggler_at, Some(5));
    assert_eq!(stopped_at, Some(6));
    s.feed(900, done(&ws, 0));
    s.feed(900, done(&ws, 1));
    let acts = s.feed(1000, saved(&[(6, 2), (7, 2)]));
    let why = "steps 5 (50% over), 6 (50% over), 7 (50% over) took longer than planned";
    assert_moved_off_worker_1(&acts, 7, why, &before);
}

/// Worker 0 registered just the memory the run's split needs there: the moves both rules
/// would make (layers off the slowed worker 1, onto worker 0) are predicted not to fit it,
/// so neither is made and the run goes on.
#[test]
fn no_move_piles_layers_onto_a_worker_without_the_memory() {
    let spec = spec(2, "1f1b", 10);
    let plan = spec.validate().unwrap();
    let (in_use, ranges) = in_use_ranges(&spec, &plan, &[]).unwrap();
    let need = plan.predicted_bytes_over(&in_use, &ranges).unwrap();
    let step = |k| {
        if k < 3 {
            ([1.0; 2], 1.0)
        } else {
            ([1.0, 3.0], 1.5)
        }
    };
    let stopped = |steps: &[Vec<Action>]| {
        steps
            .iter()
            .any(|acts| acts.iter().any(|a| matches!(a, Action::Stop(_))))
    };
    // Without memory registered the same steps move.
    let (moved, _, _) = run_steps((10, 8), true, [0, 0], step);
    assert!(stopped(&moved), "{moved:?}");
    let (steps, _, _) = run_steps((10, 8), true, [need[0], 0], step);
    assert_eq!(steps.len(), 8);
    for acts in &steps {
        assert!(matches!(&acts[..], [Action::Step(_)]), "{acts:?}");
    }
}

/// Worker 0 registered the memory of one block more than the run's split gives it, and
/// worker 1 runs 10× slower from step 4 on: the split balanced for speed would move
/// several blocks and not fit worker 0, so the move goes as far as it does (one block) and
/// its reason says so, for the drift rule (steps over their prediction) and the straggler
/// rule (steps on time, worker 1 busy for its slowed passes) alike.
#[test]
fn a_move_goes_as_far_as_the_memory_allows() {
    let spec = spec(2, "1f1b", 10);
    let plan = spec.validate().unwrap();
    let (_, ranges) = in_use_ranges(&spec, &plan, &[]).unwrap();
    let one_more = [ranges[0].len() as u32 + 1, ranges[1].len() as u32 - 1];
    let (in_use, ranges) = in_use_ranges(&spec, &plan, &one_more).unwrap();
    let need = plan.predicted_bytes_over(&in_use, &ranges).unwrap();
    let ws = workers(2);
    for (over, why) in [(1.5, Reason::Calibration), (1.0, Reason::Straggler)] {
        let step = |k| {
            if k < 3 {
                ([1.0; 2], 1.0)
            } else {
                ([1.0, 10.0], over)
            }
        };
        // Without the bound the same steps move further.
        let (reason, unbounded, counts) = moved_to(run_steps((10, 8), true, [0, 0], step), &ws);
        assert_eq!(unbounded, why, "{reason}");
        assert!(counts[0] > one_more[0], "{counts:?}: {reason}");
        assert!(!reason.contains(BOUNDED), "{reason}");
        let (reason, bounded, counts) = moved_to(run_steps((10, 8), true, [need[0], 0], step), &ws);
        assert_eq!((bounded, counts), (why, one_more.to_vec()), "{reason}");
        assert!(reason.contains(BOUNDED), "{reason}");
    }
}

/// The re-plan a stopped run of [`run_steps`] makes once its workers are done and its
/// checkpoints read: the reason, how it is counted and the new pieces per stage.
fn moved_to(
    (steps, _, mut s): (Vec<Vec<Action>>, Vec<usize>, Supervisor),
    ws: &[Worker],
) -> (String, Reason, Vec<u32>) {
    let k = steps.len() as u64;
    let last = steps.last().unwrap();
    assert!(
        last.iter().any(|a| matches!(a, Action::Stop(_))),
        "no stop in {k} steps; the last: {last:?}"
    );
    s.feed(100 * k, done(ws, 0));
    s.feed(100 * k, done(ws, 1));
    let (_, reason, why, pieces) = replanned(&s.feed(100 * k + 100, saved(&[(k - 1, 2), (k, 2)])));
    (reason, why, pieces)
}

/// Every piece's passes take the same time here ([`timed`]), while by FLOPs the embedding
/// is nearly free: worker 1, 3× slower per pass from step 3 with every step on time, is a
/// straggler, and its layers move by the measured costs — to the split that balances
/// equal pieces at speeds 1 and 3, not the one FLOPs would give.
#[test]
fn a_straggler_move_balances_the_measured_costs() {
    let (steps, before, s) = run_steps((10, 8), true, [0, 0], |k| {
        if k < 3 {
            ([1.0; 2], 1.0)
        } else {
            ([1.0, 3.0], 1.0)
        }
    });
    let ws = workers(2);
    let (reason, why, counts) = moved_to((steps, before.clone(), s), &ws);
    assert_eq!(why, Reason::Straggler, "{reason}");
    let pieces = before.iter().sum::<usize>() as u32;
    let best = (1..pieces)
        .min_by_key(|&c| c.max(3 * (pieces - c)))
        .unwrap();
    assert_eq!(counts, [best, pieces - best], "{reason}");
    let spec = spec(2, "1f1b", 10);
    let mbs = spec.parallelism.pipeline_parallel_microbatch_size;
    let start: Vec<u32> = before.iter().map(|&c| c as u32).collect();
    let (by_flops, _) = crate::partition::split_for_speeds_within(
        &spec.model.piece_costs(mbs),
        &[0, 1],
        &[1.0, 3.0],
        &start,
        |_| true,
    )
    .unwrap();
    assert_ne!(counts, by_flops, "FLOPs give the same move here");
}
