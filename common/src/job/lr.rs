//! `[lr_scheduler]`: the learning rate of each step, in torchtitan's names and arithmetic
//! (`warmup_steps`, `decay_ratio`, `decay_type`, `min_lr_factor`). Without the section
//! the rate is `optimizer.lr` at every step.
//!
//! Step `s` (0-based) of a job of `T` steps trains at `lr · f(s)`, with `W` warm-up steps,
//! `D` decay steps (`round(T · decay_ratio)`, or `T − W` without a ratio) and the stable
//! steps between them:
//!
//! - `s < W`: `f = (s + 1) / (W + 1)`;
//! - then, before the decay (or with `D = 0`): `f = 1`;
//! - in the decay, with `p = (s + 1 − (T − D)) / (D + 1)`: `linear` `1 − p`, `sqrt`
//!   `1 − √p`, `cosine` `(1 + cos πp) / 2`, scaled into `[min_lr_factor, 1]`.
//!
//! Steps past the job's last take step `T`'s factor (the floor), as torchtitan's do.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How the rate falls in the decay steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayType {
    /// Linearly to the floor.
    #[default]
    Linear,
    /// As one minus the square root of the progress.
    Sqrt,
    /// Along half a cosine period.
    Cosine,
}

/// `[lr_scheduler]`: warm-up, a stable stretch and a decay (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LrScheduler {
    /// Steps of linear warm-up.
    #[serde(default)]
    pub warmup_steps: u32,
    /// The share of the job's steps that decay (absent: every step after the warm-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_ratio: Option<f64>,
    /// How the rate decays.
    #[serde(default)]
    pub decay_type: DecayType,
    /// The floor of the decay, as a factor of `optimizer.lr`.
    #[serde(default)]
    pub min_lr_factor: f64,
}

impl LrScheduler {
    /// The factor of `optimizer.lr` at step `step` (0-based) of a job of `steps` steps.
    pub fn factor(&self, step: u64, steps: u64) -> f64 {
        let warmup = u64::from(self.warmup_steps);
        let decay = match self.decay_ratio {
            Some(ratio) => (steps as f64 * ratio).round() as u64,
            None => steps.saturating_sub(warmup),
        };
        let stable_end = steps.saturating_sub(decay).max(warmup);
        let step = step.min(stable_end + decay);
        if step < warmup {
            return (step + 1) as f64 / (warmup + 1) as f64;
        }
        if step < stable_end || decay == 0 {
            return 1.0;
        }
        let progress = (step + 1 - stable_end) as f64 / (decay + 1) as f64;
        let fall = match self.decay_type {
            DecayType::Linear => 1.0 - progress,
            DecayType::Sqrt => 1.0 - progress.sqrt(),
            DecayType::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
        };
        self.min_lr_factor + (1.0 - self.min_lr_factor) * fall
    }

    /// Checks the section against a job of `steps` steps, naming the field.
    pub fn check(&self, steps: u32) -> Result<()> {
        if self.warmup_steps > steps {
            return Err(Error::invalid(
                "lr_scheduler.warmup_steps",
                format!("{} warm-up steps in a job of {steps}", self.warmup_steps),
            ));
        }
        if let Some(ratio) = self.decay_ratio
            && !(0.0..=1.0).contains(&ratio)
        {
            return Err(Error::invalid(
                "lr_scheduler.decay_ratio",
                format!("must be in [0, 1], got {ratio}"),
            ));
        }
        if let Some(ratio) = self.decay_ratio
            && u64::from(self.warmup_steps) + (f64::from(steps) * ratio).round() as u64
                > u64::from(steps)
        {
            return Err(Error::invalid(
                "lr_scheduler.decay_ratio",
                format!(
                    "{ratio} of {steps} steps decay, which with {} warm-up steps is more than \
                     the job's steps",
                    self.warmup_steps
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_factor) {
            return Err(Error::invalid(
                "lr_scheduler.min_lr_factor",
                format!("must be in [0, 1], got {}", self.min_lr_factor),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduler(warmup: u32, ratio: Option<f64>, kind: DecayType, floor: f64) -> LrScheduler {
        LrScheduler {
            warmup_steps: warmup,
            decay_ratio: ratio,
            decay_type: kind,
            min_lr_factor: floor,
        }
    }

    /// The factors torchtitan's `linear_warmup_stable_decay` gives (computed by hand from
    /// its formula): 10 steps, 2 warm-up, 4 decay (ratio 0.4), 4 stable.
    #[test]
    fn warmup_stable_and_each_decay_follow_torchtitans_formula() {
        let linear = scheduler(2, Some(0.4), DecayType::Linear, 0.0);
        let got: Vec<f64> = (0..10).map(|s| linear.factor(s, 10)).collect();
        let want = [1.0 / 3.0, 2.0 / 3.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
        // Past the last step: step 10's factor, the floor.
        assert_eq!(linear.factor(25, 10), 0.0);
        let cosine = scheduler(0, None, DecayType::Cosine, 0.1);
        // No warm-up, every step decays: p = (s + 1) / 11.
        for s in 0..10u64 {
            let p = (s + 1) as f64 / 11.0;
            let want = 0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * p).cos());
            assert!((cosine.factor(s, 10) - want).abs() < 1e-12, "step {s}");
        }
        let sqrt = scheduler(0, Some(0.5), DecayType::Sqrt, 0.0);
        assert_eq!(sqrt.factor(4, 10), 1.0);
        assert!((sqrt.factor(5, 10) - (1.0 - (1.0f64 / 6.0).sqrt())).abs() < 1e-12);
        // No decay at all: warm-up, then constant.
        let flat = scheduler(3, Some(0.0), DecayType::Linear, 0.0);
        assert_eq!(flat.factor(3, 10), 1.0);
        assert_eq!(flat.factor(9, 10), 1.0);
    }

    #[test]
    fn out_of_range_fields_are_refused_by_name() {
        let field = |s: LrScheduler| match s.check(10) {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let ok = scheduler(2, Some(0.5), DecayType::Cosine, 0.1);
        assert!(ok.check(10).is_ok());
        assert_eq!(
            field(LrScheduler {
                warmup_steps: 11,
                ..ok
            }),
            "lr_scheduler.warmup_steps"
        );
        for ratio in [-0.1, 1.5, f64::NAN, 0.9] {
            assert_eq!(
                field(LrScheduler {
                    decay_ratio: Some(ratio),
                    ..ok
                }),
                "lr_scheduler.decay_ratio",
                "{ratio}"
            );
        }
        for floor in [-0.5, 1.5, f64::NAN] {
            assert_eq!(
                field(LrScheduler {
                    min_lr_factor: floor,
                    ..ok
                }),
                "lr_scheduler.min_lr_factor"
            );
        }
    }
}
