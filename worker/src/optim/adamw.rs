//! AdamW's hyper-parameters ([`AdamW`]) and the global-norm clipping factor
//! ([`clip_scale`]).

use pipewise_common::job::lr::LrScheduler;

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay (applied to matrices and embeddings only).
    pub weight_decay: f64,
    /// Clip gradients to this global L2 norm (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
    /// The learning rate's schedule over a job of this many steps (`None`: `lr` at every
    /// step).
    pub schedule: Option<(LrScheduler, u64)>,
}

impl AdamW {
    /// The learning rate of optimizer step `step` (1-based, as [`Stage::step`] counts
    /// them).
    ///
    /// [`Stage::step`]: crate::Stage::step
    pub fn lr_at(&self, step: u64) -> f64 {
        match self.schedule {
            Some((schedule, steps)) => self.lr * schedule.factor(step.saturating_sub(1), steps),
            None => self.lr,
        }
    }
}

impl Default for AdamW {
    /// nanoGPT's defaults: lr 6e-4, betas (0.9, 0.95), eps 1e-8, decay 0.1, clip at 1.0.
    fn default() -> Self {
        Self {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            max_grad_norm: Some(1.0),
            schedule: None,
        }
    }
}

/// The factor every stage multiplies its gradients by, given the sum over all stages of
/// their squared gradient norms: `min(1, max_norm / (norm + 1e-6))`, or 1 without clipping.
pub fn clip_scale(total_sq_norm: f64, max_grad_norm: Option<f64>) -> f64 {
    match max_grad_norm {
        Some(max) => {
            let norm = total_sq_norm.sqrt();
            if norm > max { max / (norm + 1e-6) } else { 1.0 }
        }
        None => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::clip_scale;

    #[test]
    fn clip_scale_only_shrinks() {
        assert_eq!(clip_scale(0.25, Some(1.0)), 1.0);
        let s = clip_scale(16.0, Some(1.0));
        assert!((s - 0.25).abs() < 1e-6, "{s}");
        assert_eq!(clip_scale(1e12, None), 1.0);
    }
}
