//! The pass IR: one unit of pipeline work, `(kind, stage, microbatch)`.
//!
//! Text form: `{stage}{kind}{microbatch}`, e.g. `0F3` (stage 0 forward of microbatch 3),
//! `5B0` (input-gradient backward), `5W0` (weight-gradient backward), `2BW1` (fused backward).

use std::fmt;

use serde::{Deserialize, Serialize};

mod text;

/// What a pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PassKind {
    /// Forward.
    F,
    /// Backward with respect to the stage input (on the critical path).
    B,
    /// Backward with respect to the stage weights (deferrable).
    W,
    /// Fused backward (B then W) for schedules without the split.
    BW,
}

impl PassKind {
    /// All kinds, in a fixed order.
    pub const ALL: [PassKind; 4] = [PassKind::F, PassKind::B, PassKind::W, PassKind::BW];

    /// Position in [`PassKind::ALL`].
    pub fn index(self) -> usize {
        match self {
            PassKind::F => 0,
            PassKind::B => 1,
            PassKind::W => 2,
            PassKind::BW => 3,
        }
    }

    /// The text used in the compact form.
    pub fn as_str(self) -> &'static str {
        match self {
            PassKind::F => "F",
            PassKind::B => "B",
            PassKind::W => "W",
            PassKind::BW => "BW",
        }
    }

    /// True for the passes that produce the input gradient (B or BW).
    pub fn is_input_backward(self) -> bool {
        matches!(self, PassKind::B | PassKind::BW)
    }
}

impl fmt::Display for PassKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One pass: `kind` over `stage` for microbatch `mb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Pass {
    /// What is computed.
    pub kind: PassKind,
    /// Pipeline stage index (0-based, in model order).
    pub stage: u32,
    /// Microbatch index (0-based).
    pub mb: u32,
}

impl Pass {
    /// Builds a pass.
    pub const fn new(kind: PassKind, stage: u32, mb: u32) -> Self {
        Pass { kind, stage, mb }
    }
    /// Forward pass.
    pub const fn f(stage: u32, mb: u32) -> Self {
        Pass::new(PassKind::F, stage, mb)
    }
    /// Input-gradient pass.
    pub const fn b(stage: u32, mb: u32) -> Self {
        Pass::new(PassKind::B, stage, mb)
    }
    /// Weight-gradient pass.
    pub const fn w(stage: u32, mb: u32) -> Self {
        Pass::new(PassKind::W, stage, mb)
    }
    /// Fused backward pass.
    pub const fn bw(stage: u32, mb: u32) -> Self {
        Pass::new(PassKind::BW, stage, mb)
    }
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.stage, self.kind, self.mb)
    }
}

/// A dense table with one value per pass of a step (`4 × stages × microbatches` slots),
/// for the hot loops of the planner where hashing every lookup would dominate.
#[derive(Debug, Clone, PartialEq)]
pub struct PassMap<T> {
    stages: u32,
    microbatches: u32,
    data: Vec<T>,
}

impl<T: Clone> PassMap<T> {
    /// A table for `stages × microbatches` with every slot set to `fill`.
    pub fn new(stages: u32, microbatches: u32, fill: T) -> Self {
        PassMap {
            stages,
            microbatches,
            data: vec![fill; 4 * stages as usize * microbatches as usize],
        }
    }

    fn slot(&self, pass: Pass) -> usize {
        (pass.kind.index() * self.stages as usize + pass.stage as usize)
            * self.microbatches as usize
            + pass.mb as usize
    }

    /// The value of `pass` (which must lie inside the table's shape).
    pub fn get(&self, pass: Pass) -> &T {
        &self.data[self.slot(pass)]
    }

    /// Sets the value of `pass`.
    pub fn set(&mut self, pass: Pass, value: T) {
        let slot = self.slot(pass);
        self.data[slot] = value;
    }
}

impl PassMap<f64> {
    /// A time table where NaN means "not known yet".
    pub fn times(stages: u32, microbatches: u32) -> Self {
        PassMap::new(stages, microbatches, f64::NAN)
    }

    /// The time of `pass`, if known.
    pub fn known(&self, pass: Pass) -> Option<f64> {
        let t = *self.get(pass);
        (!t.is_nan()).then_some(t)
    }
}
