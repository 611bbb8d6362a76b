//! The adaptive V search space: the building-block offsets of Eq. 3 (seed 000, App. A)
//! and the enumeration of the collision-free ones.

use std::hash::Hash;

use crate::generate::block::{BuildingBlock, Placed, VOffsets};
use crate::pass::Pass;
use crate::placement::Placement;

/// Cells per microbatch per worker in a V block (F, F, B, B, W, W).
pub(super) const PERIOD: i64 = 6;

/// Largest "down" / "up" offset searched.
const MAX_OFFSET: i64 = 4;

/// Largest turn offset searched.
const MAX_TURN: i64 = 6;

/// The offsets of Eq. 3 (seed 000, App. A), with workers numbered from 0: the offset across
/// the boundary between workers `a` and `a + 1` is the "lo" value when both lie in the first
/// `k` workers (`a + 1 < k`), the "hi" value otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SplitOffsets {
    /// The split row `K` (1 ..= d; 1 means uniform "hi" offsets).
    pub k: u32,
    /// δ⁰ within the first `K` workers (F of the first half, B of the second half).
    pub down_lo: i64,
    /// δ⁰ from row `K` on.
    pub down_hi: i64,
    /// δ¹ within the first `K` workers (F of the second half, B of the first half).
    pub up_lo: i64,
    /// δ¹ from row `K` on.
    pub up_hi: i64,
    /// δ(F_d⁰, F_d¹): the forward turn on the last worker.
    pub turn_f: i64,
    /// δ(F_1¹, B_1¹): last forward to first backward on worker 0.
    pub turn_fb: i64,
    /// δ(B_d¹, B_d⁰): the backward turn on the last worker.
    pub turn_b: i64,
}

impl SplitOffsets {
    /// Uniform offsets (the building blocks of V-Min, V-Half and V-ZB). `None` when the down
    /// (or up) offsets of F and B differ, which Eq. 3 does not describe, or the block is fused.
    pub fn from_uniform(o: &VOffsets) -> Option<SplitOffsets> {
        (!o.fused && o.f_down == o.b_down && o.f_up == o.b_up).then_some(SplitOffsets {
            k: 1,
            down_lo: o.f_down,
            down_hi: o.f_down,
            up_lo: o.f_up,
            up_hi: o.f_up,
            turn_f: o.turn_f,
            turn_fb: o.turn_fb,
            turn_b: o.turn_b,
        })
    }

    fn across(&self, a: i64, lo: i64, hi: i64) -> i64 {
        if a + 1 < i64::from(self.k) { lo } else { hi }
    }

    fn down(&self, a: i64) -> i64 {
        self.across(a, self.down_lo, self.down_hi)
    }

    fn up(&self, a: i64) -> i64 {
        self.across(a, self.up_lo, self.up_hi)
    }

    /// The building block on `d` workers; W passes take the earliest free residue after
    /// their B.
    pub fn block(&self, d: u32) -> BuildingBlock {
        let d = i64::from(d);
        let mut passes = Vec::with_capacity(6 * d as usize);
        let mut push = |pass: Pass, cell: i64| passes.push(Placed { pass, cell, len: 1 });
        let stage = |s: i64| s as u32;
        let mut t = 0;
        for s in 0..d {
            push(Pass::f(stage(s), 0), t);
            t += if s + 1 < d { self.down(s) } else { self.turn_f };
        }
        for s in d..2 * d {
            push(Pass::f(stage(s), 0), t);
            t += if s + 1 < 2 * d {
                self.up(2 * d - 2 - s)
            } else {
                self.turn_fb
            };
        }
        for s in (d..2 * d).rev() {
            push(Pass::b(stage(s), 0), t);
            t += if s > d {
                self.down(2 * d - 1 - s)
            } else {
                self.turn_b
            };
        }
        for s in (0..d).rev() {
            push(Pass::b(stage(s), 0), t);
            if s > 0 {
                t += self.up(s - 1);
            }
        }
        let mut block = BuildingBlock {
            placement: Placement::V { workers: d as u32 },
            period: PERIOD,
            passes,
        };
        block.place_weights();
        block
    }
}

/// Enumerates the collision-free Eq. 3 tuples on `d` workers. The collision test only needs
/// the residues of `s[i] − p[i]` (see `fb_cells` in the tests), so the turn loops are O(1) each.
pub fn split_candidates(d: u32) -> Vec<SplitOffsets> {
    let mut out = Vec::new();
    let di = i64::from(d);
    let ks: Vec<u32> = (1..=d.max(1)).collect();
    for &k in &ks {
        for down_lo in 1..=MAX_OFFSET {
            for down_hi in 1..=MAX_OFFSET {
                for up_lo in 1..=MAX_OFFSET {
                    for up_hi in 1..=MAX_OFFSET {
                        // K = 1 covers the uniform tuples; other K only with a real split,
                        // and only where the lo offsets are used at all (K ≥ 2).
                        let uniform = down_lo == down_hi && up_lo == up_hi;
                        if (k == 1) != uniform {
                            continue;
                        }
                        if k > 1 && k >= d {
                            continue;
                        }
                        let base = SplitOffsets {
                            k,
                            down_lo,
                            down_hi,
                            up_lo,
                            up_hi,
                            turn_f: 0,
                            turn_fb: 0,
                            turn_b: 0,
                        };
                        let mut p = 0i64;
                        let mut s0 = 0i64;
                        for a in 0..di - 1 {
                            s0 += base.up(a);
                        }
                        let mut residues = 0u8;
                        let mut s = s0;
                        for i in 0..di {
                            residues |= 1 << (s - p).rem_euclid(PERIOD);
                            if i + 1 < di {
                                p += base.down(i);
                                s -= base.up(i);
                            }
                        }
                        let total_down = p;
                        let each = |f: &dyn Fn(i64) -> i64| {
                            (0..PERIOD).all(|r| residues & (1 << r) == 0 || f(r) % PERIOD != 0)
                        };
                        for turn_f in 1..=MAX_TURN {
                            // F⁰ and F¹ on one worker: F1 − F0 = D + tf + (s − p).
                            if !each(&|r| (total_down + turn_f + r).rem_euclid(PERIOD)) {
                                continue;
                            }
                            for turn_fb in 1..=MAX_TURN {
                                // B¹ − F⁰ = D + tf + s0 + tfb (same on every worker).
                                let c1 = total_down + turn_f + s0 + turn_fb;
                                if c1.rem_euclid(PERIOD) == 0 {
                                    continue;
                                }
                                // B¹ − F¹ = s0 + tfb − (s − p).
                                if !each(&|r| (s0 + turn_fb - r).rem_euclid(PERIOD)) {
                                    continue;
                                }
                                for turn_b in 1..=MAX_TURN {
                                    // B⁰ − F¹ = s0 + tfb + D + tb; B⁰ − B¹ = D + tb + (s − p);
                                    // B⁰ − F⁰ = c1 + D + tb + (s − p).
                                    let c2 = s0 + turn_fb + total_down + turn_b;
                                    if c2.rem_euclid(PERIOD) == 0
                                        || !each(&|r| (total_down + turn_b + r).rem_euclid(PERIOD))
                                        || !each(&|r| {
                                            (c1 + total_down + turn_b + r).rem_euclid(PERIOD)
                                        })
                                    {
                                        continue;
                                    }
                                    out.push(SplitOffsets {
                                        turn_f,
                                        turn_fb,
                                        turn_b,
                                        ..base
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::pass::PassKind;

    /// The cells of worker `i`'s four F/B passes (F⁰, F¹, B¹, B⁰) in closed form, for every
    /// worker: prefix sums of the offsets.
    fn fb_cells(o: &SplitOffsets, d: u32) -> Vec<[i64; 4]> {
        let d = i64::from(d);
        // p[i]: Σ down offsets over boundaries < i; s[i]: Σ up offsets over boundaries i..d−1.
        let mut p = vec![0i64; d as usize];
        for i in 1..d {
            p[i as usize] = p[i as usize - 1] + o.down(i - 1);
        }
        let mut s = vec![0i64; d as usize];
        for i in (0..d - 1).rev() {
            s[i as usize] = s[i as usize + 1] + o.up(i);
        }
        let total_down = p[d as usize - 1];
        let f1_base = total_down + o.turn_f;
        let b1_base = f1_base + s[0] + o.turn_fb;
        let b0_base = b1_base + total_down + o.turn_b;
        (0..d as usize)
            .map(|i| [p[i], f1_base + s[i], b1_base + p[i], b0_base + s[i]])
            .collect()
    }

    #[test]
    fn closed_form_collision_test_matches_the_block() {
        for d in [1u32, 2, 3, 5, 8] {
            let fast: HashSet<SplitOffsets> = split_candidates(d).into_iter().collect();
            // Every enumerated tuple really is collision-free, and the cells agree.
            for o in &fast {
                let block = o.block(d);
                assert!(block.collision_free(), "{o:?} on d={d}");
                let cells = fb_cells(o, d);
                for p in block.passes.iter().filter(|p| p.pass.kind != PassKind::W) {
                    let w = block.placement.worker_of(p.pass.stage) as usize;
                    let first_half = p.pass.stage < d;
                    let idx = match (p.pass.kind, first_half) {
                        (PassKind::F, true) => 0,
                        (PassKind::F, false) => 1,
                        (PassKind::B, false) => 2,
                        _ => 3,
                    };
                    assert_eq!(cells[w][idx], p.cell, "{o:?} {}", p.pass);
                }
            }
            // And a brute-force check over a slice of the space finds no tuple it missed.
            for k in 1..d.max(2) {
                for (down_lo, up_hi) in [(1, 1), (2, 1), (1, 3), (4, 2)] {
                    for turn_fb in 1..=MAX_TURN {
                        let o = SplitOffsets {
                            k,
                            down_lo,
                            down_hi: 2,
                            up_lo: 1,
                            up_hi,
                            turn_f: 2,
                            turn_fb,
                            turn_b: 1,
                        };
                        let uniform = down_lo == 2 && up_hi == 1;
                        if k == 1 && !uniform {
                            continue; // the lo offsets are unused: the uniform tuple (2, up_hi)
                        }
                        let canonical = if uniform {
                            SplitOffsets { k: 1, ..o }
                        } else {
                            o
                        };
                        if o.block(d).collision_free() {
                            assert!(fast.contains(&canonical), "missed {o:?} on d={d}");
                        }
                    }
                }
            }
        }
    }
}
