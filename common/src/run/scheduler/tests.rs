//! The scheduler on logical time: the exact actions each input leaves.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::run::worker::Worker;

/// A `d`-worker job of `steps` steps, planned.
fn planned(job: u64, d: u32, steps: u32, start: Start) -> Input {
    let mut spec = crate::job::example(d, "1f1b");
    spec.training.steps = steps;
    spec.job.name = format!("job-{job}");
    let plan = spec.validate().unwrap();
    Input::Planned(Box::new(Planned {
        job,
        spec,
        plan,
        start,
    }))
}

/// `streaming` workers with their streams open, the first `idle` of them no job's; each
/// profiled at 10 GFLOP/s, so a job's run time is predicted.
fn pool(streaming: usize, idle: usize) -> Input {
    let idle = (0..idle)
        .map(|i| Worker {
            id: format!("w{i}"),
            flops_per_second: 10_000_000_000,
            ..Worker::default()
        })
        .collect();
    Input::Workers(Pool { streaming, idle })
}

/// The jobs an action list starts, in order.
fn started(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Start(s) => Some(s.job),
            _ => None,
        })
        .collect()
}

fn progress(job: u64, step: u64, predicted_ms: f64, checkpoint: bool) -> Input {
    Input::Progress(Progress {
        job,
        step,
        step_ms: 1_000.0,
        predicted_ms,
        checkpoint,
    })
}

/// A job starts with its spec, plan and start as planned, when its workers are idle; one
/// that needs more than are idle waits, saying so once (until what it waits for changes),
/// and starts when the job before it ended and gave its workers back.
#[test]
fn jobs_start_in_queue_order_on_idle_workers() {
    let mut s = Scheduler::default();
    assert_eq!(s.handle(0, pool(4, 4)), []);
    let first = planned(1, 2, 10, Start::default());
    let Input::Planned(expected) = first.clone() else {
        unreachable!()
    };
    let acts = s.handle(1, first);
    let Planned {
        job,
        spec,
        plan,
        start,
    } = *expected;
    assert_eq!(
        acts,
        [Action::Start(Box::new(Starting {
            job,
            spec,
            plan,
            start
        }))]
    );
    // Job 1 claims 2 of the 4: job 2 needs all 4 and waits.
    let acts = s.handle(2, planned(2, 4, 5, Start::default()));
    let [Action::Note(2, note)] = acts.as_slice() else {
        panic!("{acts:?}")
    };
    assert!(
        note.starts_with("4 idle workers (predicted free "),
        "{note}"
    );
    // Job 1's claim goes through: the pool shows its workers taken, then its run holds
    // them. Job 2 still waits.
    assert!(started(&s.handle(3, pool(4, 2))).is_empty());
    let acts = s.handle(4, Input::Holding(1));
    assert!(started(&acts).is_empty(), "{acts:?}");
    // Job 1 ends: job 2, the head with nothing running, starts and waits for its workers.
    assert_eq!(started(&s.handle(5, Input::Finished(1))), [2]);
    // Nothing runs twice.
    assert_eq!(s.handle(6, pool(4, 4)), []);
}

/// The workers a started job will claim are not free to the jobs behind it until its run
/// holds them (the pool shows them idle until then).
#[test]
fn a_started_jobs_workers_are_reserved_until_it_holds_them() {
    let mut s = Scheduler::default();
    s.handle(0, pool(4, 4));
    assert_eq!(
        started(&s.handle(1, planned(1, 2, 10, Start::default()))),
        [1]
    );
    assert_eq!(
        started(&s.handle(2, planned(2, 2, 10, Start::default()))),
        [2]
    );
    let acts = s.handle(3, planned(3, 2, 10, Start::default()));
    assert!(started(&acts).is_empty(), "{acts:?}");
    s.handle(4, pool(4, 0));
    s.handle(5, Input::Holding(1));
    let acts = s.handle(6, Input::Holding(2));
    assert!(started(&acts).is_empty(), "{acts:?}");
    s.handle(7, Input::Finished(1));
    assert_eq!(started(&s.handle(8, pool(4, 2))), [3]);
}

/// With nothing running, the head of the queue starts even before the cluster has its
/// workers (its run waits for them); the jobs behind it that need more workers than stream
/// wait for workers to join.
#[test]
fn the_head_starts_and_waits_for_its_workers_inside() {
    let mut s = Scheduler::default();
    assert_eq!(
        started(&s.handle(0, planned(1, 2, 10, Start::default()))),
        [1]
    );
    assert_eq!(
        s.handle(1, planned(2, 2, 10, Start::default())),
        [Action::Note(
            2,
            "workers to join: 2 needed, 0 in the cluster".into()
        )]
    );
}

/// Job 1 runs on 4 of 8 workers; job 2 needs all 8 and waits for job 1's. A 2-worker job
/// behind it starts while job 1 is predicted to run far longer than it, and waits when job
/// 1 is about to end (it would delay job 2); a job whose run waits for workers (after a
/// loss) has no end to predict, so nothing overtakes then.
#[test]
fn a_job_overtakes_the_waiting_head_only_when_it_cannot_delay_it() {
    let mut s = Scheduler::default();
    s.handle(0, pool(8, 8));
    assert_eq!(
        started(&s.handle(1, planned(1, 4, 100, Start::default()))),
        [1]
    );
    s.handle(2, Input::Holding(1));
    s.handle(3, pool(8, 4));
    // About a second left of job 1: job 3 (10 steps) would hold job 2's workers past it.
    s.handle(4, progress(1, 99, 1_000.0, false));
    let acts = s.handle(5, planned(2, 8, 10, Start::default()));
    assert!(started(&acts).is_empty(), "{acts:?}");
    let acts = s.handle(6, planned(3, 2, 10, Start::default()));
    let [Action::Note(3, note)] = acts.as_slice() else {
        panic!("{acts:?}")
    };
    assert!(note.starts_with("job 2 to start: this job"), "{note}");
    // Job 1 stalls (waits for workers): no end to predict, nothing overtakes.
    let acts = s.handle(7, Input::Stalled(1, true));
    assert!(started(&acts).is_empty(), "{acts:?}");
    // A step of job 1 predicts it to run for years: job 3 ends long before.
    let acts = s.handle(8, progress(1, 2, 1e12, false));
    assert_eq!(started(&acts), [3], "{acts:?}");
}

/// Jobs resumed after a restart start in id order: one whose plan is ready waits for an
/// earlier one still being planned, and resumed jobs queue before the jobs submitted since.
#[test]
fn resumed_jobs_start_in_id_order() {
    let mut s = Scheduler::default();
    s.handle(0, pool(8, 8));
    s.handle(0, Input::Replanning(1));
    s.handle(0, Input::Replanning(2));
    let resumed = |job| {
        let Input::Planned(p) = planned(
            job,
            2,
            10,
            Start {
                step: 4,
                restarts: 1,
                through: 5,
            },
        ) else {
            unreachable!()
        };
        Input::Resumed(job, Some(p))
    };
    assert_eq!(s.handle(1, planned(3, 2, 10, Start::default())), []);
    assert_eq!(s.handle(2, resumed(2)), []);
    let acts = s.handle(3, resumed(1));
    assert_eq!(started(&acts), [1, 2, 3]);
    let Action::Start(first) = &acts[0] else {
        unreachable!()
    };
    assert_eq!(first.start.restarts, 1);
    // A resumed job that got no plan holds nothing up.
    let mut s = Scheduler::default();
    s.handle(0, pool(8, 8));
    s.handle(0, Input::Replanning(1));
    assert_eq!(s.handle(1, planned(2, 2, 10, Start::default())), []);
    assert_eq!(started(&s.handle(2, Input::Resumed(1, None))), [2]);
}

/// A step's progress is stored at once when the checkpoint moved, and otherwise at most
/// every [`PROGRESS_SAVE_MS`].
#[test]
fn progress_is_stored_at_most_every_second_unless_a_checkpoint_moved() {
    let mut s = Scheduler::default();
    s.handle(0, planned(1, 2, 100, Start::default()));
    assert_eq!(s.handle(10, progress(1, 1, 5.0, false)), [Action::Save(1)]);
    assert_eq!(s.handle(500, progress(1, 2, 5.0, false)), []);
    assert_eq!(s.handle(600, progress(1, 3, 5.0, true)), [Action::Save(1)]);
    assert_eq!(s.handle(1_599, progress(1, 4, 5.0, false)), []);
    assert_eq!(
        s.handle(1_600, progress(1, 5, 5.0, false)),
        [Action::Save(1)]
    );
}

/// A cancelled queued job leaves the queue; a running one's run is asked to stop.
#[test]
fn a_cancel_drops_a_queued_job_and_stops_a_running_one() {
    let mut s = Scheduler::default();
    s.handle(0, planned(1, 2, 10, Start::default()));
    s.handle(0, planned(2, 2, 10, Start::default()));
    assert_eq!(s.handle(1, Input::Cancel(2)), [Action::Dropped(2)]);
    assert_eq!(s.handle(2, Input::Cancel(1)), [Action::Stop(1)]);
    // Job 2 is gone: job 1's end starts nothing.
    assert_eq!(s.handle(3, Input::Finished(1)), []);
}
