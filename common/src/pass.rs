//! The pass IR: one unit of pipeline work, `(kind, stage, microbatch)`.
//!
//! Text form: `{stage}{kind}{microbatch}`, e.g. `0F3` (stage 0 forward of microbatch 3),
//! `5B0` (input-gradient backward), `5W0` (weight-gradient backward), `2BW1` (fused backward).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::Error;

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

/// Splits `text` as `<digits><letters><digits>`.
pub(crate) fn split_action(text: &str) -> Option<(u32, &str, u32)> {
    let letters_at = text.find(|c: char| !c.is_ascii_digit())?;
    let digits_at = letters_at + text[letters_at..].find(|c: char| c.is_ascii_digit())?;
    let (stage, rest) = text.split_at(letters_at);
    let (kind, mb) = rest.split_at(digits_at - letters_at);
    if stage.is_empty() || mb.is_empty() || !mb.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stage.parse().ok()?, kind, mb.parse().ok()?))
}

impl FromStr for Pass {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let bad = || Error::BadPass {
            text: text.to_string(),
            expected: "<stage><F|B|W|BW><microbatch>, e.g. 0F3 or 2BW1",
        };
        let (stage, kind, mb) = split_action(text).ok_or_else(bad)?;
        let kind = match kind {
            "F" => PassKind::F,
            "B" => PassKind::B,
            "W" => PassKind::W,
            "BW" => PassKind::BW,
            _ => return Err(bad()),
        };
        Ok(Pass { kind, stage, mb })
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
        let kind = match pass.kind {
            PassKind::F => 0,
            PassKind::B => 1,
            PassKind::W => 2,
            PassKind::BW => 3,
        };
        (kind * self.stages as usize + pass.stage as usize) * self.microbatches as usize
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_examples() {
        assert_eq!("0F3".parse::<Pass>().ok(), Some(Pass::f(0, 3)));
        assert_eq!("5B0".parse::<Pass>().ok(), Some(Pass::b(5, 0)));
        assert_eq!("5W0".parse::<Pass>().ok(), Some(Pass::w(5, 0)));
        assert_eq!("2BW1".parse::<Pass>().ok(), Some(Pass::bw(2, 1)));
        assert_eq!(Pass::bw(12, 40).to_string(), "12BW40");
    }

    #[test]
    fn rejects_malformed() {
        for bad in ["", "F3", "0F", "0X3", "0F3x", "-1F3", "0BWW1", "0 F 3"] {
            let err = bad.parse::<Pass>().expect_err(bad);
            assert!(err.to_string().contains("expected"), "{err}");
        }
    }

    fn any_kind() -> impl Strategy<Value = PassKind> {
        prop_oneof![
            Just(PassKind::F),
            Just(PassKind::B),
            Just(PassKind::W),
            Just(PassKind::BW)
        ]
    }

    proptest! {
        #[test]
        fn text_round_trips(kind in any_kind(), stage in 0u32..100_000, mb in 0u32..1_000_000) {
            let pass = Pass::new(kind, stage, mb);
            prop_assert_eq!(pass.to_string().parse::<Pass>().ok(), Some(pass));
        }
    }
}
