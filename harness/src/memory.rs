//! The memory-pressure switch: a worker registers a memory budget and may report bytes no
//! plan predicts, as a worker process does with `--memory-bytes` and `--unplanned-bytes`.

use pipewise_worker::node::NodeConfig;

use crate::Builder;

/// A worker's memory as the coordinator sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Memory {
    /// The device memory it registers (bytes).
    budget: u64,
    /// The bytes it reports holding beyond what its stages compute.
    unplanned: u64,
}

impl Memory {
    pub(crate) fn apply(self, config: &mut NodeConfig) {
        config.memory_bytes = self.budget;
        config.unplanned_bytes = self.unplanned;
    }
}

impl Builder {
    /// Worker `w` registers `budget` bytes of device memory and reports holding
    /// `unplanned` bytes more than its stages hold after every step.
    pub fn memory(mut self, w: usize, budget: u64, unplanned: u64) -> Self {
        self.memory.push((w, Memory { budget, unplanned }));
        self
    }
}
