//! A by-hand micro-benchmark (an `#[ignore]`d test that prints, never asserts on time): each
//! kernel against the candle-op code it replaces, on the measured model's shapes (N = 512
//! tokens, h = 256, 4h = 1024, V = 256).
//!
//! `cargo test --release -p pipewise-worker --lib kernels::timing -- --ignored --nocapture`
//! (`RAYON_NUM_THREADS` sets the threads; `PIPEWISE_KERNELS_BASELINE=1` the baseline ISA).

use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use super::testing::awkward;
use crate::error::Result;
use crate::ops;
use crate::optim::{self, AdamW};
use crate::param::{Init, Param};

/// The median of `reps` timed runs of `f` after two warm-up runs, in µs.
fn median_us(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    f()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64() * 1e6);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[reps / 2])
}

fn report(name: &str, before: f64, after: f64) {
    println!(
        "{name:<34} {before:>9.1} µs {after:>9.1} µs  ×{:.1}",
        before / after
    );
}

#[test]
#[ignore = "prints timings; run by hand"]
fn kernels_versus_candle_ops() -> Result<()> {
    let (n, h, v, reps) = (512, 256, 256, 51);
    // As the worker process: freed buffers are reused, not faulted in afresh.
    let heap = crate::alloc::retain_freed_memory();
    println!(
        "threads {}, ISA {:?}, heap: {heap}; op: candle ops, fused kernel (median of {reps})",
        super::cpu::threads(),
        super::simd::level()
    );
    let x = awkward(n, h, 1.0, 1)?;
    let dy = awkward(n, h, 1.0, 2)?;
    let g = (awkward(1, h, 0.1, 3)?.flatten_all()? + 1.0)?;
    let b = awkward(1, h, 0.1, 4)?.flatten_all()?;
    let ln = ops::layer_norm(&x, &g, &b)?;
    let u = awkward(n, 4 * h, 1.0, 5)?;
    let du = awkward(n, 4 * h, 1.0, 6)?;
    let logits = awkward(n, v, 2.0, 7)?;
    let targets: Vec<u32> = (0..n).map(|i| ((i * 31) % v) as u32).collect();
    let targets = Tensor::from_vec(targets, n, &Device::Cpu)?;
    let (probs, _) = ops::cross_entropy(&logits, &targets)?;

    let t = |f: &mut dyn FnMut() -> Result<()>| median_us(reps, f);
    report(
        "layer_norm [512, 256]",
        t(&mut || ops::layer_norm_candle(&x, &g, &b).map(drop))?,
        t(&mut || ops::layer_norm(&x, &g, &b).map(drop))?,
    );
    report(
        "layer_norm_grad_input",
        t(&mut || ops::layer_norm_grad_input_candle(&dy, &ln.xhat, &ln.rstd, &g).map(drop))?,
        t(&mut || ops::layer_norm_grad_input(&dy, &ln.xhat, &ln.rstd, &g).map(drop))?,
    );
    report(
        "layer_norm_grad_weight",
        t(&mut || ops::layer_norm_grad_weight_candle(&dy, &ln.xhat).map(drop))?,
        t(&mut || ops::layer_norm_grad_weight(&dy, &ln.xhat).map(drop))?,
    );
    report(
        "sum_tokens [512, 1024]",
        t(&mut || {
            du.to_dtype(DType::F32)?.sum(0)?;
            Ok(())
        })?,
        t(&mut || ops::sum_tokens(&du).map(drop))?,
    );
    report(
        "gelu [512, 1024]",
        t(&mut || ops::gelu_candle(&u).map(drop))?,
        t(&mut || ops::gelu(&u).map(drop))?,
    );
    report(
        "gelu_grad_input [512, 1024]",
        t(&mut || ops::gelu_grad_input_candle(&u, &du).map(drop))?,
        t(&mut || ops::gelu_grad_input(&u, &du).map(drop))?,
    );
    report(
        "cross_entropy [512, 256]",
        t(&mut || ops::cross_entropy_candle(&logits, &targets).map(drop))?,
        t(&mut || ops::cross_entropy(&logits, &targets).map(drop))?,
    );
    report(
        "cross_entropy_grad",
        t(&mut || ops::cross_entropy_grad_candle(&probs, &targets, 0.25).map(drop))?,
        t(&mut || ops::cross_entropy_grad(&probs, &targets, 0.25).map(drop))?,
    );

    // The optimizer side on one [h, 4h] matrix.
    let cpu = Device::Cpu;
    let mut p = Param::new(
        "w".into(),
        &[h, 4 * h],
        Init::Normal(0.02),
        true,
        1,
        DType::F32,
        &cpu,
    )?;
    let gw = awkward(h, 4 * h, 0.01, 8)?;
    let cfg = AdamW::default();
    report(
        "accumulate [256, 1024]",
        t(&mut || {
            p.grad = (&p.grad + gw.to_dtype(DType::F64)?)?;
            Ok(())
        })?,
        t(&mut || p.accumulate(&gw))?,
    );
    report(
        "grad_sq_sum [256, 1024]",
        t(&mut || {
            let s = p.grad.sqr()?.sum_all()?;
            s.to_scalar::<f64>()?;
            Ok(())
        })?,
        t(&mut || p.grad_sq_sum().map(drop))?,
    );
    let mut step = 0;
    report(
        "adamw update [256, 1024]",
        t(&mut || {
            step += 1;
            optim::update_candle(&mut p, &cfg, step, 0.5)
        })?,
        t(&mut || {
            step += 1;
            optim::update(&mut p, &cfg, step, 0.5)
        })?,
    );
    Ok(())
}

/// `exp` alone (the `min` keeps the input in range from one run to the next; timed apart).
#[test]
#[ignore = "prints timings; run by hand"]
fn lane_functions() -> Result<()> {
    let mut x: Vec<f32> = (0..512 * 1024)
        .map(|i| (i % 1000) as f32 * 0.01 - 5.0)
        .collect();
    let t = median_us(21, || {
        super::simd::exp_in_place(&mut x);
        x.iter_mut().for_each(|v| *v = v.min(5.0));
        Ok(())
    })?;
    println!("exp_in_place + min [512·1024]: {t:.1} µs");
    let t = median_us(21, || {
        x.iter_mut().for_each(|v| *v = v.min(5.0));
        Ok(())
    })?;
    println!("min alone: {t:.1} µs");
    Ok(())
}

/// What a zeroed output buffer costs (`vec![0; n]` memsets a reused block) against an
/// uninitialised one: the kernels still pay the former.
#[test]
#[ignore = "prints timings; run by hand"]
fn zeroed_buffers() -> Result<()> {
    crate::alloc::retain_freed_memory();
    for n in [512 * 256, 512 * 1024] {
        let t = median_us(51, || {
            let v = vec![0f32; n];
            std::hint::black_box(&v);
            Ok(())
        })?;
        let u = median_us(51, || {
            let v: Vec<f32> = Vec::with_capacity(n);
            std::hint::black_box(&v);
            Ok(())
        })?;
        println!("vec![0; {n}]: {t:.1} µs, with_capacity: {u:.1} µs");
    }
    Ok(())
}
