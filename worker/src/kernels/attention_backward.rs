//! The backward of causal attention (`attention`'s layouts): `dq`, `dk`, `dv` written into
//! one `[N, 3h]` buffer, the layout of the QKV projection's output gradient.
//!
//! Per (sequence, head) pair, key tile by key tile, each query tile at or below the diagonal
//! recomputes its probabilities `P = exp(scale·Q Kᵀ − lse)`, then `dV += Pᵀ dY`,
//! `dP = dY Vᵀ`, `dS = P ∘ (dP − D)·scale` with `D = rowsum(dY ∘ Y)`, `dQ += dS K`,
//! `dK += dSᵀ Q`. A pair is one rayon item: its `dQ` rows sum over key tiles and its `dK`,
//! `dV` rows over query tiles, in a fixed order by one thread.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::attention::{Level, Shape, SharedMut, TILE, dispatch, exp_sub, level};
use super::attention_tile::{self as tile, Causal};
use super::attention_tile::{Avx2, Avx512, Isa, Plain};
#[cfg(target_arch = "x86_64")]
use super::simd;

/// A thread's buffers for one pair.
struct BwdScratch {
    /// Probabilities, then `dS`: `TILE × TILE`.
    p: Vec<f32>,
    /// `dP`: `TILE × TILE`.
    dp: Vec<f32>,
    /// `D` of every row of the pair: `t`.
    d: Vec<f32>,
    /// The key tile and the value tile transposed: `hd × TILE` each.
    kt: Vec<f32>,
    vt: Vec<f32>,
}

impl BwdScratch {
    fn new(t: usize, hd: usize) -> Self {
        Self {
            p: vec![0.0; TILE * TILE],
            dp: vec![0.0; TILE * TILE],
            d: vec![0.0; t],
            kt: vec![0.0; hd * TILE],
            vt: vec![0.0; hd * TILE],
        }
    }
}

/// The input buffers of one backward call.
#[derive(Clone, Copy)]
struct Inputs {
    qkv: *const f32,
    y: *const f32,
    lse: *const f32,
    dy: *const f32,
}

/// The backward of one (sequence, head) pair.
///
/// # Safety
/// `qkv` and `dqkv` hold `[N, 3h]`, `y` and `dy` `[N, h]`, `lse` `[b, heads, t]` for `sh`;
/// no other thread writes this pair's columns of `dqkv` meanwhile.
#[inline(always)]
unsafe fn backward_pair<I: Isa>(
    inp: Inputs,
    dqkv: SharedMut,
    sh: Shape,
    pair: usize,
    sc: &mut BwdScratch,
) {
    let (t, hd, h) = (sh.t, sh.hd, sh.h());
    let ld = 3 * h;
    let scale = sh.scale();
    let (qb, ob) = (sh.qkv_base(pair), sh.out_base(pair));
    // SAFETY: all pointers below address this pair's rows and columns (caller's contract).
    let (q, dq, dy, lse) = unsafe {
        (
            inp.qkv.add(qb),
            dqkv.0.add(qb),
            inp.dy.add(ob),
            std::slice::from_raw_parts(inp.lse.add(pair * t), t),
        )
    };
    for (i, d) in sc.d.iter_mut().enumerate() {
        // SAFETY: row `i` of this pair's `y` and `dy` columns.
        let (yr, dyr) = unsafe {
            (
                std::slice::from_raw_parts(inp.y.add(ob + i * h), hd),
                std::slice::from_raw_parts(inp.dy.add(ob + i * h), hd),
            )
        };
        *d = simd::dot(yr, dyr);
    }
    let (p, dp, kt, vt) = (&mut sc.p, &mut sc.dp, &mut sc.kt, &mut sc.vt);
    for k0 in (0..t).step_by(TILE) {
        let cols = TILE.min(t - k0);
        // SAFETY: key rows `[k0, k0 + cols)`; `kt` and `vt` are `hd × TILE`.
        let (k, dk, dv) = unsafe {
            let k = q.add(h + k0 * ld);
            let dk = dq.add(h + k0 * ld);
            tile::transpose::<I>((k, ld), (kt, TILE), cols, hd);
            tile::transpose::<I>((k.add(h), ld), (vt, TILE), cols, hd);
            (k, dk, dk.add(h))
        };
        // Query tiles before the key tile see none of its keys.
        for q0 in (k0..t).step_by(TILE) {
            let rows = TILE.min(t - q0);
            // The diagonal tile's products skip what the mask removes.
            let diag = |c| if k0 == q0 { c } else { Causal::No };
            // SAFETY: query rows `[q0, q0 + rows)`.
            let (qi, dqi, dyi) = unsafe { (q.add(q0 * ld), dq.add(q0 * ld), dy.add(q0 * h)) };
            // SAFETY (every `mm` below): `p` and `dp` are `TILE × TILE`, the tiles of Q, K,
            // V, dY and of this pair's dQ, dK, dV are in bounds, and nothing else writes them.
            unsafe {
                tile::mm::<I>(
                    (rows, cols, hd),
                    (qi, ld, 1),
                    (kt.as_ptr(), TILE),
                    (p.as_mut_ptr(), TILE),
                    (false, scale),
                    diag(Causal::Lower),
                );
            }
            for i in 0..rows {
                // Only the diagonal tile (q0 == k0) has masked keys.
                let valid = cols.min(q0 + i + 1 - k0);
                let row = &mut p[i * TILE..i * TILE + cols];
                exp_sub::<I>(&mut row[..valid], lse[q0 + i]);
                row[valid..].fill(0.0);
            }
            // dV += Pᵀ dY.
            // SAFETY: as above.
            unsafe {
                tile::mm::<I>(
                    (cols, hd, rows),
                    (p.as_ptr(), 1, TILE),
                    (dyi, h),
                    (dv, ld),
                    (q0 > k0, 1.0),
                    diag(Causal::KFrom),
                );
            }
            // dP = dY Vᵀ.
            // SAFETY: as above.
            unsafe {
                tile::mm::<I>(
                    (rows, cols, hd),
                    (dyi, h, 1),
                    (vt.as_ptr(), TILE),
                    (dp.as_mut_ptr(), TILE),
                    (false, 1.0),
                    diag(Causal::Lower),
                );
            }
            for i in 0..rows {
                let d = sc.d[q0 + i];
                // Masked keys keep P = 0 (dP there was not computed).
                let valid = cols.min(q0 + i + 1 - k0);
                let (pr, dpr) = (
                    &mut p[i * TILE..i * TILE + valid],
                    &dp[i * TILE..i * TILE + valid],
                );
                for (x, &g) in pr.iter_mut().zip(dpr) {
                    *x *= (g - d) * scale;
                }
            }
            // dQ += dS K; dK += dSᵀ Q.
            // SAFETY: as above.
            unsafe {
                tile::mm::<I>(
                    (rows, hd, cols),
                    (p.as_ptr(), TILE, 1),
                    (k, ld),
                    (dqi, ld),
                    (k0 > 0, 1.0),
                    diag(Causal::KUpTo),
                );
                tile::mm::<I>(
                    (cols, hd, rows),
                    (p.as_ptr(), 1, TILE),
                    (qi, ld),
                    (dk, ld),
                    (q0 > k0, 1.0),
                    diag(Causal::KFrom),
                );
            }
        }
    }
}

dispatch!(
    backward_dispatch,
    backward_pair,
    (inp: Inputs, dqkv: SharedMut, sh: Shape, pair: usize),
    BwdScratch
);

/// Causal attention backward: `dqkv` (`[N, 3h]`: dQ, dK, dV side by side, every element
/// written) from the forward's `qkv`, `y`, `lse` and the output gradient `dy` (`[N, h]`).
/// Splits over rayon's threads when `threads > 1`.
pub(crate) fn backward(
    inputs: (&[f32], &[f32], &[f32], &[f32]),
    dqkv: &mut [MaybeUninit<f32>],
    sh: Shape,
    threads: usize,
) {
    backward_at(level(), inputs, dqkv, sh, threads);
}

/// [`backward`] with the element-wise code of `level` (which this CPU must have).
pub(crate) fn backward_at(
    level: Level,
    (qkv, y, lse, dy): (&[f32], &[f32], &[f32], &[f32]),
    dqkv: &mut [MaybeUninit<f32>],
    sh: Shape,
    threads: usize,
) {
    let (n, h) = (sh.n(), sh.h());
    assert_eq!(qkv.len(), n * 3 * h, "qkv is [N, 3h]");
    assert_eq!(dqkv.len(), n * 3 * h, "dqkv is [N, 3h]");
    assert_eq!(y.len(), n * h, "y is [N, h]");
    assert_eq!(dy.len(), n * h, "dy is [N, h]");
    assert_eq!(lse.len(), sh.b * sh.heads * sh.t, "lse is [b, heads, t]");
    let out = SharedMut(dqkv.as_mut_ptr().cast());
    let run = |sc: &mut BwdScratch, pair: usize| {
        let inp = Inputs {
            qkv: qkv.as_ptr(),
            y: y.as_ptr(),
            lse: lse.as_ptr(),
            dy: dy.as_ptr(),
        };
        // SAFETY: the buffers have the asserted sizes; each pair writes only its own
        // columns of `dqkv`, and pairs are distinct.
        unsafe { backward_dispatch(level, inp, out, sh, pair, sc) }
    };
    let pairs = sh.b * sh.heads;
    if threads > 1 {
        (0..pairs)
            .into_par_iter()
            .for_each_init(|| BwdScratch::new(sh.t, sh.hd), run);
    } else {
        let mut sc = BwdScratch::new(sh.t, sh.hd);
        (0..pairs).for_each(|p| run(&mut sc, p));
    }
}
