//! A parameter's accumulated gradient: adding to it, its squared sum and zeroing it, with
//! the fused CPU kernels where they apply and candle's ops elsewhere.

use candle_core::{DType, Tensor};

use super::{GRAD_DTYPE, Param};
use crate::error::Result;

impl Param {
    /// Adds `g` (in the model dtype) to the accumulated gradient, in f64: in place on the
    /// CPU, a new tensor elsewhere.
    pub(crate) fn accumulate(&mut self, g: &Tensor) -> Result<()> {
        if !crate::kernels::adamw::accumulate(&self.grad, g)? {
            // Every model dtype widens to f64 exactly.
            self.grad = (&self.grad + g.to_dtype(GRAD_DTYPE)?)?;
        }
        Ok(())
    }

    /// Sum of squared gradient elements, in f64.
    pub(crate) fn grad_sq_sum(&self) -> Result<f64> {
        if let Some(s) = crate::kernels::adamw::sq_sum(&self.grad) {
            return Ok(s);
        }
        let s = self.grad.to_dtype(DType::F64)?.sqr()?.sum_all()?;
        Ok(s.to_scalar::<f64>()?)
    }

    /// Zeroes the accumulated gradient: in place on the CPU, a new tensor elsewhere.
    pub(crate) fn zero_grad(&mut self) -> Result<()> {
        if !crate::kernels::adamw::zero(&self.grad)? {
            self.grad = self.grad.zeros_like()?;
        }
        Ok(())
    }
}
