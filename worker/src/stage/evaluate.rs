//! The last stage's forward without training, for a validation loss: each window's mean
//! token cross-entropy, nothing stashed.

use candle_core::{DType, Tensor};

use super::Stage;
use crate::error::{Error, Result};

impl Stage {
    /// Each window's mean token cross-entropy on this last stage: `input` as
    /// [`Stage::infer`] takes it (hidden states `[b, t, h]`, or token ids `[b, t]` on a
    /// stage that is also the first), `targets` `[b, t]` (u32). Nothing is stashed and the
    /// stage is not changed, so training goes on exactly as without it.
    ///
    /// Each token's `log Σ exp(z) − z[target]` is computed in f32 on the stage's device
    /// (only `b × t` values come back, whatever the vocabulary); a window's mean sums its
    /// tokens in f64, in order. The result depends only on the parameters and the
    /// microbatch's windows, not on the device's threads or on which worker computes it.
    pub fn window_losses(&self, input: &Tensor, targets: &Tensor) -> Result<Vec<f64>> {
        if !self.is_last() {
            return Err(Error::invalid(
                "validation",
                "window losses come from the stage holding the head",
            ));
        }
        let (b, t) = targets.dims2()?;
        let logits = self.infer(input)?;
        let (lb, lt, v) = logits.dims3()?;
        if (lb, lt) != (b, t) {
            return Err(Error::invalid(
                "targets",
                format!("[{b}, {t}] targets for logits of [{lb}, {lt}, {v}]"),
            ));
        }
        let n = b * t;
        let logits = logits.reshape((n, v))?.to_dtype(DType::F32)?;
        let max = logits.max_keepdim(1)?;
        let log_sum = logits
            .broadcast_sub(&max)?
            .exp()?
            .sum_keepdim(1)?
            .log()?
            .add(&max)?;
        let ids = targets.reshape((n, 1))?.contiguous()?;
        if let Some(&bad) = ids
            .flatten_all()?
            .to_vec1::<u32>()?
            .iter()
            .find(|&&id| id as usize >= v)
        {
            return Err(Error::invalid(
                "targets",
                format!("token id {bad} is not below the vocabulary of {v}"),
            ));
        }
        let picked = logits.gather(&ids, 1)?;
        let nll = (log_sum - picked)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(nll
            .chunks(t)
            .map(|window| window.iter().map(|&x| f64::from(x)).sum::<f64>() / t as f64)
            .collect())
    }
}
