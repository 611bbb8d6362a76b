//! Greedy list scheduling on the V placement: the zero-bubble V scheduler of seed 000
//! (its V-ZB numbers come from a scheduler of this kind), written for pipewise's cost model.
//!
//! A microbatch crosses every worker four times ("legs"): forward down the first chunks
//! (stage `w` on worker `w`), forward back up the second chunks (stage `2d−1−w`), the
//! backward of the second chunks down again, and the backward of the first chunks back up.
//! Every worker runs each leg's passes in microbatch order.
//!
//! 1. Warm-up: forwards of the first leg are added while a worker would otherwise wait for
//!    the second leg to come back, as long as the memory that the steady state needs stays
//!    free; then forwards alternate between the legs until each worker is at least as far
//!    as the one before it.
//! 2. Steady state, `2n` rounds: every worker gets one backward (second-chunk backward
//!    first when its input is there), then one forward. Before a pass whose input comes
//!    from another worker, pending W passes fill the wait when they fit in it; one more
//!    may go in when the wait exceeds what this worker may still idle (the largest idle
//!    time of any worker so far: no worker needs to be better than the worst).
//! 3. Pending W passes close the schedule.
//!
//! A run is repeated with each worker's idle time from the previous run as its allowance
//! while that lowers the worst idle time, for the four choices of filling before forwards
//! and before first-chunk backwards; the best run is kept. Shapes the heuristic cannot
//! complete (very few microbatches) return an error so callers can fall back.

use std::collections::VecDeque;

use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::pass::{Pass, PassKind};
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

const EPS: f64 = 1e-9;
/// Refinement runs per variant (each must lower the worst idle time to continue).
const MAX_REFINEMENTS: usize = 32;

/// Span bubbles closer than this (0.1 percentage point) count as equal in [`span_first`].
const SPAN_TIE: f64 = 1e-3;

/// Whether `a` beats `b` for V-ZB: the lower span bubble (seed 000's metric, and the step
/// time when each worker starts its next step as soon as its own passes end), with bubbles
/// within 0.1 point counted equal and then the lower makespan (the step time when every
/// step ends in a global barrier) deciding.
pub(crate) fn span_first(a: &Simulation, b: &Simulation) -> bool {
    if (a.bubble_span - b.bubble_span).abs() > SPAN_TIE {
        a.bubble_span < b.bubble_span
    } else {
        a.makespan + EPS < b.makespan
    }
}

/// The best greedy V schedule for `d` workers and `n` microbatches whose activation memory
/// stays within `cap` per worker (in `costs`' unit): the lowest span bubble, bubbles within
/// 0.1 point counting as equal, then the lowest makespan.
pub fn greedy_v(d: u32, n: u32, costs: &Costs, cap: f64) -> Result<Schedule> {
    greedy_v_simulated(d, n, costs, cap).map(|(schedule, _)| schedule)
}

/// [`greedy_v`] with the winner's simulation under `costs`.
pub(crate) fn greedy_v_simulated(
    d: u32,
    n: u32,
    costs: &Costs,
    cap: f64,
) -> Result<(Schedule, Simulation)> {
    costs.check_for(&Placement::V { workers: d })?;
    let mut best: Option<(Schedule, Simulation)> = None;
    let mut last_error = unsupported(d, n, "no variant ran".into());
    for before_b in [true, false] {
        for before_f in [true, false] {
            let fill = Fill { before_b, before_f };
            // `simulate` also validates the schedule.
            let run = refined(d, n, costs, cap, fill)
                .and_then(|schedule| Ok((simulate(&schedule, costs)?, schedule)));
            match run {
                Ok((sim, schedule)) => {
                    if best.as_ref().is_none_or(|(_, b)| span_first(&sim, b)) {
                        best = Some((schedule, sim));
                    }
                }
                Err(e) => last_error = e,
            }
        }
    }
    best.ok_or(last_error)
}

fn unsupported(d: u32, n: u32, reason: String) -> Error {
    Error::Unsupported {
        schedule: "greedy-v".into(),
        reason: format!("{n} microbatches on {d} workers: {reason}"),
    }
}

#[derive(Debug, Clone, Copy)]
struct Fill {
    before_b: bool,
    before_f: bool,
}

/// What one greedy run is asked for: `n` microbatches on `d` workers under `costs`, at most
/// `cap` memory units per worker, W passes filling gaps as `fill` says.
#[derive(Debug, Clone, Copy)]
struct Setup<'a> {
    d: u32,
    n: u32,
    costs: &'a Costs,
    cap: f64,
    fill: Fill,
}

/// One variant, re-run with the previous run's idle times as allowances while the worst
/// idle time falls.
fn refined(d: u32, n: u32, costs: &Costs, cap: f64, fill: Fill) -> Result<Schedule> {
    let setup = Setup {
        d,
        n,
        costs,
        cap,
        fill,
    };
    let mut best = Greedy::run(setup, None)?;
    for _ in 0..MAX_REFINEMENTS {
        let allowance = best.idle.clone();
        match Greedy::run(setup, Some(allowance)) {
            Ok(next) if next.worst_idle() + EPS < best.worst_idle() => best = next,
            _ => break,
        }
    }
    Ok(best.into_schedule())
}

/// Legs of a microbatch's round trip, in dependency order.
const LEGS: usize = 4;

struct Greedy<'a> {
    d: u32,
    n: u32,
    costs: &'a Costs,
    cap: f64,
    fill: Fill,
    /// Per-worker idle allowance from a previous run (`None` on the first run).
    allowance: Option<Vec<f64>>,
    /// End time of every placed F and B, by `(leg, worker, mb)`; `None` until placed.
    end: Vec<Option<f64>>,
    now: Vec<f64>,
    memory: Vec<f64>,
    /// Passes placed per worker and leg.
    count: Vec<[u32; LEGS]>,
    /// Idle time per worker since its first pass.
    idle: Vec<f64>,
    /// W passes owed, per worker, in the order their B ran.
    pending: Vec<VecDeque<(u32, u32)>>,
    programs: Vec<Vec<Pass>>,
}

impl<'a> Greedy<'a> {
    fn run(setup: Setup<'a>, allowance: Option<Vec<f64>>) -> Result<Greedy<'a>> {
        let Setup {
            d,
            n,
            costs,
            cap,
            fill,
        } = setup;
        let workers = d as usize;
        let mut g = Greedy {
            d,
            n,
            costs,
            cap,
            fill,
            allowance,
            end: vec![None; LEGS * workers * n as usize],
            now: vec![0.0; workers],
            memory: vec![0.0; workers],
            count: vec![[0; LEGS]; workers],
            idle: vec![0.0; workers],
            pending: vec![VecDeque::new(); workers],
            programs: vec![Vec::new(); workers],
        };
        g.warm_up()?;
        for _ in 0..2 * n {
            g.backward_round()?;
            g.forward_round()?;
        }
        for w in 0..d {
            while !g.pending[w as usize].is_empty() {
                g.put_w(w)?;
            }
        }
        let placed = g.count.iter().all(|c| c.iter().all(|&k| k == n));
        if !placed {
            return Err(unsupported(
                d,
                n,
                "the greedy rounds left passes unplaced".into(),
            ));
        }
        Ok(g)
    }

    fn worst_idle(&self) -> f64 {
        self.idle.iter().copied().fold(0.0, f64::max)
    }

    /// The idle time worker `w` may still have without exceeding what any worker (or its
    /// allowance from the previous run) already idles.
    fn slack(&self, w: u32) -> f64 {
        let mut worst = self.worst_idle();
        if let Some(allowance) = &self.allowance {
            let most = allowance.iter().copied().fold(0.0, f64::max);
            worst = worst.max(most - allowance[w as usize]);
        }
        worst - self.idle[w as usize]
    }

    fn stage(&self, leg: usize, w: u32) -> u32 {
        match leg {
            0 | 3 => w,
            _ => 2 * self.d - 1 - w,
        }
    }

    /// The pass this one waits for: `(leg, worker)` of the same microbatch, and whether it
    /// runs on another worker (a hop with communication cost).
    fn input(&self, leg: usize, w: u32) -> Option<(usize, u32, bool)> {
        let last = self.d - 1;
        match leg {
            0 => (w > 0).then(|| (0, w - 1, true)),
            1 if w < last => Some((1, w + 1, true)),
            1 => Some((0, w, false)),
            2 if w > 0 => Some((2, w - 1, true)),
            2 => Some((1, w, false)),
            _ if w < last => Some((3, w + 1, true)),
            _ => Some((2, w, false)),
        }
    }

    fn index(&self, leg: usize, w: u32, mb: u32) -> usize {
        (leg * self.d as usize + w as usize) * self.n as usize + mb as usize
    }

    fn placed(&self, leg: usize, w: u32, mb: u32) -> bool {
        mb < self.n && self.end[self.index(leg, w, mb)].is_some()
    }

    /// When the input of the next pass of `leg` on `w` is ready there (after the hop), if
    /// it comes from another worker and has been placed.
    fn remote_ready(&self, leg: usize, w: u32) -> Option<f64> {
        let mb = self.count[w as usize][leg];
        let (dleg, dw, remote) = self.input(leg, w)?;
        if !remote || mb >= self.n {
            return None;
        }
        self.end[self.index(dleg, dw, mb)].map(|e| e + self.costs.comm)
    }

    fn put(&mut self, leg: usize, w: u32) -> Result<()> {
        let wi = w as usize;
        let mb = self.count[wi][leg];
        if mb >= self.n {
            return Err(unsupported(
                self.d,
                self.n,
                "a leg ran past the last microbatch".into(),
            ));
        }
        let stage = self.stage(leg, w);
        let cost = self.costs.stages[stage as usize];
        let forward = leg < 2;
        let duration = if forward { cost.f } else { cost.b };
        let earliest = self.now[wi] + duration;
        let mut end = earliest;
        if let Some((dleg, dw, remote)) = self.input(leg, w) {
            let Some(ready) = self.end[self.index(dleg, dw, mb)] else {
                return Err(unsupported(
                    self.d,
                    self.n,
                    "a pass came before its input was placed".into(),
                ));
            };
            let hop = if remote { self.costs.comm } else { 0.0 };
            end = end.max(ready + hop + duration);
        }
        if forward && self.memory[wi] + cost.mem > self.cap + EPS {
            return Err(unsupported(self.d, self.n, "memory cap reached".into()));
        }
        if self.count[wi][0] > 0 {
            self.idle[wi] += end - earliest;
        }
        let index = self.index(leg, w, mb);
        self.end[index] = Some(end);
        self.now[wi] = end;
        if forward {
            self.memory[wi] += cost.mem;
            self.programs[wi].push(Pass::new(PassKind::F, stage, mb));
        } else {
            self.memory[wi] -= cost.mem * self.costs.release_at_b;
            self.programs[wi].push(Pass::new(PassKind::B, stage, mb));
            self.pending[wi].push_back((stage, mb));
        }
        self.count[wi][leg] += 1;
        Ok(())
    }

    fn put_w(&mut self, w: u32) -> Result<()> {
        let wi = w as usize;
        let Some((stage, mb)) = self.pending[wi].pop_front() else {
            return Err(unsupported(
                self.d,
                self.n,
                "no W pass to free memory".into(),
            ));
        };
        let cost = self.costs.stages[stage as usize];
        self.now[wi] += cost.w;
        self.memory[wi] -= cost.mem * (1.0 - self.costs.release_at_b);
        self.programs[wi].push(Pass::new(PassKind::W, stage, mb));
        Ok(())
    }

    fn next_w_cost(&self, w: u32) -> Option<f64> {
        self.pending[w as usize]
            .front()
            .map(|&(stage, _)| self.costs.stages[stage as usize].w)
    }

    /// Fills the wait before the next pass of `leg` on `w` with W passes (see the module
    /// docs); `extra` allows one more when the wait exceeds the worker's slack.
    fn fill_wait(&mut self, leg: usize, w: u32, extra: bool) -> Result<()> {
        let Some(ready) = self.remote_ready(leg, w) else {
            return Ok(());
        };
        while let Some(cost) = self.next_w_cost(w) {
            if ready + EPS < self.now[w as usize] + cost {
                break;
            }
            self.put_w(w)?;
        }
        if extra
            && !self.pending[w as usize].is_empty()
            && ready - self.now[w as usize] > self.slack(w) + EPS
        {
            self.put_w(w)?;
        }
        Ok(())
    }

    fn forward_memory(&self, w: u32) -> f64 {
        let c = &self.costs.stages;
        c[self.stage(0, w) as usize]
            .mem
            .max(c[self.stage(1, w) as usize].mem)
    }

    fn warm_up(&mut self) -> Result<()> {
        let d = self.d;
        for w in 0..d {
            self.put(0, w)?;
        }
        for w in (0..d).rev() {
            if w + 1 < d {
                // Forwards of the first leg fill the wait for the second leg's first
                // microbatch, keeping room for the steady state's 2 + 2w activations.
                let back = self.end[self.index(1, w + 1, 0)].unwrap_or(0.0) + self.costs.comm;
                let reserve = self.forward_memory(w) * f64::from(2 + 2 * w);
                let f = self.costs.stages[w as usize].f;
                while self.memory[w as usize] + reserve <= self.cap + EPS
                    && self.now[w as usize] + f <= back + EPS
                    && self.count[w as usize][0] + w < self.n
                {
                    for j in 0..=w {
                        self.put(0, j)?;
                    }
                }
            }
            self.put(1, w)?;
        }
        // Each worker catches up with the one before it, alternating the two legs.
        let n = self.n;
        let behind = |a: [u32; LEGS], b: [u32; LEGS]| {
            a[0] + a[1] < b[0] + b[1] || (a[1] <= b[1] && b[1] < n)
        };
        let mut leg = 0;
        for w in 1..d {
            let (mut here, mut before) = (self.count[w as usize], self.count[w as usize - 1]);
            let mut rounds = 0;
            while behind(here, before) {
                let mut progressed = false;
                for j in (w..d).rev() {
                    if self.count[j as usize][leg] < self.n {
                        self.put(leg, j)?;
                        progressed = true;
                    }
                }
                leg = 1 - leg;
                rounds += 1;
                if !progressed && rounds > 2 {
                    return Err(unsupported(d, n, "the warm-up stalled".into()));
                }
                here = self.count[w as usize];
                before = self.count[w as usize - 1];
            }
        }
        Ok(())
    }

    fn backward_round(&mut self) -> Result<()> {
        let d = self.d;
        let (mut second, mut first) = (Vec::new(), Vec::new());
        for w in 0..d {
            let c = self.count[w as usize];
            if c[3] >= c[2] {
                second.push(w);
            } else if w + 1 == d || self.placed(3, w + 1, c[3]) || c[2] >= self.n {
                first.push(w);
            } else {
                second.push(w);
            }
        }
        // First-chunk backwards travel up (from the last worker), second-chunk ones down.
        let order = first
            .into_iter()
            .rev()
            .map(|w| (3, w))
            .chain(second.into_iter().map(|w| (2, w)));
        for (leg, w) in order {
            if self.count[w as usize][leg] >= self.n {
                continue;
            }
            let extra = leg == 3 || self.fill.before_b;
            self.fill_wait(leg, w, extra)?;
            self.put(leg, w)?;
        }
        Ok(())
    }

    fn forward_round(&mut self) -> Result<()> {
        let d = self.d;
        for w in 0..d {
            let c = self.count[w as usize];
            if c[1] >= self.n {
                continue;
            }
            // The second leg when its input is there (the first leg when it has caught up).
            let leg = if c[1] >= c[0] {
                0
            } else if w + 1 == d || self.placed(1, w + 1, c[1]) {
                1
            } else if c[0] < self.n && (w == 0 || self.placed(0, w - 1, c[0])) {
                0
            } else {
                continue;
            };
            let mem = self.costs.stages[self.stage(leg, w) as usize].mem;
            while self.memory[w as usize] + mem > self.cap + EPS {
                self.put_w(w)?;
            }
            self.fill_wait(leg, w, self.fill.before_f)?;
            self.put(leg, w)?;
        }
        Ok(())
    }

    fn into_schedule(self) -> Schedule {
        let placement = Placement::V { workers: self.d };
        let mut schedule = Schedule::empty("v-zb", placement, self.n);
        schedule.workers = self.programs;
        schedule
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::cost::Times;

    fn costs(d: u32, times: Times) -> Costs {
        Costs::uniform(&Placement::V { workers: d }, times).unwrap()
    }

    const TABLE4: Times = Times {
        f: 12.96,
        b: 13.22,
        w: 9.76,
        comm: 0.67,
    };

    #[test]
    fn valid_within_the_cap_or_a_clear_error() {
        for d in 1..=6u32 {
            for n in 1..=3 * d {
                for times in [Times::UNIT, TABLE4] {
                    let costs = costs(d, times);
                    // Its own memory class (d) and V-Half's, which it is not built for.
                    for cap in [f64::from(d), f64::from(d + 2) / 2.0] {
                        match greedy_v(d, n, &costs, cap) {
                            Ok(s) => {
                                crate::validate::validate(&s).unwrap();
                                let sim = simulate(&s, &costs).unwrap();
                                assert!(
                                    sim.max_peak_memory() <= cap + EPS,
                                    "d={d} n={n} cap={cap}: peak {}",
                                    sim.max_peak_memory()
                                );
                            }
                            Err(Error::Unsupported { reason, .. }) => {
                                assert!(reason.contains(&format!("{n} microbatches on {d}")));
                                // In its class it completes whenever n ≥ d.
                                assert!(
                                    cap < f64::from(d) || n < d,
                                    "d={d} n={n} cap={cap}: {reason}"
                                );
                            }
                            Err(e) => panic!("d={d} n={n} cap={cap}: unexpected error {e}"),
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn steady_state_reaches_the_memory_class_bubble_of_the_paper() {
        // Seed 000 Table 4, 9.6B model: V-ZB bubble 18.7 % at n = d = 16 with peak d.
        let costs = costs(16, TABLE4);
        let s = greedy_v(16, 16, &costs, 16.0).unwrap();
        let sim = simulate(&s, &costs).unwrap();
        assert!(sim.max_peak_memory() <= 16.0 + EPS);
        assert!(sim.bubble_span < 0.19, "span bubble {}", sim.bubble_span);
    }

    #[test]
    fn wrong_stage_count_is_an_invalid_argument() {
        let costs = Costs::uniform(
            &Placement::Loop {
                workers: 4,
                chunks: 1,
            },
            Times::UNIT,
        );
        let err = greedy_v(4, 8, &costs.unwrap(), 4.0).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { field: "costs", .. }));
    }

    #[test]
    fn span_first_orders_by_span_then_makespan() {
        let costs = costs(4, Times::UNIT);
        let base = simulate(&greedy_v(4, 8, &costs, 4.0).unwrap(), &costs).unwrap();
        let mut worse_span = base.clone();
        worse_span.bubble_span += 2.0 * SPAN_TIE;
        worse_span.makespan -= 1.0;
        assert!(span_first(&base, &worse_span));
        assert!(!span_first(&worse_span, &base));
        let mut near_tie = base.clone();
        near_tie.bubble_span += SPAN_TIE / 2.0;
        near_tie.makespan -= 1.0;
        assert!(span_first(&near_tie, &base));
        assert!(!span_first(&base, &near_tie));
    }
}
