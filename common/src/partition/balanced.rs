//! The auto-planner's balanced split: pieces with compute times and parameter counts cut
//! into contiguous stages, the largest stage time first, then the largest stage parameter
//! count, then the spread of the stage times.

use std::ops::Range;

/// Relative tolerance when comparing stage times.
const REL_EPS: f64 = 1e-9;

/// Minimises a stage objective over the partitions of `0..len` into `stages` contiguous
/// non-empty ranges. `cost(j, i)` is the cost of the stage `j..i` (`None`: not allowed);
/// the partition's objective folds the stage costs with `fold` (max or sum). Returns the
/// objective and the ranges, or `None` when no partition is allowed. Among equal
/// objectives the earliest cut wins.
///
/// Contract, which lets the search stop early: a longer stage never costs less (`cost(j, i)`
/// does not decrease as `j` decreases, and once it is `None` it stays `None`), and
/// `fold(a, c) >= c` for every objective `a >= 0` (max and sum of non-negative costs). So
/// the scan over a stage's start `j`, from the shortest stage down, ends at the first
/// stage that is not allowed or that alone costs more than the best so far; the search is
/// about `len²` steps in all rather than `stages · len²`. `EARLY_STOP = false` scans every
/// cut (the tests' reference for the stops).
fn partition_dp<const EARLY_STOP: bool>(
    len: usize,
    stages: usize,
    cost: &dyn Fn(usize, usize) -> Option<f64>,
    fold: fn(f64, f64) -> f64,
) -> Option<(f64, Vec<Range<usize>>)> {
    if stages == 0 || stages > len {
        return None;
    }
    // best[k][i]: best objective of the first i pieces in k stages; from[k][i]: the cut.
    let mut best = vec![vec![f64::INFINITY; len + 1]; stages + 1];
    let mut from = vec![vec![0usize; len + 1]; stages + 1];
    best[0][0] = 0.0;
    for k in 1..=stages {
        // Leave at least one piece for each of the stages still to come.
        for i in k..=len - (stages - k) {
            for j in ((k - 1)..i).rev() {
                let Some(c) = cost(j, i) else {
                    if EARLY_STOP {
                        break;
                    }
                    continue;
                };
                if EARLY_STOP && c > best[k][i] {
                    break;
                }
                let prev = best[k - 1][j];
                if !prev.is_finite() {
                    continue;
                }
                let value = if k == 1 { c } else { fold(prev, c) };
                // `<=`: the scan runs from the latest cut down, and the earliest wins.
                if value <= best[k][i] {
                    best[k][i] = value;
                    from[k][i] = j;
                }
            }
        }
    }
    let objective = best[stages][len];
    if !objective.is_finite() {
        return None;
    }
    let mut ranges = Vec::with_capacity(stages);
    let mut end = len;
    for k in (1..=stages).rev() {
        let start = from[k][end];
        ranges.push(start..end);
        end = start;
    }
    ranges.reverse();
    Some((objective, ranges))
}

/// Splits pieces with compute times `times` and parameter counts `params` into `stages`
/// contiguous non-empty ranges (indices into the slices).
///
/// Lexicographic objective: the smallest largest stage time; among those, the smallest
/// largest stage parameter count; among those, the smallest sum of squared stage times.
/// `None` when `stages` is 0, exceeds the piece count, or the slices differ in length.
pub fn balance(times: &[f64], params: &[u64], stages: usize) -> Option<Vec<Range<usize>>> {
    if times.len() != params.len() {
        return None;
    }
    let len = times.len();
    let mut tp = vec![0.0; len + 1];
    let mut pp = vec![0u64; len + 1];
    for i in 0..len {
        tp[i + 1] = tp[i] + times[i];
        pp[i + 1] = pp[i] + params[i];
    }
    let time = |j: usize, i: usize| tp[i] - tp[j];
    let par = |j: usize, i: usize| (pp[i] - pp[j]) as f64;
    let (t_max, _) = partition_dp::<true>(len, stages, &|j, i| Some(time(j, i)), f64::max)?;
    let t_cap = t_max * (1.0 + REL_EPS) + f64::MIN_POSITIVE;
    let (p_max, _) = partition_dp::<true>(
        len,
        stages,
        &|j, i| (time(j, i) <= t_cap).then(|| par(j, i)),
        f64::max,
    )?;
    let (_, ranges) = partition_dp::<true>(
        len,
        stages,
        &|j, i| (time(j, i) <= t_cap && par(j, i) <= p_max).then(|| time(j, i) * time(j, i)),
        |a, b| a + b,
    )?;
    Some(ranges)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::partition::testing::{compositions, random_pieces, xorshift};

    fn key(times: &[f64], params: &[u64], p: &[Range<usize>]) -> (f64, u64, f64) {
        let t: Vec<f64> = p.iter().map(|r| times[r.clone()].iter().sum()).collect();
        let max_t = t.iter().copied().fold(0.0, f64::max);
        let max_p = p
            .iter()
            .map(|r| params[r.clone()].iter().sum::<u64>())
            .max()
            .unwrap();
        (max_t, max_p, t.iter().map(|x| x * x).sum())
    }

    /// The early stops change nothing: the same objective and the same cuts (ties
    /// included) as the full scan, for max and sum folds and for costs with caps.
    #[test]
    fn partition_dp_matches_the_full_scan() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        for case in 0..300 {
            let (stages, times) = random_pieces(&mut next, 40, 0.0);
            let len = times.len();
            let mut prefix = vec![0.0; len + 1];
            for i in 0..len {
                prefix[i + 1] = prefix[i] + times[i];
            }
            let cap = prefix[len] / stages as f64 + next(6) as f64;
            let time = |j: usize, i: usize| prefix[i] - prefix[j];
            let capped = |j: usize, i: usize| (time(j, i) <= cap).then(|| time(j, i));
            let squared = |j: usize, i: usize| capped(j, i).map(|t| t * t);
            let costs: [&dyn Fn(usize, usize) -> Option<f64>; 3] =
                [&|j, i| Some(time(j, i)), &capped, &squared];
            for cost in costs {
                for fold in [f64::max, |a: f64, b: f64| a + b] {
                    assert_eq!(
                        partition_dp::<true>(len, stages, cost, fold),
                        partition_dp::<false>(len, stages, cost, fold),
                        "case {case}: {times:?} in {stages} stages, cap {cap}"
                    );
                }
            }
        }
    }

    #[test]
    fn balance_matches_brute_force() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for case in 0..200 {
            // Ties (and the tie-breaks) really occur.
            let (stages, times) = random_pieces(&mut next, 8, 1.0);
            let len = times.len();
            let params: Vec<u64> = (0..len).map(|_| 1 + next(5)).collect();
            let got = balance(&times, &params, stages).unwrap();
            assert_eq!(got.len(), stages, "case {case}");
            assert_eq!(got[0].start, 0);
            assert_eq!(got[stages - 1].end, len);
            for w in got.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            assert!(got.iter().all(|r| !r.is_empty()));
            let best = compositions(len, stages)
                .into_iter()
                .map(|p| key(&times, &params, &p))
                .min_by(|a, b| {
                    a.0.total_cmp(&b.0)
                        .then(a.1.cmp(&b.1))
                        .then(a.2.total_cmp(&b.2))
                })
                .unwrap();
            let mine = key(&times, &params, &got);
            assert_eq!(mine.0, best.0, "case {case}: max time {times:?} {params:?}");
            assert_eq!(mine.1, best.1, "case {case}: max params");
            assert!((mine.2 - best.2).abs() < 1e-9, "case {case}: spread");
        }
        assert_eq!(balance(&[1.0, 2.0], &[1, 1], 3), None);
        assert_eq!(balance(&[1.0, 2.0], &[1, 1], 0), None);
        assert_eq!(balance(&[1.0], &[1, 1], 1), None);
    }
}
