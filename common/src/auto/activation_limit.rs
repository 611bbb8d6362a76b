//! The activation limit an adaptive kind is searched under: one limit for every worker,
//! as large as still fits every worker's static state plus its peak, then lowered for the
//! least memory that keeps the step time (see the [auto-planner's docs](super), step 4).

use super::candidate::{REL_EPS, Why};
use super::worker_memory::{activation_bytes, static_reason, worker_bytes};
use crate::cost::Costs;
use crate::error::{Error, Result};
use crate::generate::{Bounds, Planned, ScheduleKind, adaptive_v, adaptive_zb};
use crate::render::report::fmt_bytes;
use crate::schedule::Schedule;
use crate::simulate::Simulation;

/// Extra searches of an adaptive kind, bisecting the activation limit for the least memory
/// that keeps the fastest makespan (the search itself breaks makespan ties by bubble).
pub const ADAPTIVE_DESCENT_STEPS: usize = 8;

/// Extra searches of an adaptive kind, bisecting the activation limit between the room on
/// the fullest worker and the room on the emptiest for the largest limit that still fits
/// every worker (when the emptiest worker's room does not).
pub const ADAPTIVE_ASCENT_STEPS: usize = 6;

/// What the activation-limit search gave for an adaptive kind.
pub(super) enum Searched {
    /// A schedule that fits every worker, its simulation, and how it was found.
    Fits(Box<(Schedule, Simulation)>, String),
    /// None fits: the class of reason, the reason, and the bytes the least-memory
    /// schedule needs on its fullest worker when known.
    Rejected(Why, String, Option<u64>),
}

/// Searches `kind` (adaptive V or adaptive zero bubble) on `d` workers and `n`
/// microbatches under `costs` for a schedule that fits `budget` on every worker holding
/// `static_bytes` of training state.
pub(super) fn search_limit(
    kind: ScheduleKind,
    d: u32,
    n: u32,
    costs: &Costs,
    static_bytes: &[u64],
    budget: u64,
) -> Result<Searched> {
    let room = static_bytes
        .iter()
        .map(|&s| budget as f64 - s as f64)
        .fold(f64::INFINITY, f64::min);
    let search = |limit: f64| match kind {
        ScheduleKind::AdaptiveV => adaptive_v(d, n, costs, Bounds::limit(limit)),
        _ => adaptive_zb(d, n, costs, Bounds::limit(limit)),
    };
    // The bytes the fullest worker of a schedule needs.
    let needs = |sim: &Simulation| {
        worker_bytes(static_bytes, &activation_bytes(sim))
            .into_iter()
            .max()
            .unwrap_or(0)
    };
    // What the least-memory schedule (the one found at the smallest limit the search
    // accepts) needs: a budget this procedure accepts (it tries that limit).
    let least_need = |smallest: f64| match search(smallest) {
        Ok(p) => Some(needs(&p.simulation)),
        Err(_) => None,
    };
    if room < 1.0 {
        // Static state alone does not fit: ask for the smallest activation limit.
        let needed = match search(f64::MIN_POSITIVE) {
            Err(Error::MemoryLimit { smallest, .. }) => least_need(smallest),
            _ => None,
        };
        return Ok(Searched::Rejected(
            Why::DoesNotFit,
            static_reason(static_bytes, budget),
            needed,
        ));
    }
    let fits_all = |sim: &Simulation| needs(sim) <= budget;
    // One limit serves every worker: first the room on the emptiest worker (kept only
    // if every worker then fits), then the room on the fullest one (always fits).
    let min_static = static_bytes.iter().copied().min().unwrap_or(0);
    let optimistic = budget as f64 - min_static as f64;
    let mut found: Option<(crate::generate::Planned, f64)> = None;
    let mut failure: Option<Error> = None;
    // The need of the least-memory schedule, when it was planned and did not fit.
    let mut least: Option<u64> = None;
    match search(optimistic) {
        Ok(p) if fits_all(&p.simulation) => found = Some((p, optimistic)),
        Ok(_) => {}
        Err(e) => failure = Some(e),
    }
    if found.is_none() && optimistic > room {
        match search(room) {
            Ok(p) => found = Some(widen_limit(&search, &fits_all, p, room, optimistic)?),
            // No schedule fits in the room on the fullest worker; the least-memory one
            // may still fit every worker when its peaks fall on the emptier ones.
            Err(Error::MemoryLimit {
                schedule,
                limit,
                smallest,
            }) => match search(smallest) {
                Ok(p) if fits_all(&p.simulation) => {
                    found = Some(widen_limit(&search, &fits_all, p, smallest, optimistic)?);
                }
                Ok(p) => {
                    failure = Some(Error::MemoryLimit {
                        schedule,
                        limit,
                        smallest,
                    });
                    least = Some(needs(&p.simulation));
                }
                Err(e) => failure = Some(e),
            },
            Err(e) => failure = Some(e),
        }
    }
    Ok(match (found, failure) {
        (Some((mut planned, mut limit)), _) => {
            // The search breaks makespan ties by bubble, not memory: bisect the limit
            // for the least memory that keeps the makespan.
            let best_ms = planned.simulation.makespan * (1.0 + REL_EPS);
            let mut lo = 0.0f64;
            for _ in 0..ADAPTIVE_DESCENT_STEPS {
                let hi = planned.simulation.max_peak_memory();
                if hi - lo <= 0.01 * hi {
                    break;
                }
                let mid = 0.5 * (lo + hi);
                match search(mid) {
                    Ok(p) if p.simulation.makespan <= best_ms && fits_all(&p.simulation) => {
                        planned = p;
                        limit = mid;
                    }
                    Ok(_) | Err(Error::MemoryLimit { .. }) => lo = mid,
                    Err(e) => return Err(e),
                }
            }
            Searched::Fits(
                Box::new((planned.schedule, planned.simulation)),
                format!(
                    "searched under an activation limit of {} per worker, the lowest found \
                     that keeps its step time (the budget leaves {} for activations on the \
                     fullest worker, {} on the emptiest)",
                    fmt_bytes(limit),
                    fmt_bytes(room),
                    fmt_bytes(optimistic)
                ),
            )
        }
        (None, Some(Error::MemoryLimit { smallest, .. })) => {
            let needed = least.or_else(|| least_need(smallest));
            return Ok(Searched::Rejected(
                Why::DoesNotFit,
                format!(
                    "does not fit: the smallest {} schedule needs {} of activations per \
                     worker, {} are left after the static state{}",
                    kind.name(),
                    fmt_bytes(smallest.ceil()),
                    fmt_bytes(room),
                    needed.map_or(String::new(), |b| format!(
                        " (it needs {} on its fullest worker)",
                        fmt_bytes(b as f64)
                    ))
                ),
                needed,
            ));
        }
        (None, Some(e)) => {
            return Ok(Searched::Rejected(
                Why::Skipped,
                format!("skipped: {e}"),
                None,
            ));
        }
        (None, None) => {
            return Ok(Searched::Rejected(
                Why::DoesNotFit,
                format!(
                    "does not fit: no {} schedule fits every worker",
                    kind.name()
                ),
                None,
            ));
        }
    })
}

/// Between `fitting` (whose schedule `at` fits every worker) and `optimistic` (whose
/// schedule did not), bisects the activation limit for the largest one whose schedule still
/// fits every worker; returns the fastest fitting schedule seen and its limit.
fn widen_limit(
    search: &dyn Fn(f64) -> Result<Planned>,
    fits_all: &dyn Fn(&Simulation) -> bool,
    at: Planned,
    fitting: f64,
    optimistic: f64,
) -> Result<(Planned, f64)> {
    let (mut lo, mut hi) = (fitting, optimistic);
    let mut best = (at, fitting);
    for _ in 0..ADAPTIVE_ASCENT_STEPS {
        if hi - lo <= 0.01 * hi {
            break;
        }
        let mid = 0.5 * (lo + hi);
        match search(mid) {
            Ok(p) if fits_all(&p.simulation) => {
                if p.simulation.makespan < best.0.simulation.makespan {
                    best = (p, mid);
                }
                lo = mid;
            }
            Ok(_) | Err(Error::MemoryLimit { .. }) => hi = mid,
            Err(e) => return Err(e),
        }
    }
    Ok(best)
}
