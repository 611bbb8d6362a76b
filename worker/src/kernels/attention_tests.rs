//! The attention kernels (and `ops::attention`'s candle path) against the unfused reference:
//! the `t × t` probabilities computed and kept, as `ops` did before the kernels.

use std::mem::MaybeUninit;

use candle_core::{D, DType, Device, Tensor};

use super::attention::{Level, Shape, forward_at, levels};
use super::attention_backward::backward_at;
use crate::error::Result;
use crate::ops;
use crate::rng::SplitMix64;

/// The reference (the earlier `ops::attention`): probabilities `softmax(q·kᵀ/√d + mask)`
/// and output `p·v`, on `[b, heads, t, hd]`.
fn reference(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Result<(Tensor, Tensor)> {
    let hd = q.dim(D::Minus1)?;
    let scale = 1.0 / (hd as f64).sqrt();
    let scores = q.matmul(&k.t()?)?.affine(scale, 0.0)?.broadcast_add(mask)?;
    let p = ops::softmax_last(&scores)?;
    let y = p.matmul(v)?;
    Ok((p, y))
}

/// The reference's backward (the earlier `ops::attention_grad`).
fn reference_grad(
    (q, k, v, p): (&Tensor, &Tensor, &Tensor, &Tensor),
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let hd = q.dim(D::Minus1)?;
    let scale = 1.0 / (hd as f64).sqrt();
    let dv = p.t()?.matmul(dy)?;
    let (dp, pw) = (
        dy.matmul(&v.t()?)?.to_dtype(DType::F32)?,
        p.to_dtype(DType::F32)?,
    );
    let row = (&dp * &pw)?.sum_keepdim(D::Minus1)?;
    let ds = (pw * dp.broadcast_sub(&row)?)?
        .affine(scale, 0.0)?
        .to_dtype(q.dtype())?;
    Ok((ds.matmul(k)?, ds.t()?.matmul(q)?, dv))
}

/// Seeded normal values.
fn normal(n: usize, seed: u64, std: f64) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| (rng.normal() * std) as f32).collect()
}

fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
}

/// Elementwise `|a − b| ≤ tol·(1 + |b|)`, with the worst offender in the message.
fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let (mut worst, mut at) = (0f32, 0);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let err = (x - y).abs() / (1.0 + y.abs());
        assert!(err.is_finite(), "{what}[{i}]: {x} vs {y}");
        if err > worst {
            (worst, at) = (err, i);
        }
    }
    assert!(
        worst <= tol,
        "{what}: [{at}] {} vs {} (relative error {worst:e} > {tol:e})",
        a[at],
        b[at]
    );
}

/// Every output of one case: `y`, `lse`, `dqkv` (each `[N, ·]` host vectors).
struct Outputs {
    y: Vec<f32>,
    lse: Vec<f32>,
    dqkv: Vec<f32>,
}

/// The reference's outputs in the kernels' layouts, from `qkv` and `dy`.
fn reference_outputs(qkv: &Tensor, dy: &Tensor, sh: Shape) -> Result<Outputs> {
    let dims = (sh.b, sh.t, sh.heads, sh.h());
    let heads = |off| ops::split_heads(qkv, off, dims);
    let (q, k, v) = (heads(0)?, heads(sh.h())?, heads(2 * sh.h())?);
    let mask = ops::causal_mask(sh.t, qkv.dtype(), qkv.device())?;
    let (p, yh) = reference(&q, &k, &v, &mask)?;
    let dyh = ops::split_heads(dy, 0, dims)?;
    let (dq, dk, dv) = reference_grad((&q, &k, &v, &p), &dyh)?;
    let dqkv = Tensor::cat(
        &[
            &ops::merge_heads(&dq)?,
            &ops::merge_heads(&dk)?,
            &ops::merge_heads(&dv)?,
        ],
        1,
    )?;
    // log Σ exp(scores) of the reference's own scores, in f64.
    let scale = 1.0 / (sh.hd as f64).sqrt();
    let scores = q.matmul(&k.t()?)?.affine(scale, 0.0)?;
    let s = host(&scores)?;
    let t = sh.t;
    let lse = (0..sh.b * sh.heads * t)
        .map(|r| {
            let i = r % t;
            let row = &s[r * t..r * t + i + 1];
            let m = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x)) as f64;
            (m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()) as f32
        })
        .collect();
    Ok(Outputs {
        y: host(&ops::merge_heads(&yh)?)?,
        lse,
        dqkv: host(&dqkv)?,
    })
}

/// Room for a kernel's output, every element NaN.
fn nans(n: usize) -> Vec<MaybeUninit<f32>> {
    vec![MaybeUninit::new(f32::NAN); n]
}

/// The values in room made by [`nans`].
#[allow(unsafe_code)]
fn values(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
    // SAFETY: `nans` initialised every element.
    v.into_iter().map(|x| unsafe { x.assume_init() }).collect()
}

/// The kernels' outputs with `threads` rayon threads (1: no rayon at all), compiled for
/// `level`.
fn kernel_outputs(level: Level, qkv: &[f32], dy: &[f32], sh: Shape, threads: usize) -> Outputs {
    let run = || {
        // NaN-filled: every element must be written.
        let (mut y, mut lse) = (nans(sh.n() * sh.h()), nans(sh.b * sh.heads * sh.t));
        forward_at(level, qkv, (&mut y, &mut lse), sh, threads);
        let (y, lse) = (values(y), values(lse));
        let mut dqkv = nans(sh.n() * sh.ld());
        backward_at(level, (qkv, &y, &lse, dy), &mut dqkv, sh, threads);
        Outputs {
            y,
            lse,
            dqkv: values(dqkv),
        }
    };
    if threads == 1 {
        return run();
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
        .install(run)
}

/// The awkward shapes: `t` not a multiple of the tile (64) nor of the vector width (16),
/// one and several sequences, one head of 64 and several heads (of 16, 24 and 20 columns).
fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for t in [13, 37, 67, 130] {
        for b in [1, 3] {
            out.push(Shape::multi_head(b, t, 1, 64));
        }
    }
    out.push(Shape::multi_head(2, 70, 4, 16));
    out.push(Shape::multi_head(1, 131, 3, 24));
    // A head width that is not a multiple of the transposes' 8 × 8 blocks.
    out.push(Shape::multi_head(2, 45, 2, 20));
    out
}

/// Inputs of one case: `qkv` scaled so the scores spread over several units (peaked and
/// flat rows both occur), and `dy`.
fn inputs(sh: Shape, seed: u64) -> (Vec<f32>, Vec<f32>) {
    (
        normal(sh.n() * sh.ld(), seed, 1.5),
        normal(sh.n() * sh.h(), seed + 1, 1.0),
    )
}

/// Forward output, log-sum-exp and all three gradients match the unfused reference, with 1
/// and 2 threads bit-identical, for every instruction set this CPU has (plain code always). Tolerance 2e-5 relative to `1 + |reference|`: both sides
/// are f32 sums of at most 131 products of O(1) terms, summed in different orders (tiles,
/// online rescaling, vector lanes), so a few hundred ulp of the operands' size at most.
#[test]
fn kernels_match_the_unfused_reference() -> Result<()> {
    for (i, (sh, level)) in shapes()
        .into_iter()
        .flat_map(|sh| levels().into_iter().map(move |l| (sh, l)))
        .enumerate()
    {
        let (qkv, dy) = inputs(sh, 100 + i as u64);
        let one = kernel_outputs(level, &qkv, &dy, sh, 1);
        let two = kernel_outputs(level, &qkv, &dy, sh, 2);
        assert_eq!(one.y, two.y, "{sh:?} {level:?}: y with 1 and 2 threads");
        assert_eq!(
            one.lse, two.lse,
            "{sh:?} {level:?}: lse with 1 and 2 threads"
        );
        assert_eq!(
            one.dqkv, two.dqkv,
            "{sh:?} {level:?}: dqkv with 1 and 2 threads"
        );
        let qkv_t = Tensor::from_vec(qkv, (sh.n(), 3 * sh.h()), &Device::Cpu)?;
        let dy_t = Tensor::from_vec(dy, (sh.n(), sh.h()), &Device::Cpu)?;
        let want = reference_outputs(&qkv_t, &dy_t, sh)?;
        assert_close(&one.y, &want.y, 2e-5, &format!("{sh:?} {level:?} y"));
        assert_close(&one.lse, &want.lse, 2e-5, &format!("{sh:?} {level:?} lse"));
        let h3 = 3 * sh.h();
        for (part, name) in ["dq", "dk", "dv"].iter().enumerate() {
            let cols = |v: &[f32]| -> Vec<f32> {
                v.chunks(h3)
                    .flat_map(|r| r[part * sh.h()..(part + 1) * sh.h()].to_vec())
                    .collect()
            };
            assert_close(
                &cols(&one.dqkv),
                &cols(&want.dqkv),
                2e-5,
                &format!("{sh:?} {level:?} {name}"),
            );
        }
    }
    Ok(())
}

/// Grouped-query attention (key/value heads shared by `heads / kv_heads` query heads, read
/// in place) against the multi-head reference on the key/value heads repeated
/// (`llama_ops::repeat_kv`, `transformers`' `repeat_kv`), whose shared heads' gradients are
/// the sums over their query heads (`llama_ops::sum_kv`); 1 and 2 threads bit-identical,
/// every instruction set. Tolerance as above (a shared head's gradient adds `heads / kv`
/// such sums).
#[test]
fn grouped_query_heads_match_the_repeated_reference() -> Result<()> {
    let shapes = [
        Shape {
            b: 2,
            t: 70,
            heads: 4,
            kv_heads: 2,
            hd: 16,
        },
        Shape {
            b: 1,
            t: 131,
            heads: 6,
            kv_heads: 2,
            hd: 24,
        },
        Shape {
            b: 3,
            t: 37,
            heads: 4,
            kv_heads: 1,
            hd: 32,
        },
    ];
    for (i, (sh, level)) in shapes
        .into_iter()
        .flat_map(|sh| levels().into_iter().map(move |l| (sh, l)))
        .enumerate()
    {
        let (qkv, dy) = inputs(sh, 300 + i as u64);
        let one = kernel_outputs(level, &qkv, &dy, sh, 1);
        let two = kernel_outputs(level, &qkv, &dy, sh, 2);
        assert_eq!(one.y, two.y, "{sh:?} {level:?}: y with 1 and 2 threads");
        assert_eq!(one.lse, two.lse, "{sh:?} {level:?}: lse");
        assert_eq!(one.dqkv, two.dqkv, "{sh:?} {level:?}: dqkv");
        let dims = (sh.heads, sh.kv_heads, sh.hd);
        let qkv_t = Tensor::from_vec(qkv, (sh.n(), sh.ld()), &Device::Cpu)?;
        let wide = crate::llama_ops::repeat_kv(&qkv_t, dims)?;
        let dy_t = Tensor::from_vec(dy, (sh.n(), sh.h()), &Device::Cpu)?;
        let mha = Shape::multi_head(sh.b, sh.t, sh.heads, sh.hd);
        let want = reference_outputs(&wide, &dy_t, mha)?;
        let dwide = Tensor::from_vec(want.dqkv, (sh.n(), mha.ld()), &Device::Cpu)?;
        let want_dqkv = host(&crate::llama_ops::sum_kv(&dwide, dims)?)?;
        let what = format!("{sh:?} {level:?}");
        assert_close(&one.y, &want.y, 2e-5, &format!("{what} y"));
        assert_close(&one.lse, &want.lse, 2e-5, &format!("{what} lse"));
        assert_close(&one.dqkv, &want_dqkv, 2e-5, &format!("{what} dqkv"));
    }
    Ok(())
}

/// `ops::attention` and `ops::attention_grad` take the kernels for a contiguous f32 CPU
/// `qkv`, and candle ops otherwise (here: the same values, not contiguous); both match the
/// reference, within the tolerance above.
#[test]
fn both_paths_of_ops_match_the_reference() -> Result<()> {
    let sh = Shape::multi_head(3, 37, 2, 32);
    let (qkv, dy) = inputs(sh, 7);
    let qkv = Tensor::from_vec(qkv, (sh.n(), 3 * sh.h()), &Device::Cpu)?;
    let dy = Tensor::from_vec(dy, (sh.n(), sh.h()), &Device::Cpu)?;
    let want = reference_outputs(&qkv, &dy, sh)?;
    let mask = ops::causal_mask(sh.t, DType::F32, &Device::Cpu)?;
    let strided = qkv.t()?.contiguous()?.t()?;
    assert!(!strided.is_contiguous());
    for (qkv, path) in [(&qkv, "kernel"), (&strided, "candle")] {
        let dims = (sh.b, sh.t, sh.heads);
        let (y, lse) = ops::attention(qkv, dims, &mask)?;
        assert_eq!(lse.dims(), &[sh.b, sh.heads, sh.t]);
        let dqkv = ops::attention_grad((qkv, &y, &lse), &dy, dims, &mask)?;
        assert_close(&host(&y)?, &want.y, 2e-5, &format!("{path} y"));
        assert_close(&host(&lse)?, &want.lse, 2e-5, &format!("{path} lse"));
        assert_close(&host(&dqkv)?, &want.dqkv, 2e-5, &format!("{path} dqkv"));
    }
    Ok(())
}

/// The candle path in bf16 keeps bf16 outputs and an f32 log-sum-exp, and stays within
/// bf16's precision of the reference run in bf16 (both round the probabilities and the
/// products to bf16: 2⁻⁸ relative each, a few of them along the way).
#[test]
fn bf16_attention_keeps_an_f32_log_sum_exp() -> Result<()> {
    let sh = Shape::multi_head(2, 13, 2, 16);
    let (qkv, dy) = inputs(sh, 9);
    let qkv = Tensor::from_vec(qkv, (sh.n(), 3 * sh.h()), &Device::Cpu)?.to_dtype(DType::BF16)?;
    let dy = Tensor::from_vec(dy, (sh.n(), sh.h()), &Device::Cpu)?.to_dtype(DType::BF16)?;
    let mask = ops::causal_mask(sh.t, DType::BF16, &Device::Cpu)?;
    let dims = (sh.b, sh.t, sh.heads);
    let (y, lse) = ops::attention(&qkv, dims, &mask)?;
    let dqkv = ops::attention_grad((&qkv, &y, &lse), &dy, dims, &mask)?;
    assert_eq!(
        (y.dtype(), lse.dtype(), dqkv.dtype()),
        (DType::BF16, DType::F32, DType::BF16)
    );
    let want = reference_outputs(&qkv, &dy, sh)?;
    assert_close(&host(&y)?, &want.y, 2e-2, "bf16 y");
    assert_close(&host(&dqkv)?, &want.dqkv, 5e-2, "bf16 dqkv");
    Ok(())
}

/// Times (on-CPU time, a mean) the block's attention before (split heads, the unfused reference with its `t × t`
/// probabilities, merge heads) and after (`ops::attention` / `ops::attention_grad`) on the
/// issue's two models and `pipewise local`'s tiny one (heads of 16). By hand, in release:
/// `RAYON_NUM_THREADS=1 cargo test --release -p pipewise-worker --lib attention_speed -- --ignored --nocapture`.
#[test]
#[ignore = "a timing to read, not a check"]
fn attention_speed() -> Result<()> {
    // On-CPU nanoseconds of every thread of this process (Linux), so that a loaded machine's
    // waiting does not count; the best of `reps` runs by this clock.
    fn cpu_ns() -> u64 {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }
    // The scheduler updates that clock at its ticks, so: the mean over runs that take at
    // least half a second of CPU together.
    fn best(_reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        f()?;
        let (start, mut runs) = (cpu_ns(), 0u32);
        while cpu_ns() - start < 500_000_000 {
            f()?;
            runs += 1;
        }
        Ok((cpu_ns() - start) as f64 * 1e-9 / f64::from(runs))
    }
    for (b, t, h, heads) in [(4, 128, 256, 4), (4, 256, 1024, 16), (1, 32, 64, 4)] {
        let sh = Shape::multi_head(b, t, heads, h / heads);
        let (qkv, dy) = inputs(sh, 1);
        let qkv = Tensor::from_vec(qkv, (sh.n(), 3 * h), &Device::Cpu)?;
        let dy = Tensor::from_vec(dy, (sh.n(), h), &Device::Cpu)?;
        let mask = ops::causal_mask(t, DType::F32, &Device::Cpu)?;
        let dims = (b, t, heads, h);
        let split = |x: &Tensor, off| ops::split_heads(x, off, dims);
        let reps = 30;
        let mut stash = None;
        let old_f = best(reps, || {
            let (q, k, v) = (split(&qkv, 0)?, split(&qkv, h)?, split(&qkv, 2 * h)?);
            let (p, yh) = reference(&q, &k, &v, &mask)?;
            let y = ops::merge_heads(&yh)?;
            stash = Some((q, k, v, p, y));
            Ok(())
        })?;
        let (q, k, v, p, _) = stash.take().expect("ran");
        let old_b = best(reps, || {
            let dyh = split(&dy, 0)?;
            let (dq, dk, dv) = reference_grad((&q, &k, &v, &p), &dyh)?;
            let m = |x: &Tensor| ops::merge_heads(x);
            Tensor::cat(&[&m(&dq)?, &m(&dk)?, &m(&dv)?], 1)?;
            Ok(())
        })?;
        let mut out = None;
        let new_f = best(reps, || {
            out = Some(ops::attention(&qkv, (b, t, heads), &mask)?);
            Ok(())
        })?;
        let (y, lse) = out.take().expect("ran");
        let new_b = best(reps, || {
            ops::attention_grad((&qkv, &y, &lse), &dy, (b, t, heads), &mask)?;
            Ok(())
        })?;
        // The kernels alone, for each instruction set.
        let (qv, dyv, yv, lv) = (host(&qkv)?, host(&dy)?, host(&y)?, host(&lse)?);
        let threads = candle_core::utils::get_num_threads();
        let mut per_level = Vec::new();
        for level in levels() {
            let (mut y2, mut l2) = (nans(yv.len()), nans(lv.len()));
            let mut dqkv = nans(qv.len());
            let f = best(reps, || {
                forward_at(level, &qv, (&mut y2, &mut l2), sh, threads);
                Ok(())
            })?;
            let bw = best(reps, || {
                backward_at(level, (&qv, &yv, &lv, &dyv), &mut dqkv, sh, threads);
                Ok(())
            })?;
            per_level.push(format!("{level:?} {:.3} / {:.3} ms", f * 1e3, bw * 1e3));
        }
        println!("  kernels forward / backward: {}", per_level.join(", "));
        // piece_flops' count for the forward (the full t × t products); the backward's four
        // products twice that.
        let flops = 4.0 * (b * t * t * h) as f64;
        let g = |secs: f64, f: f64| f / secs / 1e9;
        println!(
            "b {b} t {t} h {h} heads {heads}, {} threads: forward {:.3} ms ({:.1} GFLOP/s) -> {:.3} ms ({:.1} GFLOP/s), x{:.2}; backward {:.3} ms ({:.1}) -> {:.3} ms ({:.1}), x{:.2}",
            candle_core::utils::get_num_threads(),
            old_f * 1e3,
            g(old_f, flops),
            new_f * 1e3,
            g(new_f, flops),
            old_f / new_f,
            old_b * 1e3,
            g(old_b, 2.0 * flops),
            new_b * 1e3,
            g(new_b, 2.0 * flops),
            old_b / new_b,
        );
    }
    Ok(())
}
