//! RMSNorm (Llama's) forward, input gradient and weight gradient, one pass over the rows
//! each, in the style of [`super::layer_norm`]: rows split over threads for the forward and
//! the input gradient, columns for the weight gradient (each column summed in row order), so
//! no result depends on the thread count.
//!
//! The input gradient adds the residual branch's gradient as it writes (`dx = r + …`), the
//! sum the block needs, without a separate pass.

use std::mem::MaybeUninit;

use candle_core::Tensor;
use rayon::prelude::*;

use super::cpu::{cols_per_task, rows_per_task, tensor, uninit, with_f32, with_f32s, written};
use super::simd::{self, multiversion};
use crate::error::{Error, Result};

multiversion! {
    /// `y`, `x̂` and `1/rms` of whole rows of `x` (`rstd.len()` rows).
    fn forward_rows(
        x: &[f32],
        w: &[f32],
        eps: f32,
        y: &mut [MaybeUninit<f32>],
        xhat: &mut [MaybeUninit<f32>],
        rstd: &mut [MaybeUninit<f32>],
    ) {
        let h = w.len();
        let inv_h = 1.0 / h as f32;
        let rows = x.chunks_exact(h).zip(y.chunks_exact_mut(h)).zip(xhat.chunks_exact_mut(h));
        for (((xr, yr), hr), rs) in rows.zip(rstd.iter_mut()) {
            let r = 1.0 / (simd::sum_map(xr, |v| v * v) * inv_h + eps).sqrt();
            for (((&xv, yv), hv), &g) in xr.iter().zip(yr).zip(hr).zip(w) {
                let n = xv * r;
                hv.write(n);
                yv.write(n * g);
            }
            rs.write(r);
        }
    }
}

multiversion! {
    /// `dx = r + (1/rms)·(g − x̂·mean(g·x̂))`, `g = dy·w`, for whole rows (`r` the residual
    /// branch's gradient, or nothing: then `residual` is empty).
    fn grad_input_rows(
        dy: &[f32],
        xhat: &[f32],
        rstd: &[f32],
        w: &[f32],
        residual: &[f32],
        dx: &mut [MaybeUninit<f32>],
    ) {
        let h = w.len();
        let inv_h = 1.0 / h as f32;
        let rows = dy.chunks_exact(h).zip(xhat.chunks_exact(h)).zip(dx.chunks_exact_mut(h));
        for (i, (((dr, hr), out), &r)) in rows.zip(rstd).enumerate() {
            let mgx = row_dot(dr, hr, w) * inv_h;
            if residual.is_empty() {
                for (((o, &d), &xh), &g) in out.iter_mut().zip(dr).zip(hr).zip(w) {
                    o.write((d * g - xh * mgx) * r);
                }
            } else {
                let res = &residual[i * h..(i + 1) * h];
                for ((((o, &d), &xh), &g), &rv) in out.iter_mut().zip(dr).zip(hr).zip(w).zip(res) {
                    o.write(rv + (d * g - xh * mgx) * r);
                }
            }
        }
    }
}

/// `Σ dy·w·x̂` of a row (fixed order, see [`simd::ACC`]).
#[inline(always)]
fn row_dot(dy: &[f32], xhat: &[f32], w: &[f32]) -> f32 {
    let mut acc = [0f32; simd::ACC];
    let body = dy.len() - dy.len() % simd::ACC;
    let chunks = dy[..body]
        .chunks_exact(simd::ACC)
        .zip(xhat[..body].chunks_exact(simd::ACC))
        .zip(w[..body].chunks_exact(simd::ACC));
    for ((d, x), g) in chunks {
        for i in 0..simd::ACC {
            acc[i] += d[i] * g[i] * x[i];
        }
    }
    let tail = dy[body..].iter().zip(&xhat[body..]).zip(&w[body..]);
    for (i, ((&d, &x), &g)) in tail.enumerate() {
        acc[i] += d * g * x;
    }
    simd::combine_sum(acc)
}

multiversion! {
    /// `dw += Σ dy·x̂` over the rows of a block of columns starting at `c0` (`dw.len()`
    /// columns), rows in order.
    fn grad_weight_cols(dy: &[f32], xhat: &[f32], h: usize, c0: usize, dw: &mut [f32]) {
        let n = dw.len();
        for (dr, hr) in dy.chunks_exact(h).zip(xhat.chunks_exact(h)) {
            for ((g, &d), &x) in dw.iter_mut().zip(&dr[c0..c0 + n]).zip(&hr[c0..c0 + n]) {
                *g += d * x;
            }
        }
    }
}

/// `(rows, h)` of `x: [rows, h]` given `w: [h]`; an error naming `op` otherwise (or for
/// `h = 0`).
fn dims(op: &'static str, x: &Tensor, w: &Tensor) -> Result<(usize, usize)> {
    let (rows, h) = x.dims2()?;
    if h == 0 || w.dims1()? != h {
        return Err(Error::InvalidArgument {
            field: op,
            reason: format!("x {:?} with weight {:?}", x.dims(), w.dims()),
        });
    }
    Ok((rows, h))
}

/// RMSNorm of contiguous f32 CPU tensors `x: [N, h]`, `w: [h]`: `(y, x̂, 1/rms [N, 1])`.
pub(crate) fn forward(x: &Tensor, w: &Tensor, eps: f64) -> Result<(Tensor, Tensor, Tensor)> {
    let (rows, h) = dims("rms_norm", x, w)?;
    let eps = eps as f32;
    let (mut y, mut xhat, mut rstd) = (uninit(rows * h), uninit(rows * h), uninit(rows));
    with_f32s([x, w], |[x, w]| match rows_per_task(rows) {
        Some(k) => y
            .par_chunks_mut(k * h)
            .zip(xhat.par_chunks_mut(k * h))
            .zip(rstd.par_chunks_mut(k))
            .zip(x.par_chunks(k * h))
            .for_each(|(((y, xh), rs), x)| forward_rows(x, w, eps, y, xh, rs)),
        None => forward_rows(x, w, eps, &mut y, &mut xhat, &mut rstd),
    })
    .ok_or_else(|| not_fast("rms_norm"))?;
    // SAFETY: the kernel ran over every row, writing each row's y, x̂ and 1/rms.
    #[allow(unsafe_code)]
    let (y, xhat, rstd) = unsafe { (written(y), written(xhat), written(rstd)) };
    Ok((
        tensor(y, (rows, h))?,
        tensor(xhat, (rows, h))?,
        tensor(rstd, (rows, 1))?,
    ))
}

/// The input gradient of RMSNorm from contiguous f32 CPU `dy`, `x̂: [N, h]`,
/// `1/rms: [N, 1]`, `w: [h]`, plus `residual` (`[N, h]`) where given.
pub(crate) fn grad_input(
    dy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    w: &Tensor,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    let (rows, h) = dims("rms_norm_grad_input", dy, w)?;
    let residual_ok = residual.is_none_or(|r| r.dims() == dy.dims());
    if xhat.dims() != dy.dims() || rstd.elem_count() != rows || !residual_ok {
        return Err(Error::InvalidArgument {
            field: "rms_norm_grad_input",
            reason: format!(
                "dy {:?}, x̂ {:?}, 1/rms {:?}, residual {:?}",
                dy.dims(),
                xhat.dims(),
                rstd.dims(),
                residual.map(Tensor::dims)
            ),
        });
    }
    let mut dx = uninit(rows * h);
    let mut run = |[dy, xh, rs, w]: [&[f32]; 4], res: &[f32]| match rows_per_task(rows) {
        Some(k) => dx.par_chunks_mut(k * h).enumerate().for_each(|(i, dx)| {
            let (r0, r1) = (i * k, (i * k + dx.len() / h));
            let res = if res.is_empty() {
                res
            } else {
                &res[r0 * h..r1 * h]
            };
            let (dy, xh) = (&dy[r0 * h..r1 * h], &xh[r0 * h..r1 * h]);
            grad_input_rows(dy, xh, &rs[r0..r1], w, res, dx);
        }),
        None => grad_input_rows(dy, xh, rs, w, res, &mut dx),
    };
    let ran = with_f32s([dy, xhat, rstd, w], |ins| match residual {
        Some(r) => with_f32(r, |res| run(ins, res)),
        None => {
            run(ins, &[]);
            Some(())
        }
    });
    ran.flatten()
        .ok_or_else(|| not_fast("rms_norm_grad_input"))?;
    // SAFETY: the kernel ran over every row, writing all of it.
    #[allow(unsafe_code)]
    let dx = unsafe { written(dx) };
    tensor(dx, (rows, h))
}

/// `dw = Σ dy·x̂` over the rows of contiguous f32 CPU `dy`, `x̂: [N, h]`.
pub(crate) fn grad_weight(dy: &Tensor, xhat: &Tensor) -> Result<Tensor> {
    let (rows, h) = dy.dims2()?;
    if xhat.dims() != dy.dims() {
        return Err(Error::InvalidArgument {
            field: "rms_norm_grad_weight",
            reason: format!("dy {:?}, x̂ {:?}", dy.dims(), xhat.dims()),
        });
    }
    let mut dw = vec![0f32; h];
    with_f32s([dy, xhat], |[dy, xh]| match cols_per_task(rows, h) {
        Some(c) => dw
            .par_chunks_mut(c)
            .enumerate()
            .for_each(|(i, g)| grad_weight_cols(dy, xh, h, i * c, g)),
        None if h > 0 => grad_weight_cols(dy, xh, h, 0, &mut dw),
        None => {}
    })
    .ok_or_else(|| not_fast("rms_norm_grad_weight"))?;
    tensor(dw, h)
}

fn not_fast(op: &'static str) -> Error {
    Error::InvalidArgument {
        field: op,
        reason: "the kernel takes contiguous f32 CPU tensors".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{assert_close, awkward, bits, with_threads};
    use crate::llama_ops;

    /// Against the candle-op reference on awkward shapes. Tolerance 1e-5·(1 + |ref|): the
    /// mean square is a sum of up to a few hundred terms in another order than candle's,
    /// and the gradient adds two such terms.
    #[test]
    fn matches_the_candle_reference() -> Result<()> {
        for (rows, h) in [(13, 67), (37, 64), (1, 256), (3, 1), (70, 200)] {
            let x = (awkward(rows, h, 2.0, 1)? + 0.7)?;
            let w = (awkward(1, h, 0.3, 2)?.flatten_all()? + 1.0)?;
            let dy = awkward(rows, h, 1.0, 4)?;
            let res = awkward(rows, h, 1.0, 5)?;
            let (y, xhat, rstd) = forward(&x, &w, 1e-5)?;
            let want = llama_ops::rms_norm_candle(&x, &w, 1e-5)?;
            assert_close(&y, &want.y, 1e-5)?;
            assert_close(&xhat, &want.xhat, 1e-5)?;
            assert_close(&rstd, &want.rstd, 1e-5)?;
            let want_dx = llama_ops::rms_norm_grad_input_candle(&dy, &want.xhat, &want.rstd, &w)?;
            assert_close(&grad_input(&dy, &xhat, &rstd, &w, None)?, &want_dx, 1e-5)?;
            assert_close(
                &grad_input(&dy, &xhat, &rstd, &w, Some(&res))?,
                &(&res + &want_dx)?,
                1e-5,
            )?;
            // Both sum rows in order per column: the same bits.
            assert_eq!(
                bits(&grad_weight(&dy, &xhat)?)?,
                bits(&llama_ops::rms_norm_grad_weight_candle(&dy, &xhat)?)?
            );
        }
        Ok(())
    }

    /// A weight or residual of the wrong shape is refused, naming the op.
    #[test]
    fn mismatched_shapes_are_refused() -> Result<()> {
        let x = awkward(4, 16, 1.0, 9)?;
        let w = awkward(1, 16, 1.0, 10)?.flatten_all()?;
        let short = awkward(1, 15, 1.0, 12)?.flatten_all()?;
        let err = forward(&x, &short, 1e-5).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("rms_norm")));
        let (_, xhat, rstd) = forward(&x, &w, 1e-5)?;
        let bad = awkward(3, 16, 1.0, 13)?;
        let err = grad_input(&x, &xhat, &rstd, &w, Some(&bad)).err();
        assert!(err.is_some_and(|e| e.to_string().contains("rms_norm_grad_input")));
        Ok(())
    }

    /// Rows (forward, input gradient) and columns (weight gradient) split over two threads
    /// give the bits of one thread.
    #[test]
    fn threads_do_not_change_the_result() -> Result<()> {
        let (rows, h) = (131, 200);
        let x = awkward(rows, h, 2.0, 5)?;
        let w = awkward(1, h, 1.0, 6)?.flatten_all()?;
        let dy = awkward(rows, h, 1.0, 8)?;
        let res = awkward(rows, h, 1.0, 7)?;
        let run = || -> Result<Vec<Vec<u64>>> {
            let (y, xhat, rstd) = forward(&x, &w, 1e-5)?;
            let dx = grad_input(&dy, &xhat, &rstd, &w, Some(&res))?;
            let dw = grad_weight(&dy, &xhat)?;
            [y, xhat, rstd, dx, dw].iter().map(bits).collect()
        };
        assert_eq!(with_threads(1, run)?, with_threads(2, run)?);
        Ok(())
    }
}
