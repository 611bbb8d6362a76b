//! What both adaptive searches share: the planned result, the comparison of candidates,
//! the best few starts of the local search and its end.

use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::generate::local::improve;
use crate::generate::order::in_microbatch_order;
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

pub(super) const EPS: f64 = 1e-9;

/// A planned schedule with its simulation and what the search did.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The schedule.
    pub schedule: Schedule,
    /// Its simulation under the costs it was planned for.
    pub simulation: Simulation,
    /// Building blocks (or warm-up shapes) considered.
    pub considered: usize,
    /// Candidates evaluated at full size: realised blocks, and list-scheduling runs
    /// (counted even when a run deadlocks and so is never simulated).
    pub evaluated: usize,
    /// Makespan of the best schedule found before the local search (the best of its
    /// starts; the result is never longer).
    pub before_local_search: f64,
}

pub(super) fn better(a: &Simulation, b: &Simulation) -> bool {
    a.makespan + EPS < b.makespan
        || (a.makespan <= b.makespan + EPS && a.bubble_span + EPS < b.bubble_span)
}

/// Checks the inputs of both searches: `d` and `n` at least 1, a finite positive `limit`,
/// and costs for every stage of `placement`.
pub(super) fn check_inputs(
    d: u32,
    n: u32,
    limit: f64,
    costs: &Costs,
    placement: &Placement,
) -> Result<()> {
    crate::generate::counts::check_counts(d, n)?;
    if !limit.is_finite() || limit <= 0.0 {
        return Err(Error::InvalidArgument {
            field: "memory limit",
            reason: format!("must be a finite number > 0, got {limit}"),
        });
    }
    costs.check_for(placement)
}

/// Keeps `candidate` in `best` if it is better.
pub(super) fn keep_better(
    best: &mut Option<(Schedule, Simulation)>,
    candidate: Option<(Schedule, Simulation)>,
) {
    if let Some((s, sim)) = candidate
        && best.as_ref().is_none_or(|(_, b)| better(&sim, b))
    {
        *best = Some((s, sim));
    }
}

/// Passes per schedule up to which the local search starts from the [`STARTS`] best
/// distinct schedules rather than from the best alone (where it ends is not monotone in
/// where it starts: a larger limit whose best start is better could end worse).
const SEVERAL_STARTS_UP_TO: usize = 4096;

/// Starts of the local search on small shapes.
const STARTS: usize = 3;

/// Simulated passes the local search may spend inside [`generate`] (about 0.1–0.3 s).
///
/// [`generate`]: crate::generate::generate
pub const LOCAL_SEARCH_BUDGET: u64 = 3_000_000;

/// What bounds an adaptive search: the activation memory every worker's simulated peak
/// must fit (in the costs' memory units), and the local search's budget in pass
/// simulations (0 turns it off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// The activation memory limit.
    pub limit: f64,
    /// Pass simulations the local search may spend.
    pub local_search_budget: u64,
}

impl Bounds {
    /// `limit`, with the default local search ([`LOCAL_SEARCH_BUDGET`]).
    pub const fn limit(limit: f64) -> Bounds {
        Bounds {
            limit,
            local_search_budget: LOCAL_SEARCH_BUDGET,
        }
    }

    /// `limit`, without the local search.
    pub const fn without_local_search(limit: f64) -> Bounds {
        Bounds {
            limit,
            local_search_budget: 0,
        }
    }
}

/// The best few distinct schedules found (best first) under a memory limit: the local
/// search's starts, which it improves within that limit and budget.
pub(super) struct Starts {
    kept: Vec<(Schedule, Simulation)>,
    size: usize,
    bounds: Bounds,
}

impl Starts {
    /// Room for [`STARTS`] schedules of `passes` passes each if that is at most
    /// [`SEVERAL_STARTS_UP_TO`], else one.
    pub(super) fn new(passes: usize, bounds: Bounds) -> Starts {
        let size = if passes <= SEVERAL_STARTS_UP_TO {
            STARTS
        } else {
            1
        };
        Starts {
            kept: Vec::with_capacity(size + 1),
            size,
            bounds,
        }
    }

    /// Keeps `candidate` if it is among the best few and not one already kept.
    pub(super) fn offer(&mut self, candidate: Option<(Schedule, Simulation)>) {
        let Some((schedule, sim)) = candidate else {
            return;
        };
        if self.kept.iter().any(|(s, _)| s.workers == schedule.workers) {
            return;
        }
        let at = self.kept.partition_point(|(_, b)| !better(&sim, b));
        if at < self.size {
            self.kept.insert(at, (schedule, sim));
            self.kept.truncate(self.size);
        }
    }

    /// [`Starts::offer`] if the candidate fits the limit.
    pub(super) fn offer_fitting(&mut self, candidate: (Schedule, Simulation)) {
        if candidate.1.max_peak_memory() <= self.bounds.limit + EPS {
            self.offer(Some(candidate));
        }
    }

    /// The end of both searches: the typed error if nothing fit (`smallest`: the smallest
    /// limit that would), else the local search from each start, the best result and its
    /// simulation.
    pub(super) fn conclude(
        self,
        name: &str,
        costs: &Costs,
        smallest: f64,
        (considered, evaluated): (usize, usize),
    ) -> Result<Planned> {
        let Bounds {
            limit,
            local_search_budget: budget,
        } = self.bounds;
        let before = self.kept.first().map(|(_, sim)| sim.makespan);
        let mut best: Option<(Schedule, Simulation)> = None;
        for (schedule, _) in self.kept {
            // W slots in microbatch order (same timeline and peaks): see `generate::order`.
            let schedule = in_microbatch_order(improve(schedule, costs, limit, budget)?);
            let simulation = simulate(&schedule, costs)?;
            keep_better(&mut best, Some((schedule, simulation)));
        }
        let (Some(before), Some((schedule, simulation))) = (before, best) else {
            return Err(Error::MemoryLimit {
                schedule: name.into(),
                limit,
                smallest,
            });
        };
        Ok(Planned {
            schedule,
            simulation,
            considered,
            evaluated,
            before_local_search: before,
        })
    }
}

/// Keeps the better of `best` and `candidate` if the candidate fits `limit`.
pub(super) fn consider(
    best: &mut Option<(Schedule, Simulation)>,
    candidate: Schedule,
    costs: &Costs,
    limit: f64,
) -> Result<()> {
    let sim = simulate(&candidate, costs)?;
    consider_simulated(best, (candidate, sim), limit);
    Ok(())
}

/// [`consider`] for a candidate already simulated under the same costs.
pub(super) fn consider_simulated(
    best: &mut Option<(Schedule, Simulation)>,
    (candidate, sim): (Schedule, Simulation),
    limit: f64,
) {
    if sim.max_peak_memory() > limit + EPS {
        return;
    }
    if best.as_ref().is_none_or(|(_, b)| better(&sim, b)) {
        *best = Some((candidate, sim));
    }
}
