//! LayerNorm forward, input gradient and weight gradient, one pass over the rows each.
//!
//! Direct storage access rather than custom ops: the forward has three outputs (`y`, `x̂`,
//! `1/σ`), the input gradient four inputs and the weight gradient two outputs. Rows are
//! split over threads for the forward and the input gradient; the weight gradient sums over
//! rows, so it is split by columns, each column summed in row order.

use std::mem::MaybeUninit;

use candle_core::Tensor;
use rayon::prelude::*;

use super::cpu::{cols_per_task, rows_per_task, tensor, uninit, with_f32, written};
use super::simd::{self, ACC, multiversion};
use crate::error::{Error, Result};

/// GPT-2's epsilon, as `ops::LN_EPS`.
const EPS: f32 = 1e-5;

multiversion! {
    /// `y`, `x̂` and `1/σ` of whole rows of `x` (`rstd.len()` rows).
    fn forward_rows(
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        y: &mut [MaybeUninit<f32>],
        xhat: &mut [MaybeUninit<f32>],
        rstd: &mut [MaybeUninit<f32>],
    ) {
        let h = gamma.len();
        let inv_h = 1.0 / h as f32;
        let rows = x.chunks_exact(h).zip(y.chunks_exact_mut(h)).zip(xhat.chunks_exact_mut(h));
        for (((xr, yr), hr), rs) in rows.zip(rstd.iter_mut()) {
            let mean = simd::sum(xr) * inv_h;
            let var = simd::sum_map(xr, |v| (v - mean) * (v - mean)) * inv_h;
            let r = 1.0 / (var + EPS).sqrt();
            for ((((&xv, yv), hv), &g), &b) in xr.iter().zip(yr).zip(hr).zip(gamma).zip(beta) {
                let n = (xv - mean) * r;
                hv.write(n);
                yv.write(n * g + b);
            }
            rs.write(r);
        }
    }
}

/// `(Σ g, Σ g·x̂)` of a row with `g = dy·γ` (fixed order, see [`simd::ACC`]).
#[inline(always)]
fn row_sums(dy: &[f32], xhat: &[f32], gamma: &[f32]) -> (f32, f32) {
    let (mut sg, mut sgx) = ([0f32; ACC], [0f32; ACC]);
    let body = dy.len() - dy.len() % ACC;
    for ((d, x), g) in dy[..body]
        .chunks_exact(ACC)
        .zip(xhat[..body].chunks_exact(ACC))
        .zip(gamma[..body].chunks_exact(ACC))
    {
        for i in 0..ACC {
            let gi = d[i] * g[i];
            sg[i] += gi;
            sgx[i] += gi * x[i];
        }
    }
    for (i, ((&d, &x), &g)) in dy[body..]
        .iter()
        .zip(&xhat[body..])
        .zip(&gamma[body..])
        .enumerate()
    {
        let gi = d * g;
        sg[i] += gi;
        sgx[i] += gi * x;
    }
    (simd::combine_sum(sg), simd::combine_sum(sgx))
}

multiversion! {
    /// `dx = (1/σ)·(g − mean(g) − x̂·mean(g·x̂))`, `g = dy·γ`, for whole rows.
    fn grad_input_rows(
        dy: &[f32],
        xhat: &[f32],
        rstd: &[f32],
        gamma: &[f32],
        dx: &mut [MaybeUninit<f32>],
    ) {
        let h = gamma.len();
        let inv_h = 1.0 / h as f32;
        let rows = dy.chunks_exact(h).zip(xhat.chunks_exact(h)).zip(dx.chunks_exact_mut(h));
        for (((dr, hr), out), &r) in rows.zip(rstd) {
            let (sg, sgx) = row_sums(dr, hr, gamma);
            let (mg, mgx) = (sg * inv_h, sgx * inv_h);
            for (((o, &d), &xh), &g) in out.iter_mut().zip(dr).zip(hr).zip(gamma) {
                o.write(((d * g - mg) - xh * mgx) * r);
            }
        }
    }
}

multiversion! {
    /// `dγ += Σ dy·x̂`, `dβ += Σ dy` over the rows of a block of columns starting at `c0`
    /// (`dgamma.len()` columns), rows in order.
    fn grad_weight_cols(dy: &[f32], xhat: &[f32], h: usize, c0: usize, dgamma: &mut [f32], dbeta: &mut [f32]) {
        let w = dgamma.len();
        for (dr, hr) in dy.chunks_exact(h).zip(xhat.chunks_exact(h)) {
            let (dr, hr) = (&dr[c0..c0 + w], &hr[c0..c0 + w]);
            for (((g, b), &d), &x) in dgamma.iter_mut().zip(dbeta.iter_mut()).zip(dr).zip(hr) {
                *g += d * x;
                *b += d;
            }
        }
    }
}

/// `(rows, h)` of `x: [rows, h]` given `γ: [h]`; an error otherwise (or for `h = 0`).
fn dims(x: &Tensor, gamma: &Tensor) -> Result<(usize, usize)> {
    let (rows, h) = x.dims2()?;
    if h == 0 || gamma.dims1()? != h {
        return Err(Error::InvalidArgument {
            field: "layer_norm",
            reason: format!("x {:?} with γ {:?}", x.dims(), gamma.dims()),
        });
    }
    Ok((rows, h))
}

/// LayerNorm of contiguous f32 CPU tensors `x: [N, h]`, `γ`, `β: [h]`: `(y, x̂, 1/σ [N, 1])`.
pub(crate) fn forward(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (rows, h) = dims(x, gamma)?;
    // Every row is written whole only where β is as long as γ (the zip stops at the shorter).
    if beta.dims1()? != h {
        return Err(Error::InvalidArgument {
            field: "layer_norm",
            reason: format!("x {:?} with β {:?}", x.dims(), beta.dims()),
        });
    }
    let (mut y, mut xhat, mut rstd) = (uninit(rows * h), uninit(rows * h), uninit(rows));
    with_f32(x, |x| {
        with_f32(gamma, |g| {
            with_f32(beta, |b| match rows_per_task(rows) {
                Some(k) => y
                    .par_chunks_mut(k * h)
                    .zip(xhat.par_chunks_mut(k * h))
                    .zip(rstd.par_chunks_mut(k))
                    .zip(x.par_chunks(k * h))
                    .for_each(|(((y, xh), rs), x)| forward_rows(x, g, b, y, xh, rs)),
                None => forward_rows(x, g, b, &mut y, &mut xhat, &mut rstd),
            })
        })
    })
    .flatten()
    .flatten()
    .ok_or_else(|| not_fast("layer_norm"))?;
    // SAFETY: the kernel ran over every row, writing each row's y, x̂ and 1/σ.
    #[allow(unsafe_code)]
    let (y, xhat, rstd) = unsafe { (written(y), written(xhat), written(rstd)) };
    Ok((
        tensor(y, (rows, h))?,
        tensor(xhat, (rows, h))?,
        tensor(rstd, (rows, 1))?,
    ))
}

/// The input gradient of LayerNorm from contiguous f32 CPU `dy`, `x̂: [N, h]`,
/// `1/σ: [N, 1]`, `γ: [h]`.
pub(crate) fn grad_input(
    dy: &Tensor,
    xhat: &Tensor,
    rstd: &Tensor,
    gamma: &Tensor,
) -> Result<Tensor> {
    let (rows, h) = dims(dy, gamma)?;
    if xhat.dims() != dy.dims() || rstd.elem_count() != rows {
        return Err(Error::InvalidArgument {
            field: "layer_norm_grad_input",
            reason: format!(
                "dy {:?}, x̂ {:?}, 1/σ {:?}",
                dy.dims(),
                xhat.dims(),
                rstd.dims()
            ),
        });
    }
    let mut dx = uninit(rows * h);
    with_f32(dy, |dy| {
        with_f32(xhat, |xh| {
            with_f32(rstd, |rs| {
                with_f32(gamma, |g| match rows_per_task(rows) {
                    Some(k) => dx
                        .par_chunks_mut(k * h)
                        .zip(dy.par_chunks(k * h))
                        .zip(xh.par_chunks(k * h))
                        .zip(rs.par_chunks(k))
                        .for_each(|(((dx, dy), xh), rs)| grad_input_rows(dy, xh, rs, g, dx)),
                    None => grad_input_rows(dy, xh, rs, g, &mut dx),
                })
            })
        })
    })
    .flatten()
    .flatten()
    .flatten()
    .ok_or_else(|| not_fast("layer_norm_grad_input"))?;
    // SAFETY: the kernel ran over every row, writing all of it.
    #[allow(unsafe_code)]
    let dx = unsafe { written(dx) };
    tensor(dx, (rows, h))
}

/// `(dγ, dβ) = (Σ dy·x̂, Σ dy)` over the rows of contiguous f32 CPU `dy`, `x̂: [N, h]`.
pub(crate) fn grad_weight(dy: &Tensor, xhat: &Tensor) -> Result<(Tensor, Tensor)> {
    let (rows, h) = dy.dims2()?;
    if xhat.dims() != dy.dims() {
        return Err(Error::InvalidArgument {
            field: "layer_norm_grad_weight",
            reason: format!("dy {:?}, x̂ {:?}", dy.dims(), xhat.dims()),
        });
    }
    let (mut dg, mut db) = (vec![0f32; h], vec![0f32; h]);
    with_f32(dy, |dy| {
        with_f32(xhat, |xh| match cols_per_task(rows, h) {
            Some(w) => dg
                .par_chunks_mut(w)
                .zip(db.par_chunks_mut(w))
                .enumerate()
                .for_each(|(i, (g, b))| grad_weight_cols(dy, xh, h, i * w, g, b)),
            None if h > 0 => grad_weight_cols(dy, xh, h, 0, &mut dg, &mut db),
            None => {}
        })
    })
    .flatten()
    .ok_or_else(|| not_fast("layer_norm_grad_weight"))?;
    Ok((tensor(dg, h)?, tensor(db, h)?))
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
    use crate::ops;

    /// Against the candle-op reference on awkward shapes (1 row, 13 or 37 rows, widths 64,
    /// 67 and 1). Tolerance 1e-5·(1 + |ref|): x̂ is `(x − μ)·(1/σ)` with μ and σ from
    /// sums of up to a few hundred terms summed in another order than candle's (each sum
    /// within ~h·2⁻²⁴ relative), and the gradients add three such terms.
    #[test]
    fn matches_the_candle_reference() -> Result<()> {
        for (rows, h) in [(13, 67), (37, 64), (1, 256), (3, 1), (70, 200)] {
            let x = (awkward(rows, h, 2.0, 1)? + 0.7)?;
            let g = (awkward(1, h, 0.3, 2)?.flatten_all()? + 1.0)?;
            let b = awkward(1, h, 0.3, 3)?.flatten_all()?;
            let dy = awkward(rows, h, 1.0, 4)?;
            let (y, xhat, rstd) = forward(&x, &g, &b)?;
            let want = ops::layer_norm_candle(&x, &g, &b)?;
            assert_close(&y, &want.y, 1e-5)?;
            assert_close(&xhat, &want.xhat, 1e-5)?;
            assert_close(&rstd, &want.rstd, 1e-5)?;
            assert_close(
                &grad_input(&dy, &xhat, &rstd, &g)?,
                &ops::layer_norm_grad_input_candle(&dy, &want.xhat, &want.rstd, &g)?,
                1e-5,
            )?;
            let (dg, db) = grad_weight(&dy, &xhat)?;
            let (wg, wb) = ops::layer_norm_grad_weight_candle(&dy, &xhat)?;
            // Both sum rows in order per column: the same bits.
            assert_eq!(bits(&dg)?, bits(&wg)?);
            assert_eq!(bits(&db)?, bits(&wb)?);
        }
        Ok(())
    }

    /// A γ or β that is not `[h]` is refused, naming the op (a short β would leave the rows'
    /// tails unwritten).
    #[test]
    fn mismatched_weights_are_refused() -> Result<()> {
        let x = awkward(4, 16, 1.0, 9)?;
        let (g, b) = (
            awkward(1, 16, 1.0, 10)?.flatten_all()?,
            awkward(1, 16, 1.0, 11)?.flatten_all()?,
        );
        let short = awkward(1, 15, 1.0, 12)?.flatten_all()?;
        for (gamma, beta) in [(&g, &short), (&short, &b)] {
            let err = forward(&x, gamma, beta).err().map(|e| e.to_string());
            assert!(
                err.as_deref().is_some_and(|e| e.contains("layer_norm")),
                "{err:?}"
            );
        }
        assert!(forward(&x, &g, &b).is_ok());
        Ok(())
    }

    /// Rows (forward, input gradient) and columns (weight gradient) split over two threads
    /// give the bits of one thread.
    #[test]
    fn threads_do_not_change_the_result() -> Result<()> {
        let (rows, h) = (131, 200);
        let x = awkward(rows, h, 2.0, 5)?;
        let g = awkward(1, h, 1.0, 6)?.flatten_all()?;
        let b = awkward(1, h, 1.0, 7)?.flatten_all()?;
        let dy = awkward(rows, h, 1.0, 8)?;
        let run = || -> Result<Vec<Vec<u64>>> {
            let (y, xhat, rstd) = forward(&x, &g, &b)?;
            let dx = grad_input(&dy, &xhat, &rstd, &g)?;
            let (dg, db) = grad_weight(&dy, &xhat)?;
            [y, xhat, rstd, dx, dg, db].iter().map(bits).collect()
        };
        assert_eq!(with_threads(1, run)?, with_threads(2, run)?);
        Ok(())
    }
}
