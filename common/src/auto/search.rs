//! The auto-planner's search: every microbatch size and kind planned, the fitting plans
//! ranked by predicted step time.

use std::collections::BTreeMap;

use super::candidate::{AutoPlan, Candidate, Outcome, REL_EPS, Rejected, Why};
use super::configuration::plan_one;
use super::request::{AutoRequest, piece_costs};
use crate::error::{Error, Result};
use crate::generate::ScheduleKind;
use crate::render::report::fmt_bytes;

/// The schedules the auto-planner considers, in tie-break order: `--compare` order less the
/// kinds the module documentation says it leaves out.
pub fn auto_kinds() -> impl Iterator<Item = ScheduleKind> {
    ScheduleKind::ALL.into_iter().filter(|kind| {
        !matches!(
            kind,
            ScheduleKind::Eager1F1B | ScheduleKind::LoopedBfs | ScheduleKind::DualPipeV
        )
    })
}

/// Plans every configuration of `req` and ranks the ones that fit.
///
/// Fails with [`Error::InvalidArgument`] on an invalid request, or with field
/// `"memory per worker"` when nothing fits, naming the smallest budget that would, or with
/// field `"workers"` when nothing can be planned at any budget (e.g. fewer model pieces
/// than stages), naming the reasons.
pub fn auto_plan(req: &AutoRequest) -> Result<AutoPlan> {
    req.validate()?;
    let per_param = req.spec.dtype.training_state_bytes();
    let mut planned: Vec<Candidate> = Vec::new();
    let mut rejected: Vec<Rejected> = Vec::new();
    for shape in req.shapes() {
        // One replica's pipeline, on its share of the batch.
        let sub = req.shape(shape);
        let batch = sub.global_batch;
        let sizes = (1..=batch).filter(|b| {
            batch.is_multiple_of(*b) && req.fixed.microbatch_size.is_none_or(|f| f == *b)
        });
        for mbs in sizes {
            let n = batch / mbs;
            let pieces = piece_costs(&sub, mbs);
            // The kinds with the same stages' workers share the partition of these pieces.
            let mut partitions = BTreeMap::new();
            for kind in auto_kinds() {
                match plan_one(&sub, kind, mbs, n, &pieces, per_param, &mut partitions)? {
                    Outcome::Planned(c) => planned.push(*c),
                    Outcome::Rejected(r) => rejected.push(r),
                }
            }
        }
    }
    // Fastest first; then less memory; then the lower bubble; then search order (stable).
    planned.sort_by(|a, b| {
        let tol = REL_EPS * a.step_ms.max(b.step_ms);
        if (a.step_ms - b.step_ms).abs() > tol {
            a.step_ms.total_cmp(&b.step_ms)
        } else {
            a.max_worker_bytes
                .cmp(&b.max_worker_bytes)
                .then(a.bubble.total_cmp(&b.bubble))
        }
    });
    let (fits, no_fit): (Vec<Candidate>, Vec<Candidate>) =
        planned.into_iter().partition(|c| c.fits);
    for c in no_fit {
        let worst = c
            .worker_bytes
            .iter()
            .enumerate()
            .max_by_key(|&(_, b)| *b)
            .map_or(0, |(w, _)| w);
        rejected.push(Rejected {
            config: c.config,
            why: Why::DoesNotFit,
            reason: format!(
                "does not fit: worker {worst} needs {} > budget {} ({} static + {} activations)",
                fmt_bytes(c.max_worker_bytes as f64),
                fmt_bytes(req.memory_per_worker as f64),
                fmt_bytes(c.static_bytes[worst] as f64),
                fmt_bytes(c.activation_bytes[worst] as f64)
            ),
            needed_bytes: Some(c.max_worker_bytes),
            step_ms: Some(c.step_ms),
        });
    }
    if fits.is_empty() {
        let smallest = rejected
            .iter()
            .filter_map(|r| r.needed_bytes.map(|b| (b, r.label())))
            .min_by_key(|(b, _)| *b);
        let reason = match smallest {
            Some((u64::MAX, _)) => format!(
                "no plan fits {} bytes per worker; every plan needs more than 2^64 bytes",
                req.memory_per_worker
            ),
            Some((bytes, what)) => format!(
                "no plan fits {} bytes per worker; the smallest plan needs {bytes} bytes ({what})",
                req.memory_per_worker
            ),
            None => {
                // Nothing was even planned: the reasons are the shape's, not the budget's.
                let mut why: Vec<&str> = Vec::new();
                for r in &rejected {
                    if !why.contains(&r.reason.as_str()) {
                        why.push(&r.reason);
                    }
                }
                return Err(Error::InvalidArgument {
                    field: "workers",
                    reason: format!(
                        "no schedule could be planned for {} workers, {} layers and a global \
                         batch of {}: {}",
                        req.workers,
                        req.spec.layers,
                        req.global_batch,
                        why.iter().take(3).copied().collect::<Vec<_>>().join("; ")
                    ),
                });
            }
        };
        return Err(Error::InvalidArgument {
            field: "memory per worker",
            reason,
        });
    }
    let fitting = fits.len();
    let best_ms = fits[0].step_ms;
    let mut ranked = Vec::with_capacity(req.top.min(fitting));
    for (i, c) in fits.into_iter().enumerate() {
        if i < req.top {
            ranked.push(c);
        } else {
            rejected.push(Rejected {
                config: c.config,
                why: Why::Slower,
                reason: format!("slower: step {:.3} ms vs best {best_ms:.3} ms", c.step_ms),
                needed_bytes: Some(c.max_worker_bytes),
                step_ms: Some(c.step_ms),
            });
        }
    }
    Ok(AutoPlan {
        params: req.spec.params(),
        bytes_per_param: per_param,
        memory_per_worker: req.memory_per_worker,
        tokens_per_step: u64::from(req.global_batch) * u64::from(req.spec.seq_len),
        fitting,
        ranked,
        rejected,
    })
}
