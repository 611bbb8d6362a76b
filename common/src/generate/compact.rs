//! Compaction with true costs: the last reordering step of every split schedule.
//!
//! The schedule is executed event by event under the real per-stage times and
//! communication latency. A worker whose next pass is not ready may run a later pass of its
//! program that is ready now, if that cannot hold the next pass up (its inputs are still
//! being computed elsewhere, or it finishes before they arrive), and, for a forward, if the
//! worker stays within the peak activation memory of its original order; and a ready B
//! (or F, within memory) overtakes a W: W is never on the critical path. The new order is
//! kept only when its simulated makespan is shorter, so this step can only help.

use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::cost::Costs;
use crate::error::Result;
use crate::pass::{Pass, PassKind, PassMap};
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};
use crate::validate::{PassIndex, validate};

/// How far ahead in its program a waiting worker looks for a ready pass.
const WINDOW: usize = 12;
const EPS: f64 = 1e-9;

/// Runs the compaction; returns the better of the input and the compacted schedule.
pub fn compact(schedule: Schedule, costs: &Costs) -> Result<Schedule> {
    compact_scanning(schedule, costs, false)
}

/// [`compact`]; `scan_all` re-scans every free worker at every step instead of only those
/// whose choice may have changed (the tests check that both give the same schedule).
fn compact_scanning(schedule: Schedule, costs: &Costs, scan_all: bool) -> Result<Schedule> {
    let before = simulate(&schedule, costs)?;
    let index = validate(&schedule)?;
    compact_indexed(schedule, &index, before, costs, scan_all).map(|(s, _)| s)
}

/// [`compact`] of a schedule validated into `index` and simulated into `before` under
/// `costs`; the winner comes with its simulation.
pub(crate) fn compact_simulated(
    schedule: Schedule,
    index: &PassIndex,
    before: Simulation,
    costs: &Costs,
) -> Result<(Schedule, Simulation)> {
    compact_indexed(schedule, index, before, costs, false)
}

fn compact_indexed(
    schedule: Schedule,
    index: &PassIndex,
    before: Simulation,
    costs: &Costs,
    scan_all: bool,
) -> Result<(Schedule, Simulation)> {
    let workers = schedule.workers.len();
    let cap = before.peak_memory.clone();

    let mut remaining: Vec<Vec<Option<Pass>>> = schedule
        .workers
        .iter()
        .map(|ps| ps.iter().copied().map(Some).collect())
        .collect();
    let mut head = vec![0usize; workers];
    let mut free = vec![0.0f64; workers];
    let mut mem = vec![0.0f64; workers];
    let mut orders: Vec<Vec<Pass>> = schedule
        .workers
        .iter()
        .map(|ps| Vec::with_capacity(ps.len()))
        .collect();
    let mut clock = Clock::new(&schedule, index, costs);
    // A waiting worker's choice changes only when an input of a pass in its window becomes
    // known (a pass starts on a neighbouring stage: `dirty`) or when the clock reaches an
    // arrival it saw coming (`wake`); until then its scan would find nothing again, so it
    // is skipped. The same schedule comes out, with far fewer scans on many workers.
    let mut dirty = vec![true; workers];
    let mut wake = vec![f64::INFINITY; workers];

    let total = schedule.num_passes();
    let mut placed = 0usize;
    while placed < total {
        let mut next_event = f64::INFINITY;
        let mut progressed = false;
        for w in 0..workers {
            while head[w] < remaining[w].len() && remaining[w][head[w]].is_none() {
                head[w] += 1;
            }
            if head[w] >= remaining[w].len() {
                continue;
            }
            if free[w] > clock.now + EPS {
                next_event = next_event.min(free[w]);
                continue;
            }
            if !scan_all && !dirty[w] && clock.now + EPS < wake[w] {
                continue;
            }
            let first = remaining[w][head[w]].unwrap_or(Pass::f(0, 0));
            let head_ready = clock.ready_at(first, w);
            // W is never on the critical path: a ready B, or an F that fits, goes first.
            let b_first = || {
                (head[w] + 1..remaining[w].len().min(head[w] + 1 + WINDOW)).find(|&i| {
                    remaining[w][i].is_some_and(|p| {
                        let ready = clock.ready_at(p, w).is_some_and(|r| r <= clock.now + EPS);
                        let allowed = match p.kind {
                            PassKind::B | PassKind::BW => true,
                            PassKind::F => {
                                held_until(&remaining[w][head[w]..i], mem[w], costs)
                                    + costs.stages[p.stage as usize].mem
                                    <= cap[w] + EPS
                            }
                            PassKind::W => false,
                        };
                        ready && allowed
                    })
                })
            };
            let pick = match head_ready {
                Some(t) if t <= clock.now + EPS && first.kind == PassKind::W => {
                    b_first().or(Some(head[w]))
                }
                Some(t) if t <= clock.now + EPS => Some(head[w]),
                _ => {
                    let limit = head_ready.unwrap_or(f64::INFINITY);
                    (head[w] + 1..remaining[w].len().min(head[w] + 1 + WINDOW)).find(|&i| {
                        let Some(p) = remaining[w][i] else {
                            return false;
                        };
                        let Some(r) = clock.ready_at(p, w) else {
                            return false;
                        };
                        let fits = clock.now + costs.duration(p.kind, p.stage) <= limit + EPS;
                        let mem_ok = p.kind != PassKind::F
                            || held_until(&remaining[w][head[w]..i], mem[w], costs)
                                + costs.stages[p.stage as usize].mem
                                <= cap[w] + EPS;
                        // `r` exists only when every input of `p` is done, so a pass that
                        // depends on one between the head and `i` is never picked.
                        r <= clock.now + EPS && fits && mem_ok
                    })
                }
            };
            match pick {
                Some(i) => {
                    let Some(p) = remaining[w][i].take() else {
                        continue;
                    };
                    let dur = costs.duration(p.kind, p.stage);
                    mem[w] += costs.memory_change(p);
                    free[w] = clock.start(p, dur);
                    orders[w].push(p);
                    placed += 1;
                    progressed = true;
                    next_event = next_event.min(free[w]);
                    // Its consumers live on its own stage's worker and the neighbouring
                    // stages' (F feeds the next stage, B the previous one).
                    let s = p.stage;
                    for t in [s.checked_sub(1), Some(s), Some(s + 1)]
                        .into_iter()
                        .flatten()
                    {
                        if t < schedule.placement.stages() {
                            dirty[schedule.placement.worker_of(t) as usize] = true;
                        }
                    }
                }
                None => {
                    if let Some(t) = head_ready.filter(|&t| t > clock.now + EPS) {
                        next_event = next_event.min(t);
                    }
                    dirty[w] = false;
                    wake[w] = (head[w]..remaining[w].len().min(head[w] + 1 + WINDOW))
                        .filter_map(|i| remaining[w][i].and_then(|p| clock.ready_at(p, w)))
                        .filter(|&r| r > clock.now + EPS)
                        .fold(f64::INFINITY, f64::min);
                }
            }
        }
        if progressed {
            continue;
        }
        if !clock.advance(next_event) {
            return Ok((schedule, before));
        }
    }
    let mut candidate = schedule.clone();
    candidate.workers = orders;
    match simulate(&candidate, costs) {
        Ok(after) if after.makespan + EPS < before.makespan => Ok((candidate, after)),
        _ => Ok((schedule, before)),
    }
}

/// The most memory a worker holds while running `passes` (in order) from `now`: moving a
/// forward in front of them adds its activation to every one of those moments.
fn held_until(passes: &[Option<Pass>], now: f64, costs: &Costs) -> f64 {
    let (mut held, mut most) = (now, now);
    for p in passes.iter().flatten() {
        held += costs.memory_change(*p);
        most = most.max(held);
    }
    most
}

/// Zero-bubble style weight filling: each worker runs its F and B passes in their order,
/// and its W passes (oldest first) only to fill time when its next F/B is not ready — if
/// `eager`, whenever that happens; otherwise only when the W ends before the next pass's
/// inputs arrive — or when the next F would take the worker above `cap` activation memory.
/// Left-over W passes run at the end. Schedules without W passes come back unchanged.
pub fn fill_weights(schedule: &Schedule, costs: &Costs, cap: f64, eager: bool) -> Result<Schedule> {
    let index = validate(schedule)?;
    fill_weights_indexed(schedule, &index, costs, cap, eager)
}

/// [`fill_weights`] of a schedule validated into `index`.
pub(crate) fn fill_weights_indexed(
    schedule: &Schedule,
    index: &PassIndex,
    costs: &Costs,
    cap: f64,
    eager: bool,
) -> Result<Schedule> {
    let placement = &schedule.placement;
    let workers = schedule.workers.len();
    if schedule
        .workers
        .iter()
        .flatten()
        .all(|p| p.kind != PassKind::W)
    {
        return Ok(schedule.clone());
    }
    let main: Vec<Vec<Pass>> = schedule
        .workers
        .iter()
        .map(|ps| {
            ps.iter()
                .copied()
                .filter(|p| p.kind != PassKind::W)
                .collect()
        })
        .collect();
    let mut head = vec![0usize; workers];
    let mut pending: Vec<std::collections::VecDeque<Pass>> = vec![Default::default(); workers];
    let mut free = vec![0.0f64; workers];
    let mut mem = vec![0.0f64; workers];
    let mut orders: Vec<Vec<Pass>> = schedule
        .workers
        .iter()
        .map(|ps| Vec::with_capacity(ps.len()))
        .collect();
    let mut clock = Clock::new(schedule, index, costs);
    let total = schedule.num_passes();
    let mut placed = 0usize;
    while placed < total {
        let mut progressed = false;
        let mut next_event = f64::INFINITY;
        for w in 0..workers {
            if free[w] > clock.now + EPS {
                next_event = next_event.min(free[w]);
                continue;
            }
            let next = main[w].get(head[w]).copied();
            let next_ready = next.and_then(|p| clock.ready_at(p, w));
            let run_w = match (next, next_ready) {
                (None, _) => !pending[w].is_empty(),
                (Some(p), Some(r)) if r <= clock.now + EPS => {
                    p.kind == PassKind::F
                        && mem[w] + costs.stages[p.stage as usize].mem > cap + EPS
                        && !pending[w].is_empty()
                }
                (Some(p), r) => pending[w].front().is_some_and(|wp| {
                    // When the inputs of `p` can arrive at the earliest: known for started
                    // passes; a pass not started yet needs at least its own duration.
                    let earliest = r.unwrap_or_else(|| {
                        index
                            .deps(p)
                            .filter(|(dep, _)| clock.end.known(*dep).is_none())
                            .map(|(dep, _)| {
                                let hop = if placement.worker_of(dep.stage) as usize != w {
                                    costs.comm
                                } else {
                                    0.0
                                };
                                clock.now + costs.duration(dep.kind, dep.stage) + hop
                            })
                            .fold(clock.now, f64::max)
                    });
                    eager || clock.now + costs.duration(PassKind::W, wp.stage) <= earliest + EPS
                }),
            };
            let pass = if run_w {
                pending[w].pop_front()
            } else if next_ready.is_some_and(|r| r <= clock.now + EPS) {
                head[w] += 1;
                next
            } else {
                if let Some(r) = next_ready {
                    next_event = next_event.min(r);
                }
                None
            };
            let Some(p) = pass else { continue };
            let dur = costs.duration(p.kind, p.stage);
            mem[w] += costs.memory_change(p);
            if p.kind == PassKind::B {
                pending[w].push_back(Pass::w(p.stage, p.mb));
            }
            free[w] = clock.start(p, dur);
            orders[w].push(p);
            placed += 1;
            progressed = true;
        }
        if progressed {
            continue;
        }
        if !clock.advance(next_event) {
            return Ok(schedule.clone());
        }
    }
    let mut out = schedule.clone();
    out.workers = orders;
    Ok(out)
}

/// The event clock shared by the compaction and the W filling: end times of the passes
/// started so far, and the moments at which something can change.
struct Clock<'a> {
    /// Stage → worker.
    worker_of: Vec<u32>,
    index: &'a PassIndex,
    costs: &'a Costs,
    end: PassMap<f64>,
    /// [`Clock::ready_at`] of the passes whose inputs are all known (NaN for the others):
    /// it never changes after, and the scans ask it again at every event.
    ready: PassMap<Cell<f64>>,
    /// Ends and arrivals (end + comm) of started passes, as f64 bits (non-negative values
    /// order like their bits).
    events: BinaryHeap<Reverse<u64>>,
    now: f64,
}

impl<'a> Clock<'a> {
    fn new(schedule: &'a Schedule, index: &'a PassIndex, costs: &'a Costs) -> Self {
        Clock {
            worker_of: schedule.placement.table(),
            index,
            costs,
            end: PassMap::times(schedule.placement.stages(), schedule.microbatches),
            ready: PassMap::new(
                schedule.placement.stages(),
                schedule.microbatches,
                Cell::new(f64::NAN),
            ),
            events: BinaryHeap::new(),
            now: 0.0,
        }
    }

    /// When `pass` could start on worker `w`: None while an input is still being computed.
    fn ready_at(&self, pass: Pass, w: usize) -> Option<f64> {
        // The scans ask about a pass on its own worker; only those answers are kept.
        let own = self.worker_of[pass.stage as usize] as usize == w;
        let cached = self.ready.get(pass);
        if own && !cached.get().is_nan() {
            return Some(cached.get());
        }
        let mut t = 0.0f64;
        for (dep, _) in self.index.deps(pass) {
            let e = self.end.known(dep)?;
            let hop = if self.worker_of[dep.stage as usize] as usize != w {
                self.costs.comm
            } else {
                0.0
            };
            t = t.max(e + hop);
        }
        if own {
            cached.set(t);
        }
        Some(t)
    }

    /// Starts `pass` now for `dur`; returns its end.
    fn start(&mut self, pass: Pass, dur: f64) -> f64 {
        let end = self.now + dur;
        self.end.set(pass, end);
        self.events.push(Reverse(end.to_bits()));
        self.events.push(Reverse((end + self.costs.comm).to_bits()));
        end
    }

    /// Moves to the next moment anything can change: `next_event` or an end or arrival.
    /// False when nothing ever will (the caller gives up).
    fn advance(&mut self, next_event: f64) -> bool {
        while self
            .events
            .peek()
            .is_some_and(|Reverse(t)| f64::from_bits(*t) <= self.now + EPS)
        {
            self.events.pop();
        }
        let soonest = self
            .events
            .peek()
            .map_or(next_event, |Reverse(t)| next_event.min(f64::from_bits(*t)));
        if !soonest.is_finite() || soonest <= self.now + EPS {
            return false;
        }
        self.now = soonest;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{StageCost, Times};
    use crate::generate::{Request, ScheduleKind, generate};

    fn costs_for(schedule: &Schedule, times: Times, uneven: bool) -> Costs {
        let mut costs = Costs::uniform(&schedule.placement, times).expect("costs");
        if uneven {
            // First and last stages slower (embedding, output layer), one odd stage.
            let last = costs.stages.len() - 1;
            for (s, c) in costs.stages.iter_mut().enumerate() {
                let k = if s == 0 || s == last {
                    1.6
                } else if s == 3 {
                    1.3
                } else {
                    1.0
                };
                *c = StageCost {
                    f: c.f * k,
                    b: c.b * k,
                    w: c.w * k,
                    mem: c.mem,
                };
            }
        }
        costs
    }

    /// Skipping workers whose choice cannot have changed gives exactly the schedule that
    /// re-scanning every worker gives, over schedules and costs where compaction does
    /// reorder passes.
    #[test]
    fn skipping_unchanged_workers_gives_the_same_schedule() {
        let mut changed = 0;
        let mut cases = 0;
        for kind in [
            ScheduleKind::ZbH1,
            ScheduleKind::ZbH2,
            ScheduleKind::VHalf,
            ScheduleKind::VMin,
        ] {
            for (d, n) in [(4, 8), (8, 16), (8, 24)] {
                let schedule = generate(&Request::new(kind, d, n)).expect("generates");
                for times in [
                    Times::UNIT,
                    Times {
                        f: 12.96,
                        b: 13.22,
                        w: 9.76,
                        comm: 6.48,
                    },
                    Times {
                        f: 1.0,
                        b: 2.0,
                        w: 1.0,
                        comm: 0.3,
                    },
                ] {
                    for uneven in [false, true] {
                        let costs = costs_for(&schedule, times, uneven);
                        let fast =
                            compact_scanning(schedule.clone(), &costs, false).expect("compacts");
                        let full =
                            compact_scanning(schedule.clone(), &costs, true).expect("compacts");
                        assert_eq!(
                            fast.workers, full.workers,
                            "{kind:?} d={d} n={n} {times:?} uneven={uneven}"
                        );
                        cases += 1;
                        changed += usize::from(full.workers != schedule.workers);
                    }
                }
            }
        }
        assert!(
            changed > 0,
            "compaction changed none of the {cases} schedules"
        );
        println!("{changed} of {cases} schedules reordered by compaction");
    }
}
