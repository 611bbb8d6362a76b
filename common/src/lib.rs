//! `pipewise-common`: the pure planning core of pipewise.
//!
//! Everything here is a function of its inputs: no I/O, no clock, no randomness (a
//! [`cancel`] flag can only cut a planning call short).
//!
//! # Layout
//!
//! - [`pass`]: the pass IR (`F`, `B`, `W`, `BW` over a stage and microbatch) and its text form `0F3`.
//! - [`placement`]: stage → worker layouts (one per worker, loop, V, explicit).
//! - [`schedule`]: per-worker ordered pass lists.
//! - [`mod@validate`]: the validator (typed errors, marked grids).
//! - [`model`]: the GPT-style model spec: pieces, parameter counts, activation bytes, FLOPs.
//! - [`cost`]: per-stage F/B/W durations, communication latency, activation memory.
//! - [`mod@simulate`]: start/end of every pass, makespan, bubble rates, peak memory, lower bounds.
//! - [`mod@generate`]: every schedule generator, and the building-block framework they share.
//! - [`job`]: a training job as submitted (TOML, torchtitan-style names), its validation and
//!   planning, its predicted memory, and its checkpoint layout and run ids.
//! - [`csv`]: import/export in the CSV form torchtitan and PyTorch use.
//! - [`trace`]: executed step timelines (spans recorded by workers) and their measured costs.
//! - [`render`]: text grid, SVG, Chrome trace and report renderings; planned vs executed.
//! - [`error`]: the crate's one error type.
//! - [`cancel`]: cooperative cancellation of long planning calls.
//! - [`auto`]: the auto-planner: partition, microbatch size and schedule under a memory budget.
//! - [`partition`]: every split of the model's pieces into stages (even, torchtitan's,
//!   balanced for the auto-planner, for measured worker speeds).
//! - [`address`]: whether an address a worker advertises is one its peers can dial.
//! - [`run`]: the sans-I/O supervisor of a job's runs on worker processes and its policies
//!   (lost workers, growing back, stragglers, memory pressure).

pub mod address;
pub mod auto;
pub mod calibration;
pub mod cancel;
pub mod cost;
pub mod csv;
pub mod data;
pub mod error;
pub mod generate;
pub mod job;
pub mod model;
pub mod partition;
pub mod pass;
pub mod placement;
pub mod render;
pub mod run;
pub mod schedule;
pub mod simulate;
pub mod trace;
pub mod validate;

pub use cost::{Costs, StageCost, Times};
pub use error::{Error, Result};
pub use generate::{Request, ScheduleKind, generate};
pub use pass::{Pass, PassKind};
pub use placement::Placement;
pub use schedule::Schedule;
pub use simulate::{Simulation, simulate};
pub use validate::validate;
