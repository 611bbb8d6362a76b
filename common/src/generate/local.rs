//! Local search after planning: moves that can only shorten the simulated makespan.
//!
//! Each round simulates the schedule, walks its critical path back from the pass that ends
//! last, and tries to take passes off the stretches where the path runs along one worker:
//! a W (which nothing on the path needs) moves into the latest idle gap before the stretch
//! or to the end of the worker's program; an F or B moves into the latest gap before the
//! stretch where its inputs are already there. A move is kept only if the schedule still
//! validates, every worker stays within the memory limit and the pair (makespan, sum of the
//! workers' finish times) strictly decreases, so the search terminates and never makes a
//! schedule worse. The work is bounded by a budget counted in simulated passes (the core has
//! no clock).

use crate::cost::Costs;
use crate::error::Result;
use crate::pass::{Pass, PassKind};
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};
use crate::validate::{PassIndex, validate};

const EPS: f64 = 1e-9;
/// Candidate moves tried per round.
const MOVES_PER_ROUND: usize = 24;

/// A budget that lets the local search run about `rounds` full rounds on `schedule`.
pub fn budget_for(schedule: &Schedule, rounds: u64) -> u64 {
    schedule.num_passes() as u64 * rounds * MOVES_PER_ROUND as u64
}

fn key(sim: &Simulation) -> (f64, f64) {
    let ends: f64 = sim
        .timeline
        .iter()
        .filter_map(|t| t.last())
        .map(|p| p.end)
        .sum();
    (sim.makespan, ends)
}

fn improves(new: (f64, f64), old: (f64, f64)) -> bool {
    new.0 + EPS < old.0 || (new.0 <= old.0 + EPS && new.1 + EPS < old.1)
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
        let index = validate(&current)?;
        let moves = candidate_moves(&current, &index, &sim, costs);
        let mut accepted = false;
        for (w, from, to) in moves.into_iter().take(MOVES_PER_ROUND) {
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

/// Moves `(worker, from, to)` (positions in the worker's program; `to` is the position the
/// pass takes after removal) suggested by the critical path, most promising first.
fn candidate_moves(
    schedule: &Schedule,
    index: &PassIndex,
    sim: &Simulation,
    costs: &Costs,
) -> Vec<(usize, usize, usize)> {
    let placement = &schedule.placement;
    let lines = &sim.timeline;
    // The pass that ends last.
    let Some((mut w, mut i)) = lines
        .iter()
        .enumerate()
        .filter_map(|(w, l)| l.last().map(|p| (w, l.len() - 1, p.end)))
        .max_by(|a, b| a.2.total_cmp(&b.2))
        .map(|(w, i, _)| (w, i))
    else {
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
                assert!(sim.max_peak_memory() <= limit + EPS);
            }
        }
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
