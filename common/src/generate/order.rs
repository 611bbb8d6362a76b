//! Weight gradients summed in microbatch order, whatever the schedule.
//!
//! A parameter's gradient is the sum of its microbatches' contributions, added as each `W`
//! (or `BW`) pass runs. Floating-point addition is not associative, so two schedules that
//! run a stage's `W` passes in different microbatch orders give gradients a few ulps apart,
//! and AdamW turns those into visible differences where a gradient is pure rounding noise
//! (the key bias of attention, whose exact gradient is zero): a schedule that deferred
//! `W0` to the end of the step (`W1 … W7 W0`) left parameters 6e-5 off the single-device
//! trainer's after 24 steps, where the schedules that keep the order match it bit for bit.
//!
//! Every `W` of a stage costs the same and frees the same memory, so which microbatch a `W`
//! slot serves changes neither the timeline nor the peak: [`in_microbatch_order`] gives each
//! slot the lowest microbatch whose `B` has run, which is microbatch order wherever a
//! stage's `B` passes are (as in every generator here).

use std::collections::{BTreeSet, HashMap};

use crate::pass::{Pass, PassKind};
use crate::schedule::Schedule;

/// Renumbers the `W` passes of every stage so that each serves the lowest microbatch whose
/// `B` ran before it on its worker and whose `W` has not: a valid schedule stays valid
/// (the microbatch a slot served had its `B` done, so some such microbatch exists) with the
/// same pass kinds and stages in the same places.
pub fn in_microbatch_order(schedule: Schedule) -> Schedule {
    serve_w_slots(schedule, BTreeSet::pop_first)
}

/// Gives every `W` slot the microbatch `pick` takes from those of its stage whose `B` ran
/// before it on its worker and whose `W` has not.
fn serve_w_slots(mut schedule: Schedule, pick: fn(&mut BTreeSet<u32>) -> Option<u32>) -> Schedule {
    for program in &mut schedule.workers {
        let mut ready: HashMap<u32, BTreeSet<u32>> = HashMap::new();
        for pass in program.iter_mut() {
            match pass.kind {
                PassKind::B => {
                    ready.entry(pass.stage).or_default().insert(pass.mb);
                }
                PassKind::W => {
                    if let Some(mb) = ready.get_mut(&pass.stage).and_then(pick) {
                        *pass = Pass::w(pass.stage, mb);
                    }
                }
                PassKind::F | PassKind::BW => {}
            }
        }
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{Bounds, Request, ScheduleKind, adaptive_v, adaptive_zb, generate_with};
    use crate::placement::Placement;
    use crate::simulate::simulate;
    use crate::validate::validate;

    /// Whether every stage adds its microbatches' weight gradients (`W` or `BW` passes) in
    /// microbatch order.
    fn accumulates_in_microbatch_order(schedule: &Schedule) -> bool {
        schedule.workers.iter().all(|program| {
            let mut last: HashMap<u32, u32> = HashMap::new();
            program
                .iter()
                .filter(|p| matches!(p.kind, PassKind::W | PassKind::BW))
                .all(|p| {
                    last.insert(p.stage, p.mb)
                        .is_none_or(|before| before < p.mb)
                })
        })
    }

    /// One worker, one stage: `B0 B1 B2 W1 W2 W0` becomes `W0 W1 W2` in the same slots.
    #[test]
    fn deferred_w_slots_take_the_lowest_ready_microbatch() {
        let mut s = Schedule::empty("t", Placement::OnePerWorker { workers: 1 }, 3);
        for mb in 0..3 {
            s.push(Pass::f(0, mb));
        }
        for mb in 0..3 {
            s.push(Pass::b(0, mb));
        }
        for mb in [1, 2, 0] {
            s.push(Pass::w(0, mb));
        }
        assert!(!accumulates_in_microbatch_order(&s));
        let fixed = in_microbatch_order(s.clone());
        let ws: Vec<u32> = fixed.workers[0]
            .iter()
            .filter(|p| p.kind == PassKind::W)
            .map(|p| p.mb)
            .collect();
        assert_eq!(ws, [0, 1, 2]);
        assert!(accumulates_in_microbatch_order(&fixed));
        validate(&fixed).expect("still valid");
    }

    /// A `W` slot never takes a microbatch whose `B` has not run: with `B1` before `B0`,
    /// the slot between them serves microbatch 1.
    #[test]
    fn a_slot_serves_only_a_microbatch_whose_b_ran() {
        let mut s = Schedule::empty("t", Placement::OnePerWorker { workers: 1 }, 2);
        for p in Pass::parse_list("0F0 0F1 0B1 0W1 0B0 0W0").expect("valid passes") {
            s.push(p);
        }
        assert_eq!(in_microbatch_order(s.clone()), s);
    }

    /// `s` with every `W` slot serving the highest ready microbatch instead.
    fn highest_first(s: &Schedule) -> Schedule {
        let s = serve_w_slots(s.clone(), BTreeSet::pop_last);
        validate(&s).expect("still valid");
        s
    }

    /// Every generator's schedules add gradients in microbatch order, on unit and uneven
    /// times, and the renumbering changes neither a makespan nor a peak.
    #[test]
    fn every_generated_schedule_accumulates_in_microbatch_order() {
        let uneven = crate::cost::Times {
            f: 1.0,
            b: 1.3,
            w: 0.6,
            comm: 0.1,
        };
        for kind in ScheduleKind::ALL {
            for (d, n) in [(2, 8), (3, 9), (4, 8), (4, 12)] {
                for times in [crate::cost::Times::UNIT, uneven] {
                    let mut req = Request::new(kind, d, n);
                    req.times = times;
                    let costs_for = |p: &Placement| crate::cost::Costs::uniform(p, req.times);
                    let Ok(s) = generate_with(&req, &costs_for) else {
                        continue;
                    };
                    assert!(
                        accumulates_in_microbatch_order(&s),
                        "{kind} d={d} n={n} {times:?}:\n{}",
                        s.to_text()
                    );
                    let costs = costs_for(&s.placement).expect("costs");
                    let (a, b) = (
                        simulate(&s, &costs).expect("simulates"),
                        simulate(&highest_first(&s), &costs).expect("simulates"),
                    );
                    assert_eq!(a.makespan, b.makespan, "{kind} d={d} n={n}");
                    assert_eq!(a.peak_memory, b.peak_memory, "{kind} d={d} n={n}");
                }
            }
        }
    }

    /// Uneven stage costs, as fitted to a real model (the first and last stages carry the
    /// embedding and the head): `seed` varies them.
    fn uneven(placement: &Placement, seed: u64) -> crate::cost::Costs {
        let stages = placement.stages();
        let mut x = seed;
        let mut next = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            0.5 + (x >> 40) as f64 / f64::from(1u32 << 24)
        };
        let costs = (0..stages)
            .map(|s| {
                let edge = if s == 0 || s == stages - 1 { 1.5 } else { 1.0 };
                crate::cost::StageCost {
                    f: edge * next(),
                    b: edge * next() * 1.5,
                    w: edge * next(),
                    mem: 1.0,
                }
            })
            .collect();
        crate::cost::Costs::per_stage(placement, costs, 0.05).expect("costs")
    }

    /// The adaptive searches, as the auto-planner calls them (under its own limits, on
    /// uneven stage costs), give schedules in microbatch order too.
    #[test]
    fn the_adaptive_searches_accumulate_in_microbatch_order() {
        for (d, n) in [(2, 8), (3, 6), (4, 8)] {
            for seed in 0..6 {
                for limit in [f64::from(d) / 2.0, f64::from(d)] {
                    let v = uneven(&Placement::V { workers: d }, seed);
                    let zb = uneven(&Placement::OnePerWorker { workers: d }, seed);
                    for planned in [
                        adaptive_v(d, n, &v, Bounds::limit(limit)),
                        adaptive_zb(d, n, &zb, Bounds::limit(limit)),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        assert!(
                            accumulates_in_microbatch_order(&planned.schedule),
                            "d={d} n={n} seed {seed} limit {limit}:\n{}",
                            planned.schedule.to_text()
                        );
                    }
                }
            }
        }
    }
}
