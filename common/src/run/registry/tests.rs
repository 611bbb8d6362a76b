//! The registry on logical time: every call's answer and the exact actions it leaves.

#![allow(clippy::unwrap_used)]

use super::*;

fn worker(id: &str, address: &str) -> Worker {
    Worker {
        id: id.into(),
        address: address.into(),
        memory_bytes: 1 << 20,
        ..Worker::default()
    }
}

fn incarnation(w: &Worker, n: u64) -> Worker {
    Worker {
        incarnation: n,
        ..w.clone()
    }
}

fn pool(streaming: usize, idle: &[&Worker]) -> Action {
    Action::Pool(Pool {
        streaming,
        idle: idle.iter().map(|w| (*w).clone()).collect(),
    })
}

fn tell(input: Input) -> Action {
    Action::Tell(input)
}

fn claimed(id: &str, job: u64) -> Action {
    tell(Input::Claimed { id: id.into(), job })
}

/// A registry with workers `ids` registered at 0 (incarnations 1, 2, …) with their
/// streams open; the actions so far dropped.
fn streaming(ids: &[&str]) -> (Registry, Vec<Worker>) {
    let mut r = Registry::default();
    let mut ws = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let w = worker(id, &format!("10.0.0.{i}:1"));
        let n = r.register(0, w.clone(), 0).unwrap();
        assert!(r.open_stream(0, id));
        ws.push(incarnation(&w, n));
    }
    r.actions();
    (r, ws)
}

/// A registration is told to the run actors and makes the worker a member of the pool
/// once its stream is open; a stream opened by an unknown worker is refused.
#[test]
fn a_worker_joins_the_pool_when_its_stream_opens() {
    let mut r = Registry::default();
    let w = worker("w0", "10.0.0.1:1");
    assert_eq!(r.register(5, w.clone(), 0), Ok(1));
    let w1 = incarnation(&w, 1);
    assert_eq!(
        r.actions(),
        [
            Action::Note(Note::Registered {
                id: "w0".into(),
                address: "10.0.0.1:1".into(),
                was: None,
            }),
            tell(Input::Registered(w1.clone())),
            pool(0, &[]),
        ]
    );
    assert!(r.open_stream(6, "w0"));
    assert_eq!(
        r.actions(),
        [tell(Input::StreamOpened("w0".into())), pool(1, &[&w1])]
    );
    assert!(!r.open_stream(7, "nobody"));
    assert_eq!(r.actions(), []);
    let live = r.live(8);
    assert_eq!(
        live,
        [Member {
            worker: w1,
            streaming: true,
            running: 0,
            claimed: 0,
        }]
    );
}

/// A worker silent past the deadline (four intervals) is lost at the next tick, told once;
/// a heartbeat brings it back (registered, held and streaming as before); one silent for
/// [`Config::forget_after_ms`] is forgotten and its stream dropped.
#[test]
fn silence_loses_a_worker_and_then_forgets_it() {
    let (mut r, ws) = streaming(&["a", "b"]);
    r.claim(3, &["a".to_string()]).unwrap();
    r.actions();
    let deadline = Config::default().deadline_ms();
    assert_eq!(r.heartbeat(deadline, "b", 0, 0), (true, None));
    r.actions();
    r.tick(deadline);
    let gauges = |r: &mut Registry| {
        r.actions()
            .into_iter()
            .filter(|a| !matches!(a, Action::Gauges(_)))
            .collect::<Vec<_>>()
    };
    assert_eq!(gauges(&mut r), []);
    r.tick(deadline + 1);
    assert_eq!(
        gauges(&mut r),
        [tell(Input::Lost("a".into())), pool(1, &[&ws[1]])]
    );
    r.tick(deadline + 2);
    assert_eq!(gauges(&mut r), []);
    assert_eq!(r.heartbeat(deadline + 3, "a", 0, 0), (true, None));
    assert_eq!(
        r.actions(),
        [
            tell(Input::Registered(ws[0].clone())),
            claimed("a", 3),
            tell(Input::StreamOpened("a".into())),
            tell(Input::Heartbeat {
                id: "a".into(),
                run: 0
            }),
            pool(2, &[&ws[1]]),
        ]
    );
    // Silent for good. Ticks tell the loss long before the worker is forgotten; one that
    // was not told lost (no tick came in between) is told so as it is forgotten.
    let forget = deadline + 3 + FORGET_AFTER_MS;
    r.heartbeat(forget - 1, "b", 0, 0);
    assert_eq!(
        r.actions(),
        [
            tell(Input::Heartbeat {
                id: "b".into(),
                run: 0
            }),
            pool(1, &[&ws[1]]),
        ]
    );
    r.tick(forget);
    assert_eq!(
        gauges(&mut r),
        [
            tell(Input::Lost("a".into())),
            Action::Note(Note::Forgotten("a".into())),
            Action::CloseStream("a".into()),
        ]
    );
    assert_eq!(r.live(forget).len(), 1);
    // Its claim went with it.
    assert_eq!(r.claim(4, &["a".to_string()]), Ok(()));
}

/// An id a live worker holds (heartbeating, stream open) is refused to a process at another
/// address; the holder itself registers again (a new incarnation, its earlier stream
/// dropped), and once the holder's stream closed or it went silent the id is free.
#[test]
fn a_live_workers_id_is_refused_to_another_address() {
    let (mut r, ws) = streaming(&["w1"]);
    let other = worker("w1", "10.9.9.9:1");
    assert_eq!(
        r.register(100, other.clone(), 0),
        Err(InUse {
            address: ws[0].address.clone(),
            ago_ms: 100,
        })
    );
    assert_eq!(
        r.actions(),
        [Action::Note(Note::Refused {
            id: "w1".into(),
            address: other.address.clone(),
            holder: ws[0].address.clone(),
        })]
    );
    assert_eq!(r.register(200, worker("w1", &ws[0].address), 0), Ok(2));
    let again = incarnation(&ws[0], 2);
    assert_eq!(
        r.actions(),
        [
            Action::CloseStream("w1".into()),
            Action::Note(Note::Registered {
                id: "w1".into(),
                address: ws[0].address.clone(),
                was: Some(ws[0].address.clone()),
            }),
            tell(Input::Registered(again)),
            pool(0, &[]),
        ]
    );
    // Not streaming since it registered again: the other address may take the id.
    assert_eq!(r.register(300, other.clone(), 0), Ok(3));
    r.actions();
    assert!(r.open_stream(300, "w1"));
    r.stream_closed(400, "w1");
    assert_eq!(
        r.actions(),
        [
            tell(Input::StreamOpened("w1".into())),
            pool(1, &[&incarnation(&other, 3)]),
            tell(Input::StreamClosed("w1".into())),
            pool(0, &[]),
        ]
    );
    // A closed stream is told once.
    r.stream_closed(401, "w1");
    assert_eq!(r.actions(), []);
    // Streaming, but silent past the deadline: the id is free too.
    assert!(r.open_stream(500, "w1"));
    let late = 500 + Config::default().deadline_ms() + 1;
    assert_eq!(r.register(late, worker("w1", "10.0.0.7:1"), 0), Ok(4));
}

/// A worker is one job's at a time: a claim naming another job's worker is refused whole,
/// a job's new claim replaces its old one, and a job's end gives its workers back; the run
/// actors hear of each change and the pool shows the idle ones.
#[test]
fn a_worker_is_one_jobs_at_a_time() {
    let (mut r, ws) = streaming(&["a", "b", "c"]);
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let holders = |r: &mut Registry| {
        r.live(0)
            .iter()
            .map(|m| (m.worker.id.clone(), m.claimed))
            .collect::<Vec<_>>()
    };
    assert_eq!(r.claim(1, &ids(&["a", "b"])), Ok(()));
    assert_eq!(
        r.actions(),
        [claimed("a", 1), claimed("b", 1), pool(3, &[&ws[2]])]
    );
    assert_eq!(
        r.claim(2, &ids(&["b", "c"])),
        Err(Taken(vec![("b".into(), 1)]))
    );
    assert_eq!(r.actions(), []);
    assert_eq!(r.claim(1, &ids(&["a"])), Ok(()));
    assert_eq!(r.actions(), [claimed("b", 0), pool(3, &[&ws[1], &ws[2]])]);
    assert_eq!(r.claim(2, &ids(&["b", "c"])), Ok(()));
    assert_eq!(
        holders(&mut r),
        [("a".into(), 1), ("b".into(), 2), ("c".into(), 2)]
    );
    r.actions();
    r.release(2);
    assert_eq!(
        r.actions(),
        [claimed("b", 0), claimed("c", 0), pool(3, &[&ws[1], &ws[2]])]
    );
    assert_eq!(
        holders(&mut r),
        [("a".into(), 1), ("b".into(), 0), ("c".into(), 0)]
    );
}

/// A run this coordinator did not start is abandoned (heartbeats and reports say so); an
/// aborted one is pushed down its workers' streams; a stopping one is stopped at the next
/// step; reports are routed while the run is attached.
#[test]
fn reports_and_heartbeats_say_what_a_run_must_do() {
    let (mut r, _) = streaming(&["a", "b"]);
    assert_eq!(r.heartbeat(10, "a", 0, 0), (true, None));
    assert_eq!(r.heartbeat(10, "a", 12_345, 0), (true, Some(12_345)));
    assert_eq!(r.heartbeat(10, "nobody", 0, 0), (false, None));
    r.actions();
    let abandon = ReportAnswer {
        stop: false,
        abort: true,
        routed: false,
    };
    assert_eq!(r.report(7), abandon);
    r.attach(7);
    r.assigned("a", 7, 0, 0);
    r.assigned("b", 7, 0, 1);
    let memory = |index| {
        Action::Memory(Memory {
            run: 7,
            replica: 0,
            index,
            bytes: 0,
            limit: 1 << 20,
        })
    };
    assert_eq!(r.actions(), [memory(0), memory(1)]);
    let go_on = ReportAnswer {
        stop: false,
        abort: false,
        routed: true,
    };
    assert_eq!(r.report(7), go_on);
    r.stop(7);
    assert_eq!(
        r.report(7),
        ReportAnswer {
            stop: true,
            ..go_on
        }
    );
    r.abort(7);
    assert_eq!(
        r.actions(),
        [
            Action::Abandon {
                worker: "a".into(),
                run: 7
            },
            Action::Abandon {
                worker: "b".into(),
                run: 7
            },
        ]
    );
    assert_eq!(
        r.report(7),
        ReportAnswer {
            routed: true,
            ..abandon
        }
    );
    assert_eq!(r.heartbeat(20, "b", 7, 0), (true, Some(7)));
    r.detach(7);
    assert_eq!(r.report(7), abandon);
}

/// A worker that leaves is forgotten at once: its stream dropped, its claim gone, the run
/// actors told; one the registry does not know is only noted.
#[test]
fn a_leaving_worker_is_forgotten_at_once() {
    let (mut r, ws) = streaming(&["a", "b"]);
    r.claim(1, &["a".to_string()]).unwrap();
    r.actions();
    r.leave("a", 1);
    assert_eq!(
        r.actions(),
        [
            Action::Note(Note::Left {
                id: "a".into(),
                run: 1
            }),
            Action::CloseStream("a".into()),
            tell(Input::Left("a".into())),
            pool(1, &[&ws[1]]),
        ]
    );
    assert_eq!(r.live(1).len(), 1);
    r.leave("a", 0);
    assert_eq!(r.actions(), [Action::Note(Note::UnknownLeft("a".into()))]);
}

/// Every tick shows each worker's silence, the live, idle and busy counts, and the memory
/// of the workers of attached runs only.
#[test]
fn ticks_show_the_gauges() {
    let (mut r, _) = streaming(&["a", "b", "c"]);
    r.claim(1, &["a".to_string(), "b".to_string()]).unwrap();
    r.attach(1);
    r.assigned("a", 1, 0, 0);
    r.assigned("c", 9, 0, 0);
    r.heartbeat(1_000, "a", 1, 4096);
    r.heartbeat(1_000, "b", 1, 0);
    r.actions();
    r.tick(2_500);
    let shown = r.actions();
    assert_eq!(
        shown,
        [
            Action::Tell(Input::Lost("c".into())),
            Action::Gauges(Box::new(Gauges {
                ages: vec![("a".into(), 1.5), ("b".into(), 1.5), ("c".into(), 2.5)],
                up: 2,
                idle: 0,
                busy: 2,
                memory: vec![Memory {
                    run: 1,
                    replica: 0,
                    index: 0,
                    bytes: 4096,
                    limit: 1 << 20,
                }],
            })),
            pool(2, &[]),
        ]
    );
}
