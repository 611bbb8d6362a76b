//! A schedule: the ordered pass list of every worker.

use serde::{Deserialize, Serialize};

mod recompute;

pub use recompute::{
    RECOMPUTING_SCHEDULES, Recomputation, Recompute, RecomputeShares, backward_follows,
    recomputing_schedule,
};

use crate::pass::Pass;
use crate::placement::Placement;

/// Per-worker ordered pass lists plus the placement they run on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// A display name (generator name, or `csv:PATH`).
    pub name: String,
    /// Stage → worker layout.
    pub placement: Placement,
    /// Microbatches per step.
    pub microbatches: u32,
    /// `workers[w]` is worker `w`'s program, in execution order.
    pub workers: Vec<Vec<Pass>>,
}

impl Schedule {
    /// An empty schedule (one empty list per worker).
    pub fn empty(name: impl Into<String>, placement: Placement, microbatches: u32) -> Self {
        let workers = vec![Vec::new(); placement.workers() as usize];
        Schedule {
            name: name.into(),
            placement,
            microbatches,
            workers,
        }
    }

    /// Worker count.
    pub fn num_workers(&self) -> u32 {
        self.workers.len() as u32
    }

    /// Total passes over all workers.
    pub fn num_passes(&self) -> usize {
        self.workers.iter().map(Vec::len).sum()
    }

    /// Appends `pass` to the program of the worker that holds its stage.
    pub fn push(&mut self, pass: Pass) {
        let w = self.placement.worker_of(pass.stage) as usize;
        self.workers[w].push(pass);
    }

    /// One line per worker in the compact text form (`0F0 0F1 0B0 …`).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (w, passes) in self.workers.iter().enumerate() {
            let cells: Vec<String> = passes.iter().map(Pass::to_string).collect();
            out.push_str(&format!("worker {w}: {}\n", cells.join(" ")));
        }
        out
    }
}
