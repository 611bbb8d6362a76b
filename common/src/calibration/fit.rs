//! The least-squares fit behind [`super::CostModel`]: per-piece costs and per-worker speed
//! factors from mean pass times, by alternating two linear problems.
//!
//! A measured mean time of passes of one kind over a stage made of `n_e` embeddings, `n_b`
//! blocks and `n_h` heads on worker `w` is modelled as `factor_w · Σ n_k · c_k` (a fused
//! `BW` as `B + W`). With the factors fixed the costs solve a 9-unknown linear least
//! squares problem; with the costs fixed every factor has a closed form. Residuals are
//! relative (a 1 ms pass weighs as much as a 100 ms one) and a small ridge pulls every cost
//! towards its prior, which decides the directions the measurements do not (pieces that
//! always run together). The factors' geometric mean is pinned to 1: costs are those of a
//! worker of the mean speed.

use crate::pass::PassKind;

/// Piece kinds (embedding, block, head) times pass kinds (F, B, W).
pub(super) const UNKNOWNS: usize = 9;

/// Alternations of the two solves; the problem is tiny, and the fit settles in a few.
const ROUNDS: usize = 60;

/// Weight of the pull towards the prior, against measurements of weight about 1 each: only
/// enough to decide what the rows leave open. At 1e-6 it held an embedding that ran 150×
/// its FLOPs prior 2 % short of its own measured time.
const RIDGE: f64 = 1e-9;

/// One averaged measurement for the fit.
#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    /// The worker's index among the fitted workers.
    pub(super) worker: usize,
    /// Embeddings, blocks and heads of the stage.
    pub(super) counts: [u32; 3],
    /// The pass kind.
    pub(super) kind: PassKind,
    /// Mean seconds.
    pub(super) secs: f64,
    /// How much the mean counts (the passes behind it, capped).
    pub(super) weight: f64,
}

impl Row {
    /// The row's coefficients on the nine costs (`3·piece + pass`).
    fn coefficients(&self) -> [f64; UNKNOWNS] {
        let mut a = [0.0; UNKNOWNS];
        let passes: &[usize] = match self.kind {
            PassKind::F => &[0],
            PassKind::B => &[1],
            PassKind::W => &[2],
            PassKind::BW => &[1, 2],
        };
        for (piece, &n) in self.counts.iter().enumerate() {
            for &p in passes {
                a[3 * piece + p] = f64::from(n);
            }
        }
        a
    }
}

/// Fits costs (`3·piece + pass`, seconds at the mean speed) and factors (one per worker)
/// to `rows`, starting from (and pulled towards) `prior` and `prior_factors`. Where the
/// rows do not separate a worker's speed from its pieces' costs (one split seen), the
/// first solve decides: the costs for the prior factors, or with `factors_first` (the
/// costs are known and the workers' speeds are not: after a drift) the factors for the
/// prior costs.
pub(super) fn fit(
    rows: &[Row],
    prior: [f64; UNKNOWNS],
    prior_factors: &[f64],
    factors_first: bool,
) -> ([f64; UNKNOWNS], Vec<f64>) {
    let mut costs = prior;
    let mut factors = prior_factors.to_vec();
    if rows.is_empty() {
        return (costs, factors);
    }
    let measured: Vec<usize> = (0..factors.len())
        .filter(|w| rows.iter().any(|r| r.worker == *w))
        .collect();
    let geo_mean = |f: &[f64]| {
        let logs = measured.iter().map(|&w| f[w].ln()).sum::<f64>();
        (logs / measured.len().max(1) as f64).exp()
    };
    if factors_first {
        solve_factors(rows, &costs, &mut factors);
    }
    for _ in 0..ROUNDS {
        costs = solve_costs(rows, &factors, &prior).unwrap_or(costs);
        solve_factors(rows, &costs, &mut factors);
        let g = geo_mean(&factors);
        if g.is_finite() && g > 0.0 {
            measured.iter().for_each(|&w| factors[w] /= g);
            costs.iter_mut().for_each(|c| *c *= g);
        }
    }
    // A worker with no passes measured yet (another replica's, one that just joined) keeps
    // its start-up profile's speed relative to the measured workers' profiles.
    let base = geo_mean(prior_factors);
    if base.is_finite() && base > 0.0 {
        for (w, f) in factors.iter_mut().enumerate() {
            if !measured.contains(&w) {
                *f = prior_factors[w] / base;
            }
        }
    }
    (costs, factors)
}

/// Costs for fixed factors: the normal equations of the relative residuals plus the ridge.
fn solve_costs(rows: &[Row], factors: &[f64], prior: &[f64; UNKNOWNS]) -> Option<[f64; UNKNOWNS]> {
    let mut ata = [[0.0f64; UNKNOWNS]; UNKNOWNS];
    let mut atb = [0.0f64; UNKNOWNS];
    for r in rows {
        let target = r.secs / factors[r.worker];
        if !(target.is_finite() && target > 0.0) {
            continue;
        }
        // Relative residual: the row over its own target.
        let a = r.coefficients().map(|x| x / target);
        for i in 0..UNKNOWNS {
            atb[i] += r.weight * a[i];
            for j in 0..UNKNOWNS {
                ata[i][j] += r.weight * a[i] * a[j];
            }
        }
    }
    for j in 0..UNKNOWNS {
        let scale = prior[j].max(f64::MIN_POSITIVE);
        ata[j][j] += RIDGE / (scale * scale);
        atb[j] += RIDGE / scale;
    }
    let mut x = gauss(ata, atb)?;
    for (j, c) in x.iter_mut().enumerate() {
        // A cost is never negative; a piece the data says costs nothing keeps a trace of
        // its prior so the fit stays well posed.
        *c = c.max(prior[j] * 1e-3);
    }
    Some(x)
}

/// Every measured worker's factor for fixed costs: `argmin Σ wgt·((f·s − t)/t)²`.
fn solve_factors(rows: &[Row], costs: &[f64; UNKNOWNS], factors: &mut [f64]) {
    let mut sums = vec![(0.0f64, 0.0f64); factors.len()];
    for r in rows {
        let s: f64 = r.coefficients().iter().zip(costs).map(|(a, c)| a * c).sum();
        if r.secs > 0.0 && s > 0.0 {
            let q = s / r.secs;
            sums[r.worker].0 += r.weight * q;
            sums[r.worker].1 += r.weight * q * q;
        }
    }
    for (f, (num, den)) in factors.iter_mut().zip(sums) {
        if den > 0.0 {
            *f = num / den;
        }
    }
}

/// Solves `a·x = b` by Gaussian elimination with partial pivoting (`None`: singular).
fn gauss(mut a: [[f64; UNKNOWNS]; UNKNOWNS], mut b: [f64; UNKNOWNS]) -> Option<[f64; UNKNOWNS]> {
    for col in 0..UNKNOWNS {
        let pivot = (col..UNKNOWNS).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..UNKNOWNS {
            let m = a[row][col] / a[col][col];
            let pivot_row = a[col];
            for (x, p) in a[row].iter_mut().zip(pivot_row).skip(col) {
                *x -= m * p;
            }
            b[row] -= m * b[col];
        }
    }
    let mut x = [0.0; UNKNOWNS];
    for row in (0..UNKNOWNS).rev() {
        let rest: f64 = (row + 1..UNKNOWNS).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}
