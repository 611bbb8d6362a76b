//! Linear layers on the `gemm` crate directly, as candle custom ops (CPU, f32, contiguous):
//! the forward with its bias and residual folded into the product's destination, the input
//! gradient against the transposed weight, and the weight gradient accumulated in place into
//! the parameter's gradient.
//!
//! candle's own matmul zeroes a fresh destination, and the bias, the residual and the
//! gradient accumulation each cost another pass and another buffer; here each is one GEMM.
//! `gemm` picks its micro-kernel at run time (AVX-512 with the `x86-v4` feature where the
//! CPU has it, else AVX2 + FMA, else SSE); [`isa`] names the one it takes. Threads split the
//! output, never the inner dimension, so the result does not depend on the thread count.

#![allow(unsafe_code)]

use candle_core::{CpuStorage, CustomOp2, InplaceOp3, Layout, Shape, Tensor};
use gemm::Parallelism;

use super::cpu::{storage_f32, storage_slice, threads};
use crate::error::Result;

/// The instruction set `gemm`'s f32 micro-kernels use on this CPU.
pub(crate) fn isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "AVX2+FMA";
        }
        "SSE"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "portable"
    }
}

/// `Parallelism::Rayon` over the kernels' thread count, or none on one thread.
fn parallelism() -> Parallelism {
    match threads() {
        0 | 1 => Parallelism::None,
        n => Parallelism::Rayon(n),
    }
}

/// A row-major matrix operand: where it starts and its strides in elements.
#[derive(Clone, Copy)]
struct Operand {
    ptr: *const f32,
    rs: isize,
    cs: isize,
}

/// Output rows (or columns) per block, about: on several threads a product is cut along its
/// longer side into blocks of this size, shared among them. Two threads on two
/// single-threaded blocks ran 1.1–1.5x faster here than `gemm`'s own threading (which
/// splits finer and synchronises more) at the model's shapes. With more threads than blocks,
/// each block is threaded too. No element's sum depends on the cut: `gemm` blocks the inner
/// dimension by `k` and the cache sizes alone, and sums each element in the same order in
/// any block, except in products with both sides at most [`SMALL_SIDE`], which a cut
/// therefore never makes.
const BLOCK: usize = 256;

/// Both sides at most this: `gemm`'s small-product path, with its own inner blocking.
const SMALL_SIDE: usize = 64;

/// The narrowest block a cut for balance may make (rows or columns).
const MIN_BLOCK: usize = 64;

/// How many blocks `long` output rows (or columns) are cut into on `threads` threads: about
/// [`BLOCK`] each, made a multiple of the thread count where blocks stay at least
/// [`MIN_BLOCK`] wide, so no thread idles while another runs a last block (3 blocks on 2
/// threads cost as much as 4). One thread makes one call: each block packs the operand it
/// shares again (the large bench model's 3072-wide products were 12 calls, and packing 11 %
/// of its step; one call took its 1-thread step from 50.5 to 44.0 s). Nor is a product cut
/// into blocks on gemm's small-product path (both sides ≤ [`SMALL_SIDE`], the other side
/// being `short`) unless it is one: gemm blocks the inner dimension differently there
/// (`kc = min(k, 512)`), so the sums (and bits) would depend on the thread count.
fn block_count(long: usize, short: usize, threads: usize) -> usize {
    if threads <= 1 {
        return 1;
    }
    let count = (long / BLOCK).max(1);
    let blocks = if count.is_multiple_of(threads) {
        count
    } else {
        let widest = (long / MIN_BLOCK).max(1);
        let balanced = count.next_multiple_of(threads);
        if balanced <= widest { balanced } else { count }
    };
    if short <= SMALL_SIDE && long.div_ceil(blocks) <= SMALL_SIDE {
        1
    } else {
        blocks
    }
}

/// `dst = (read ? dst : 0) + lhs·rhs` for an `m × k` lhs and a `k × n` rhs.
///
/// # Safety
/// `dst` must be valid for writes (and, with `read`, reads) of a row-major `m × n` matrix,
/// and each operand valid for reads of its matrix under its strides; `dst` must not overlap
/// either operand.
unsafe fn product(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    read: bool,
    lhs: Operand,
    rhs: Operand,
) {
    let long = m.max(n);
    let blocks = block_count(long, m.min(n), threads());
    let ld = n as isize;
    let one = |(m, n): (usize, usize), dst: *mut f32, lhs: Operand, rhs: Operand, par| {
        // SAFETY: the caller's contract is gemm's, for this block.
        unsafe {
            gemm::gemm(
                m, n, k, dst, 1, ld, read, lhs.ptr, lhs.cs, lhs.rs, rhs.ptr, rhs.cs, rhs.rs, 1.0,
                1.0, false, false, false, par,
            )
        }
    };
    if blocks == 1 {
        return one((m, n), dst, lhs, rhs, parallelism());
    }
    let size = long.div_ceil(blocks).next_multiple_of(16);
    let count = long.div_ceil(size);
    // Addresses as integers, so the closure is `Send`; the blocks are disjoint.
    let (dst_at, lhs_at, rhs_at) = (dst as usize, lhs.ptr as usize, rhs.ptr as usize);
    let block = |i: usize, par: Parallelism| {
        let start = i * size;
        let len = size.min(long - start);
        let dst = dst_at as *mut f32;
        let (lhs_p, rhs_p) = (lhs_at as *const f32, rhs_at as *const f32);
        // SAFETY: block `i` covers rows (or columns) `start .. start + len` of `dst` and
        // the matching rows of `lhs` (or columns of `rhs`), inside the matrices the caller
        // vouched for; no two blocks write the same element.
        unsafe {
            if m >= n {
                let lhs = Operand {
                    ptr: lhs_p.offset(start as isize * lhs.rs),
                    ..lhs
                };
                let rhs = Operand { ptr: rhs_p, ..rhs };
                one((len, n), dst.add(start * n), lhs, rhs, par);
            } else {
                let lhs = Operand { ptr: lhs_p, ..lhs };
                let rhs = Operand {
                    ptr: rhs_p.offset(start as isize * rhs.cs),
                    ..rhs
                };
                one((m, len), dst.add(start), lhs, rhs, par);
            }
        }
    };
    match threads() {
        0 | 1 => (0..count).for_each(|i| block(i, Parallelism::None)),
        t => {
            use rayon::prelude::*;
            // More threads than blocks (a many-core CPU): each block also uses gemm's own
            // threads, which split its output too (the bits stay those of one thread).
            let inner = match t / count {
                0 | 1 => Parallelism::None,
                n => Parallelism::Rayon(n),
            };
            (0..count).into_par_iter().for_each(|i| block(i, inner));
        }
    }
}

/// Rows and columns of a contiguous 2-D layout.
fn dims2(l: &Layout, op: &'static str) -> candle_core::Result<(usize, usize)> {
    match l.dims() {
        &[r, c] => Ok((r, c)),
        d => candle_core::bail!("{op}: expected a 2-D tensor, got shape {d:?}"),
    }
}

/// `y = x·W (+ b) (+ r)` for `x: [N, in]`, `W: [in, out]`, `b: [out]`, `r: [N, out]`.
struct Linear<'a> {
    bias: Option<&'a Tensor>,
    residual: Option<&'a Tensor>,
}

impl CustomOp2 for Linear<'_> {
    fn name(&self) -> &'static str {
        "pipewise-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, w) = (storage_f32(xs, xl, "x")?, storage_f32(ws, wl, "w")?);
        let ((rows, inner), (inner_w, cols)) = (dims2(xl, self.name())?, dims2(wl, self.name())?);
        if inner != inner_w {
            candle_core::bail!("pipewise-linear: x is [{rows}, {inner}], w is [{inner_w}, {cols}]");
        }
        let mut dst: Vec<f32> = Vec::with_capacity(rows * cols);
        let bias_guard = self.bias.map(Tensor::storage_and_layout);
        let res_guard = self.residual.map(Tensor::storage_and_layout);
        let bias = match &bias_guard {
            Some((s, l)) => Some(storage_slice(s, l, "bias", cols)?),
            None => None,
        };
        let res = match &res_guard {
            Some((s, l)) => Some(storage_slice(s, l, "residual", rows * cols)?),
            None => None,
        };
        // The destination starts as the bias and residual (one write pass), or is written
        // by the product alone.
        let read = match (bias, res) {
            (None, None) => false,
            (Some(b), None) => {
                for _ in 0..rows {
                    dst.extend_from_slice(b);
                }
                true
            }
            (None, Some(r)) => {
                dst.extend_from_slice(r);
                true
            }
            (Some(b), Some(r)) => {
                for row in r.chunks_exact(cols) {
                    dst.extend(row.iter().zip(b).map(|(r, b)| r + b));
                }
                true
            }
        };
        let lhs = Operand {
            ptr: x.as_ptr(),
            rs: inner as isize,
            cs: 1,
        };
        let rhs = Operand {
            ptr: w.as_ptr(),
            rs: cols as isize,
            cs: 1,
        };
        // SAFETY: `dst` has capacity for `rows × cols`, all of it initialised when `read`
        // (the fills above wrote exactly that many); gemm writes every element, after which
        // the length is set. `x` and `w` are `rows × inner` and `inner × cols` row-major
        // slices (checked above), distinct from the fresh `dst`.
        unsafe {
            product((rows, cols, inner), dst.as_mut_ptr(), read, lhs, rhs);
            dst.set_len(rows * cols);
        }
        Ok((CpuStorage::F32(dst), Shape::from((rows, cols))))
    }
}

/// `dx = dy·Wᵀ` for `dy: [N, out]`, `W: [in, out]`.
struct GradInput;

impl CustomOp2 for GradInput {
    fn name(&self) -> &'static str {
        "pipewise-linear-grad-input"
    }

    fn cpu_fwd(
        &self,
        ds: &CpuStorage,
        dl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (dy, w) = (storage_f32(ds, dl, "dy")?, storage_f32(ws, wl, "w")?);
        let ((rows, out), (inner, out_w)) = (dims2(dl, self.name())?, dims2(wl, self.name())?);
        if out != out_w {
            candle_core::bail!(
                "{}: dy is [{rows}, {out}], w is [{inner}, {out_w}]",
                self.name()
            );
        }
        let mut dst: Vec<f32> = Vec::with_capacity(rows * inner);
        let lhs = Operand {
            ptr: dy.as_ptr(),
            rs: out as isize,
            cs: 1,
        };
        // Wᵀ: element (j, i) is W[i][j].
        let rhs = Operand {
            ptr: w.as_ptr(),
            rs: 1,
            cs: out as isize,
        };
        // SAFETY: as in `Linear`: a fresh destination fully written by gemm (no read), and
        // operands that are the checked row-major slices, read through valid strides.
        unsafe {
            product((rows, inner, out), dst.as_mut_ptr(), false, lhs, rhs);
            dst.set_len(rows * inner);
        }
        Ok((CpuStorage::F32(dst), Shape::from((rows, inner))))
    }
}

/// `grad += xᵀ·dy` in place, for `x: [N, in]`, `dy: [N, out]`, `grad: [in, out]` (f64).
struct AccumulateGradWeight;

thread_local! {
    /// One strip of a weight gradient's product before it is added in f64 (reused, never
    /// shrunk; at most about [`STRIP_ELEMS`]).
    static PRODUCT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Elements of the f32 product a weight gradient is computed in before its f64 add, about:
/// a larger gradient (a vocabulary table's, tens of millions of elements) is made strip by
/// strip, so the scratch stays a fixed few MiB instead of an f32 copy of the table beside
/// its f64 gradient. Strips change no bit: each is a product of its own, and no element's
/// sum depends on the cut (see [`BLOCK`]); strips are at least [`BLOCK`] wide, so none is
/// on gemm's small-product path.
const STRIP_ELEMS: usize = 1 << 20;

/// How an `inner × out` weight gradient is cut into strips of about `budget` elements:
/// whether along its rows (else its columns, the longer side), and how many strips. Strip
/// `i` of `count` over a side of `long` covers `long·i/count .. long·(i+1)/count`.
fn strips(inner: usize, out: usize, budget: usize) -> (bool, usize) {
    let (long, short) = (inner.max(out), inner.min(out));
    let wanted = (long * short).div_ceil(budget.max(1));
    (inner > out, wanted.min(long / BLOCK).max(1))
}

impl InplaceOp3 for AccumulateGradWeight {
    fn name(&self) -> &'static str {
        "pipewise-linear-accumulate-grad-weight"
    }

    fn cpu_fwd(
        &self,
        gs: &mut CpuStorage,
        gl: &Layout,
        xs: &CpuStorage,
        xl: &Layout,
        ds: &CpuStorage,
        dl: &Layout,
    ) -> candle_core::Result<()> {
        let ((n, inner), (n_d, out)) = (dims2(xl, self.name())?, dims2(dl, self.name())?);
        if dims2(gl, self.name())? != (inner, out) || n != n_d {
            candle_core::bail!(
                "{}: grad {:?}, x [{n}, {inner}], dy [{n_d}, {out}]",
                self.name(),
                gl.dims()
            );
        }
        let (x, dy) = (storage_f32(xs, xl, "x")?, storage_f32(ds, dl, "dy")?);
        let (start, end) = gl.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{}: grad not contiguous", self.name()))
        })?;
        let grad = match gs {
            CpuStorage::F64(v) => &mut v[start..end],
            _ => candle_core::bail!("{}: grad is not f64", self.name()),
        };
        accumulate_strips(grad, (x, dy), (n, inner, out), STRIP_ELEMS);
        Ok(())
    }
}

/// `grad += xᵀ·dy` for `x: [n, inner]`, `dy: [n, out]` and a row-major `inner × out`
/// `grad`: each strip of the product ([`strips`] of `budget` elements) in f32 (one
/// microbatch's gradient, the same bits wherever it is computed), then added in f64.
fn accumulate_strips(
    grad: &mut [f64],
    (x, dy): (&[f32], &[f32]),
    (n, inner, out): (usize, usize, usize),
    budget: usize,
) {
    let (by_rows, count) = strips(inner, out, budget);
    let long = if by_rows { inner } else { out };
    PRODUCT.with_borrow_mut(|scratch| {
        for strip in 0..count {
            let (start, end) = (long * strip / count, long * (strip + 1) / count);
            let (rows, cols) = if by_rows {
                (end - start, out)
            } else {
                (inner, end - start)
            };
            // xᵀ: element (i, t) is x[t][i]; the strip's rows of it, or columns of dy.
            let lhs = Operand {
                ptr: x.as_ptr().wrapping_add(if by_rows { start } else { 0 }),
                rs: 1,
                cs: inner as isize,
            };
            let rhs = Operand {
                ptr: dy.as_ptr().wrapping_add(if by_rows { 0 } else { start }),
                rs: out as isize,
                cs: 1,
            };
            // Grown, never cleared: the product overwrites it (no zeroing per pass).
            if scratch.len() < rows * cols {
                scratch.resize(rows * cols, 0.0);
            }
            let part = &mut scratch[..rows * cols];
            // SAFETY: `part` is an initialised `rows × cols` row-major buffer of this
            // thread's, so it overlaps neither `x` nor `dy`; the operands start inside the
            // checked `n × inner` and `n × out` row-major slices and read, through their
            // strides, only the strip's `rows` columns of `x` or `cols` columns of `dy`.
            unsafe { product((rows, cols, n), part.as_mut_ptr(), false, lhs, rhs) };
            if by_rows {
                add_wide_split(&mut grad[start * out..end * out], part);
            } else {
                add_columns(grad, out, start, part);
            }
        }
    });
}

/// `grad += part` in f64, element by element, so splitting it over the threads changes no
/// bit.
fn add_wide_split(grad: &mut [f64], part: &[f32]) {
    match threads() {
        0 | 1 => super::adamw::add_wide(grad, part),
        t => {
            use rayon::prelude::*;
            let chunk = grad.len().div_ceil(t).next_multiple_of(64).max(64);
            grad.par_chunks_mut(chunk)
                .zip(part.par_chunks(chunk))
                .for_each(|(g, p)| super::adamw::add_wide(g, p));
        }
    }
}

/// Adds `part`, a row-major strip with as many rows as `grad`, to the columns from `start`
/// of each row of the row-major, `cols`-wide `grad`, in f64.
fn add_columns(grad: &mut [f64], cols: usize, start: usize, part: &[f32]) {
    let width = part.len() / (grad.len() / cols);
    let add =
        |(g, p): (&mut [f64], &[f32])| super::adamw::add_wide(&mut g[start..start + width], p);
    match threads() {
        0 | 1 => grad
            .chunks_exact_mut(cols)
            .zip(part.chunks_exact(width))
            .for_each(add),
        _ => {
            use rayon::prelude::*;
            grad.par_chunks_exact_mut(cols)
                .zip(part.par_chunks_exact(width))
                .for_each(add);
        }
    }
}

/// `x·W (+ b) (+ r)` in one GEMM.
pub(crate) fn linear(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
) -> Result<Tensor> {
    Ok(x.apply_op2_no_bwd(w, &Linear { bias, residual })?)
}

/// `dy·Wᵀ`.
pub(crate) fn linear_grad_input(dy: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(dy.apply_op2_no_bwd(w, &GradInput)?)
}

/// `grad += xᵀ·dy`, in place.
pub(crate) fn accumulate_grad_weight(grad: &Tensor, x: &Tensor, dy: &Tensor) -> Result<()> {
    Ok(grad.inplace_op3(x, dy, &AccumulateGradWeight)?)
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};

    use super::*;
    use crate::kernels::testing::with_threads;
    use crate::rng::SplitMix64;

    fn random(shape: (usize, usize), seed: u64) -> Result<Tensor> {
        let mut rng = SplitMix64::new(seed);
        let v: Vec<f32> = (0..shape.0 * shape.1)
            .map(|_| rng.normal() as f32)
            .collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
        Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
    }

    /// Odd shapes (not multiples of any register block): the folded bias and residual, the
    /// transposed weight and the in-place accumulation all agree with candle's ops.
    #[test]
    fn linear_passes_match_candle() -> Result<()> {
        for &(n, i, o) in &[
            (13, 67, 37),
            (1, 64, 192),
            (130, 64, 256),
            (600, 40, 37),
            (9, 70, 530),
        ] {
            let x = random((n, i), 1)?;
            let w = random((i, o), 2)?;
            let b = random((1, o), 3)?.flatten_all()?;
            let r = random((n, o), 4)?;
            let tol = 1e-4 * (i as f32).sqrt();
            let want = x.matmul(&w)?;
            assert!(max_diff(&linear(&x, &w, None, None)?, &want)? < tol);
            let want_b = want.broadcast_add(&b)?;
            assert!(max_diff(&linear(&x, &w, Some(&b), None)?, &want_b)? < tol);
            assert!(max_diff(&linear(&x, &w, None, Some(&r))?, &(&want + &r)?)? < tol);
            assert!(max_diff(&linear(&x, &w, Some(&b), Some(&r))?, &(&want_b + &r)?)? < tol);
            let dy = random((n, o), 5)?;
            let dx = linear_grad_input(&dy, &w)?;
            assert!(max_diff(&dx, &dy.matmul(&w.t()?)?)? < tol);
            // Added in f64 to the gradient: exactly what adding the f32 product gives.
            let grad = random((i, o), 6)?.to_dtype(DType::F64)?;
            let before = grad.copy()?;
            accumulate_grad_weight(&grad, &x, &dy)?;
            let product = x.t()?.matmul(&dy)?.to_dtype(DType::F64)?;
            let want_g = (before + product)?.to_dtype(DType::F32)?;
            let got = grad.to_dtype(DType::F32)?;
            assert!(max_diff(&got, &want_g)? < 1e-4 * (n as f32).sqrt());
        }
        Ok(())
    }

    /// Blocks are about `BLOCK` wide, balanced over the threads where they can stay wide;
    /// one thread makes one call.
    #[test]
    fn blocks_balance_over_the_threads() {
        assert_eq!(block_count(768, 256, 1), 1);
        assert_eq!(block_count(3072, 256, 1), 1);
        assert_eq!(block_count(768, 256, 2), 4);
        assert_eq!(block_count(256, 256, 2), 2);
        assert_eq!(block_count(100, 256, 2), 1);
        assert_eq!(block_count(1024, 256, 2), 4);
        assert_eq!(block_count(768, 256, 16), 3);
        assert_eq!(block_count(1024, 256, 16), 16);
        // Two 64-wide blocks of a 128 × 48 product would be on gemm's small path.
        assert_eq!(block_count(128, 48, 2), 1);
        assert_eq!(block_count(128, 96, 2), 2);
    }

    /// A weight gradient made strip by strip, along its columns or its rows, on one thread
    /// or several, has the bits of the one product; strips are at least `BLOCK` wide.
    #[test]
    fn strips_do_not_change_the_bits() -> Result<()> {
        assert_eq!(strips(1024, 32000, STRIP_ELEMS), (false, 32));
        assert_eq!(strips(32000, 1024, STRIP_ELEMS), (true, 32));
        assert_eq!(strips(768, 2048, STRIP_ELEMS), (false, 2));
        assert_eq!(strips(300, 1100, 1000), (false, 4));
        assert_eq!(strips(300, 200, 1000), (true, 1));
        for (n, inner, out) in [(37, 300, 1100), (37, 1100, 300), (5, 64, 777)] {
            let x = random((n, inner), 10)?.flatten_all()?.to_vec1::<f32>()?;
            let dy = random((n, out), 11)?.flatten_all()?.to_vec1::<f32>()?;
            let grad = |budget, threads| -> Result<Vec<f64>> {
                let mut g = vec![0.25f64; inner * out];
                with_threads(threads, || {
                    accumulate_strips(&mut g, (&x, &dy), (n, inner, out), budget);
                    Ok(())
                })?;
                Ok(g)
            };
            let whole = grad(usize::MAX, 1)?;
            assert_ne!(strips(inner, out, 1000).1, 1, "{inner} × {out} is cut");
            for threads in [1, 3] {
                assert_eq!(
                    whole,
                    grad(1000, threads)?,
                    "{inner} × {out}, {threads} threads"
                );
            }
        }
        Ok(())
    }

    /// Any thread count gives the bits of one: the output is split, never the inner dimension
    /// (and the weight gradient's f64 add element by element).
    #[test]
    fn threads_do_not_change_the_bits() -> Result<()> {
        // One block or two (gemm's own threads, or one block each), and three or four blocks
        // (one thread each, or threaded inside with 8 threads).
        // The last, 128 × 48 over 1024, would make two blocks on gemm's small-product path.
        for (rows, cols, inner) in [
            (300, 130, 96),
            (96, 800, 96),
            (768, 256, 96),
            (256, 256, 96),
            (128, 48, 1024),
        ] {
            let x = random((rows, inner), 7)?;
            let w = random((inner, cols), 8)?;
            let one = with_threads(1, || linear(&x, &w, None, None))?;
            // The weight gradient, accumulated twice into f64 (its add split over threads).
            let dy = random((rows, cols), 9)?;
            let grad = |n| -> Result<Vec<Vec<f64>>> {
                let g = Tensor::zeros((inner, cols), DType::F64, &Device::Cpu)?;
                for _ in 0..2 {
                    with_threads(n, || accumulate_grad_weight(&g, &x, &dy))?;
                }
                Ok(g.to_vec2::<f64>()?)
            };
            let one_grad = grad(1)?;
            for n in [2, 3, 8] {
                let many = with_threads(n, || linear(&x, &w, None, None))?;
                assert_eq!(one.to_vec2::<f32>()?, many.to_vec2::<f32>()?, "{n} threads");
                assert_eq!(one_grad, grad(n)?, "{n} threads: weight gradient");
            }
            assert_eq!(one.dtype(), DType::F32);
        }
        Ok(())
    }
}
