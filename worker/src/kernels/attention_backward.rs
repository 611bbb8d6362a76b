//! The backward of causal attention (`attention`'s layouts): `dq`, `dk`, `dv` written into
//! one `[N, h + 2·kv·hd]` buffer, the layout of the QKV projection's output gradient.
//!
//! Per (sequence, key/value head) group, key tile by key tile (K and V transposed once for
//! the group's query heads), for each of its query heads, each query tile at or below the
//! diagonal recomputes its probabilities `P = exp(scale·Q Kᵀ − lse)`, then `dV += Pᵀ dY`,
//! `dP = dY Vᵀ`, `dS = P ∘ (dP − D)·scale` with `D = rowsum(dY ∘ Y)`, `dQ += dS K`,
//! `dK += dSᵀ Q`. A group is one rayon item: its `dQ` rows sum over key tiles and its `dK`,
//! `dV` rows over its heads and query tiles, in a fixed order by one thread (a shared
//! key/value head's gradient is the sum over the query heads that read it).
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use rayon::prelude::*;

use candle_core::Tensor;

use super::attention::{Level, Shape, SharedMut, TILE, check_qkv, dispatch, exp_sub, level};
use super::attention_tile::{self as tile, Causal};
use super::attention_tile::{Avx2, Avx512, Isa, Plain};
use super::cpu;
#[cfg(target_arch = "x86_64")]
use super::simd;
use crate::error::{Error, Result};

/// A thread's buffers for one pair.
struct BwdScratch {
    /// Probabilities, then `dS`: `TILE × TILE`.
    p: Vec<f32>,
    /// `dP`: `TILE × TILE`.
    dp: Vec<f32>,
    /// `D` of every row of the group's heads: `group × t`.
    d: Vec<f32>,
    /// The key tile and the value tile transposed: `hd × TILE` each.
    kt: Vec<f32>,
    vt: Vec<f32>,
}

impl BwdScratch {
    fn new(sh: Shape) -> Self {
        let (t, hd) = (sh.t, sh.hd);
        Self {
            p: vec![0.0; TILE * TILE],
            dp: vec![0.0; TILE * TILE],
            d: vec![0.0; sh.group() * t],
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

/// The backward of one (sequence, key/value head) group.
///
/// # Safety
/// `qkv` and `dqkv` hold `[N, ld]`, `y` and `dy` `[N, h]`, `lse` `[b, heads, t]` for `sh`;
/// no other thread writes this group's columns of `dqkv` meanwhile.
#[inline(always)]
unsafe fn backward_group<I: Isa>(
    inp: Inputs,
    dqkv: SharedMut,
    sh: Shape,
    group: usize,
    sc: &mut BwdScratch,
) {
    let (t, hd, h, ld) = (sh.t, sh.hd, sh.h(), sh.ld());
    let first = group / sh.kv_heads * sh.heads + group % sh.kv_heads * sh.group();
    for (j, d) in sc.d.chunks_exact_mut(t).enumerate() {
        let ob = sh.out_base(first + j);
        for (i, d) in d.iter_mut().enumerate() {
            // SAFETY: row `i` of this head's `y` and `dy` columns (caller's contract).
            let (yr, dyr) = unsafe {
                (
                    std::slice::from_raw_parts(inp.y.add(ob + i * h), hd),
                    std::slice::from_raw_parts(inp.dy.add(ob + i * h), hd),
                )
            };
            *d = simd::dot(yr, dyr);
        }
    }
    let kb = sh.k_base(first);
    for k0 in (0..t).step_by(TILE) {
        let cols = TILE.min(t - k0);
        // SAFETY: key rows `[k0, k0 + cols)` of the group's K and V (and of their gradient);
        // `kt` and `vt` are `hd × TILE`.
        let keys = unsafe {
            let k = inp.qkv.add(kb + k0 * ld);
            let v = k.add(sh.kv_heads * hd);
            tile::transpose::<I>((k, ld), (&mut sc.kt, TILE), cols, hd);
            tile::transpose::<I>((v, ld), (&mut sc.vt, TILE), cols, hd);
            let dk = dqkv.0.add(kb + k0 * ld);
            KeyTile {
                k0,
                cols,
                k,
                dk,
                dv: dk.add(sh.kv_heads * hd),
            }
        };
        for j in 0..sh.group() {
            // SAFETY: the caller's contract, for head `first + j` of this group.
            unsafe { key_tile_of_head::<I>(inp, dqkv, sh, (first + j, j), &keys, sc) };
        }
    }
}

/// Key rows `[k0, k0 + cols)` of a group: K in the QKV buffer, its and V's gradient.
struct KeyTile {
    k0: usize,
    cols: usize,
    k: *const f32,
    dk: *mut f32,
    dv: *mut f32,
}

/// One key tile's share of a query head's backward: every query tile at or below the
/// diagonal, adding to `dQ`, `dK` and `dV` (`dK` and `dV` start from this product only for
/// the group's first head on the diagonal tile).
///
/// # Safety
/// As [`backward_group`]'s; `sc.kt` and `sc.vt` hold the tile's K and V transposed.
#[inline(always)]
unsafe fn key_tile_of_head<I: Isa>(
    inp: Inputs,
    dqkv: SharedMut,
    sh: Shape,
    (pair, j): (usize, usize),
    kt: &KeyTile,
    sc: &mut BwdScratch,
) {
    let (t, h, hd, ld) = (sh.t, sh.h(), sh.hd, sh.ld());
    let scale = sh.scale();
    let (k0, cols) = (kt.k0, kt.cols);
    // SAFETY: this head's rows and columns (caller's contract).
    let (q, dq, dy, lse) = unsafe {
        (
            inp.qkv.add(sh.q_base(pair)),
            dqkv.0.add(sh.q_base(pair)),
            inp.dy.add(sh.out_base(pair)),
            std::slice::from_raw_parts(inp.lse.add(pair * t), t),
        )
    };
    let d = &sc.d[j * t..(j + 1) * t];
    let (p, dp, ktr, vtr) = (&mut sc.p, &mut sc.dp, &sc.kt, &sc.vt);
    // Query tiles before the key tile see none of its keys.
    for q0 in (k0..t).step_by(TILE) {
        let rows = TILE.min(t - q0);
        // The diagonal tile's products skip what the mask removes.
        let diag = |c| if k0 == q0 { c } else { Causal::No };
        // dK and dV start from the group's first head's diagonal tile.
        let add_kv = j > 0 || q0 > k0;
        // SAFETY: query rows `[q0, q0 + rows)`.
        let (qi, dqi, dyi) = unsafe { (q.add(q0 * ld), dq.add(q0 * ld), dy.add(q0 * h)) };
        // SAFETY (every `mm` below): `p` and `dp` are `TILE × TILE`, the tiles of Q, K, V,
        // dY and of this group's dQ, dK, dV are in bounds, and nothing else writes them.
        unsafe {
            tile::mm::<I>(
                (rows, cols, hd),
                (qi, ld, 1),
                (ktr.as_ptr(), TILE),
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
                (kt.dv, ld),
                (add_kv, 1.0),
                diag(Causal::KFrom),
            );
        }
        // dP = dY Vᵀ.
        // SAFETY: as above.
        unsafe {
            tile::mm::<I>(
                (rows, cols, hd),
                (dyi, h, 1),
                (vtr.as_ptr(), TILE),
                (dp.as_mut_ptr(), TILE),
                (false, 1.0),
                diag(Causal::Lower),
            );
        }
        for i in 0..rows {
            let di = d[q0 + i];
            // Masked keys keep P = 0 (dP there was not computed).
            let valid = cols.min(q0 + i + 1 - k0);
            let (pr, dpr) = (
                &mut p[i * TILE..i * TILE + valid],
                &dp[i * TILE..i * TILE + valid],
            );
            for (x, &g) in pr.iter_mut().zip(dpr) {
                *x *= (g - di) * scale;
            }
        }
        // dQ += dS K; dK += dSᵀ Q.
        // SAFETY: as above.
        unsafe {
            tile::mm::<I>(
                (rows, hd, cols),
                (p.as_ptr(), TILE, 1),
                (kt.k, ld),
                (dqi, ld),
                (k0 > 0, 1.0),
                diag(Causal::KUpTo),
            );
            tile::mm::<I>(
                (cols, hd, rows),
                (p.as_ptr(), 1, TILE),
                (qi, ld),
                (kt.dk, ld),
                (add_kv, 1.0),
                diag(Causal::KFrom),
            );
        }
    }
}

dispatch!(
    backward_dispatch,
    backward_group,
    (inp: Inputs, dqkv: SharedMut, sh: Shape, group: usize),
    BwdScratch
);

/// Causal attention backward: `dqkv` (`[N, ld]`: dQ, dK, dV side by side, every element
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

/// [`backward`] of tensors: `dqkv` (`[N, h + 2·kv·hd]`), or `None` where an input is not a
/// contiguous f32 CPU tensor; an error where `qkv` does not fit `sh`.
pub(crate) fn backward_tensors(
    (qkv, y, lse, dy): (&Tensor, &Tensor, &Tensor, &Tensor),
    sh: Shape,
) -> Result<Option<Tensor>> {
    check_qkv("attention_grad", qkv, sh)?;
    let (n, h) = (sh.n(), sh.h());
    if y.dims() != [n, h] || dy.dims() != [n, h] || lse.elem_count() != sh.b * sh.heads * sh.t {
        return Err(Error::InvalidArgument {
            field: "attention_grad",
            reason: format!(
                "y {:?}, dy {:?}, lse {:?} for qkv {:?}",
                y.dims(),
                dy.dims(),
                lse.dims(),
                qkv.dims()
            ),
        });
    }
    let mut dqkv = cpu::uninit(n * sh.ld());
    let threads = cpu::threads();
    let run = |[q, y, l, d]: [&[f32]; 4]| backward((q, y, l, d), &mut dqkv, sh, threads);
    if cpu::with_f32s([qkv, y, lse, dy], run).is_none() {
        return Ok(None);
    }
    // SAFETY: the kernel writes every element of `dqkv`.
    let dqkv = unsafe { cpu::written(dqkv) };
    Ok(Some(cpu::tensor(dqkv, (n, sh.ld()))?))
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
    assert!(
        sh.kv_heads > 0 && sh.heads.is_multiple_of(sh.kv_heads),
        "kv_heads divides heads"
    );
    assert_eq!(qkv.len(), n * sh.ld(), "qkv is [N, h + 2·kv·hd]");
    assert_eq!(dqkv.len(), n * sh.ld(), "dqkv is [N, h + 2·kv·hd]");
    assert_eq!(y.len(), n * h, "y is [N, h]");
    assert_eq!(dy.len(), n * h, "dy is [N, h]");
    assert_eq!(lse.len(), sh.b * sh.heads * sh.t, "lse is [b, heads, t]");
    let out = SharedMut(dqkv.as_mut_ptr().cast());
    let run = |sc: &mut BwdScratch, group: usize| {
        let inp = Inputs {
            qkv: qkv.as_ptr(),
            y: y.as_ptr(),
            lse: lse.as_ptr(),
            dy: dy.as_ptr(),
        };
        // SAFETY: the buffers have the asserted sizes; each group writes only its own
        // columns of `dqkv`, and groups are distinct.
        unsafe { backward_dispatch(level, inp, out, sh, group, sc) }
    };
    let groups = sh.b * sh.kv_heads;
    if threads > 1 {
        (0..groups)
            .into_par_iter()
            .for_each_init(|| BwdScratch::new(sh), run);
    } else {
        let mut sc = BwdScratch::new(sh);
        (0..groups).for_each(|g| run(&mut sc, g));
    }
}
