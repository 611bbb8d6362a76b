//! Event-driven list scheduling on the V placement under a memory limit, timed with the true
//! per-stage costs and the per-hop communication latency.
//!
//! The building-block search of seed 000 plans in unit cells and repeats one block, so every
//! microbatch waits at the same places; with a communication cost those waits add up along
//! the 4d − 4 hops of a round trip. This scheduler instead places passes one at a time in
//! time order, each on its worker as soon as the worker is free and the pass's input has
//! arrived:
//!
//! - worker 0 starts microbatches `0 ..= burst` as fast as memory allows, then a new one at
//!   most every `gap` time units (this shapes the order of worker 0's passes; the simulator
//!   then runs that order as soon as possible, so a first forward may start sooner);
//! - a first-chunk forward that would leave less than `reserve` second-chunk activations of
//!   room on its worker waits; a second-chunk forward only needs to fit, since its microbatch
//!   already holds memory on every worker it still has to pass (the reserve is what keeps a
//!   run free of deadlock; one that still deadlocks returns `None`);
//! - the oldest leg goes first (first-chunk backward, second-chunk backward, second-chunk
//!   forward, first-chunk forward); a pending W fills idle time only when no input known so
//!   far (from passes already placed) arrives within `w_slack` × its length.
//!
//! Every choice is a function of the inputs. [`search`] runs the scheduler over [`grid`] and
//! refines the best few points by pattern search, within a budget of runs; the simulator
//! confirms each run's memory.

use std::collections::VecDeque;

use crate::cost::Costs;
use crate::error::Result;
use crate::pass::{Pass, PassKind};
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

const EPS: f64 = 1e-9;

/// One point of the parameter grid.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ListParams {
    /// Least time between two first forwards on worker 0.
    pub gap: f64,
    /// Room (in activations of the worker's second chunk) a first-chunk forward must leave.
    pub reserve: f64,
    /// A W fills idle time only if no input known so far arrives within `w_slack` × its length.
    pub w_slack: f64,
    /// Microbatches `0 ..= burst` start without the gap (only memory holds them back).
    pub burst: u32,
}

#[derive(Clone, Copy, Debug)]
struct Choice {
    at: f64,
    pass: Pass,
}

struct State<'a> {
    d: u32,
    n: u32,
    costs: &'a Costs,
    limit: f64,
    p: ListParams,
    next_f: Vec<u32>,
    next_b: Vec<u32>,
    f_end: Vec<f64>,
    b_end: Vec<f64>,
    w_queue: Vec<VecDeque<u32>>,
    free: Vec<f64>,
    mem: Vec<f64>,
    last_inject: f64,
    order: Vec<Vec<Pass>>,
}

impl State<'_> {
    fn worker(&self, stage: u32) -> u32 {
        Placement::V { workers: self.d }.worker_of(stage)
    }

    fn hop(&self, from: u32, to: u32) -> f64 {
        if self.worker(from) == self.worker(to) {
            0.0
        } else {
            self.costs.comm
        }
    }

    fn idx(&self, stage: u32, mb: u32) -> usize {
        (stage * self.n + mb) as usize
    }

    /// When the next forward of `stage` can start its input, if known.
    fn f_ready(&self, stage: u32) -> Option<(u32, f64)> {
        let mb = self.next_f[stage as usize];
        if mb >= self.n {
            return None;
        }
        if stage == 0 {
            let at = if mb <= self.p.burst {
                0.0
            } else {
                self.last_inject + self.p.gap
            };
            return Some((mb, at));
        }
        (self.next_f[stage as usize - 1] > mb).then(|| {
            (
                mb,
                self.f_end[self.idx(stage - 1, mb)] + self.hop(stage - 1, stage),
            )
        })
    }

    fn b_ready(&self, stage: u32) -> Option<(u32, f64)> {
        let mb = self.next_b[stage as usize];
        if mb >= self.n || self.next_f[stage as usize] <= mb {
            return None;
        }
        let last = 2 * self.d - 1;
        if stage == last {
            return Some((mb, self.f_end[self.idx(stage, mb)]));
        }
        (self.next_b[stage as usize + 1] > mb).then(|| {
            (
                mb,
                self.b_end[self.idx(stage + 1, mb)] + self.hop(stage + 1, stage),
            )
        })
    }

    fn w_ready(&self, stage: u32) -> Option<(u32, f64)> {
        self.w_queue[stage as usize]
            .front()
            .map(|&mb| (mb, self.b_end[self.idx(stage, mb)]))
    }

    fn fits(&self, w: u32, stage: u32) -> bool {
        let m = self.costs.stages[stage as usize].mem;
        let room = if stage < self.d {
            let up = 2 * self.d - 1 - w;
            self.p.reserve * self.costs.stages[up as usize].mem
        } else {
            0.0
        };
        self.mem[w as usize] + m + room <= self.limit + EPS
    }

    /// The pass worker `w` runs next and when, or `None` if it has nothing it may start.
    fn decide(&self, w: u32) -> Option<Choice> {
        let down = w;
        let up = 2 * self.d - 1 - w;
        let free = self.free[w as usize];
        // Non-W candidates in priority order: older legs first (fixed arrays: this runs
        // three times per placed pass).
        const NONE: (Pass, f64) = (Pass::f(0, 0), f64::INFINITY);
        let mut work = [NONE; 4];
        let mut k = 0;
        let mut push = |c: Option<(Pass, f64)>| {
            if let Some(c) = c {
                work[k] = c;
                k += 1;
            }
        };
        push(self.b_ready(down).map(|(mb, at)| (Pass::b(down, mb), at)));
        push(self.b_ready(up).map(|(mb, at)| (Pass::b(up, mb), at)));
        push(
            self.f_ready(up)
                .filter(|_| self.fits(w, up))
                .map(|(mb, at)| (Pass::f(up, mb), at)),
        );
        push(
            self.f_ready(down)
                .filter(|_| self.fits(w, down))
                .map(|(mb, at)| (Pass::f(down, mb), at)),
        );
        let work = &work[..k];
        // The pending W whose B ended first.
        let ws = [down, up]
            .into_iter()
            .filter_map(|s| self.w_ready(s).map(|(mb, at)| (Pass::w(s, mb), at)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let earliest_work = work.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
        let t = free.max(earliest_work);
        if let Some((pass, at)) = ws
            && at.max(free) + EPS < t
        {
            let start = at.max(free);
            let len = self.costs.duration(PassKind::W, pass.stage);
            if earliest_work >= start + self.p.w_slack * len - EPS {
                return Some(Choice { at: start, pass });
            }
        }
        // The first candidate (in priority order) whose input is there at `t`.
        if let Some(&(pass, _)) = work.iter().find(|x| x.1 <= t + EPS) {
            return Some(Choice { at: t, pass });
        }
        ws.map(|(pass, at)| Choice {
            at: at.max(free),
            pass,
        })
    }

    fn apply(&mut self, w: u32, c: Choice) {
        let pass = c.pass;
        let end = c.at + self.costs.duration(pass.kind, pass.stage);
        let i = self.idx(pass.stage, pass.mb);
        match pass.kind {
            PassKind::F => {
                self.f_end[i] = end;
                self.next_f[pass.stage as usize] += 1;
                if pass.stage == 0 {
                    self.last_inject = c.at;
                }
            }
            PassKind::B => {
                self.b_end[i] = end;
                self.next_b[pass.stage as usize] += 1;
                self.w_queue[pass.stage as usize].push_back(pass.mb);
            }
            // The list scheduler never makes a BW.
            PassKind::W | PassKind::BW => {
                self.w_queue[pass.stage as usize].pop_front();
            }
        }
        self.mem[w as usize] += self.costs.memory_change(pass);
        self.free[w as usize] = end;
        self.order[w as usize].push(pass);
    }
}

/// Every worker's next choice, with the earliest of them kept at the root of a tournament
/// tree: each node holds the earlier of its children's choices, the lower worker on equal
/// times (the first of a scan in worker order), so a change costs O(log d) rather than a
/// scan of every worker per placed pass.
struct Earliest {
    choice: Vec<Option<Choice>>,
    /// `winner[i]` for nodes `1..2 * leaves`: the worker that node's subtree picks (leaves
    /// at `leaves + w`; leaves past the last worker hold a worker without a choice).
    winner: Vec<u32>,
    leaves: usize,
}

impl Earliest {
    fn new(mut choice: Vec<Option<Choice>>) -> Earliest {
        let workers = choice.len();
        let leaves = workers.next_power_of_two();
        choice.resize(leaves, None);
        let mut winner = vec![0; 2 * leaves];
        for (w, slot) in winner[leaves..].iter_mut().enumerate() {
            *slot = w as u32;
        }
        let mut tree = Earliest {
            choice,
            winner,
            leaves,
        };
        for node in (1..leaves).rev() {
            tree.replay(node);
        }
        tree
    }

    /// The earliest choice and its worker, if any worker has one.
    fn first(&self) -> Option<(u32, Choice)> {
        let w = self.winner[1];
        self.choice[w as usize].map(|c| (w, c))
    }

    fn set(&mut self, w: u32, c: Option<Choice>) {
        self.choice[w as usize] = c;
        let mut node = (self.leaves + w as usize) / 2;
        while node >= 1 {
            self.replay(node);
            node /= 2;
        }
    }

    /// Recomputes `node` from its children: the left one wins unless the right one is
    /// strictly earlier (or the left has no choice).
    fn replay(&mut self, node: usize) {
        let (l, r) = (self.winner[2 * node], self.winner[2 * node + 1]);
        let right_first = match (self.choice[l as usize], self.choice[r as usize]) {
            (Some(a), Some(b)) => b.at.total_cmp(&a.at).is_lt(),
            (None, Some(_)) => true,
            _ => false,
        };
        self.winner[node] = if right_first { r } else { l };
    }
}

/// One list-scheduled V schedule for `d` workers and `n` microbatches under `limit`, or
/// `None` if the run deadlocks (a limit too tight for `p.reserve`).
pub(crate) fn list_v(
    d: u32,
    n: u32,
    costs: &Costs,
    limit: f64,
    name: &str,
    p: ListParams,
) -> Option<Schedule> {
    let mut schedule = Schedule::empty(name, Placement::V { workers: d }, n);
    schedule.workers = place_all(State::new(d, n, costs, limit, p), false)?;
    Some(schedule)
}

impl<'a> State<'a> {
    fn new(d: u32, n: u32, costs: &'a Costs, limit: f64, p: ListParams) -> State<'a> {
        let stages = 2 * d;
        let cells = (stages * n) as usize;
        State {
            d,
            n,
            costs,
            limit,
            p,
            next_f: vec![0; stages as usize],
            next_b: vec![0; stages as usize],
            f_end: vec![f64::NAN; cells],
            b_end: vec![f64::NAN; cells],
            w_queue: vec![VecDeque::new(); stages as usize],
            free: vec![0.0; d as usize],
            mem: vec![0.0; d as usize],
            last_inject: 0.0,
            order: vec![Vec::with_capacity(6 * n as usize); d as usize],
        }
    }
}

/// Places every pass from `st` on; the workers' orders, or `None` on a deadlock.
/// `neighbours` recomputes the choices of the placing worker's neighbours too after every
/// pass, not only of the workers whose choice it can change (the tests check that both
/// give the same schedule).
fn place_all(mut st: State<'_>, neighbours: bool) -> Option<Vec<Vec<Pass>>> {
    let (d, stages) = (st.d, 2 * st.d);
    let cells = (stages * st.n) as usize;
    let mut choice = Earliest::new((0..d).map(|w| st.decide(w)).collect());
    for _ in 0..3 * cells {
        let (w, c) = choice.first()?;
        st.apply(w, c);
        // Only two choices can change: the worker's own and, through the pass's successor,
        // that of the worker of the next stage (after an F) or of the previous one (after a
        // B); every other worker's choice reads nothing the pass changed.
        choice.set(w, st.decide(w));
        let s = c.pass.stage;
        let successor = match c.pass.kind {
            PassKind::F => (s + 1 < stages).then(|| st.worker(s + 1)),
            PassKind::B | PassKind::BW => s.checked_sub(1).map(|p| st.worker(p)),
            PassKind::W => None,
        };
        if let Some(v) = successor.filter(|&v| v != w) {
            choice.set(v, st.decide(v));
        }
        if neighbours {
            for v in w.saturating_sub(1)..=(w + 1).min(d - 1) {
                choice.set(v, st.decide(v));
            }
        }
    }
    Some(st.order)
}

/// The parameter grid (108 points for d ≥ 4, fewer distinct ones below, since d/4 and d/2
/// round to 0; run in this order while the budget lasts): no burst, then
/// bursts up to microbatch d/4 and d/2; two W policies; reserves of one and two activations;
/// gaps from "as fast as memory allows" to 1.5× the busiest worker's work per microbatch.
/// Then the same bursts and W policies with no reserve, at gaps from 0 to 1.1× that work:
/// at a tight limit a first-chunk forward may then take the last room (the run deadlocks
/// when an older microbatch needed it, and is dropped), and starting microbatches a little
/// faster than the steady state lets worker 0 fill its warm-up (unit times, d = 8, n = 16,
/// 4 units: 59.5, the App. E.2 bound, against 60 from every point with a reserve).
pub(crate) fn grid(d: u32, costs: &Costs) -> Vec<ListParams> {
    let work = busiest_work(d, costs);
    let mut out = Vec::new();
    for burst in [0, d / 4, d / 2] {
        for w_slack in [0.5, 1.0] {
            for reserve in [1.0, 2.0] {
                for g in [0.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5] {
                    out.push(ListParams {
                        gap: g * work,
                        reserve,
                        w_slack,
                        burst,
                    });
                }
            }
        }
    }
    for burst in [0, d / 4, d / 2] {
        for w_slack in [0.5, 1.0] {
            for g in [0.0, 0.9, 1.0, 1.1] {
                out.push(ListParams {
                    gap: g * work,
                    reserve: 0.0,
                    w_slack,
                    burst,
                });
            }
        }
    }
    out
}

/// The least activation memory any V schedule needs: on every worker both stages' activations
/// of one microbatch are live when its second-chunk forward starts. A run with a reserve of
/// one activation completes at this limit (the oldest microbatch in flight always finds room
/// ahead of it), so it is also the smallest limit list scheduling plans at.
pub(crate) fn memory_floor(d: u32, costs: &Costs) -> f64 {
    (0..d)
        .map(|w| costs.stages[w as usize].mem + costs.stages[(2 * d - 1 - w) as usize].mem)
        .fold(0.0, f64::max)
}

/// The most work per microbatch on any worker (F, B and W of both its stages).
fn busiest_work(d: u32, costs: &Costs) -> f64 {
    (0..d)
        .map(|w| {
            [w, 2 * d - 1 - w]
                .iter()
                .map(|&s| {
                    let c = &costs.stages[s as usize];
                    c.f + c.b + c.w
                })
                .sum::<f64>()
        })
        .fold(0.0, f64::max)
}

/// Grid points the pattern search starts from (the best few: the landscape has several
/// valleys).
const REFINED_STARTS: usize = 3;

/// Runs the list scheduler over [`grid`], then refines the best few points by pattern search
/// (the gap in steps from 4 % down to 0.5 % of the busiest worker's work per microbatch, the
/// burst by one or two microbatches, the other W policies and reserves), spending at most
/// `runs` runs. Returns the least-makespan run that the simulator confirms within `limit`,
/// with its simulation, and the number of runs made.
pub(crate) fn search(
    d: u32,
    n: u32,
    costs: &Costs,
    limit: f64,
    name: &str,
    runs: usize,
) -> Result<(Option<(Schedule, Simulation)>, usize)> {
    let mut s = Search {
        d,
        n,
        costs,
        limit,
        name,
        left: runs,
        tried: Vec::new(),
        best: None,
    };
    let mut ranked: Vec<(f64, ListParams)> = Vec::new();
    for p in grid(d, costs) {
        if let Some(makespan) = s.run(p)? {
            ranked.push((makespan, p));
        }
    }
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
    let work = busiest_work(d, costs);
    for &(makespan, start) in ranked.iter().take(REFINED_STARTS) {
        s.refine(start, makespan, work)?;
    }
    Ok((s.best, runs - s.left))
}

struct Search<'a> {
    d: u32,
    n: u32,
    costs: &'a Costs,
    limit: f64,
    name: &'a str,
    left: usize,
    tried: Vec<ListParams>,
    best: Option<(Schedule, Simulation)>,
}

impl Search<'_> {
    /// Runs `p` unless tried before or out of runs: its makespan if it fits the limit (and
    /// it is kept if it beats the best so far).
    fn run(&mut self, p: ListParams) -> Result<Option<f64>> {
        if self.left == 0 || p.gap < 0.0 || self.tried.contains(&p) {
            return Ok(None);
        }
        self.left -= 1;
        self.tried.push(p);
        let Some(schedule) = list_v(self.d, self.n, self.costs, self.limit, self.name, p) else {
            return Ok(None);
        };
        let sim = simulate(&schedule, self.costs)?;
        if sim.max_peak_memory() > self.limit + EPS {
            return Ok(None);
        }
        let makespan = sim.makespan;
        if self
            .best
            .as_ref()
            .is_none_or(|(_, b)| makespan + EPS < b.makespan)
        {
            self.best = Some((schedule, sim));
        }
        Ok(Some(makespan))
    }

    /// Pattern search from `cur` (whose run took `at`): the first improving neighbour, else a
    /// smaller gap step, until the step is below 0.5 % of `work` or the runs are spent.
    fn refine(&mut self, mut cur: ListParams, mut at: f64, work: f64) -> Result<()> {
        let mut step = 0.04 * work;
        // Relative, so that tiny pass times (or none) still end the search.
        let smallest_step = 0.005 * work;
        while self.left > 0 && step > 0.0 && step >= smallest_step * (1.0 - 1e-9) {
            let mut next = vec![
                ListParams {
                    gap: cur.gap - step,
                    ..cur
                },
                ListParams {
                    gap: cur.gap + step,
                    ..cur
                },
                ListParams {
                    burst: cur.burst + 1,
                    ..cur
                },
                ListParams {
                    burst: cur.burst.saturating_sub(1),
                    ..cur
                },
                ListParams {
                    burst: cur.burst + 2,
                    ..cur
                },
                ListParams {
                    burst: cur.burst.saturating_sub(2),
                    ..cur
                },
            ];
            for w_slack in [0.0, 0.25, 0.5, 1.0, 2.0] {
                next.push(ListParams { w_slack, ..cur });
            }
            for reserve in [1.0, 2.0, 3.0] {
                next.push(ListParams { reserve, ..cur });
            }
            let mut moved = false;
            for p in next {
                if let Some(m) = self.run(p)?
                    && m + EPS < at
                {
                    (cur, at, moved) = (p, m, true);
                    break;
                }
            }
            if !moved {
                step /= 2.0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::Times;
    use crate::simulate::simulate;

    fn costs(d: u32, comm: f64) -> Costs {
        let times = Times {
            f: 12.96,
            b: 13.22,
            w: 9.76,
            comm,
        };
        Costs::uniform(&Placement::V { workers: d }, times).expect("valid costs")
    }

    /// Every run that completes is a valid schedule of all 6dn passes, and its simulated peak
    /// stays within the limit.
    #[test]
    fn runs_validate_and_fit() {
        let mut completed = 0;
        for d in [1u32, 2, 4, 8] {
            for n in [1u32, d, 3 * d] {
                for comm in [0.0, 6.48] {
                    let c = costs(d, comm);
                    for limit in [f64::from(d + 2) / 2.0, f64::from(d)] {
                        for p in grid(d, &c) {
                            let Some(s) = list_v(d, n, &c, limit, "list", p) else {
                                continue;
                            };
                            completed += 1;
                            assert_eq!(s.num_passes(), (6 * d * n) as usize);
                            let sim = simulate(&s, &c).expect("a valid schedule");
                            assert!(
                                sim.max_peak_memory() <= limit + 1e-9,
                                "d={d} n={n} comm={comm} limit={limit} {p:?}: peak {}",
                                sim.max_peak_memory()
                            );
                        }
                    }
                }
            }
        }
        assert!(completed > 500, "only {completed} runs completed");
    }

    /// Recomputing only the choices a placed pass can change gives the schedule that
    /// recomputing the placing worker's and both its neighbours' gives, over the grid,
    /// limits, hops and uneven stages.
    #[test]
    fn recomputing_only_the_changed_choices_gives_the_same_schedule() {
        use crate::cost::StageCost;
        let mut completed = 0;
        for d in [1u32, 2, 3, 5, 8] {
            let uneven: Vec<StageCost> = (0..2 * d)
                .map(|s| StageCost {
                    f: 5.0 + f64::from(s % 4),
                    b: 6.0 + f64::from(s % 3),
                    w: 4.0,
                    mem: 0.25 + 0.1 * f64::from(s % 3),
                })
                .collect();
            let uneven =
                Costs::per_stage(&Placement::V { workers: d }, uneven, 2.0).expect("costs");
            for c in [costs(d, 0.0), costs(d, 6.48), uneven] {
                for n in [1u32, d + 1, 3 * d] {
                    for limit in [memory_floor(d, &c), f64::from(d + 2) / 2.0, f64::from(d)] {
                        for p in grid(d, &c) {
                            let run = |all| place_all(State::new(d, n, &c, limit, p), all);
                            let (fast, full) = (run(false), run(true));
                            assert_eq!(fast, full, "d={d} n={n} limit={limit} {p:?}");
                            completed += usize::from(fast.is_some());
                        }
                    }
                }
            }
        }
        assert!(completed > 500, "only {completed} runs completed");
    }

    /// The tournament tree picks what a scan in worker order picks: the earliest choice,
    /// the lowest worker on equal times, nothing when no worker has a choice.
    #[test]
    fn the_earliest_choice_is_the_first_of_a_scan() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for workers in [1usize, 2, 3, 5, 8, 13] {
            let mut choices: Vec<Option<Choice>> = vec![None; workers];
            let mut tree = Earliest::new(choices.clone());
            for mb in 0..400u32 {
                let w = next(workers as u64) as usize;
                // Few distinct times, so that ties are common; a quarter without a choice.
                let c = (next(4) != 0).then(|| Choice {
                    at: next(5) as f64,
                    pass: Pass::f(w as u32, mb),
                });
                choices[w] = c;
                tree.set(w as u32, c);
                let scan = choices
                    .iter()
                    .enumerate()
                    .filter_map(|(w, c)| c.map(|c| (w as u32, c)))
                    .min_by(|a, b| a.1.at.total_cmp(&b.1.at));
                let key = |(w, c): (u32, Choice)| (w, c.at, c.pass);
                assert_eq!(tree.first().map(key), scan.map(key), "{workers} workers");
            }
        }
    }

    /// A limit below one microbatch's first and last chunk on worker 0 cannot be met: the run
    /// stops with `None` instead of looping or overrunning the limit.
    #[test]
    fn a_limit_too_small_deadlocks_cleanly() {
        let c = costs(4, 6.48);
        let p = grid(4, &c)[0];
        assert!(list_v(4, 8, &c, 0.5, "list", p).is_none());
    }

    /// The search keeps within its run budget, and its pattern search only improves on the
    /// best grid point.
    #[test]
    fn search_respects_the_budget_and_improves_on_the_grid() {
        let (d, n, limit) = (4u32, 8u32, 3.0);
        let c = costs(d, 6.48);
        let mut grid_best = f64::INFINITY;
        for p in grid(d, &c) {
            if let Some(s) = list_v(d, n, &c, limit, "list", p) {
                let sim = simulate(&s, &c).expect("a valid schedule");
                if sim.max_peak_memory() <= limit + 1e-9 {
                    grid_best = grid_best.min(sim.makespan);
                }
            }
        }
        assert!(grid_best.is_finite());
        let (best, made) = search(d, n, &c, limit, "list", 10_000).expect("search");
        let (schedule, sim) = best.expect("a fitting run");
        assert!(
            made > grid(d, &c).len(),
            "the pattern search ran ({made} runs)"
        );
        assert!(sim.makespan <= grid_best + 1e-9);
        assert!(sim.max_peak_memory() <= limit + 1e-9);
        assert_eq!(simulate(&schedule, &c).expect("valid"), sim);
        let (_, made) = search(d, n, &c, limit, "list", 5).expect("search");
        assert_eq!(made, 5);
    }

    /// At the memory floor (here with heterogeneous stages, so the floor is set by one worker
    /// and the others have room to run ahead), every run with a reserve of one activation
    /// completes and fits (a larger reserve may not start at all, and no reserve may
    /// deadlock), and nothing fits below.
    #[test]
    fn the_memory_floor_plans_and_nothing_below_it_does() {
        use crate::cost::StageCost;
        let d = 4u32;
        let stages: Vec<StageCost> = (0..2 * d)
            .map(|s| StageCost {
                f: 5.0 + f64::from(s),
                b: 6.0,
                w: 4.0,
                mem: 0.25 + 0.1 * f64::from(s % 3),
            })
            .collect();
        let c = Costs::per_stage(&Placement::V { workers: d }, stages, 2.0).expect("costs");
        let floor = memory_floor(d, &c);
        for n in [1u32, 4, 9] {
            for p in grid(d, &c) {
                let Some(s) = list_v(d, n, &c, floor, "list", p) else {
                    assert!(p.reserve != 1.0, "n={n} {p:?} deadlocked at the floor");
                    continue;
                };
                let sim = simulate(&s, &c).expect("a valid schedule");
                assert!(sim.max_peak_memory() <= floor + 1e-9, "{p:?}");
            }
            let (best, _) = search(d, n, &c, floor - 1e-3, "list", 50).expect("search");
            assert!(best.is_none(), "a run fit below the floor");
        }
    }

    /// With vanishing pass times the pattern search still ends by its step rule, long before
    /// a large run budget is spent.
    #[test]
    fn the_pattern_search_ends_with_tiny_pass_times() {
        let times = Times {
            f: 1e-12,
            b: 1e-12,
            w: 1e-12,
            comm: 0.0,
        };
        let c = Costs::uniform(&Placement::V { workers: 2 }, times).expect("valid costs");
        let (best, made) = search(2, 3, &c, 2.0, "list", 1_000_000).expect("search");
        assert!(best.is_some());
        assert!(made < 1_000, "{made} runs");
    }
}
