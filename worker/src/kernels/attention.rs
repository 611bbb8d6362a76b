//! Causal multi-head self-attention on f32 CPU buffers, flash-style: the `t × t`
//! probabilities are never stored. The forward keeps, per query row, the log-sum-exp of its
//! scaled scores; the backward (`attention_backward`) recomputes each probability tile from
//! `q`, `k` and that log-sum-exp.
//!
//! Layout: Q, K and V are read in place from the QKV projection's output `[N, 3h]`
//! (`N = b·t` tokens, token-major; head `j`'s Q columns are `[j·hd, (j+1)·hd)`, its K columns
//! `h` further, its V columns `2h` further); the output is written token-major `[N, h]`, the
//! layout the attention projection reads; the log-sum-exp is `[b, heads, t]`. No split or
//! merge of heads is copied. These are plain functions on slices (with several outputs, not a
//! candle `CustomOp`); `ops::attention` and `ops::attention_grad` reach the slices through
//! `Tensor::storage_and_layout`.
//!
//! Tiles are `TILE` query rows by `TILE` keys; their products run on a register-blocked
//! micro-kernel (`attention_tile`) reading the strided buffers directly. All of a tile's
//! work (products, max, exponential, rescale) is generic code compiled once per
//! instruction set (AVX-512, AVX2 + FMA, plain) and chosen at run time. A (sequence, head)
//! pair's keys are transposed once per call (the products' `B` must have contiguous rows).
//! Work is split over pairs with rayon (in the forward over query tiles where there are
//! fewer pairs than threads); each query row is computed by one thread in a fixed order, so
//! results do not depend on the thread count.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

use super::attention_tile::{self as tile, Avx2, Avx512, Causal, Isa, Plain};
use super::simd;

/// Query rows and keys per tile: a `TILE × TILE` score tile and a `TILE × hd` output tile
/// (16 KiB each at hd = 64) stay in L1/L2. Query and key tiles must be the same size and
/// aligned (the causal diagonal then only crosses tiles with equal start).
pub(crate) const TILE: usize = 64;

/// The sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Sequences (`b`).
    pub(crate) b: usize,
    /// Tokens per sequence (`t`).
    pub(crate) t: usize,
    /// Heads.
    pub(crate) heads: usize,
    /// Head dimension (`h / heads`).
    pub(crate) hd: usize,
}

impl Shape {
    /// Hidden size `h = heads·hd`.
    pub(crate) fn h(&self) -> usize {
        self.heads * self.hd
    }

    /// Tokens `N = b·t`.
    pub(crate) fn n(&self) -> usize {
        self.b * self.t
    }

    /// `1/√hd`.
    pub(crate) fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }

    /// Offset in the `[N, 3h]` buffer of the first Q element of (sequence, head) `pair`.
    pub(crate) fn qkv_base(&self, pair: usize) -> usize {
        let (bi, head) = (pair / self.heads, pair % self.heads);
        bi * self.t * 3 * self.h() + head * self.hd
    }

    /// Offset in a `[N, h]` buffer of the first element of `pair`.
    pub(crate) fn out_base(&self, pair: usize) -> usize {
        let (bi, head) = (pair / self.heads, pair % self.heads);
        bi * self.t * self.h() + head * self.hd
    }
}

/// A pointer shared by the threads of one call; each thread writes a disjoint part.
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(pub(crate) *mut f32);
// SAFETY: only used to hand disjoint regions of one buffer to rayon tasks (each task writes
// the rows and columns of its own (sequence, head) pair, or query tiles of one), while the buffer's
// `&mut` borrow is held by the caller for the whole call.
unsafe impl Send for SharedMut {}
// SAFETY: as above.
unsafe impl Sync for SharedMut {}

pub(crate) use super::simd::{Level, level};

/// Lanes of the element-wise loops: LLVM turns a `[f32; LANES]` body into 1 (AVX-512) or 2
/// (AVX2) vector operations.
const LANES: usize = 16;

/// `row[i] = e^(row[i] − sub)`, vectorised.
#[inline(always)]
pub(crate) fn exp_sub<I: Isa>(row: &mut [f32], sub: f32) {
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        let c: &mut [f32; LANES] = c.try_into().expect("LANES elements");
        for x in c.iter_mut() {
            *x = simd::exp(*x - sub);
        }
    }
    for x in chunks.into_remainder() {
        *x = simd::exp(*x - sub);
    }
}

/// A thread's buffers for forward tiles.
struct FwdScratch {
    /// Scores, then probabilities: `TILE × TILE`.
    s: Vec<f32>,
    /// Unnormalised output: `TILE × hd`.
    o: Vec<f32>,
    /// Running row maximum and row sum.
    m: Vec<f32>,
    l: Vec<f32>,
    /// The pair's keys transposed: `hd × t`.
    kt: Vec<f32>,
}

impl FwdScratch {
    fn new(hd: usize, t: usize) -> Self {
        Self {
            s: vec![0.0; TILE * TILE],
            o: vec![0.0; TILE * hd],
            m: vec![0.0; TILE],
            l: vec![0.0; TILE],
            kt: vec![0.0; hd * t],
        }
    }
}

/// The forward of query tiles `tiles` of `pair`: the keys they see (up to the last tile's
/// end) transposed once, then each tile's online softmax over the key tiles up to the
/// diagonal.
///
/// # Safety
/// `qkv` holds `[N, 3h]`, `y` `[N, h]`, `lse` `[b, heads, t]` for `sh`; no other thread
/// writes these tiles' rows of `y` and `lse` meanwhile.
#[inline(always)]
unsafe fn forward_pair<I: Isa>(
    qkv: *const f32,
    y: SharedMut,
    lse: SharedMut,
    sh: Shape,
    (pair, tiles): (usize, Range<usize>),
    sc: &mut FwdScratch,
) {
    let (t, h) = (sh.t, sh.h());
    let kend = t.min(tiles.end * TILE);
    // SAFETY: the pair's first `kend` key rows of `hd` columns, inside the `[N, 3h]`
    // buffer (caller's contract); `kt` holds `hd × t`.
    unsafe {
        let k = qkv.add(sh.qkv_base(pair) + h);
        tile::transpose::<I>((k, 3 * h), (&mut sc.kt, t), kend, sh.hd);
    }
    for q0 in tiles.map(|i| i * TILE) {
        // SAFETY: as this function's.
        unsafe { forward_tile::<I>(qkv, (y, lse), sh, (pair, q0), sc) };
    }
}

/// The forward of query rows `[q0, q0 + TILE)` of `pair`, whose keys `sc.kt` holds
/// transposed: online softmax over the key tiles up to the diagonal.
///
/// # Safety
/// As [`forward_pair`]'s.
#[inline(always)]
unsafe fn forward_tile<I: Isa>(
    qkv: *const f32,
    (y, lse): (SharedMut, SharedMut),
    sh: Shape,
    (pair, q0): (usize, usize),
    sc: &mut FwdScratch,
) {
    let (t, hd, h) = (sh.t, sh.hd, sh.h());
    let ld = 3 * h;
    let scale = sh.scale();
    let rows = TILE.min(t - q0);
    // SAFETY: all offsets below stay inside the `[N, 3h]` buffer (caller's contract).
    let q = unsafe { qkv.add(sh.qkv_base(pair) + q0 * ld) };
    let (m, l, o, s, kt) = (&mut sc.m, &mut sc.l, &mut sc.o, &mut sc.s, &sc.kt);
    m[..rows].fill(f32::NEG_INFINITY);
    l[..rows].fill(0.0);
    let kend = q0 + rows;
    for k0 in (0..kend).step_by(TILE) {
        let cols = TILE.min(kend - k0);
        // The diagonal tile's products skip what the mask removes.
        let diag = |c| if k0 == q0 { c } else { Causal::No };
        // SAFETY: value rows `[k0, k0 + cols)` of this sequence.
        let v = unsafe { qkv.add(sh.qkv_base(pair) + 2 * h + k0 * ld) };
        // S = scale · Q Kᵀ, from columns `[k0, k0 + cols)` of the transposed keys.
        // SAFETY: `s` is `TILE × TILE`, `kt` `hd × t`, the Q tile in bounds.
        unsafe {
            tile::mm::<I>(
                (rows, cols, hd),
                (q, ld, 1),
                (kt.as_ptr().add(k0), t),
                (s.as_mut_ptr(), TILE),
                (false, scale),
                diag(Causal::Lower),
            );
        }
        for i in 0..rows {
            // Keys after the query are masked (only the diagonal tile has any).
            let valid = cols.min(q0 + i + 1 - k0);
            let row = &mut s[i * TILE..i * TILE + cols];
            let m_new = m[i].max(simd::max(&row[..valid]));
            exp_sub::<I>(&mut row[..valid], m_new);
            row[valid..].fill(0.0);
            // One `exp` per row: the old terms' rescale (0 on the first tile).
            let alpha = (m[i] - m_new).exp();
            l[i] = l[i] * alpha + simd::sum(&row[..valid]);
            m[i] = m_new;
            if k0 > 0 && alpha != 1.0 {
                for x in &mut o[i * hd..(i + 1) * hd] {
                    *x *= alpha;
                }
            }
        }
        // O += P V.
        // SAFETY: `o` is `TILE × hd`, P and V tiles in bounds.
        unsafe {
            tile::mm::<I>(
                (rows, hd, cols),
                (s.as_ptr(), TILE, 1),
                (v, ld),
                (o.as_mut_ptr(), hd),
                (k0 > 0, 1.0),
                diag(Causal::KUpTo),
            );
        }
    }
    let (yb, lb) = (sh.out_base(pair) + q0 * h, pair * t + q0);
    for i in 0..rows {
        let inv = 1.0 / l[i];
        // SAFETY: row `q0 + i` of this pair's `y` columns and `lse` entries: this item's own.
        // (Written through pointers: the output may not be initialised yet.)
        unsafe {
            let dst = y.0.add(yb + i * h);
            for (j, &x) in o[i * hd..(i + 1) * hd].iter().enumerate() {
                dst.add(j).write(x * inv);
            }
            lse.0.add(lb + i).write(m[i] + l[i].ln());
        }
    }
}

/// Defines `$name`, which runs `$body::<I>` compiled for the best instruction set.
macro_rules! dispatch {
    ($name:ident, $body:ident, ($($arg:ident: $ty:ty),*), $scratch:ty) => {
        /// Runs the tile body compiled for the CPU's best instruction set.
        ///
        /// # Safety
        /// As the body's.
        unsafe fn $name(level: Level, $($arg: $ty,)* sc: &mut $scratch) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty,)* sc: &mut $scratch) {
                // SAFETY: the caller's contract.
                unsafe { $body::<Avx2>($($arg,)* sc) }
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512($($arg: $ty,)* sc: &mut $scratch) {
                // SAFETY: the caller's contract.
                unsafe { $body::<Avx512>($($arg,)* sc) }
            }
            // SAFETY: the features were detected by `level`; the rest is the caller's contract.
            unsafe {
                match level {
                    #[cfg(target_arch = "x86_64")]
                    Level::Avx2 => avx2($($arg,)* sc),
                    #[cfg(target_arch = "x86_64")]
                    Level::Avx512 => avx512($($arg,)* sc),
                    _ => $body::<Plain>($($arg,)* sc),
                }
            }
        }
    };
}
pub(crate) use dispatch;

dispatch!(
    forward_dispatch,
    forward_pair,
    (qkv: *const f32, y: SharedMut, lse: SharedMut, sh: Shape, item: (usize, Range<usize>)),
    FwdScratch
);

/// Causal attention forward: `y` (`[N, h]`) and the per-row log-sum-exp `lse`
/// (`[b, heads, t]`) from `qkv` (`[N, 3h]`). Splits over rayon's threads when `threads > 1`.
pub(crate) fn forward(
    qkv: &[f32],
    y: &mut [MaybeUninit<f32>],
    lse: &mut [MaybeUninit<f32>],
    sh: Shape,
    threads: usize,
) {
    forward_at(level(), qkv, (y, lse), sh, threads);
}

/// The levels this CPU runs, best last (the tests check each).
#[cfg(test)]
pub(crate) fn levels() -> Vec<Level> {
    let mut out = vec![Level::Baseline];
    #[cfg(target_arch = "x86_64")]
    {
        if matches!(level(), Level::Avx2 | Level::Avx512) {
            out.push(Level::Avx2);
        }
        if level() == Level::Avx512 {
            out.push(Level::Avx512);
        }
    }
    out
}

/// [`forward`] with the element-wise code of `level` (which this CPU must have).
pub(crate) fn forward_at(
    level: Level,
    qkv: &[f32],
    (y, lse): (&mut [MaybeUninit<f32>], &mut [MaybeUninit<f32>]),
    sh: Shape,
    threads: usize,
) {
    let (n, h) = (sh.n(), sh.h());
    assert_eq!(qkv.len(), n * 3 * h, "qkv is [N, 3h]");
    assert_eq!(y.len(), n * h, "y is [N, h]");
    assert_eq!(lse.len(), sh.b * sh.heads * sh.t, "lse is [b, heads, t]");
    let (pairs, tiles) = (sh.b * sh.heads, sh.t.div_ceil(TILE));
    let (yp, lp) = (
        SharedMut(y.as_mut_ptr().cast()),
        SharedMut(lse.as_mut_ptr().cast()),
    );
    let run = |sc: &mut FwdScratch, item: (usize, Range<usize>)| {
        // SAFETY: the buffers have the asserted sizes; an item writes only its query
        // tiles' rows of its pair's `y` columns and `lse`, and items are distinct.
        unsafe { forward_dispatch(level, qkv.as_ptr(), yp, lp, sh, item, sc) }
    };
    if threads > 1 {
        // Whole pairs (keys transposed once each) while they keep every thread busy, else
        // one item per query tile, each transposing the keys it sees.
        let items: Vec<(usize, Range<usize>)> = if pairs >= threads {
            (0..pairs).map(|p| (p, 0..tiles)).collect()
        } else {
            (0..pairs)
                .flat_map(|p| (0..tiles).map(move |i| (p, i..i + 1)))
                .collect()
        };
        items
            .into_par_iter()
            .for_each_init(|| FwdScratch::new(sh.hd, sh.t), run);
    } else {
        let mut sc = FwdScratch::new(sh.hd, sh.t);
        (0..pairs).for_each(|p| run(&mut sc, (p, 0..tiles)));
    }
}
