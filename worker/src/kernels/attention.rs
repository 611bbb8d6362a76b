//! Causal multi-head self-attention on f32 CPU buffers, flash-style: the `t × t`
//! probabilities are never stored. The forward keeps, per query row, the log-sum-exp of its
//! scaled scores; the backward (`attention_backward`) recomputes each probability tile from
//! `q`, `k` and that log-sum-exp.
//!
//! Layout: Q, K and V are read in place from the QKV projection's output `[N, h + 2·kv·hd]`
//! (`N = b·t` tokens, token-major; head `j`'s Q columns are `[j·hd, (j+1)·hd)`; the `kv`
//! key heads follow Q's `h` columns and the `kv` value heads follow those; query head `j`
//! reads key/value head `j / (heads / kv)`, grouped-query attention, `kv = heads` for GPT's
//! multi-head attention); the output is written token-major `[N, h]`, the layout the
//! attention projection reads; the log-sum-exp is `[b, heads, t]`. No split or merge of
//! heads is copied, and no shared key/value head is repeated. These are plain functions on slices (with several outputs, not a
//! candle `CustomOp`); `ops::attention` and `ops::attention_grad` reach the slices through
//! `Tensor::storage_and_layout`.
//!
//! Tiles are `TILE` query rows by `TILE` keys; their products run on a register-blocked
//! micro-kernel (`attention_tile`) reading the strided buffers directly. All of a tile's
//! work (products, max, exponential, rescale) is generic code compiled once per
//! instruction set (AVX-512, AVX2 + FMA, plain) and chosen at run time. A (sequence,
//! key/value head) group's keys are transposed once per call for all of its query heads
//! (the products' `B` must have contiguous rows). Work is split over groups with rayon (in
//! the forward over heads and query tiles where there are fewer groups than threads); each
//! query row is computed by one thread in a fixed order, so results do not depend on the
//! thread count.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

use candle_core::Tensor;

use super::attention_tile::{self as tile, Avx2, Avx512, Causal, Isa, Plain};
use super::{cpu, simd};
use crate::error::{Error, Result};

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
    /// Query heads.
    pub(crate) heads: usize,
    /// Key/value heads, dividing `heads`: query head `j` reads key/value head
    /// `j / (heads / kv_heads)` (grouped-query attention; `heads` for multi-head).
    pub(crate) kv_heads: usize,
    /// Head dimension (`h / heads`).
    pub(crate) hd: usize,
}

impl Shape {
    /// Multi-head attention: as many key/value heads as query heads.
    pub(crate) fn multi_head(b: usize, t: usize, heads: usize, hd: usize) -> Self {
        Self {
            b,
            t,
            heads,
            kv_heads: heads,
            hd,
        }
    }

    /// Hidden size `h = heads·hd` (Q's columns and the output's).
    pub(crate) fn h(&self) -> usize {
        self.heads * self.hd
    }

    /// The QKV buffer's row: Q's `h` columns, then K's and V's `kv_heads·hd` each.
    pub(crate) fn ld(&self) -> usize {
        self.h() + 2 * self.kv_heads * self.hd
    }

    /// Query heads per key/value head.
    pub(crate) fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Tokens `N = b·t`.
    pub(crate) fn n(&self) -> usize {
        self.b * self.t
    }

    /// `1/√hd`.
    pub(crate) fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }

    /// Offset in the QKV buffer of the first Q element of (sequence, head) `pair`.
    pub(crate) fn q_base(&self, pair: usize) -> usize {
        let (bi, head) = (pair / self.heads, pair % self.heads);
        bi * self.t * self.ld() + head * self.hd
    }

    /// Offset in the QKV buffer of the first K element that `pair`'s query head reads.
    pub(crate) fn k_base(&self, pair: usize) -> usize {
        let (bi, head) = (pair / self.heads, pair % self.heads);
        bi * self.t * self.ld() + self.h() + head / self.group() * self.hd
    }

    /// Offset in the QKV buffer of the first V element that `pair`'s query head reads.
    pub(crate) fn v_base(&self, pair: usize) -> usize {
        self.k_base(pair) + self.kv_heads * self.hd
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

/// One forward work item: the query heads `heads` (indices within the group) of key/value
/// group `group` (sequence `group / kv_heads`, key/value head `group % kv_heads`), over query
/// tiles `tiles`.
#[derive(Debug, Clone)]
struct Item {
    group: usize,
    heads: Range<usize>,
    tiles: Range<usize>,
}

/// The forward of `item`: the keys its tiles see (up to the last tile's end) transposed
/// once for all of its heads, then each head's tiles' online softmax over the key tiles up
/// to the diagonal.
///
/// # Safety
/// `qkv` holds `[N, ld]`, `y` `[N, h]`, `lse` `[b, heads, t]` for `sh`; no other thread
/// writes these tiles' rows of `y` and `lse` meanwhile.
#[inline(always)]
unsafe fn forward_group<I: Isa>(
    qkv: *const f32,
    y: SharedMut,
    lse: SharedMut,
    sh: Shape,
    item: Item,
    sc: &mut FwdScratch,
) {
    let t = sh.t;
    let (bi, kvh) = (item.group / sh.kv_heads, item.group % sh.kv_heads);
    let first = bi * sh.heads + kvh * sh.group();
    let kend = t.min(item.tiles.end * TILE);
    // SAFETY: the group's first `kend` key rows of `hd` columns, inside the `[N, ld]`
    // buffer (caller's contract); `kt` holds `hd × t`.
    unsafe {
        let k = qkv.add(sh.k_base(first));
        tile::transpose::<I>((k, sh.ld()), (&mut sc.kt, t), kend, sh.hd);
    }
    for pair in item.heads.map(|j| first + j) {
        for q0 in item.tiles.clone().map(|i| i * TILE) {
            // SAFETY: as this function's.
            unsafe { forward_tile::<I>(qkv, (y, lse), sh, (pair, q0), sc) };
        }
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
    let (t, hd, h, ld) = (sh.t, sh.hd, sh.h(), sh.ld());
    let scale = sh.scale();
    let rows = TILE.min(t - q0);
    // SAFETY: all offsets below stay inside the `[N, ld]` buffer (caller's contract).
    let q = unsafe { qkv.add(sh.q_base(pair) + q0 * ld) };
    let (m, l, o, s, kt) = (&mut sc.m, &mut sc.l, &mut sc.o, &mut sc.s, &sc.kt);
    m[..rows].fill(f32::NEG_INFINITY);
    l[..rows].fill(0.0);
    let kend = q0 + rows;
    for k0 in (0..kend).step_by(TILE) {
        let cols = TILE.min(kend - k0);
        // The diagonal tile's products skip what the mask removes.
        let diag = |c| if k0 == q0 { c } else { Causal::No };
        // SAFETY: value rows `[k0, k0 + cols)` of this sequence.
        let v = unsafe { qkv.add(sh.v_base(pair) + k0 * ld) };
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
    forward_group,
    (qkv: *const f32, y: SharedMut, lse: SharedMut, sh: Shape, item: Item),
    FwdScratch
);

/// Causal attention forward: `y` (`[N, h]`) and the per-row log-sum-exp `lse`
/// (`[b, heads, t]`) from `qkv` (`[N, ld]`). Splits over rayon's threads when `threads > 1`.
pub(crate) fn forward(
    qkv: &[f32],
    y: &mut [MaybeUninit<f32>],
    lse: &mut [MaybeUninit<f32>],
    sh: Shape,
    threads: usize,
) {
    forward_at(level(), qkv, (y, lse), sh, threads);
}

/// [`forward`] of a tensor: `(y [N, h], lse [b, heads, t])`, or `None` where `qkv` is not
/// a contiguous f32 CPU tensor; an error where it is not `[N, h + 2·kv·hd]` for `sh`.
pub(crate) fn forward_tensors(qkv: &Tensor, sh: Shape) -> Result<Option<(Tensor, Tensor)>> {
    check_qkv("attention", qkv, sh)?;
    let mut y = cpu::uninit(sh.n() * sh.h());
    let mut lse = cpu::uninit(sh.b * sh.heads * sh.t);
    let threads = cpu::threads();
    let run = |[q]: [&[f32]; 1]| forward(q, &mut y, &mut lse, sh, threads);
    if cpu::with_f32s([qkv], run).is_none() {
        return Ok(None);
    }
    // SAFETY: the kernel writes every element of `y` and `lse`.
    let (y, lse) = unsafe { (cpu::written(y), cpu::written(lse)) };
    Ok(Some((
        cpu::tensor(y, (sh.n(), sh.h()))?,
        cpu::tensor(lse, (sh.b, sh.heads, sh.t))?,
    )))
}

/// An error naming `op` where `qkv` is not `[N, h + 2·kv·hd]` for `sh`, or `sh`'s heads do
/// not group.
pub(crate) fn check_qkv(op: &'static str, qkv: &Tensor, sh: Shape) -> Result<()> {
    let groups = sh.kv_heads > 0 && sh.heads.is_multiple_of(sh.kv_heads);
    if !groups || qkv.dims() != [sh.n(), sh.ld()] {
        return Err(Error::InvalidArgument {
            field: op,
            reason: format!(
                "qkv {:?} is not [b·t, (heads + 2·kv_heads)·hd] for b = {}, t = {}, {} heads, \
                 {} key/value heads of {}",
                qkv.dims(),
                sh.b,
                sh.t,
                sh.heads,
                sh.kv_heads,
                sh.hd
            ),
        });
    }
    Ok(())
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
    assert!(
        sh.kv_heads > 0 && sh.heads.is_multiple_of(sh.kv_heads),
        "kv_heads divides heads"
    );
    assert_eq!(qkv.len(), n * sh.ld(), "qkv is [N, h + 2·kv·hd]");
    assert_eq!(y.len(), n * h, "y is [N, h]");
    assert_eq!(lse.len(), sh.b * sh.heads * sh.t, "lse is [b, heads, t]");
    let (groups, group, tiles) = (sh.b * sh.kv_heads, sh.group(), sh.t.div_ceil(TILE));
    let (yp, lp) = (
        SharedMut(y.as_mut_ptr().cast()),
        SharedMut(lse.as_mut_ptr().cast()),
    );
    let run = |sc: &mut FwdScratch, item: Item| {
        // SAFETY: the buffers have the asserted sizes; an item writes only its heads' query
        // tiles' rows of `y` and `lse`, and items are distinct.
        unsafe { forward_dispatch(level, qkv.as_ptr(), yp, lp, sh, item, sc) }
    };
    let whole = |g| Item {
        group: g,
        heads: 0..group,
        tiles: 0..tiles,
    };
    if threads > 1 {
        // Whole groups (keys transposed once each) while they keep every thread busy, else
        // one item per head and query tile, each transposing the keys it sees.
        let items: Vec<Item> = if groups >= threads {
            (0..groups).map(whole).collect()
        } else {
            (0..groups)
                .flat_map(|g| {
                    (0..group).flat_map(move |j| {
                        (0..tiles).map(move |i| Item {
                            group: g,
                            heads: j..j + 1,
                            tiles: i..i + 1,
                        })
                    })
                })
                .collect()
        };
        items
            .into_par_iter()
            .for_each_init(|| FwdScratch::new(sh.hd, sh.t), run);
    } else {
        let mut sc = FwdScratch::new(sh.hd, sh.t);
        (0..groups).for_each(|g| run(&mut sc, whole(g)));
    }
}
