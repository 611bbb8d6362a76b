//! Shared vector math for the stage kernels: run-time ISA dispatch ([`multiversion!`]),
//! lane-wise `exp` / `expm1` / `tanh` / `sigmoid` without libm, and fixed-order row
//! reductions.
//!
//! Everything here is plain Rust that LLVM auto-vectorises: a kernel's body is compiled three
//! times (AVX-512, AVX2, baseline) by [`multiversion!`] and the widest the CPU has is picked
//! once. No `mul_add` is used and LLVM may not reassociate or contract floating-point
//! arithmetic, so every ISA computes bit-identical results, and reductions run over
//! [`ACC`] fixed lanes combined in a fixed order: a sum does not depend on the ISA, the
//! thread count or where a row starts.

/// The instruction sets a kernel is compiled for, widest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// AVX-512F (plus AVX2 and FMA).
    Avx512,
    /// AVX2 and FMA.
    Avx2,
    /// The target's baseline (SSE2 on x86-64, NEON on aarch64).
    Baseline,
}

/// The widest [`Level`] this CPU runs, detected once.
#[inline]
pub(crate) fn level() -> Level {
    use std::sync::OnceLock;
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if std::env::var_os("PIPEWISE_KERNELS_BASELINE").is_some() {
            return Level::Baseline;
        }
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
        if avx2 && is_x86_feature_detected!("avx512f") {
            return Level::Avx512;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    Level::Baseline
}

/// Defines a function whose body is compiled for AVX-512, for AVX2 and for the baseline, and
/// which runs the widest version the CPU supports ([`level`]). The body is ordinary Rust
/// (loops over slices, calls to `#[inline(always)]` lane functions such as [`exp`]), inlined
/// into each `#[target_feature]` copy so that LLVM vectorises it for that ISA. Arguments are
/// plain `name: Type` pairs; no generics.
///
/// ```ignore
/// multiversion! {
///     /// Doubles every element.
///     pub(crate) fn double(x: &mut [f32]) {
///         for v in x { *v *= 2.0; }
///     }
/// }
/// ```
macro_rules! multiversion {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[allow(unsafe_code)]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                match $crate::kernels::simd::level() {
                    // SAFETY: `level()` reports AVX-512F, AVX2 and FMA only where the CPU
                    // has them (`is_x86_feature_detected!`).
                    $crate::kernels::simd::Level::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above, AVX2 and FMA were detected.
                    $crate::kernels::simd::Level::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::kernels::simd::Level::Baseline => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use multiversion;

// === Lane-wise transcendental functions ===
//
// Cephes' `expf` scheme: `eˣ = 2ⁿ·eʳ` with `n = round(x·log₂e)`, `r = x − n·ln2` (ln 2 split
// in two so `n·C1` is exact) and a degree-7 polynomial for `eʳ` on |r| ≤ ln2/2. Measured
// relative error below 2e-7 (see the tests). The rounding and `2ⁿ` come from bit tricks,
// so a lane is branch-free and vectorises.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
/// `1.5·2²³ + 127`: adding it rounds `x·log₂e` to an integer `n` held in the low mantissa
/// bits as `n + 127`, the biased exponent of `2ⁿ`.
const ROUND: f32 = 12_583_039.0;
/// Below this `eˣ` is under f32's smallest normal: the result is 0.
const EXP_LO: f32 = -87.3;
/// Above this `2ⁿ` would overflow the exponent: the result is +∞.
const EXP_HI: f32 = 88.37;

/// `n`, `2ⁿ` and `eʳ − 1` for `eˣ = 2ⁿ·eʳ` (`x` within `[EXP_LO, EXP_HI]`).
#[inline(always)]
fn exp_parts(x: f32) -> (f32, f32) {
    let k = x * LOG2E + ROUND;
    let n = k - ROUND;
    let pow2 = f32::from_bits(k.to_bits() << 23);
    let r = (x - n * C1) - n * C2;
    let z = r * r;
    let p = ((((1.987_569_2e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    (pow2, p * z + r)
}

/// `eˣ` (relative error < 2e-7; 0 below −87.3, +∞ above 88.37, NaN for NaN).
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // `clamp` keeps a NaN.
    let xc = x.clamp(EXP_LO, EXP_HI);
    let (pow2, em1) = exp_parts(xc);
    let y = pow2 * em1 + pow2;
    if x < EXP_LO {
        0.0
    } else if x > EXP_HI {
        f32::INFINITY
    } else {
        y
    }
}

/// `eˣ − 1`, accurate near 0 (relative error < 3e-7); for `x` in `[−87.3, 88.37]`.
#[inline(always)]
fn expm1(x: f32) -> f32 {
    let (pow2, em1) = exp_parts(x);
    pow2 * em1 + (pow2 - 1.0)
}

#[allow(
    dead_code,
    reason = "vector forms kept with their accuracy tests (GELU uses the sigmoid form)"
)]
/// `tanh x` as `sign(x)·m/(m + 2)` with `m = e^{2|x|} − 1` (relative error < 5e-7 near 0
/// and absolute < 2e-7 elsewhere; exactly ±1 beyond |x| = 9).
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let a = if a > 9.0 { 9.0 } else { a };
    let m = expm1(2.0 * a);
    (m / (m + 2.0)).copysign(x)
}

/// The logistic `1/(1 + e⁻ˣ)` (relative error < 3e-7), with `e⁻ˣ` capped at `e⁸⁰` so that
/// `s·(1 − s) = e⁻ˣ·s²` stays finite: it returns `(s, e⁻ˣ)`.
#[inline(always)]
pub(crate) fn sigmoid_and_exp(x: f32) -> (f32, f32) {
    let nx = -x;
    let e = exp(if nx > 80.0 { 80.0 } else { nx });
    (1.0 / (1.0 + e), e)
}

multiversion! {
    #[allow(dead_code, reason = "vector forms kept with their accuracy tests (GELU uses the sigmoid form)")]
    /// `x ← eˣ` element-wise.
    pub(crate) fn exp_in_place(x: &mut [f32]) {
        for v in x {
            *v = exp(*v);
        }
    }
}

multiversion! {
    #[allow(dead_code, reason = "vector forms kept with their accuracy tests (GELU uses the sigmoid form)")]
    /// `x ← tanh x` element-wise.
    pub(crate) fn tanh_in_place(x: &mut [f32]) {
        for v in x {
            *v = tanh(*v);
        }
    }
}

// === Fixed-order reductions ===

/// Independent accumulators per reduction: 4 AVX2 or 2 AVX-512 registers, enough to hide the
/// add latency. The lanes are combined pairwise in a fixed order.
pub(crate) const ACC: usize = 32;

/// Combines `ACC` lanes pairwise (halving), a fixed order whatever the ISA.
#[inline(always)]
fn combine(mut acc: [f32; ACC], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut w = ACC / 2;
    while w > 0 {
        for i in 0..w {
            acc[i] = op(acc[i], acc[i + w]);
        }
        w /= 2;
    }
    acc[0]
}

/// The sum of `ACC` lanes, combined pairwise in the fixed order of [`sum`].
#[inline(always)]
pub(crate) fn combine_sum(acc: [f32; ACC]) -> f32 {
    combine(acc, |x, y| x + y)
}

/// `Σ f(a[i], b[i])` over two equally long slices (fixed order, see [`ACC`]).
#[inline(always)]
pub(crate) fn sum_map2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; ACC];
    let (ac, at) = a.split_at(a.len() - a.len() % ACC);
    let bc = &b[..ac.len()];
    let bt = &b[ac.len()..];
    for (ca, cb) in ac.chunks_exact(ACC).zip(bc.chunks_exact(ACC)) {
        for i in 0..ACC {
            acc[i] += f(ca[i], cb[i]);
        }
    }
    for (i, (&x, &y)) in at.iter().zip(bt).enumerate() {
        acc[i] += f(x, y);
    }
    combine(acc, |x, y| x + y)
}

/// `Σ f(a[i])` (fixed order, see [`ACC`]).
#[inline(always)]
pub(crate) fn sum_map(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; ACC];
    let (ac, at) = a.split_at(a.len() - a.len() % ACC);
    for c in ac.chunks_exact(ACC) {
        for i in 0..ACC {
            acc[i] += f(c[i]);
        }
    }
    for (i, &x) in at.iter().enumerate() {
        acc[i] += f(x);
    }
    combine(acc, |x, y| x + y)
}

/// `Σ a[i]`.
#[inline(always)]
pub(crate) fn sum(a: &[f32]) -> f32 {
    sum_map(a, |x| x)
}

/// `Σ a[i]·b[i]`.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    sum_map2(a, b, |x, y| x * y)
}

/// The largest element (−∞ for an empty slice; NaN-ignoring where a NaN is not first in its
/// lane, as a comparison-based max).
#[inline(always)]
pub(crate) fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; ACC];
    let (ac, at) = a.split_at(a.len() - a.len() % ACC);
    for c in ac.chunks_exact(ACC) {
        for i in 0..ACC {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    for (i, &x) in at.iter().enumerate() {
        acc[i] = if x > acc[i] { x } else { acc[i] };
    }
    combine(acc, |x, y| if y > x { y } else { x })
}

/// `Σ a[i]²` of f64 values (fixed order, 16 lanes).
#[inline(always)]
pub(crate) fn sum_sq_f64(a: &[f64]) -> f64 {
    const L: usize = 16;
    let mut acc = [0f64; L];
    let (ac, at) = a.split_at(a.len() - a.len() % L);
    for c in ac.chunks_exact(L) {
        for i in 0..L {
            let x = c[i];
            acc[i] += x * x;
        }
    }
    for (i, &x) in at.iter().enumerate() {
        acc[i] += x * x;
    }
    let mut w = L / 2;
    while w > 0 {
        for i in 0..w {
            acc[i] += acc[i + w];
        }
        w /= 2;
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Points spread over `[lo, hi]`, plus the ends.
    fn grid(lo: f32, hi: f32, n: usize) -> Vec<f32> {
        (0..=n)
            .map(|i| lo + (hi - lo) * (i as f32 / n as f32))
            .collect()
    }

    fn rel(a: f32, want: f64) -> f64 {
        ((f64::from(a) - want) / want.abs().max(f64::MIN_POSITIVE)).abs()
    }

    /// `exp` against f64's over the whole finite range, and its edge cases.
    #[test]
    fn exp_is_within_2e7_relative() {
        let mut xs = grid(-87.0, 88.3, 400_000);
        xs.extend(grid(-1.0, 1.0, 100_000));
        let mut ys = xs.clone();
        exp_in_place(&mut ys);
        let worst = xs
            .iter()
            .zip(&ys)
            .map(|(&x, &y)| rel(y, f64::from(x).exp()))
            .fold(0.0, f64::max);
        assert!(worst < 2e-7, "worst relative error {worst:e}");
        let mut edge = [
            0.0,
            -0.0,
            f32::NEG_INFINITY,
            -100.0,
            100.0,
            f32::INFINITY,
            f32::NAN,
        ];
        exp_in_place(&mut edge);
        assert_eq!(
            &edge[..6],
            &[1.0, 1.0, 0.0, 0.0, f32::INFINITY, f32::INFINITY]
        );
        assert!(edge[6].is_nan());
    }

    /// `tanh` against f64's: relative error near 0, absolute elsewhere, ±1 far out.
    #[test]
    fn tanh_is_accurate() {
        let mut xs = grid(-12.0, 12.0, 200_000);
        xs.extend(grid(-1e-3, 1e-3, 10_000));
        let mut ys = xs.clone();
        tanh_in_place(&mut ys);
        for (&x, &y) in xs.iter().zip(&ys) {
            let want = f64::from(x).tanh();
            let err = (f64::from(y) - want).abs();
            assert!(
                err <= 5e-7 * want.abs() + 1e-7,
                "tanh({x}) = {y}, want {want}"
            );
        }
        let mut edge = [0.0, 30.0, -30.0, f32::INFINITY, f32::NEG_INFINITY];
        tanh_in_place(&mut edge);
        assert_eq!(edge, [0.0, 1.0, -1.0, 1.0, -1.0]);
    }

    /// Every ISA this CPU has gives the same bits as the baseline code (no FMA, no
    /// reassociation), so results do not depend on the machine's vector width.
    #[test]
    fn reductions_are_fixed_order() {
        let a: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 101) as f32 * 0.013 - 0.6)
            .collect();
        let mut want = 0f32;
        // The lane-by-lane order, written out scalar.
        let mut lanes = [0f32; ACC];
        for (i, &x) in a.iter().enumerate() {
            lanes[i % ACC] += x;
        }
        let mut w = ACC / 2;
        while w > 0 {
            for i in 0..w {
                lanes[i] += lanes[i + w];
            }
            w /= 2;
        }
        want += lanes[0];
        multiversion! {
            fn vsum(a: &[f32]) -> f32 {
                sum(a)
            }
        }
        assert_eq!(vsum(&a).to_bits(), want.to_bits());
        assert_eq!(max(&a), a.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        let sq: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        let wide: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
        assert!((sum_sq_f64(&wide) - sq).abs() < 1e-12 * sq);
    }
}
