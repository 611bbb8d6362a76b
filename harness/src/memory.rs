//! A worker's memory as the coordinator sees it: the budget it registers and what it
//! reports holding beyond what its passes compute.

use crate::Builder;

impl Builder {
    /// Worker `w` registers `budget` bytes of device memory and reports `unplanned` bytes
    /// more than its passes hold after every step (memory no plan predicts), so that the
    /// coordinator's after-a-step check moves a job that overflows it.
    pub fn memory(mut self, w: usize, budget: u64, unplanned: u64) -> Self {
        self.memory.push((w, budget, unplanned));
        self
    }
}
