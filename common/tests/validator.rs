//! The validator against corrupted schedules: each corruption is built by hand (or drawn at
//! random from a generated schedule) and must be reported as the matching error variant,
//! pointing at the cell that was corrupted; `error_grid` must mark that cell.

#![allow(clippy::unwrap_used)]

use pipewise_common::error::{Cell, Rule};
use pipewise_common::simulate::simulate_validated;
use pipewise_common::validate::error_grid;
use pipewise_common::{
    Costs, Error, Pass, PassKind, Placement, Request, Schedule, ScheduleKind, Times, generate,
    simulate, validate,
};
use proptest::prelude::*;

fn generated(kind: ScheduleKind, d: u32, n: u32) -> Schedule {
    let s = generate(&Request::new(kind, d, n)).unwrap();
    validate(&s).unwrap();
    s
}

/// Position of `pass` in the program of worker `w`.
fn pos(s: &Schedule, w: u32, pass: Pass) -> usize {
    s.workers[w as usize]
        .iter()
        .position(|p| *p == pass)
        .unwrap_or_else(|| panic!("{pass} not on worker {w}:\n{}", s.to_text()))
}

fn cell(w: u32, p: usize, pass: Pass) -> Cell {
    Cell {
        worker: w,
        pos: p as u32,
        pass,
    }
}

/// Swaps `a` and `b` on worker `w`; returns their old positions (of `a`, of `b`).
fn swap(s: &mut Schedule, w: u32, a: Pass, b: Pass) -> (usize, usize) {
    let (pa, pb) = (pos(s, w, a), pos(s, w, b));
    s.workers[w as usize].swap(pa, pb);
    (pa, pb)
}

/// The error grid must mark `at` on its worker's row as `>pass<` and carry the banner.
fn assert_grid_marks(s: &Schedule, err: &Error, at: Cell) {
    let grid = error_grid(s, err);
    let marked = format!(">{}<", at.pass);
    assert!(grid.contains("ERROR HERE"), "no banner:\n{grid}");
    let row = grid
        .lines()
        .find(|l| {
            l.trim_start()
                .starts_with(&format!("worker {} ", at.worker))
        })
        .unwrap_or_else(|| panic!("no row for worker {}:\n{grid}", at.worker));
    assert!(
        row.contains(&marked),
        "row of worker {} does not mark {marked}:\n{grid}",
        at.worker
    );
    // The marked cell sits in the column of its position: cells hold no spaces and only a
    // row's tail can be empty, so the k-th cell of a row is under the k-th step.
    let steps: Vec<&str> = grid
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .collect();
    let k = row
        .split_whitespace()
        .skip(2)
        .position(|c| c == marked)
        .unwrap();
    assert_eq!(
        steps[k],
        at.pos.to_string(),
        "{marked} is not under step {}:\n{grid}",
        at.pos
    );
}

#[test]
fn forward_chain_on_the_v_turn() {
    // On the V placement worker d−1 holds stages d−1 and d: F(d−1) must precede F(d).
    for kind in [ScheduleKind::VMin, ScheduleKind::VHalf, ScheduleKind::VZb] {
        for d in [2u32, 3, 4, 8] {
            let mut s = generated(kind, d, 2 * d);
            let w = d - 1;
            let (lo, hi) = (Pass::f(d - 1, 1), Pass::f(d, 1));
            let (p_lo, p_hi) = swap(&mut s, w, lo, hi);
            assert!(p_lo < p_hi);
            let err = validate(&s).unwrap_err();
            assert_eq!(
                err,
                Error::OutOfOrder {
                    at: cell(w, p_lo, hi),
                    needs: cell(w, p_hi, lo),
                    rule: Rule::ForwardChain
                },
                "{kind} d={d}"
            );
            assert_grid_marks(&s, &err, cell(w, p_lo, hi));
        }
    }
}

#[test]
fn backward_chain_on_the_v_turn() {
    // B(d) must precede B(d−1) on worker d−1.
    for d in [2u32, 4, 6] {
        let mut s = generated(ScheduleKind::VZb, d, 3 * d);
        let w = d - 1;
        let (up, down) = (Pass::b(d, 2), Pass::b(d - 1, 2));
        let (p_up, p_down) = swap(&mut s, w, up, down);
        assert!(p_up < p_down);
        let err = validate(&s).unwrap_err();
        assert_eq!(
            err,
            Error::OutOfOrder {
                at: cell(w, p_up, down),
                needs: cell(w, p_down, up),
                rule: Rule::BackwardChain
            },
            "v-zb d={d}"
        );
        assert_grid_marks(&s, &err, cell(w, p_up, down));
    }
}

#[test]
fn backward_before_forward() {
    // Fused: last worker of 1F1B runs F(d−1, m) BW(d−1, m) back to back.
    let d = 4;
    let mut s = generated(ScheduleKind::OneFOneB, d, 8);
    let w = d - 1;
    let (f, bw) = (Pass::f(w, 3), Pass::bw(w, 3));
    let (pf, pbw) = swap(&mut s, w, f, bw);
    assert_eq!(pbw, pf + 1, "1F1B's last worker alternates F and BW");
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfOrder {
            at: cell(w, pf, bw),
            needs: cell(w, pbw, f),
            rule: Rule::ForwardBeforeBackward
        }
    );
    assert_grid_marks(&s, &err, cell(w, pf, bw));

    // Split: ZB-H1 on worker 1.
    let mut s = generated(ScheduleKind::ZbH1, d, 8);
    let (f, b) = (Pass::f(1, 5), Pass::b(1, 5));
    let (pf, pb) = swap(&mut s, 1, f, b);
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfOrder {
            at: cell(1, pf, b),
            needs: cell(1, pb, f),
            rule: Rule::ForwardBeforeBackward
        }
    );
    assert_grid_marks(&s, &err, cell(1, pf, b));
}

#[test]
fn weight_before_its_input_gradient() {
    for kind in [ScheduleKind::ZbH1, ScheduleKind::ZbH2, ScheduleKind::VZb] {
        let mut s = generated(kind, 4, 8);
        // Stage 1 (worker 1) has no same-worker stage neighbour on either placement.
        let (b, wt) = (Pass::b(1, 2), Pass::w(1, 2));
        let (pb, pw) = swap(&mut s, 1, b, wt);
        assert!(pb < pw);
        let err = validate(&s).unwrap_err();
        assert_eq!(
            err,
            Error::OutOfOrder {
                at: cell(1, pb, wt),
                needs: cell(1, pw, b),
                rule: Rule::InputBeforeWeight
            },
            "{kind}"
        );
        assert_grid_marks(&s, &err, cell(1, pb, wt));
    }
}

#[test]
fn dropped_weight_is_missing() {
    let mut s = generated(ScheduleKind::VHalf, 4, 8);
    let wt = Pass::w(6, 3); // stage 6 lives on worker 1
    let p = pos(&s, 1, wt);
    s.workers[1].remove(p);
    assert_eq!(validate(&s).unwrap_err(), Error::MissingPass { pass: wt });

    let mut s = generated(ScheduleKind::GPipe, 3, 4);
    let p = pos(&s, 2, Pass::bw(2, 0));
    s.workers[2].remove(p);
    assert_eq!(
        validate(&s).unwrap_err(),
        Error::MissingPass {
            pass: Pass::bw(2, 0)
        }
    );

    // A B without its W, and a W without its B.
    let mut s = generated(ScheduleKind::ZbH1, 3, 4);
    let p = pos(&s, 0, Pass::b(0, 1));
    s.workers[0].remove(p);
    assert_eq!(
        validate(&s).unwrap_err(),
        Error::MissingPass {
            pass: Pass::b(0, 1)
        }
    );
    let mut s = generated(ScheduleKind::ZbH1, 3, 4);
    let p = pos(&s, 0, Pass::f(0, 3));
    s.workers[0].remove(p);
    assert_eq!(
        validate(&s).unwrap_err(),
        Error::MissingPass {
            pass: Pass::f(0, 3)
        }
    );
}

#[test]
fn duplicated_pass() {
    let mut s = generated(ScheduleKind::OneFOneB, 4, 8);
    let dup = Pass::f(2, 4);
    let first = pos(&s, 2, dup);
    s.workers[2].push(dup);
    let at = s.workers[2].len() - 1;
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::DuplicatePass {
            at: cell(2, at, dup),
            first: cell(2, first, dup)
        }
    );
    assert_grid_marks(&s, &err, cell(2, first, dup));
}

#[test]
fn stage_on_two_workers() {
    let mut s = generated(ScheduleKind::OneFOneB, 4, 8);
    let moved = Pass::bw(1, 5);
    let p = pos(&s, 1, moved);
    s.workers[1].remove(p);
    s.workers[2].insert(3, moved);
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::WrongWorker {
            at: cell(2, 3, moved),
            expected: 1
        }
    );
    assert_grid_marks(&s, &err, cell(2, 3, moved));

    // V: stage 2d−1 belongs to worker 0, not worker d−1.
    let mut s = generated(ScheduleKind::VMin, 3, 6);
    let moved = Pass::f(5, 0);
    let p = pos(&s, 0, moved);
    s.workers[0].remove(p);
    s.workers[2].insert(0, moved);
    assert_eq!(
        validate(&s).unwrap_err(),
        Error::WrongWorker {
            at: cell(2, 0, moved),
            expected: 0
        }
    );
}

/// Builds a schedule from text lines (`"0F0 0BW0"`, one per worker).
fn from_text(placement: Placement, n: u32, lines: &[&str]) -> Schedule {
    let mut s = Schedule::empty("hand", placement, n);
    for (w, line) in lines.iter().enumerate() {
        s.workers[w] = Pass::parse_list(line).unwrap();
    }
    s
}

#[test]
fn cross_worker_cycle_deadlocks() {
    // Worker 0 runs BW(0,0) (needs BW(1,0) from worker 1) before F(0,1); worker 1 starts
    // with F(1,1) (needs F(0,1) from worker 0). Each waits on the other forever, while
    // every same-worker order is legal.
    let placement = Placement::OnePerWorker { workers: 2 };
    let s = from_text(
        placement.clone(),
        2,
        &["0F0 0BW0 0F1 0BW1", "1F1 1F0 1BW0 1BW1"],
    );
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::Deadlock {
            stuck: vec![
                (cell(0, 1, Pass::bw(0, 0)), Pass::bw(1, 0)),
                (cell(1, 0, Pass::f(1, 1)), Pass::f(0, 1)),
            ]
        }
    );
    assert_grid_marks(&s, &err, cell(0, 1, Pass::bw(0, 0)));
    assert!(err.to_string().contains("deadlock"), "{err}");
    // The same orders with worker 1 fixed are fine: the cycle is the only problem.
    let ok = from_text(placement, 2, &["0F0 0BW0 0F1 0BW1", "1F0 1BW0 1F1 1BW1"]);
    validate(&ok).unwrap();
    // And a simulator never runs a deadlocked schedule.
    let costs = Costs::uniform(&s.placement, Times::UNIT).unwrap();
    assert!(matches!(simulate(&s, &costs), Err(Error::Deadlock { .. })));
}

#[test]
fn generated_schedule_made_to_deadlock() {
    // 1F1B d = 2: worker 0 F0 F1 BW0 BW1, worker 1 F0 BW0 F1 BW1. Putting BW(0,0) ahead of
    // F(0,1) on worker 0 is legal; also starting worker 1 with F(1,1) closes the cycle.
    let mut s = generated(ScheduleKind::OneFOneB, 2, 2);
    swap(&mut s, 0, Pass::f(0, 1), Pass::bw(0, 0));
    validate(&s).unwrap();
    let p = pos(&s, 1, Pass::f(1, 1));
    let f11 = s.workers[1].remove(p);
    s.workers[1].insert(0, f11);
    let err = validate(&s).unwrap_err();
    assert!(
        matches!(&err, Error::Deadlock { stuck } if stuck.len() == 2),
        "{err:?}"
    );
}

#[test]
fn microbatch_out_of_range() {
    let mut s = generated(ScheduleKind::Interleaved1F1B, 4, 8);
    let p = 5;
    let old = s.workers[3][p];
    let bad = Pass { mb: 8, ..old };
    s.workers[3][p] = bad;
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::MicrobatchOutOfRange {
            at: cell(3, p, bad),
            microbatches: 8
        }
    );
    assert_grid_marks(&s, &err, cell(3, p, bad));
}

#[test]
fn unknown_stage() {
    let mut s = generated(ScheduleKind::VZb, 4, 8);
    let p = 2;
    let bad = Pass {
        stage: 8,
        ..s.workers[1][p]
    };
    s.workers[1][p] = bad;
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::UnknownStage {
            at: cell(1, p, bad),
            stages: 8
        }
    );
    assert_grid_marks(&s, &err, cell(1, p, bad));
}

#[test]
fn mixed_fused_and_split_backward() {
    // A W next to a fused BW of the same (stage, mb).
    let mut s = generated(ScheduleKind::OneFOneB, 3, 6);
    let p = pos(&s, 1, Pass::bw(1, 2));
    s.workers[1].insert(p + 1, Pass::w(1, 2));
    let err = validate(&s).unwrap_err();
    assert_eq!(
        err,
        Error::MixedBackward {
            at: cell(1, p + 1, Pass::w(1, 2))
        }
    );
    assert_grid_marks(&s, &err, cell(1, p + 1, Pass::w(1, 2)));

    // A BW instead of a split W: points at the B.
    let mut s = generated(ScheduleKind::ZbH1, 3, 6);
    let pw = pos(&s, 2, Pass::w(2, 4));
    s.workers[2][pw] = Pass::bw(2, 4);
    let pb = pos(&s, 2, Pass::b(2, 4));
    assert_eq!(
        validate(&s).unwrap_err(),
        Error::MixedBackward {
            at: cell(2, pb, Pass::b(2, 4))
        }
    );
}

#[test]
fn worker_count_and_empty_step() {
    let mut s = generated(ScheduleKind::OneFOneB, 4, 4);
    s.workers.pop();
    assert_eq!(
        validate(&s).unwrap_err(),
        Error::WorkerCount {
            got: 3,
            expected: 4
        }
    );
    let s = Schedule::empty("empty", Placement::OnePerWorker { workers: 2 }, 0);
    assert!(matches!(
        validate(&s),
        Err(Error::InvalidArgument {
            field: "microbatches",
            ..
        })
    ));
    let s = Schedule::empty("none", Placement::OnePerWorker { workers: 0 }, 1);
    assert!(matches!(
        validate(&s),
        Err(Error::InvalidArgument {
            field: "workers",
            ..
        })
    ));
}

// === Random corruptions of generated schedules ===

/// A supported random shape: kind, d, n (chunks stay at the default 2).
fn any_schedule() -> impl Strategy<Value = Schedule> {
    (0..ScheduleKind::ALL.len(), 1u32..=8, 1u32..=16).prop_map(|(k, d, n)| {
        let kind = ScheduleKind::ALL[k];
        let mut n = n.max(kind.min_microbatches(d));
        if kind == ScheduleKind::Interleaved1F1B {
            n = n.div_ceil(d) * d;
        }
        generated(kind, d, n)
    })
}

/// The rule under which `later` depends directly on `earlier` (same microbatch), if any.
fn direct_rule(earlier: Pass, later: Pass) -> Option<Rule> {
    use PassKind::*;
    if earlier.mb != later.mb {
        return None;
    }
    let (s0, s1) = (earlier.stage, later.stage);
    match (earlier.kind, later.kind) {
        (F, F) if s1 == s0 + 1 => Some(Rule::ForwardChain),
        (F, B | BW) if s1 == s0 => Some(Rule::ForwardBeforeBackward),
        (B, W) if s1 == s0 => Some(Rule::InputBeforeWeight),
        (B | BW, B | BW) if s0 == s1 + 1 => Some(Rule::BackwardChain),
        _ => None,
    }
}

/// Every (worker, earlier position, later position, rule) of a direct dependency between
/// two passes of the same worker.
fn same_worker_deps(s: &Schedule) -> Vec<(u32, usize, usize, Rule)> {
    let mut out = Vec::new();
    for (w, passes) in s.workers.iter().enumerate() {
        for (i, a) in passes.iter().enumerate() {
            for (j, b) in passes.iter().enumerate().skip(i + 1) {
                if let Some(rule) = direct_rule(*a, *b) {
                    out.push((w as u32, i, j, rule));
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Dropping any one pass (a W, B, BW or F) is reported as exactly that missing pass.
    #[test]
    fn dropping_a_pass_is_missing(s in any_schedule(), pick in any::<prop::sample::Index>(), prefer_w in any::<bool>()) {
        let mut s = s;
        let all: Vec<(usize, usize)> = s.workers.iter().enumerate()
            .flat_map(|(w, ps)| (0..ps.len()).map(move |p| (w, p)))
            .collect();
        let ws: Vec<(usize, usize)> = all.iter().copied()
            .filter(|&(w, p)| s.workers[w][p].kind == PassKind::W)
            .collect();
        let pool = if prefer_w && !ws.is_empty() { &ws } else { &all };
        let (w, p) = *pick.get(pool);
        let dropped = s.workers[w].remove(p);
        prop_assert_eq!(validate(&s).unwrap_err(), Error::MissingPass { pass: dropped });
    }

    /// Swapping two passes of a worker where one depends directly on the other (for
    /// adjacent pairs: a same-stage F/B, B/W or F/BW pair, or the V turn) is reported at
    /// the earlier position with the rule that links them.
    #[test]
    fn swapping_a_dependent_pair_is_out_of_order(s in any_schedule(), pick in any::<prop::sample::Index>(), adjacent in any::<bool>()) {
        let mut s = s;
        let deps = same_worker_deps(&s);
        let near: Vec<_> = deps.iter().copied().filter(|d| d.2 == d.1 + 1).collect();
        let pool = if adjacent && !near.is_empty() { &near } else { &deps };
        prop_assert!(!pool.is_empty(), "every F has its backward on its worker");
        let (w, i, j, rule) = *pick.get(pool);
        let (earlier, later) = (s.workers[w as usize][i], s.workers[w as usize][j]);
        s.workers[w as usize].swap(i, j);
        let err = validate(&s).unwrap_err();
        prop_assert_eq!(&err, &Error::OutOfOrder {
            at: cell(w, i, later),
            needs: cell(w, j, earlier),
            rule,
        });
        let grid = error_grid(&s, &err);
        let marked = format!(">{later}<");
        prop_assert!(grid.contains(&marked) && grid.contains("ERROR HERE"), "{}", grid);
    }

    /// Swapping two adjacent passes that do not depend on each other can only make the
    /// schedule deadlock, never break a same-worker rule or membership; when it stays
    /// valid it still simulates.
    #[test]
    fn swapping_independent_neighbours(s in any_schedule(), pick in any::<prop::sample::Index>()) {
        let mut s = s;
        let pairs: Vec<(usize, usize)> = s.workers.iter().enumerate()
            .flat_map(|(w, ps)| (1..ps.len()).map(move |p| (w, p - 1)))
            .filter(|&(w, p)| direct_rule(s.workers[w][p], s.workers[w][p + 1]).is_none())
            .collect();
        prop_assume!(!pairs.is_empty());
        let (w, p) = *pick.get(&pairs);
        s.workers[w].swap(p, p + 1);
        match validate(&s) {
            Ok(_) => {
                let costs = Costs::uniform(&s.placement, Times::UNIT).unwrap();
                prop_assert!(simulate(&s, &costs).is_ok());
            }
            Err(Error::Deadlock { stuck }) => prop_assert!(!stuck.is_empty()),
            Err(other) => prop_assert!(false, "unexpected {other:?}"),
        }
    }

    /// `simulate` checks the progress rule with its own timed run: after any swap of two
    /// passes of a worker it fails with exactly the validator's error, also when the costs
    /// do not fit the placement, and otherwise simulates as validating first does.
    #[test]
    fn simulate_fails_as_the_validator_does(s in any_schedule(), worker in any::<prop::sample::Index>(), one in any::<prop::sample::Index>(), other in any::<prop::sample::Index>()) {
        let mut s = s;
        let w = worker.index(s.workers.len());
        let program = &mut s.workers[w];
        let len = program.len();
        program.swap(one.index(len), other.index(len));
        let costs = Costs::uniform(&s.placement, Times::UNIT).unwrap();
        let mut unfit = costs.clone();
        unfit.stages.push(unfit.stages[0]);
        match validate(&s) {
            Ok(index) => {
                prop_assert_eq!(simulate(&s, &costs), simulate_validated(&s, &index, &costs));
                let unfit_costs = simulate(&s, &unfit);
                let named = matches!(&unfit_costs, Err(Error::InvalidArgument { field: "costs", .. }));
                prop_assert!(named, "{:?}", unfit_costs);
            }
            Err(e) => {
                prop_assert_eq!(simulate(&s, &costs).unwrap_err(), e.clone());
                prop_assert_eq!(simulate(&s, &unfit).unwrap_err(), e);
            }
        }
    }

    /// A copy of any pass inserted anywhere on its worker is a duplicate of the original.
    #[test]
    fn inserting_a_copy_is_duplicate(s in any_schedule(), pick in any::<prop::sample::Index>(), at in any::<prop::sample::Index>()) {
        let mut s = s;
        let all: Vec<(usize, usize)> = s.workers.iter().enumerate()
            .flat_map(|(w, ps)| (0..ps.len()).map(move |p| (w, p)))
            .collect();
        let (w, p) = *pick.get(&all);
        let pass = s.workers[w][p];
        let q = at.index(s.workers[w].len() + 1);
        s.workers[w].insert(q, pass);
        // The original is now at p (q > p) or p + 1 (q ≤ p).
        let (first, second) = if q > p { (p, q) } else { (q, p + 1) };
        prop_assert_eq!(validate(&s).unwrap_err(), Error::DuplicatePass {
            at: cell(w as u32, second, pass),
            first: cell(w as u32, first, pass),
        });
    }

    /// Any pass moved to another worker is on the wrong worker.
    #[test]
    fn moving_a_pass_is_wrong_worker(s in any_schedule(), pick in any::<prop::sample::Index>(), to in any::<prop::sample::Index>(), at in any::<prop::sample::Index>()) {
        let mut s = s;
        let d = s.workers.len();
        prop_assume!(d >= 2);
        let all: Vec<(usize, usize)> = s.workers.iter().enumerate()
            .flat_map(|(w, ps)| (0..ps.len()).map(move |p| (w, p)))
            .collect();
        let (w, p) = *pick.get(&all);
        let other = (w + 1 + to.index(d - 1)) % d;
        let pass = s.workers[w].remove(p);
        let q = at.index(s.workers[other].len() + 1);
        s.workers[other].insert(q, pass);
        prop_assert_eq!(validate(&s).unwrap_err(), Error::WrongWorker {
            at: cell(other as u32, q, pass),
            expected: w as u32,
        });
    }
}
