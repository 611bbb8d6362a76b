//! Local search after planning: moves that can only shorten the simulated makespan.
//!
//! Each round simulates the schedule, walks its critical path back from the pass that ends
//! last, and tries to take passes off the stretches where the path runs along one worker:
//! a W (which nothing on the path needs) moves into the latest idle gap before the stretch
//! or to the end of the worker's program; an F or B moves into the latest gap before the
//! stretch where its inputs are already there. The same moves are then tried along the path
//! that ends with the last pass of the worker with the largest span bubble (the paper's
//! metric: idle time within a worker's own span), to end that worker sooner. A move is kept
//! only if the schedule still validates, every worker stays within the memory limit and the
//! triple (makespan, span bubble, sum of the workers' finish times) strictly decreases in
//! that order, so the search terminates, never lengthens the makespan and raises the span
//! bubble only when it shortens the makespan. The work is bounded by a budget counted in
//! simulated passes (the core has no clock).

use crate::cost::Costs;
use crate::error::Result;
use crate::pass::{Pass, PassKind};
use crate::schedule::Schedule;
use crate::simulate::{Simulation, TimedPass, simulate};
use crate::validate::{PassIndex, validate};

const EPS: f64 = 1e-9;
/// Candidate moves tried per round.
const MOVES_PER_ROUND: usize = 24;

/// A budget that lets the local search run about `rounds` full rounds on `schedule`.
pub fn budget_for(schedule: &Schedule, rounds: u64) -> u64 {
    schedule.num_passes() as u64 * rounds * MOVES_PER_ROUND as u64
}

/// What the search lowers, in order: the makespan, the paper's span bubble (the largest
/// share of idle time within a worker's own span), and the sum of the workers' finish times.
fn key(sim: &Simulation) -> (f64, f64, f64) {
    let ends: f64 = sim
        .timeline
        .iter()
        .filter_map(|t| t.last())
        .map(|p| p.end)
        .sum();
    (sim.makespan, sim.bubble_span, ends)
}

fn improves(new: (f64, f64, f64), old: (f64, f64, f64)) -> bool {
    if new.0 + EPS < old.0 {
        return true;
    }
    if new.0 > old.0 + EPS {
        return false;
    }
    new.1 + EPS < old.1 || (new.1 <= old.1 + EPS && new.2 + EPS < old.2)
}

/// Runs the local search on `schedule` within `limit` activation memory per worker, spending
/// at most `budget` simulated passes; returns a schedule at least as good as the input.
pub fn improve(schedule: Schedule, costs: &Costs, limit: f64, budget: u64) -> Result<Schedule> {
    let per_trial = schedule.num_passes().max(1) as u64;
    let mut spent = 0u64;
    let mut current = schedule;
    let mut sim = simulate(&current, costs)?;
    loop {
        if spent + per_trial > budget {
            break;
        }
        crate::cancel::check()?;
        let index = validate(&current)?;
        // Moves that may shorten the makespan, then moves that may end the worker with the
        // largest span bubble sooner.
        let last = last_pass(&sim.timeline, None);
        let mut moves = candidate_moves(&current, &index, &sim, costs, last);
        moves.truncate(MOVES_PER_ROUND);
        let worst = sim.worst_span_worker();
        if worst.is_some() && last_pass(&sim.timeline, worst) != last {
            let more = candidate_moves(
                &current,
                &index,
                &sim,
                costs,
                last_pass(&sim.timeline, worst),
            );
            moves.extend(more.into_iter().take(MOVES_PER_ROUND));
        }
        let mut accepted = false;
        for (w, from, to) in moves {
            if spent + per_trial > budget {
                break;
            }
            spent += per_trial;
            let mut trial = current.clone();
            let line = &mut trial.workers[w];
            let pass = line.remove(from);
            let to = to.min(line.len());
            line.insert(to, pass);
            let Ok(trial_sim) = simulate(&trial, costs) else {
                continue;
            };
            if trial_sim.max_peak_memory() > limit + EPS {
                continue;
            }
            if improves(key(&trial_sim), key(&sim)) {
                current = trial;
                sim = trial_sim;
                accepted = true;
                break;
            }
        }
        if !accepted {
            break;
        }
    }
    Ok(current)
}

/// The pass that ends last (on `worker` only, when given): (worker, position).
fn last_pass(lines: &[Vec<TimedPass>], worker: Option<usize>) -> Option<(usize, usize)> {
    lines
        .iter()
        .enumerate()
        .filter(|(w, _)| worker.is_none_or(|only| only == *w))
        .filter_map(|(w, l)| l.last().map(|p| (w, l.len() - 1, p.end)))
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .map(|(w, i, _)| (w, i))
}

/// Moves `(worker, from, to)` (positions in the worker's program; `to` is the position the
/// pass takes after removal) suggested by the critical path that ends with the pass at
/// `end` (worker, position), most promising first.
fn candidate_moves(
    schedule: &Schedule,
    index: &PassIndex,
    sim: &Simulation,
    costs: &Costs,
    end: Option<(usize, usize)>,
) -> Vec<(usize, usize, usize)> {
    let placement = &schedule.placement;
    let lines = &sim.timeline;
    let Some((mut w, mut i)) = end else {
        return Vec::new();
    };
    let end_of = |p: Pass| -> Option<(usize, usize, f64)> {
        let pos = index.position(p)? as usize;
        let pw = placement.worker_of(p.stage) as usize;
        lines.get(pw)?.get(pos).map(|t| (pw, pos, t.end))
    };
    // Stretches of the critical path along one worker: (worker, first pos, last pos).
    let mut stretches: Vec<(usize, usize, usize)> = Vec::new();
    let mut stretch_end = i;
    loop {
        let here = lines[w][i];
        if i > 0 && lines[w][i - 1].end >= here.start - EPS {
            i -= 1;
            continue;
        }
        stretches.push((w, i, stretch_end));
        // Which dependency held this pass back?
        let held_by = index.deps(here.pass).find_map(|(dep, _)| {
            let (dw, dpos, dend) = end_of(dep)?;
            let hop = if dw != w { costs.comm } else { 0.0 };
            (dend + hop >= here.start - EPS && dend > 0.0).then_some((dw, dpos))
        });
        match held_by {
            Some((dw, dpos)) => {
                w = dw;
                i = dpos;
                stretch_end = dpos;
            }
            None => break,
        }
    }
    let mut ws = Vec::new();
    let mut others = Vec::new();
    for &(w, first, last) in &stretches {
        let line = &lines[w];
        // Idle gaps at or before the stretch start: positions g with idle time before g.
        let gaps: Vec<usize> = (1..=first)
            .rev()
            .filter(|&g| line[g].start > line[g - 1].end + EPS)
            .take(3)
            .collect();
        for pos in first..=last {
            let p = line[pos];
            let ready = index
                .deps(p.pass)
                .filter_map(|(dep, _)| {
                    let (dw, _, dend) = end_of(dep)?;
                    Some(dend + if dw != w { costs.comm } else { 0.0 })
                })
                .fold(0.0f64, f64::max);
            let into_gap = gaps
                .iter()
                .find(|&&g| g < pos && line[g - 1].end + EPS >= ready)
                .copied();
            match p.pass.kind {
                PassKind::W => {
                    if let Some(g) = into_gap {
                        ws.push((w, pos, g));
                    }
                    if pos + 1 < line.len() {
                        ws.push((w, pos, line.len() - 1));
                    }
                }
                _ => {
                    if let Some(g) = into_gap {
                        others.push((w, pos, g));
                    }
                }
            }
        }
    }
    ws.extend(others);
    ws
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Times;
    use crate::generate::{Request, ScheduleKind, generate};

    #[test]
    fn never_worsens_and_keeps_validity_and_memory() {
        for kind in [ScheduleKind::ZbH1, ScheduleKind::VHalf, ScheduleKind::VMin] {
            for (d, n) in [(4u32, 8u32), (6, 12)] {
                let times = Times {
                    f: 1.0,
                    b: 1.3,
                    w: 0.7,
                    comm: 0.1,
                };
                let req = Request {
                    times,
                    ..Request::new(kind, d, n)
                };
                let s = generate(&req).expect("generates");
                let costs = Costs::uniform(&s.placement, times).expect("costs");
                let before = simulate(&s, &costs).expect("simulates");
                let limit = before.max_peak_memory();
                let after =
                    improve(s.clone(), &costs, limit, budget_for(&s, 20)).expect("improves");
                let sim = simulate(&after, &costs).expect("valid");
                assert!(sim.makespan <= before.makespan + EPS, "{kind} d={d} n={n}");
                assert!(
                    sim.makespan + EPS < before.makespan
                        || sim.bubble_span <= before.bubble_span + EPS,
                    "{kind} d={d} n={n}: span bubble {} after {}",
                    sim.bubble_span,
                    before.bubble_span
                );
                assert!(sim.max_peak_memory() <= limit + EPS);
            }
        }
    }

    #[test]
    fn lowers_the_span_bubble_of_a_worker_that_ends_late() {
        // ZB-H2 (unit times), where worker 0 ends 3 before the last worker, with its first W
        // moved to the end of its program: worker 0 still ends before the makespan (which
        // does not change) but waits inside its span, so the span bubble rises.
        let mut s = generate(&Request::new(ScheduleKind::ZbH2, 4, 8)).expect("zb-h2");
        let costs = Costs::uniform(&s.placement, Times::UNIT).expect("costs");
        let original = simulate(&s, &costs).expect("valid");
        let line = &mut s.workers[0];
        let first_w = line
            .iter()
            .position(|p| p.kind == PassKind::W)
            .expect("a W");
        let w = line.remove(first_w);
        line.push(w);
        let before = simulate(&s, &costs).expect("valid");
        assert!((before.makespan - original.makespan).abs() < EPS);
        assert!(
            before.bubble_span > original.bubble_span + 1e-3,
            "span bubble {} → {}",
            original.bubble_span,
            before.bubble_span
        );
        let limit = before.max_peak_memory();
        let after = improve(s.clone(), &costs, limit, budget_for(&s, 50)).expect("improves");
        let after = simulate(&after, &costs).expect("valid");
        assert!(after.makespan <= before.makespan + EPS);
        assert!(
            after.bubble_span < before.bubble_span - 1e-3,
            "span bubble {} → {}",
            before.bubble_span,
            after.bubble_span
        );
    }

    #[test]
    fn shortens_a_schedule_with_a_misplaced_weight_pass() {
        // ZB-H1 with every W of worker 0 moved to the end of its program: worker 0 finishes
        // last, and W passes moved back into its idle gaps shorten the tail.
        let mut s = generate(&Request::new(ScheduleKind::ZbH1, 4, 4)).expect("zb-h1");
        let (ws, rest): (Vec<Pass>, Vec<Pass>) =
            s.workers[0].iter().partition(|p| p.kind == PassKind::W);
        s.workers[0] = rest.into_iter().chain(ws).collect();
        let costs = Costs::uniform(&s.placement, Times::UNIT).expect("costs");
        let before = simulate(&s, &costs).expect("valid").makespan;
        let limit = 8.0;
        let after = improve(s.clone(), &costs, limit, budget_for(&s, 50)).expect("improves");
        let after = simulate(&after, &costs).expect("valid").makespan;
        assert!(after < before - 0.5, "before {before}, after {after}");
    }
}
