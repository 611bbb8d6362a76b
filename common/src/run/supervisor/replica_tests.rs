//! The supervisor on logical time with data-parallel replicas: it waits for every
//! replica's workers, hands them out replica by replica, makes each step's event from
//! replica 0's reports (`shed_tests.rs` follows a loss).

#![allow(clippy::unwrap_used)]

use super::tests::{Feed, JOB, assign, done, report, spec, supervisor, workers};
use super::*;
use crate::run::worker::{StageTimes, StepReport};

/// A 1F1B job of 2 replicas × 2 workers, 6 steps.
pub(super) fn replicated() -> JobSpec {
    let mut spec = spec(2, "1f1b", 6);
    spec.parallelism.data_parallel_replicate_degree = 2;
    spec
}

/// Replica `r`'s rank `w` reports `step`.
pub(super) fn replica_report(ws: &[Worker], r: usize, w: usize, step: u64) -> Input {
    Input::Report(Box::new(StepReport {
        worker_index: w as u32,
        replica: r as u32,
        worker_id: ws[2 * r + w].id.clone(),
        ..report(ws, 2 * r + w, step)
    }))
}

/// The job waits for 2 × 2 workers and says so; the fourth one starts the run on all four,
/// replica by replica in id order.
#[test]
fn waits_for_every_replica_and_hands_them_out() {
    let spec = replicated();
    let plan = spec.validate().unwrap();
    assert_eq!(plan.schedule.num_workers(), 2);
    assert_eq!(plan.microbatches, 4);
    let ws = workers(4);
    let mut s = supervisor(&spec, &ws[..3], Start::default());
    assert_eq!(
        s.feed(0, Input::Tick),
        [
            Action::Waiting("workers: 3 of 4 ready (2 replicas × 2)".into()),
            Action::Info("waiting for workers: 3 of 4 ready (2 replicas × 2)".into()),
        ]
    );
    assert_eq!(s.feed(100, Input::Registered(ws[3].clone())), []);
    let r0 = RunId::new(JOB, 0);
    assert_eq!(
        s.feed(200, Input::StreamOpened("w3".into())),
        [
            Action::Waiting(String::new()),
            Action::Attach(r0),
            assign(r0, 0, &ws, &plan, &[]),
        ]
    );
}

/// Replica 1's step reports make no event; replica 0's complete one does, with its two
/// reports. Every worker's `done` ends the run.
#[test]
fn replica_zero_reports_make_the_step() {
    let spec = replicated();
    let ws = workers(4);
    let mut s = supervisor(&spec, &ws, Start::default());
    s.feed(0, Input::Tick);
    assert_eq!(s.feed(100, replica_report(&ws, 1, 0, 0)), []);
    assert_eq!(s.feed(100, replica_report(&ws, 1, 1, 0)), []);
    assert_eq!(s.feed(110, replica_report(&ws, 0, 0, 0)), []);
    let acts = s.feed(120, replica_report(&ws, 0, 1, 0));
    let [Action::Step(step)] = &acts[..] else {
        panic!("{acts:?}")
    };
    assert_eq!((step.step, step.reports.len()), (0, 2));
    // A report under another worker's slot is not taken.
    let stray = Input::Report(Box::new(StepReport {
        replica: 1,
        ..report(&ws, 0, 1)
    }));
    assert!(matches!(&s.feed(130, stray)[..], [Action::Warn(w)] if w.contains("not in the job")));
    for i in 0..3 {
        let r = (i / 2) as u32;
        let input = match done(&ws, i) {
            Input::Report(d) => Input::Report(Box::new(StepReport {
                worker_index: (i % 2) as u32,
                replica: r,
                ..*d
            })),
            other => other,
        };
        assert_eq!(s.feed(200, input), [], "worker {i}");
    }
    let last = Input::Report(Box::new(StepReport {
        worker_index: 1,
        replica: 1,
        done: true,
        ..report(&ws, 3, 0)
    }));
    assert_eq!(
        s.feed(210, last),
        [
            Action::Detach(RunId::new(JOB, 0)),
            Action::Finish(Err(Failure::StoppedEarly {
                through: 1,
                steps: 6
            }))
        ]
    );
}

/// The shape a loss re-plans onto: whole replicas the survivors hold and the global batch
/// splits into, else one pipeline of them all.
#[test]
fn survivors_make_whole_replicas() {
    let mut spec = spec(2, "1f1b", 6);
    spec.parallelism.data_parallel_replicate_degree = 4;
    // 8 sequences in microbatches of 1: 4, 2 or 1 replicas split them.
    assert_eq!(survivor_shape(&spec, 8), (2, 4));
    assert_eq!(survivor_shape(&spec, 7), (2, 2));
    assert_eq!(survivor_shape(&spec, 3), (2, 1));
    assert_eq!(survivor_shape(&spec, 1), (1, 1));
    assert_eq!(survivor_shape(&spec, 0), (0, 1));
    // 6 sequences split into 3 replicas, not into 4.
    spec.training.global_batch_size = 6;
    assert_eq!(survivor_shape(&spec, 8), (2, 3));
}

/// A worker of replica 1 registered less memory than the plan needs on its rank: the plan
/// moves before the run starts, as it would for replica 0's (every replica runs the same
/// stages).
#[test]
fn every_replicas_memory_is_checked_before_the_run() {
    let mut spec = replicated();
    spec.parallelism.pipeline_parallel_schedule = "gpipe".into();
    spec.training.global_batch_size = 32;
    let plan = spec.validate().unwrap();
    let need = plan.predicted_bytes(&spec).unwrap();
    let mut ws: Vec<Worker> = (0..4)
        .map(|i| Worker {
            memory_bytes: need[i % 2],
            ..workers(4)[i].clone()
        })
        .collect();
    // Replica 0's workers hold what GPipe needs: no move.
    let mut s = supervisor(&spec, &ws, Start::default());
    let acts = s.feed(0, Input::Tick);
    assert!(matches!(&acts[..], [Action::Attach(_), Action::Assign(a)] if a.plan == plan));
    // Replica 1's rank 0 holds a byte less.
    ws[2].memory_bytes = need[0] - 1;
    let mut s = supervisor(&spec, &ws, Start::default());
    let acts = s.feed(0, Input::Tick);
    assert!(
        matches!(
            &acts[..],
            [
                Action::Warn(_),
                Action::Replanned(Reason::MemoryPressure),
                Action::Attach(_),
                Action::Assign(a),
            ] if a.plan != plan && a.workers == ws
        ),
        "{acts:?}"
    );
}

/// Replica 1's step reports measure its workers in the job's cost model (its first step,
/// a warm-up, aside): its rank 1 twice as slow as replica 0's comes out so.
#[test]
fn other_replicas_measure_their_workers() {
    let ws = workers(4);
    let mut s = supervisor(&replicated(), &ws, Start::default());
    s.feed(0, Input::Tick);
    let timed = |r: usize, w: usize, step: u64, secs: f64| {
        Input::Report(Box::new(StepReport {
            stage_times: vec![StageTimes {
                stage: w as u32,
                f: secs,
                b: secs,
                w: secs,
                edge: [0.0; 3],
            }],
            ..match replica_report(&ws, r, w, step) {
                Input::Report(report) => *report,
                other => panic!("{other:?}"),
            }
        }))
    };
    for step in 0..3 {
        for (r, w, secs) in [(1, 0, 0.01), (1, 1, 0.02), (0, 0, 0.01), (0, 1, 0.01)] {
            s.feed(100 * (step + 1), timed(r, w, step, secs));
        }
    }
    let factor = |id: &str| s.costs.factor(id).unwrap();
    assert!(
        (factor("w3") / factor("w1") - 2.0).abs() < 1e-6,
        "{}",
        factor("w3")
    );
    assert!(
        (factor("w2") / factor("w0") - 1.0).abs() < 1e-6,
        "{}",
        factor("w2")
    );
}
