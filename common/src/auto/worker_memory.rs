//! What each worker of a planned configuration holds: its static training state plus its
//! simulated activation peak.

use crate::render::report::fmt_bytes;
use crate::simulate::Simulation;

/// Each worker's simulated activation peak, in whole bytes.
pub(super) fn activation_bytes(sim: &Simulation) -> Vec<u64> {
    sim.peak_memory.iter().map(|m| m.ceil() as u64).collect()
}

/// What each worker holds: its static state plus its activation peak.
pub(super) fn worker_bytes(static_bytes: &[u64], activation_bytes: &[u64]) -> Vec<u64> {
    static_bytes
        .iter()
        .zip(activation_bytes)
        .map(|(s, a)| s.saturating_add(*a))
        .collect()
}

/// "parameters and optimizer state need X on worker w" for the fullest worker.
pub(super) fn static_reason(static_bytes: &[u64], budget: u64) -> String {
    let (w, bytes) = static_bytes
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|&(_, b)| b)
        .unwrap_or((0, 0));
    format!(
        "does not fit: parameters and optimizer state need {} on worker {w} > budget {}",
        fmt_bytes(bytes as f64),
        fmt_bytes(budget as f64)
    )
}
