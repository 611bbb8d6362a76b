//! The start-up profile: how fast this worker runs a linear layer of a small model's shape
//! (FLOP/s), measured once when the worker starts and sent with its registration. The
//! coordinator's cost model starts from it; the pass times of the first step replace it.

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// Tokens, inputs and outputs of the timed product (`2·m·k·n` FLOPs each).
const SHAPE: (usize, usize, usize) = (512, 256, 1024);

/// How long the profile runs at least (after one warm-up product).
const BUDGET: Duration = Duration::from_millis(30);

/// FLOP/s of the linear layers the stages run, on `device`.
pub(crate) fn linear_flops(device: &Device) -> Result<f64> {
    let (m, k, n) = SHAPE;
    let x = Tensor::ones((m, k), DType::F32, device)?;
    let w = Tensor::ones((k, n), DType::F32, device)?;
    let b = Tensor::zeros(n, DType::F32, device)?;
    crate::ops::linear(&x, &w, Some(&b))?;
    let started = Instant::now();
    let mut products = 0u32;
    while products == 0 || started.elapsed() < BUDGET {
        let y = crate::ops::linear(&x, &w, Some(&b))?;
        // A device runs asynchronously: reading one value waits for the product.
        y.get(0)?.get(0)?.to_scalar::<f32>()?;
        products += 1;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    Ok(2.0 * (m * k * n) as f64 * f64::from(products) / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_measures_a_positive_finite_speed() {
        let flops = linear_flops(&Device::Cpu).expect("profile");
        assert!(flops.is_finite() && flops > 0.0, "{flops}");
    }
}
