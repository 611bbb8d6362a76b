//! What a run knows of its workers: who they are, and what each reports after a step.

use std::collections::BTreeMap;

use crate::trace::Span;

/// A registered worker process, as a run sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Worker {
    /// Worker id (unique per live process).
    pub id: String,
    /// Address of its activation service (its peers connect there).
    pub address: String,
    /// The device memory it registered (0: not given).
    pub memory_bytes: u64,
    /// Which registration this is: a process that registers again under a known id is a
    /// later one, so a run holding the earlier one has lost that worker.
    pub incarnation: u64,
    /// The speed its start-up profile measured (FLOP/s; 0: not given).
    pub flops_per_second: u64,
    /// Thousandths of a core it may count on while every worker sharing its host computes
    /// (0: not given; `pipewise local`'s threads on fewer cores than workers get less than
    /// 1000).
    pub millicores: u32,
    /// Its host as the shared-memory tier sees it (empty: not known, or the tier is off):
    /// workers with the same non-empty host exchange frames through shared memory.
    pub host: String,
}

/// One stage's mean measured pass times in a step (seconds; a fused `BW` counts as `b`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StageTimes {
    /// The stage.
    pub stage: u32,
    /// Mean forward.
    pub f: f64,
    /// Mean input-gradient (or fused) backward.
    pub b: f64,
    /// Mean weight-gradient backward.
    pub w: f64,
    /// Of `f`, `b` and `w`, the part spent in the stage's embedding or head piece (0: not
    /// measured, or the stage holds both): with it the cost model tells a costly piece from
    /// a slow worker on one split.
    pub edge: [f64; 3],
}

/// One worker's report of one step of a run, or of its end: what the worker's executor
/// measured, named by the worker that ran it. The worker sends it and the coordinator's run
/// takes it as it is (`pipewise_proto::convert` carries it over the wire).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepReport {
    /// The run (the assignment's `run`).
    pub run: u64,
    /// The worker's index in its replica's pipeline.
    pub worker_index: u32,
    /// The worker's data-parallel replica (0 with one).
    pub replica: u32,
    /// The worker's id.
    pub worker_id: String,
    /// The step (0-based).
    pub step: u64,
    /// The step's mean loss (NaN on workers without the head).
    pub loss: f64,
    /// Wall time of the step on this worker.
    pub wall_secs: f64,
    /// Time in passes.
    pub busy_secs: f64,
    /// Time the worker's waits for peers spent waiting for a core once the data was there.
    pub core_wait_secs: f64,
    /// Time in passes spent waiting for a core (part of `busy_secs`).
    pub pass_core_wait_secs: f64,
    /// Peak activation bytes in the step: the largest stash (bytes for pending `B` and `W`
    /// over all the worker's stages) seen at a pass boundary.
    pub peak_activation_bytes: u64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// Parameters, gradients and optimizer state held.
    pub static_bytes: u64,
    /// Mean pass times per stage the worker ran.
    pub stage_times: Vec<StageTimes>,
    /// Activation and gradient bytes sent to each peer worker (by index).
    pub bytes_sent: BTreeMap<u32, u64>,
    /// Activation and gradient bytes received from each peer worker (by index).
    pub bytes_received: BTreeMap<u32, u64>,
    /// What the worker did when (empty: not recorded, or not readable).
    pub spans: Vec<Span>,
    /// Why the worker gave up on the run (empty: it did not).
    pub error: String,
    /// With `error`: the worker gave up while starting the run, before running `step`.
    pub starting: bool,
    /// The worker finished its part of the run (no step in this report).
    pub done: bool,
    /// With `done`: where the worker wrote its final parameters.
    pub params_path: String,
    /// `[validation]`: the validation loss, on a step after which the job evaluated.
    pub validation_loss: Option<f64>,
    /// `[validation]`: the validation loss before the job's first step, on that step's
    /// report.
    pub initial_validation_loss: Option<f64>,
}

impl StepReport {
    /// The bytes the worker held at its peak: activations and training state.
    pub fn held_bytes(&self) -> u64 {
        self.peak_activation_bytes.saturating_add(self.static_bytes)
    }
}

/// Why worker `index` of a run, assigned as `assigned`, is no longer in it, given the worker
/// live under its id now (`None`: none is, it stopped heartbeating); `None` while it is.
pub fn gone(index: usize, assigned: &Worker, live: Option<&Worker>) -> Option<String> {
    match live {
        None => Some(format!(
            "worker {index} ({}) stopped heartbeating",
            assigned.id
        )),
        // A new process under its id (a restarted pod) holds none of the run.
        Some(l) if l.incarnation != assigned.incarnation => Some(format!(
            "worker {index} ({}) restarted (registered again from {})",
            assigned.id, l.address
        )),
        Some(_) => None,
    }
}
