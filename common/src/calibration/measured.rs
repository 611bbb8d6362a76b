//! The cost model as the auto-planner takes it ([`Measured`]), and rescaling it when a
//! plan changes the microbatch size.

use super::{CostModel, DEFAULT_SECS_PER_BYTE};
use crate::auto::Measured;
use crate::auto::job::Overheads;
use crate::run::worker::Worker;

impl CostModel {
    /// The costs as they stand for `workers` (by index): per-piece pass times in
    /// milliseconds at the model's microbatch size, every worker's speed factor, the hop per
    /// sequence; and the end-of-step sync and the replicas' sums.
    pub fn measured(&mut self, workers: &[Worker]) -> (Measured, Overheads) {
        let worker_factors = self.worker_factors(workers);
        let pieces = self.piece_costs().map(|c| [c.f, c.b, c.w].map(|s| s * 1e3));
        let sequence = self.frame_bytes() / u64::from(self.microbatch_size.max(1));
        let per_byte = self.secs_per_byte.get().unwrap_or(DEFAULT_SECS_PER_BYTE);
        let measured = Measured {
            pieces,
            microbatch_size: self.microbatch_size,
            worker_factors,
            hop_ms_per_sequence: sequence as f64 * per_byte * 1e3,
        };
        let overheads = Overheads {
            sync_ms: self.sync.get().unwrap_or(0.0) * 1e3,
            sum_ms_per_value: self
                .secs_per_value
                .get()
                .unwrap_or(super::all_reduce::DEFAULT_SECS_PER_VALUE)
                * 1e3,
        };
        (measured, overheads)
    }

    /// Moves the model to microbatches of `size`: pass times scale with the sequences in a
    /// microbatch (the FLOPs do), the per-byte hop cost and the sync stay.
    pub fn rescale(&mut self, size: u32) {
        if size == 0 || size == self.microbatch_size {
            return;
        }
        let ratio = f64::from(size) / f64::from(self.microbatch_size);
        for mean in self.samples.values_mut() {
            mean.value *= ratio;
        }
        if let Some((costs, _)) = &mut self.fitted {
            for c in costs.iter_mut() {
                *c *= ratio;
            }
        }
        if let Some(held) = &mut self.held {
            for c in held.iter_mut() {
                *c *= ratio;
            }
        }
        self.microbatch_size = size;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::job::example;

    fn worker(id: &str, flops: u64) -> Worker {
        Worker {
            id: id.into(),
            address: String::new(),
            memory_bytes: 1 << 30,
            incarnation: 1,
            flops_per_second: flops,
            millicores: 0,
            host: String::new(),
        }
    }

    /// Before any step: the FLOPs prior over each worker's profile; a worker half as fast
    /// as the other costs twice as much, and rescaling doubles the piece times.
    #[test]
    fn measured_costs_follow_the_profiles_and_the_microbatch_size() {
        let spec = example(2, "auto");
        let mut model = CostModel::new(spec.model, 1);
        let workers = [worker("a", 2_000_000_000), worker("b", 1_000_000_000)];
        let (m, overheads) = model.measured(&workers);
        assert_eq!(overheads.sync_ms, 0.0);
        assert_eq!(m.microbatch_size, 1);
        let ratio = m.worker_factors[1] / m.worker_factors[0];
        assert!((ratio - 2.0).abs() < 1e-9, "{:?}", m.worker_factors);
        let block = m.pieces[1][0];
        assert!(block > 0.0);
        model.rescale(4);
        let (m4, _) = model.measured(&workers);
        assert_eq!(m4.microbatch_size, 4);
        assert!((m4.pieces[1][0] / block - 4.0).abs() < 1e-9);
        assert!((m4.hop_ms_per_sequence - m.hop_ms_per_sequence).abs() < 1e-15);
    }
}
