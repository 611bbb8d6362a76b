//! One AdamW update of a parameter: the fused CPU kernel, or candle's ops elsewhere.

use candle_core::Tensor;

use super::adamw::AdamW;
use crate::error::Result;
use crate::param::Param;

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

    /// Microbatch gradients of a bf16 parameter are summed wide (f64): a hundred of 2⁻⁸
    /// added to 1.0 reach 1.390625, where a bf16 sum would stay at 1.0 (half of bf16's
    /// spacing there rounds to even).
    #[test]
    fn bf16_gradients_are_summed_wide() -> Result<()> {
        let cpu = Device::Cpu;
        let mut p = param(&[3], Init::Const(0.5), DType::BF16)?;
        p.accumulate(&Tensor::ones(3, DType::BF16, &cpu)?)?;
        let small = Tensor::full(2f32.powi(-8), 3, &cpu)?.to_dtype(DType::BF16)?;
        for _ in 0..100 {
            p.accumulate(&small)?;
        }
        assert_eq!(p.grad.dtype(), DType::F64);
        assert_eq!(p.grad.to_vec1::<f64>()?, vec![1.390625; 3]);
        assert_eq!(p.state_bytes(), 3 * (2 + 8 + 4 + 4 + 4));
        Ok(())
    }

    #[test]
    fn f32_parameters_have_no_master_copy() -> Result<()> {
        let p = param(&[2, 3], Init::Normal(0.02), DType::F32)?;
        assert!(p.master.is_none());
        assert_eq!(p.state_bytes(), 6 * 20);
        Ok(())
    }
}
