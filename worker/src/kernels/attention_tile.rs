//! The tile products of attention: `C (+)= α·A·B` for one tile (at most 64 × 64 × 64), a
//! register-blocked micro-kernel on the instruction set's vectors ([`Simd`]: AVX-512,
//! AVX2, or an array of 8 for CPUs with neither). At these sizes it beats calling `gemm`,
//! whose packing and dispatch are paid per call; plain loops over `[f32; 16]` accumulators
//! were not vectorised by LLVM here (loop-carried through the inner product), hence the
//! intrinsics.
//!
//! `B`'s rows must be contiguous (a transposed operand is packed first, [`transpose`]);
//! `A` is read element by element through any strides, so `Pᵀ` and `dSᵀ` need no copy.
#![allow(unsafe_code)]

/// What the generic kernel code needs of an instruction set: its multiply-add (fused where
/// FMA is enabled; `mul_add` would be a libm call otherwise, hence the plain variant) and
/// the vector type of the tile products' micro-kernel.
pub(crate) trait Isa {
    /// The micro-kernel's vector.
    type V: Simd;
    /// `a·b + c`.
    fn fma(a: f32, b: f32, c: f32) -> f32;
    /// Copies the 8 × 8 block at `src` (rows `ld_src` apart) transposed to `dst` (rows
    /// `ld_dst` apart).
    ///
    /// # Safety
    /// Both blocks must be in bounds and must not overlap.
    #[inline(always)]
    unsafe fn transpose8(src: *const f32, ld_src: usize, dst: *mut f32, ld_dst: usize) {
        for i in 0..8 {
            for j in 0..8 {
                // SAFETY: the caller's contract.
                unsafe { *dst.add(j * ld_dst + i) = *src.add(i * ld_src + j) };
            }
        }
    }
}

/// No SIMD assumed: separate multiply and add, an 8-lane array as the "vector".
pub(crate) struct Plain;

impl Isa for Plain {
    type V = Lanes8;
    #[inline(always)]
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// An x86 instruction set with FMA and AVX: the two differ only in the micro-kernel's vector.
macro_rules! x86_isa {
    ($(#[$doc:meta])* $name:ident, $vector:ty) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        pub(crate) struct $name;

        #[cfg(target_arch = "x86_64")]
        impl Isa for $name {
            type V = $vector;
            #[inline(always)]
            fn fma(a: f32, b: f32, c: f32) -> f32 {
                a.mul_add(b, c)
            }
            #[inline(always)]
            unsafe fn transpose8(src: *const f32, ld_src: usize, dst: *mut f32, ld_dst: usize) {
                // SAFETY: the caller's contract; AVX is enabled wherever this is used.
                unsafe { transpose8_avx(src, ld_src, dst, ld_dst) }
            }
        }
    };
}

x86_isa!(
    /// AVX2 + FMA.
    Avx2,
    M256
);
x86_isa!(
    /// AVX-512F (with AVX2 + FMA).
    Avx512,
    M512
);

/// [`Isa::transpose8`] in AVX registers: pairs of rows interleaved, then pairs of pairs,
/// then the 128-bit halves swapped (24 shuffles for 64 elements, against 64 scalar stores
/// 256 bytes apart, which were 15 % of the attention kernels' time).
///
/// # Safety
/// As [`Isa::transpose8`]'s; only called where AVX is enabled.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose8_avx(src: *const f32, ld_src: usize, dst: *mut f32, ld_dst: usize) {
    use std::arch::x86_64::{
        _mm256_permute2f128_ps as halves, _mm256_shuffle_ps as shuffle, _mm256_unpackhi_ps as hi,
        _mm256_unpacklo_ps as lo,
    };
    // SAFETY: rows `0..8` of both blocks are in bounds (the caller's contract).
    unsafe {
        // Written out, not through a closure, so every intrinsic sits in this inlined body.
        let r: [__m256; 8] = [
            _mm256_loadu_ps(src),
            _mm256_loadu_ps(src.add(ld_src)),
            _mm256_loadu_ps(src.add(2 * ld_src)),
            _mm256_loadu_ps(src.add(3 * ld_src)),
            _mm256_loadu_ps(src.add(4 * ld_src)),
            _mm256_loadu_ps(src.add(5 * ld_src)),
            _mm256_loadu_ps(src.add(6 * ld_src)),
            _mm256_loadu_ps(src.add(7 * ld_src)),
        ];
        let t = [
            lo(r[0], r[1]),
            hi(r[0], r[1]),
            lo(r[2], r[3]),
            hi(r[2], r[3]),
            lo(r[4], r[5]),
            hi(r[4], r[5]),
            lo(r[6], r[7]),
            hi(r[6], r[7]),
        ];
        let u = [
            shuffle::<0x44>(t[0], t[2]),
            shuffle::<0xEE>(t[0], t[2]),
            shuffle::<0x44>(t[1], t[3]),
            shuffle::<0xEE>(t[1], t[3]),
            shuffle::<0x44>(t[4], t[6]),
            shuffle::<0xEE>(t[4], t[6]),
            shuffle::<0x44>(t[5], t[7]),
            shuffle::<0xEE>(t[5], t[7]),
        ];
        for j in 0..4 {
            _mm256_storeu_ps(dst.add(j * ld_dst), halves::<0x20>(u[j], u[j + 4]));
            _mm256_storeu_ps(dst.add((j + 4) * ld_dst), halves::<0x31>(u[j], u[j + 4]));
        }
    }
}

/// A vector of `LANES` f32.
pub(crate) trait Simd: Copy {
    /// Lanes.
    const LANES: usize;
    /// All lanes `x`.
    fn splat(x: f32) -> Self;
    /// `self·b + c`, lane by lane.
    fn mul_add(self, b: Self, c: Self) -> Self;
    /// `LANES` elements from `p`.
    ///
    /// # Safety
    /// `p..p + LANES` must be readable.
    unsafe fn load(p: *const f32) -> Self;
    /// Writes the lanes to `p..p + LANES`.
    ///
    /// # Safety
    /// `p..p + LANES` must be writable.
    unsafe fn store(self, p: *mut f32);
}

/// Eight lanes as an array: the fallback without AVX2.
#[derive(Clone, Copy)]
pub(crate) struct Lanes8([f32; 8]);

impl Simd for Lanes8 {
    const LANES: usize = 8;
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Self([x; 8])
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        let mut out = c.0;
        for ((o, &x), &y) in out.iter_mut().zip(&self.0).zip(&b.0) {
            *o += x * y;
        }
        Self(out)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's contract.
        Self(unsafe { std::ptr::read_unaligned(p as *const [f32; 8]) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_unaligned(p as *mut [f32; 8], self.0) }
    }
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m256, __m512, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_storeu_ps,
    _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps,
};

/// An AVX register of 8 lanes. Only used by code compiled with AVX2 + FMA enabled (the
/// `Avx2` and `Avx512` instruction sets), after run-time detection.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct M256(__m256);

#[cfg(target_arch = "x86_64")]
impl Simd for M256 {
    const LANES: usize = 8;
    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: AVX is enabled wherever this is used (see the type).
        Self(unsafe { _mm256_set1_ps(x) })
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        // SAFETY: FMA is enabled wherever this is used (see the type).
        Self(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's contract; AVX as above.
        Self(unsafe { _mm256_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's contract; AVX as above.
        unsafe { _mm256_storeu_ps(p, self.0) }
    }
}

/// An AVX-512 register of 16 lanes. Only used by code compiled with AVX-512F enabled (the
/// `Avx512` instruction set), after run-time detection.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct M512(__m512);

#[cfg(target_arch = "x86_64")]
impl Simd for M512 {
    const LANES: usize = 16;
    #[inline(always)]
    fn splat(x: f32) -> Self {
        // SAFETY: AVX-512F is enabled wherever this is used (see the type).
        Self(unsafe { _mm512_set1_ps(x) })
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        // SAFETY: as above.
        Self(unsafe { _mm512_fmadd_ps(self.0, b.0, c.0) })
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller's contract; AVX-512F as above.
        Self(unsafe { _mm512_loadu_ps(p) })
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller's contract; AVX-512F as above.
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
}

/// `C = α·A·B` (`accumulate`: `C += α·A·B`) for `A: m × k` (element `(r, i)` at
/// `a[r·a_rs + i·a_cs]`), `B: k × n` (row `i` at `b[i·ldb..]`, contiguous), `C: m × n` (row
/// `r` at `c[r·ldc..]`). Blocks of 6 rows by two vectors (12 accumulators: enough to hide
/// the FMA latency on two FMA units, with registers left for `B` and the broadcast `A`),
/// then one of 4 rows (64 = 6·10 + 4); columns short of two vectors but holding one in
/// blocks one vector wide (a head of 16 columns under AVX-512, which the scalar edge took
/// at a third of AVX2's speed); the ragged edges in scalar code. Every element is the same
/// sum in the same order whichever of them computes it.
///
/// # Safety
/// Every addressed element of `a`, `b` and `c` must be in bounds, `c` must not overlap `a`
/// or `b`, and no other thread may access `c` meanwhile.
#[inline(always)]
pub(crate) unsafe fn mm<I: Isa>(
    (m, n, k): (usize, usize, usize),
    a: (*const f32, usize, usize),
    b: (*const f32, usize),
    c: (*mut f32, usize),
    (accumulate, alpha): (bool, f32),
    causal: Causal,
) {
    let w = I::V::LANES;
    let n_two = n - n % (2 * w);
    // Columns in vector blocks: the two-vector ones, then one of a single vector.
    let n_full = if n - n_two >= w { n_two + w } else { n_two };
    let m6 = m - m % 6;
    let m_full = m6 + (m - m6) / 4 * 4;
    // SAFETY: each block and edge addresses its own rows and columns, in bounds by the
    // caller's contract.
    unsafe {
        for r0 in (0..m6).step_by(6) {
            for c0 in (0..n_two).step_by(2 * w) {
                if let Some(ks) = causal.span::<6>(r0, c0, k) {
                    block::<I, 6, 2>((r0, c0), ks, a, b, c, accumulate, alpha);
                }
            }
            if n_full > n_two
                && let Some(ks) = causal.span::<6>(r0, n_two, k)
            {
                block::<I, 6, 1>((r0, n_two), ks, a, b, c, accumulate, alpha);
            }
        }
        if m_full > m6 {
            for c0 in (0..n_two).step_by(2 * w) {
                if let Some(ks) = causal.span::<4>(m6, c0, k) {
                    block::<I, 4, 2>((m6, c0), ks, a, b, c, accumulate, alpha);
                }
            }
            if n_full > n_two
                && let Some(ks) = causal.span::<4>(m6, n_two, k)
            {
                block::<I, 4, 1>((m6, n_two), ks, a, b, c, accumulate, alpha);
            }
        }
        // Columns past the last full block on every row, rows past the last full block on
        // the full columns.
        edge::<I>((0, m), (n_full, n), k, a, b, c, accumulate, alpha);
        edge::<I>((m_full, m), (0, n_full), k, a, b, c, accumulate, alpha);
    }
}

/// Which part of a diagonal tile's product matters (query `i` sees key `j` when `j ≤ i`;
/// the tile's rows and columns start at the same token). Blocks are skipped or their inner
/// range cut accordingly; the scalar edges compute everything (the masked terms are 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Causal {
    /// A full product.
    No,
    /// Only `C[r][j]` with `j ≤ r` is needed (scores, `dP`): blocks wholly above the
    /// diagonal are skipped (their `C` is left as it was).
    Lower,
    /// `A[r][i] = 0` for `i > r` (`P V`, `dS K`): the inner sum stops at the block's last row.
    KUpTo,
    /// `A[r][i] = 0` for `i < r` (`Pᵀ dY`, `dSᵀ Q`): the inner sum starts at the block's
    /// first row.
    KFrom,
}

impl Causal {
    /// The inner range of the block at `(r0, c0)` of `R` rows, or `None` to skip it.
    #[inline(always)]
    fn span<const R: usize>(self, r0: usize, c0: usize, k: usize) -> Option<(usize, usize)> {
        match self {
            Causal::No => Some((0, k)),
            Causal::Lower => (c0 < r0 + R).then_some((0, k)),
            Causal::KUpTo => Some((0, k.min(r0 + R))),
            Causal::KFrom => Some((r0.min(k), k)),
        }
    }
}

/// `mm` on rows `r0..r0 + R` and columns `c0..c0 + N·LANES`, in `N·R` vector accumulators.
///
/// # Safety
/// As `mm`'s, for these rows and columns.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block<I: Isa, const R: usize, const N: usize>(
    (r0, c0): (usize, usize),
    (k0, k1): (usize, usize),
    (a, a_rs, a_cs): (*const f32, usize, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    alpha: f32,
) {
    let w = I::V::LANES;
    // SAFETY: rows `r0..r0 + R` of A and C, columns `c0..c0 + N·LANES` of B and C.
    unsafe {
        let mut acc = [[I::V::splat(0.0); N]; R];
        let a0 = a.add(r0 * a_rs);
        for i in k0..k1 {
            let bp = b.add(i * ldb + c0);
            let bv: [I::V; N] = std::array::from_fn(|j| I::V::load(bp.add(j * w)));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = I::V::splat(*a0.add(r * a_rs + i * a_cs));
                for (x, &bj) in acc_r.iter_mut().zip(&bv) {
                    *x = av.mul_add(bj, *x);
                }
            }
        }
        let al = I::V::splat(alpha);
        for (r, acc_r) in acc.iter().enumerate() {
            let cp = c.add((r0 + r) * ldc + c0);
            for (j, &x) in acc_r.iter().enumerate() {
                let cj = cp.add(j * w);
                let base = if accumulate {
                    I::V::load(cj)
                } else {
                    I::V::splat(0.0)
                };
                al.mul_add(x, base).store(cj);
            }
        }
    }
}

/// `mm` on rows `rows.0..rows.1` and columns `cols.0..cols.1`, one element at a time.
///
/// # Safety
/// As `mm`'s.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn edge<I: Isa>(
    rows: (usize, usize),
    cols: (usize, usize),
    k: usize,
    (a, a_rs, a_cs): (*const f32, usize, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    alpha: f32,
) {
    for r in rows.0..rows.1 {
        for j in cols.0..cols.1 {
            // SAFETY: element `(r, j)` of C, row `r` of A, column `j` of B.
            unsafe {
                let mut s = 0f32;
                for i in 0..k {
                    s = I::fma(*a.add(r * a_rs + i * a_cs), *b.add(i * ldb + j), s);
                }
                let cp = c.add(r * ldc + j);
                *cp = if accumulate {
                    I::fma(alpha, s, *cp)
                } else {
                    alpha * s
                };
            }
        }
    }
}

/// `dst[j·ld_dst + i] = src[i·ld_src + j]` for `i < rows`, `j < cols`: a tile of K or V
/// transposed, so that it can be `mm`'s `B`. 8 × 8 blocks through [`Isa::transpose8`], the
/// ragged edges one element at a time.
///
/// # Safety
/// `src` must hold `rows` rows of `cols` elements at stride `ld_src`; `dst` must hold
/// `cols` rows of `rows` elements at stride `ld_dst`.
#[inline(always)]
pub(crate) unsafe fn transpose<I: Isa>(
    (src, ld_src): (*const f32, usize),
    (dst, ld_dst): (&mut [f32], usize),
    rows: usize,
    cols: usize,
) {
    assert!(
        cols == 0 || rows == 0 || (cols - 1) * ld_dst + rows <= dst.len(),
        "transpose: destination too small"
    );
    let (r8, c8) = (rows - rows % 8, cols - cols % 8);
    let d = dst.as_mut_ptr();
    // SAFETY: every block and element below is inside `src` (the caller's contract) and
    // `dst` (asserted above); the two do not overlap (`dst` is a `&mut`).
    unsafe {
        for i in (0..r8).step_by(8) {
            for j in (0..c8).step_by(8) {
                I::transpose8(
                    src.add(i * ld_src + j),
                    ld_src,
                    d.add(j * ld_dst + i),
                    ld_dst,
                );
            }
        }
        for i in 0..rows {
            let from = if i < r8 { c8 } else { 0 };
            for j in from..cols {
                *d.add(j * ld_dst + i) = *src.add(i * ld_src + j);
            }
        }
    }
}
