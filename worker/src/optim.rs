//! AdamW with decoupled weight decay, and gradient clipping by the whole model's norm.
//!
//! Clipping across stages works in two steps: every stage reports
//! [`Stage::grad_sq_norm`](crate::Stage::grad_sq_norm); the driver adds them up and computes
//! one scale with [`clip_scale`]; every stage then calls
//! [`Stage::optimizer_step`](crate::Stage::optimizer_step) with that scale.

use candle_core::Tensor;

use crate::error::Result;
use crate::param::Param;

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

/// One AdamW update of `p` at step `step` (1-based) with gradient `grad_scale · p.grad`.
/// The update is computed in f32, on the master copy of a bf16 or f16 parameter, whose
/// rounding becomes the parameter; the gradient is zeroed. On the CPU it is one fused pass
/// in place ([`update_fused`], the same f32 arithmetic); elsewhere [`update_candle`].
pub(crate) fn update(p: &mut Param, cfg: &AdamW, step: u64, grad_scale: f64) -> Result<()> {
    if update_fused(p, cfg, step, grad_scale)? {
        return Ok(());
    }
    update_candle(p, cfg, step, grad_scale)
}

/// [`update`] through the fused CPU kernel; `false`, having changed nothing, where the
/// parameter's state is not contiguous f32 on the CPU in distinct storages.
pub(crate) fn update_fused(p: &mut Param, cfg: &AdamW, step: u64, grad_scale: f64) -> Result<bool> {
    let hyper = crate::kernels::adamw::Hyper {
        lr: cfg.lr,
        beta1: cfg.beta1,
        beta2: cfg.beta2,
        eps: cfg.eps,
        weight_decay: cfg.weight_decay,
        decay: p.decay,
        step,
        grad_scale,
    };
    let target = p.master.as_ref().unwrap_or(&p.value);
    if !crate::kernels::adamw::update(target, &p.grad, &p.m, &p.v, hyper)? {
        return Ok(false);
    }
    if let Some(master) = &p.master {
        p.value = master.to_dtype(p.value.dtype())?;
    }
    p.zero_grad()?;
    Ok(true)
}

/// [`update`] with candle's ops (new tensors for the value, moments and gradient).
pub(crate) fn update_candle(p: &mut Param, cfg: &AdamW, step: u64, grad_scale: f64) -> Result<()> {
    let wide = p.m.dtype();
    let g = p.grad.to_dtype(wide)?;
    let g = if grad_scale == 1.0 {
        g
    } else {
        g.affine(grad_scale, 0.0)?
    };
    let m = (p.m.affine(cfg.beta1, 0.0)? + g.affine(1.0 - cfg.beta1, 0.0)?)?;
    let v = (p.v.affine(cfg.beta2, 0.0)? + g.sqr()?.affine(1.0 - cfg.beta2, 0.0)?)?;
    let exp = i32::try_from(step).unwrap_or(i32::MAX);
    let bc1 = 1.0 - cfg.beta1.powi(exp);
    let bc2 = 1.0 - cfg.beta2.powi(exp);
    let denom = v.affine(1.0 / bc2, 0.0)?.sqrt()?.affine(1.0, cfg.eps)?;
    let adam = m.affine(1.0 / bc1, 0.0)?.div(&denom)?;
    let mut value: Tensor = match &p.master {
        Some(master) => master.clone(),
        None => p.value.to_dtype(wide)?,
    };
    if p.decay && cfg.weight_decay != 0.0 {
        value = value.affine(1.0 - cfg.lr * cfg.weight_decay, 0.0)?;
    }
    let value = (value - adam.affine(cfg.lr, 0.0)?)?;
    p.value = value.to_dtype(p.value.dtype())?;
    if p.master.is_some() {
        p.master = Some(value);
    }
    p.m = m;
    p.v = v;
    p.grad = p.grad.zeros_like()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;
    use crate::param::Init;

    /// A parameter named `w` on the CPU.
    fn param(shape: &[usize], init: Init, dtype: DType) -> Result<Param> {
        Param::new("w".into(), shape, init, true, 0, dtype, &Device::Cpu)
    }

    /// bf16 parameters keep an f32 master copy: twenty updates of 1e-3 each move a weight of
    /// 1.0, though each is below half of bf16's spacing there (2⁻⁸) and would round away.
    #[test]
    fn bf16_updates_accumulate_in_the_master_copy() -> Result<()> {
        let mut p = param(&[4], Init::Const(1.0), DType::BF16)?;
        assert_eq!(p.m.dtype(), DType::F32);
        let cfg = AdamW {
            lr: 1e-3,
            weight_decay: 0.0,
            ..AdamW::default()
        };
        for step in 1..=20 {
            p.grad = p.grad.ones_like()?;
            update(&mut p, &cfg, step, 1.0)?;
        }
        let master = p
            .master
            .as_ref()
            .expect("a bf16 parameter has a master copy");
        // A constant gradient makes every bias-corrected Adam step ≈ lr.
        for x in master.to_vec1::<f32>()? {
            assert!((x - (1.0 - 20e-3)).abs() < 1e-4, "master {x}");
        }
        assert_eq!(
            p.value.to_dtype(DType::F32)?.to_vec1::<f32>()?,
            master
                .to_dtype(DType::BF16)?
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?
        );
        assert!(
            p.value
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?
                .iter()
                .all(|&x| x < 0.99)
        );
        Ok(())
    }

    /// Microbatch gradients of a bf16 parameter are summed in f32: a hundred of 2⁻⁸ added
    /// to 1.0 reach 1.390625, where a bf16 sum would stay at 1.0 (half of bf16's spacing
    /// there rounds to even).
    #[test]
    fn bf16_gradients_are_summed_in_f32() -> Result<()> {
        let cpu = Device::Cpu;
        let mut p = param(&[3], Init::Const(0.5), DType::BF16)?;
        p.accumulate(&Tensor::ones(3, DType::BF16, &cpu)?)?;
        let small = Tensor::full(2f32.powi(-8), 3, &cpu)?.to_dtype(DType::BF16)?;
        for _ in 0..100 {
            p.accumulate(&small)?;
        }
        assert_eq!(p.grad.dtype(), DType::F32);
        assert_eq!(p.grad.to_vec1::<f32>()?, vec![1.390625; 3]);
        assert_eq!(p.state_bytes(), 3 * (2 + 4 + 4 + 4 + 4));
        Ok(())
    }

    #[test]
    fn f32_parameters_have_no_master_copy() -> Result<()> {
        let p = param(&[2, 3], Init::Normal(0.02), DType::F32)?;
        assert!(p.master.is_none());
        assert_eq!(p.state_bytes(), 6 * 16);
        Ok(())
    }

    #[test]
    fn clip_scale_only_shrinks() {
        assert_eq!(clip_scale(0.25, Some(1.0)), 1.0);
        let s = clip_scale(16.0, Some(1.0));
        assert!((s - 0.25).abs() < 1e-6, "{s}");
        assert_eq!(clip_scale(1e12, None), 1.0);
    }
}
