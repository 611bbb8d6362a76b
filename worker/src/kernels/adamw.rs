//! The optimizer-side kernels on a parameter's f32 state, all in place (no allocation):
//! the fused AdamW update (one pass over value, gradient and moments), gradient
//! accumulation, the gradient's squared norm and zeroing it.
//!
//! In place through [`with_f32_mut`] (a candle in-place op), which every tensor sharing the
//! buffer sees: a [`Param`]'s tensors own their buffers (`Param::new` allocates each, and
//! nothing keeps clones of them across a step). Each kernel first checks that the tensors it
//! locks together are distinct storages ([`distinct_f32`]), and declines otherwise (the
//! caller falls back to candle's ops).

use candle_core::{DType, Tensor};

use super::cpu::{all_f32_cpu, distinct_f32, with_f32, with_f32_mut, with_f64, with_f64_mut};
use super::simd::{self, multiversion};
use crate::error::Result;

/// AdamW's hyper-parameters for one update (the optimizer's configuration, the step and
/// whether this parameter decays), in f64 as the optimizer holds them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hyper {
    /// Learning rate.
    pub(crate) lr: f64,
    /// First-moment decay.
    pub(crate) beta1: f64,
    /// Second-moment decay.
    pub(crate) beta2: f64,
    /// Denominator epsilon.
    pub(crate) eps: f64,
    /// Decoupled weight decay, applied where `decay`.
    pub(crate) weight_decay: f64,
    /// Whether this parameter decays.
    pub(crate) decay: bool,
    /// The step (1-based): the bias corrections' exponent.
    pub(crate) step: u64,
    /// The gradient's factor (clipping).
    pub(crate) grad_scale: f64,
}

/// The f32 constants of one update, rounded from f64 exactly as candle's `affine` rounds its
/// arguments, so the kernel repeats the reference's f32 arithmetic.
#[derive(Debug, Clone, Copy)]
struct Consts {
    scale: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    inv_bc1: f32,
    inv_bc2: f32,
    eps: f32,
    lr: f32,
    /// `1 − lr·decay`, or `None` without decay.
    shrink: Option<f32>,
}

impl Consts {
    fn new(cfg: Hyper) -> Self {
        let exp = i32::try_from(cfg.step).unwrap_or(i32::MAX);
        let bc1 = 1.0 - cfg.beta1.powi(exp);
        let bc2 = 1.0 - cfg.beta2.powi(exp);
        Self {
            scale: cfg.grad_scale as f32,
            beta1: cfg.beta1 as f32,
            one_minus_beta1: (1.0 - cfg.beta1) as f32,
            beta2: cfg.beta2 as f32,
            one_minus_beta2: (1.0 - cfg.beta2) as f32,
            inv_bc1: (1.0 / bc1) as f32,
            inv_bc2: (1.0 / bc2) as f32,
            eps: cfg.eps as f32,
            lr: cfg.lr as f32,
            shrink: (cfg.decay && cfg.weight_decay != 0.0)
                .then_some((1.0 - cfg.lr * cfg.weight_decay) as f32),
        }
    }
}

multiversion! {
    /// One AdamW step over `w` (value or master copy), `m`, `v` with the accumulated
    /// gradient `g`, each element rounded to f32 as it is read (as candle's cast rounds
    /// it): no f32 copy of the whole gradient is made, which for a vocabulary table would
    /// be a table-sized buffer beside the parameter's own state.
    fn step(w: &mut [f32], g: &[f64], m: &mut [f32], v: &mut [f32], c: Consts) {
        let shrink = c.shrink.unwrap_or(1.0);
        let decay = c.shrink.is_some();
        for (((wv, &gv), mv), vv) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let g = (gv as f32) * c.scale;
            let m = *mv * c.beta1 + g * c.one_minus_beta1;
            let v = *vv * c.beta2 + (g * g) * c.one_minus_beta2;
            let denom = (v * c.inv_bc2).sqrt() + c.eps;
            let adam = (m * c.inv_bc1) / denom;
            let x = if decay { *wv * shrink } else { *wv };
            *wv = x - adam * c.lr;
            *mv = m;
            *vv = v;
        }
    }
}

multiversion! {
    /// `acc[i] += g[i]` in f64 (vectorised for the CPU found at run time).
    pub(crate) fn add_wide(acc: &mut [f64], g: &[f32]) {
        for (a, &x) in acc.iter_mut().zip(g) {
            *a += f64::from(x);
        }
    }
}

multiversion! {
    fn sum_sq_wide(g: &[f64]) -> f64 {
        simd::sum_sq_f64(g)
    }
}

/// One AdamW update in place where `target` (an f32 parameter's value or the master copy of
/// a narrower one), `m` and `v` are contiguous f32 CPU tensors with distinct storages and
/// `grad` a contiguous f64 CPU tensor (the accumulated gradient, rounded to f32 here as
/// candle's cast rounds it). The caller then zeroes the gradient (and rounds a master copy
/// into the value). Returns `false`, having changed nothing, where that does not hold.
pub(crate) fn update(
    target: &Tensor,
    grad: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: Hyper,
) -> Result<bool> {
    let n = grad.elem_count();
    if [target, m, v].iter().any(|t| t.elem_count() != n) || !distinct_f32(&[target, m, v]) {
        return Ok(false);
    }
    let c = Consts::new(h);
    // The gradient is f64 and the others f32, so it is never one of their storages.
    let done = with_f64(grad, |g| -> Result<bool> {
        let m_done = with_f32_mut(m, |m| -> Result<bool> {
            let v_done = with_f32_mut(v, |v| -> Result<bool> {
                Ok(with_f32_mut(target, |w| step(w, g, m, v, c))?.is_some())
            })?;
            Ok(v_done.transpose()?.unwrap_or(false))
        })?;
        Ok(m_done.transpose()?.unwrap_or(false))
    });
    Ok(done.transpose()?.unwrap_or(false))
}

/// One AdamW update of plain host slices (a shard of a stage's flattened parameters, as a
/// sharded optimizer holds it): the same f32 arithmetic as [`update`], element by element,
/// so a shard updated here gets the bits the whole parameter would.
pub(crate) fn update_slices(w: &mut [f32], g: &[f64], m: &mut [f32], v: &mut [f32], h: Hyper) {
    step(w, g, m, v, Consts::new(h));
}

/// `acc += g` in place (`g` converted to f32 first if narrower, each value then added in
/// f64) where `acc` is a contiguous f64 CPU tensor; `false`, having changed nothing,
/// otherwise.
pub(crate) fn accumulate(acc: &Tensor, g: &Tensor) -> Result<bool> {
    if acc.elem_count() != g.elem_count() || !g.device().is_cpu() {
        return Ok(false);
    }
    let wide;
    let g = if g.dtype() == DType::F32 {
        g
    } else {
        wide = g.to_dtype(DType::F32)?;
        &wide
    };
    let packed;
    let g = if all_f32_cpu(&[g]) {
        g
    } else {
        packed = g.contiguous()?;
        &packed
    };
    Ok(with_f32(g, |g| with_f64_mut(acc, |a| add_wide(a, g)))
        .transpose()?
        .flatten()
        .is_some())
}

/// `Σ g²` of a contiguous f64 CPU tensor (`None` otherwise).
pub(crate) fn sq_sum(g: &Tensor) -> Option<f64> {
    with_f64(g, sum_sq_wide)
}

/// Sets a contiguous f64 CPU tensor to zeros in place; `false` otherwise.
pub(crate) fn zero(t: &Tensor) -> Result<bool> {
    Ok(with_f64_mut(t, |s| s.fill(0.0))?.is_some())
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::kernels::testing::{awkward, flat};
    use crate::optim::AdamW;
    use crate::param::{Init, Param};

    fn param(n: usize, dtype: DType, decay: bool) -> Result<Param> {
        Param::new(
            "w".into(),
            &[n],
            Init::Normal(0.5),
            decay,
            3,
            dtype,
            &Device::Cpu,
        )
    }

    /// Three steps with awkward gradients, in place, against `optim::update_candle` on a
    /// copy: the same f32 operations in the same order, so the same values (±0 aside).
    #[test]
    fn fused_update_repeats_the_reference_arithmetic() -> Result<()> {
        let cfg = AdamW::default();
        for (dtype, decay, n) in [
            (DType::F32, true, 67),
            (DType::F32, false, 1000),
            (DType::BF16, true, 37),
        ] {
            let mut fused = param(n, dtype, decay)?;
            let mut reference = param(n, dtype, decay)?;
            for step_no in 1..=3 {
                let g = awkward(1, n, 0.1, step_no)?.flatten_all()?;
                for p in [&mut fused, &mut reference] {
                    p.accumulate(&g)?;
                }
                assert!(crate::optim::update_fused(&mut fused, &cfg, step_no, 0.7)?);
                crate::optim::update_candle(&mut reference, &cfg, step_no, 0.7)?;
                for (a, b) in [
                    (&fused.value, &reference.value),
                    (&fused.m, &reference.m),
                    (&fused.v, &reference.v),
                    (&fused.grad, &reference.grad),
                ] {
                    assert_eq!(flat(a)?, flat(b)?, "{dtype:?} step {step_no}");
                }
                if let (Some(a), Some(b)) = (&fused.master, &reference.master) {
                    assert_eq!(flat(a)?, flat(b)?);
                }
            }
        }
        Ok(())
    }

    /// Tensors sharing a storage are declined rather than locked twice.
    #[test]
    fn shared_storages_are_declined() -> Result<()> {
        let mut p = param(5, DType::F32, true)?;
        p.v = p.m.clone();
        assert!(!crate::optim::update_fused(
            &mut p,
            &AdamW::default(),
            1,
            1.0
        )?);
        // Only an f64 gradient is accumulated into, squared and zeroed here.
        let t = Tensor::ones(4, DType::F32, &Device::Cpu)?;
        assert!(!accumulate(&t, &t)?);
        let wide = Tensor::ones(4, DType::F64, &Device::Cpu)?;
        assert!(accumulate(&wide, &t)?);
        assert_eq!(wide.to_vec1::<f64>()?, vec![2.0; 4]);
        assert_eq!(sq_sum(&wide), Some(16.0));
        assert_eq!(sq_sum(&t), None);
        assert!(zero(&wide)?);
        assert!(!zero(&t)?);
        assert_eq!(wide.to_vec1::<f64>()?, vec![0.0; 4]);
        Ok(())
    }
}
