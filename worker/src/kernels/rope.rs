//! Rotary position embeddings in place on the QKV projection's output (or its gradient):
//! the first `rotated` heads of every row (Q's and K's; V's follow, untouched) turned by
//! their position's angles, `transformers`' half-split rotation — the pair
//! `(x_i, x_{i+hd/2})` turns by angle `i`. The inverse turns the other way: the rotation's
//! input gradient, applied to `dQ` and `dK` as the attention kernels write them.
//!
//! Rows are split over threads; each element is the same two products and a sum whoever
//! computes it, the very operations of the candle-op version (`y₁ = x₁·cos − x₂·sin`,
//! `y₂ = x₂·cos + x₁·sin`), so the result is bit-identical to it.

use candle_core::Tensor;
use rayon::prelude::*;

use super::cpu::{distinct_f32, rows_per_task, with_f32_mut, with_f32s};
use super::simd::multiversion;
use crate::error::{Error, Result};

/// What a rotation reads beside the buffer: the tables and where the rows sit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rotation {
    /// Tokens per sequence: row `r` is at position `start + r mod t`.
    pub(crate) t: usize,
    /// The position of each sequence's first row.
    pub(crate) start: usize,
    /// Heads turned at the start of each row (`heads + kv_heads`).
    pub(crate) rotated: usize,
    /// Head size (even).
    pub(crate) hd: usize,
    /// Turn back (the input gradient).
    pub(crate) inverse: bool,
}

multiversion! {
    /// Rotates whole rows of `x` (`width` columns each); the first row is row `row0` of the
    /// buffer.
    fn rotate_rows(
        x: &mut [f32],
        width: usize,
        row0: usize,
        cos: &[f32],
        sin: &[f32],
        r: Rotation,
    ) {
        let half = r.hd / 2;
        for (i, row) in x.chunks_exact_mut(width).enumerate() {
            let p = r.start + (row0 + i) % r.t;
            let (c, s) = (&cos[p * half..(p + 1) * half], &sin[p * half..(p + 1) * half]);
            for head in row[..r.rotated * r.hd].chunks_exact_mut(r.hd) {
                let (a, b) = head.split_at_mut(half);
                if r.inverse {
                    for (((x1, x2), &cv), &sv) in a.iter_mut().zip(b.iter_mut()).zip(c).zip(s) {
                        let (u, v) = (*x1, *x2);
                        *x1 = u * cv + v * sv;
                        *x2 = v * cv - u * sv;
                    }
                } else {
                    for (((x1, x2), &cv), &sv) in a.iter_mut().zip(b.iter_mut()).zip(c).zip(s) {
                        let (u, v) = (*x1, *x2);
                        *x1 = u * cv - v * sv;
                        *x2 = v * cv + u * sv;
                    }
                }
            }
        }
    }
}

/// Rotates `x: [N, width]` in place (rows of `b` sequences of `r.t` tokens) with the
/// tables `cos`, `sin: [positions, hd/2]`. `Ok(false)` without touching anything where a
/// tensor is not a contiguous f32 CPU one of its own storage (the caller's candle path
/// then serves); an error naming the field for sizes that do not fit.
pub(crate) fn rotate_in_place(
    x: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    r: Rotation,
) -> Result<bool> {
    let (rows, width) = x.dims2()?;
    let (positions, half) = cos.dims2()?;
    let fits = r.hd.is_multiple_of(2)
        && r.hd / 2 == half
        && sin.dims() == cos.dims()
        && r.rotated * r.hd <= width
        && r.t > 0
        && rows.is_multiple_of(r.t)
        && r.start + r.t <= positions;
    if !fits {
        return Err(Error::InvalidArgument {
            field: "rope",
            reason: format!(
                "x {:?}, tables {:?}, {} heads of {} turned, {} tokens from position {}",
                x.dims(),
                cos.dims(),
                r.rotated,
                r.hd,
                r.t,
                r.start
            ),
        });
    }
    if !distinct_f32(&[x, cos, sin]) || rows == 0 {
        return Ok(rows == 0);
    }
    let ran = with_f32_mut(x, |x| {
        with_f32s([cos, sin], |[c, s]| match rows_per_task(rows) {
            Some(k) => x
                .par_chunks_mut(k * width)
                .enumerate()
                .for_each(|(i, x)| rotate_rows(x, width, i * k, c, s, r)),
            None => rotate_rows(x, width, 0, c, s, r),
        })
    })?;
    Ok(ran.flatten().is_some())
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::kernels::testing::{awkward, bits, with_threads};
    use crate::llama_ops::Rope;

    /// The same bits as the candle-op rotation (forward and inverse), on 1 and 2 threads,
    /// from position 0 and further on; V's columns untouched.
    #[test]
    fn matches_the_candle_rotation_bit_for_bit() -> Result<()> {
        let (heads, kv, hd) = (4, 2, 8);
        let width = (heads + 2 * kv) * hd;
        let rope = Rope::new(80, hd, 10_000.0, &Device::Cpu)?;
        for (b, t, start, inverse) in [(3, 13, 0, false), (2, 70, 0, true), (1, 5, 30, false)] {
            let x = awkward(b * t, width, 1.0, 3)?;
            let want = rope.apply_from_candle(&x, (b, t), (heads, kv, hd), inverse, start)?;
            for threads in [1, 2] {
                let got = x.copy()?;
                let r = Rotation {
                    t,
                    start,
                    rotated: heads + kv,
                    hd,
                    inverse,
                };
                let done = with_threads(threads, || rotate_in_place(&got, rope.tables(), r))?;
                assert!(done);
                assert_eq!(bits(&got)?, bits(&want)?, "b {b} t {t} start {start}");
            }
        }
        Ok(())
    }

    /// Positions past the tables, or an odd head, are refused naming the field.
    #[test]
    fn sizes_that_do_not_fit_are_refused() -> Result<()> {
        let rope = Rope::new(8, 8, 10_000.0, &Device::Cpu)?;
        let x = awkward(10, 48, 1.0, 4)?;
        let r = Rotation {
            t: 10,
            start: 0,
            rotated: 3,
            hd: 8,
            inverse: false,
        };
        let err = rotate_in_place(&x, rope.tables(), r).err();
        assert!(err.is_some_and(|e| e.to_string().contains("rope")));
        Ok(())
    }
}
