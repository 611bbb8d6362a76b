//! A parameter's accumulated gradient: adding to it, its squared sum and zeroing it, with
//! the fused CPU kernels where they apply and candle's ops elsewhere.

use candle_core::{DType, Tensor};

use super::{Param, STATE_DTYPE};
use crate::error::Result;

impl Param {
    /// Adds `g` (in the model dtype) to the accumulated gradient, in f32: in place on the
    /// CPU, a new tensor elsewhere.
    pub(crate) fn accumulate(&mut self, g: &Tensor) -> Result<()> {
        if !crate::kernels::adamw::accumulate(&self.grad, g)? {
            self.grad = (&self.grad + g.to_dtype(STATE_DTYPE)?)?;
        }
        Ok(())
    }

    /// Sum of squared gradient elements (accumulated in f64 on the CPU, in f32 elsewhere).
    pub(crate) fn grad_sq_sum(&self) -> Result<f64> {
        if let Some(s) = crate::kernels::adamw::sq_sum(&self.grad) {
            return Ok(s);
        }
        let s = self.grad.to_dtype(DType::F32)?.sqr()?.sum_all()?;
        Ok(f64::from(s.to_scalar::<f32>()?))
    }

    /// Zeroes the accumulated gradient: in place on the CPU, a new tensor elsewhere.
    pub(crate) fn zero_grad(&mut self) -> Result<()> {
        if !crate::kernels::adamw::zero(&self.grad)? {
            self.grad = self.grad.zeros_like()?;
        }
        Ok(())
    }
}
