//! Test helpers of the partition module: a seeded generator and every split by brute force.

use std::ops::Range;

/// A small deterministic pseudo-random generator (no external crates): a draw below `m`.
pub(crate) fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    }
}

/// A random split problem: 1 to `most` pieces of whole times `lightest` to `lightest + 3`
/// (small, so that ties occur) into 1 to that many stages, as `(stages, times)`.
pub(crate) fn random_pieces(
    next: &mut impl FnMut(u64) -> u64,
    most: u64,
    lightest: f64,
) -> (usize, Vec<f64>) {
    let len = 1 + next(most) as usize;
    let stages = 1 + next(len as u64) as usize;
    (
        stages,
        (0..len).map(|_| lightest + next(4) as f64).collect(),
    )
}

/// Every composition of `len` into `stages` positive parts, as ranges.
pub(crate) fn compositions(len: usize, stages: usize) -> Vec<Vec<Range<usize>>> {
    if stages == 1 {
        return vec![vec![0..len]];
    }
    let mut out = Vec::new();
    for first in 1..=len - (stages - 1) {
        for rest in compositions(len - first, stages - 1) {
            let mut p = Vec::with_capacity(stages);
            p.push(0..first);
            p.extend(rest.into_iter().map(|r| r.start + first..r.end + first));
            out.push(p);
        }
    }
    out
}
