//! The building-block framework of seed 000 (Sec. 2): lay out one microbatch (the building
//! block), repeat it every `T` cells, check for collisions, squeeze (keep each worker's
//! order, drop idle cells — the simulator does this), and reorder the warm-up and
//! cool-down (App. C).
//!
//! Time here is in cells: F, B and W take one cell, a fused BW two.

use std::collections::HashMap;

use crate::cost::{Costs, Times};
use crate::error::{Error, Result};
use crate::pass::{Pass, PassKind, PassMap};
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::{TimedPass, simulate};

/// A pass of microbatch 0 placed at a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// The pass (microbatch 0).
    pub pass: Pass,
    /// First cell it occupies.
    pub cell: i64,
    /// Cells it occupies.
    pub len: i64,
}

/// One microbatch laid out over the workers, repeated every `period` cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildingBlock {
    /// Where the stages live.
    pub placement: Placement,
    /// Repeating interval `T` (cells of work per worker per microbatch).
    pub period: i64,
    /// Every pass of microbatch 0.
    pub passes: Vec<Placed>,
}

/// Offsets of a V-shape building block (notation of seed 000, App. A, with workers
/// numbered from 0): "down" offsets go from worker `i` to `i + 1`, "up" offsets back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VOffsets {
    /// δF⁰: between F passes of the first half (down).
    pub f_down: i64,
    /// δF¹: between F passes of the second half (up).
    pub f_up: i64,
    /// δB¹: between B passes of the second half (down).
    pub b_down: i64,
    /// δB⁰: between B passes of the first half (up).
    pub b_up: i64,
    /// δ(F_d⁰, F_d¹): the forward turn on the last worker.
    pub turn_f: i64,
    /// δ(F_1¹, B_1¹): from the last forward to the first backward on worker 0.
    pub turn_fb: i64,
    /// δ(B_d¹, B_d⁰): the backward turn on the last worker.
    pub turn_b: i64,
    /// Fused BW (two cells) instead of B and W.
    pub fused: bool,
}

impl VOffsets {
    /// V-Min (App. F, Table 8): all offsets 1; δ(F_1¹, B_1¹) = 3 when `d ≡ 0 (mod 3)`.
    pub fn v_min(d: u32) -> VOffsets {
        let turn_fb = if d.is_multiple_of(3) { 3 } else { 1 };
        VOffsets {
            f_down: 1,
            f_up: 1,
            b_down: 1,
            b_up: 1,
            turn_f: 1,
            turn_fb,
            turn_b: 1,
            fused: false,
        }
    }

    /// V-Half (App. F, Table 9): δ⁰ = 2 down, δ¹ = 1 up; the turns are (2, 4, 1) for even
    /// `d` and (2, 1, 1) for odd `d`.
    pub fn v_half(d: u32) -> VOffsets {
        let turn_fb = if d.is_multiple_of(2) { 4 } else { 1 };
        VOffsets {
            f_down: 2,
            f_up: 1,
            b_down: 2,
            b_up: 1,
            turn_f: 2,
            turn_fb,
            turn_b: 1,
            fused: false,
        }
    }

    /// The building block these offsets describe on `d` workers (W passes fill the cells
    /// left free by F and B, each as early as possible after its B).
    pub fn block(&self, d: u32) -> BuildingBlock {
        let d = d as i64;
        let bl = if self.fused { 2 } else { 1 };
        let back = |s: i64| {
            if self.fused {
                Pass::bw(s as u32, 0)
            } else {
                Pass::b(s as u32, 0)
            }
        };
        let mut passes = Vec::with_capacity(6 * d as usize);
        let mut t = 0;
        for s in 0..d {
            passes.push(Placed {
                pass: Pass::f(s as u32, 0),
                cell: t,
                len: 1,
            });
            t += if s + 1 < d { self.f_down } else { self.turn_f };
        }
        for s in d..2 * d {
            passes.push(Placed {
                pass: Pass::f(s as u32, 0),
                cell: t,
                len: 1,
            });
            t += if s + 1 < 2 * d {
                self.f_up
            } else {
                self.turn_fb
            };
        }
        for s in (d..2 * d).rev() {
            passes.push(Placed {
                pass: back(s),
                cell: t,
                len: bl,
            });
            t += if s > d { self.b_down } else { self.turn_b };
        }
        for s in (0..d).rev() {
            passes.push(Placed {
                pass: back(s),
                cell: t,
                len: bl,
            });
            t += self.b_up;
        }
        let period = 6;
        let mut block = BuildingBlock {
            placement: Placement::V { workers: d as u32 },
            period,
            passes,
        };
        if !self.fused {
            block.place_weights();
        }
        block
    }
}

impl BuildingBlock {
    fn worker_of(&self, p: &Placed) -> u32 {
        self.placement.worker_of(p.pass.stage)
    }

    /// Adds a W after every B: on each worker, the earliest cell after the B whose residue
    /// modulo the period is still free (so that repeating stays collision-free).
    pub(crate) fn place_weights(&mut self) {
        let workers = self.placement.workers() as usize;
        let period = self.period as usize;
        // One flat table of used residues, and the B passes sorted by worker then cell: two
        // allocations however many workers (this runs for every candidate block).
        let mut used = vec![false; workers * period];
        let mut bs: Vec<(usize, Placed)> = Vec::with_capacity(self.passes.len() / 3);
        for p in &self.passes {
            let w = self.worker_of(p) as usize;
            for c in p.cell..p.cell + p.len {
                used[w * period + c.rem_euclid(self.period) as usize] = true;
            }
            if p.pass.kind == PassKind::B {
                bs.push((w, *p));
            }
        }
        bs.sort_by_key(|(w, p)| (*w, p.cell));
        let mut extra = Vec::with_capacity(bs.len());
        for (w, b) in bs {
            let used = &mut used[w * period..(w + 1) * period];
            // No free residue: the block collides anyway (`collision_free` rejects it).
            if used.iter().all(|u| *u) {
                continue;
            }
            let mut c = b.cell + b.len;
            while used[c.rem_euclid(self.period) as usize] {
                c += 1;
            }
            used[c.rem_euclid(self.period) as usize] = true;
            extra.push(Placed {
                pass: Pass::w(b.pass.stage, 0),
                cell: c,
                len: 1,
            });
        }
        self.passes.extend(extra);
    }

    /// Cells from the block's first cell to the end of its last pass.
    pub fn length(&self) -> i64 {
        self.passes
            .iter()
            .map(|p| p.cell + p.len)
            .max()
            .unwrap_or(0)
    }

    /// True when repeating every `period` cells never puts two passes in one cell.
    pub fn collision_free(&self) -> bool {
        (0..self.placement.workers()).all(|w| {
            let mut used = vec![false; self.period as usize];
            self.passes
                .iter()
                .filter(|p| self.worker_of(p) == w)
                .all(|p| {
                    (p.cell..p.cell + p.len).all(|c| {
                        let r = c.rem_euclid(self.period) as usize;
                        !std::mem::replace(&mut used[r], true)
                    })
                })
        })
    }

    /// Eq. 1 of seed 000: per worker, `Σ_s ⌈lifespan_s / T⌉` microbatches of stage `s` held at
    /// the peak (lifespan = F start to W or BW end); the maximum over workers.
    pub fn peak_estimate(&self) -> i64 {
        let mut start: HashMap<u32, i64> = HashMap::new();
        let mut end: HashMap<u32, i64> = HashMap::new();
        for p in &self.passes {
            match p.pass.kind {
                PassKind::F => {
                    start.insert(p.pass.stage, p.cell);
                }
                PassKind::W | PassKind::BW => {
                    end.insert(p.pass.stage, p.cell + p.len);
                }
                PassKind::B => {}
            }
        }
        (0..self.placement.workers())
            .map(|w| {
                self.placement
                    .stages_of(w)
                    .iter()
                    .map(|s| {
                        (end.get(s).copied().unwrap_or(0) - start.get(s).copied().unwrap_or(0))
                            .max(0)
                    })
                    .map(|l| (l + self.period - 1) / self.period)
                    .sum::<i64>()
            })
            .max()
            .unwrap_or(0)
    }

    /// Repeats the block for `n` microbatches and returns every worker's order (by cell).
    pub fn repeat(&self, name: &str, n: u32) -> Result<Schedule> {
        if !self.collision_free() {
            return Err(Error::NoBuildingBlock {
                schedule: name.into(),
                workers: self.placement.workers(),
            });
        }
        let mut cells: Vec<Vec<(i64, Pass)>> = vec![Vec::new(); self.placement.workers() as usize];
        for mb in 0..n {
            for p in &self.passes {
                let pass = Pass { mb, ..p.pass };
                cells[self.worker_of(p) as usize]
                    .push((p.cell + i64::from(mb) * self.period, pass));
            }
        }
        let mut schedule = Schedule::empty(name, self.placement.clone(), n);
        for (w, mut list) in cells.into_iter().enumerate() {
            list.sort_by_key(|(c, _)| *c);
            schedule.workers[w] = list.into_iter().map(|(_, p)| p).collect();
        }
        Ok(schedule)
    }
}

/// Unit-cell costs for a placement: every F, B and W of a stage takes one cell.
fn cell_costs(placement: &Placement) -> Result<Costs> {
    let v = f64::from(placement.chunks());
    Costs::uniform(
        placement,
        Times {
            f: v,
            b: v,
            w: v,
            comm: 0.0,
        },
    )
}

const EPS: f64 = 1e-9;

/// App. C warm-up reordering: walking the cells left to right, a vacant cell before a
/// worker's first backward is filled with a later forward of that worker whose inputs are
/// ready, keeping every other pass where it is. A move never raises the worker's peak memory.
pub fn reorder_warmup(schedule: Schedule) -> Result<Schedule> {
    let costs = cell_costs(&schedule.placement)?;
    let sim = simulate(&schedule, &costs)?;
    let mut lines: Vec<Vec<TimedPass>> = sim.timeline;
    let mut end = PassMap::times(schedule.placement.stages(), schedule.microbatches);
    for t in lines.iter().flatten() {
        end.set(t.pass, t.end);
    }
    let first_b: Vec<f64> = lines
        .iter()
        .map(|l| {
            l.iter()
                .find(|t| t.pass.kind != PassKind::F)
                .map_or(f64::INFINITY, |t| t.start)
        })
        .collect();
    let horizon = first_b
        .iter()
        .copied()
        .filter(|t| t.is_finite())
        .fold(0.0, f64::max);
    let peak: Vec<f64> = sim.peak_memory;
    let mut t = 0.0;
    while t < horizon {
        for (w, line) in lines.iter_mut().enumerate() {
            if t + EPS >= first_b[w] {
                continue;
            }
            // The line is sorted by start and passes do not overlap: only the last pass
            // starting by `t` can cover it; `next` is the first pass after the vacant cell.
            let next = line.partition_point(|p| p.start <= t + EPS);
            if next == line.len() || (next > 0 && line[next - 1].end > t + EPS) {
                continue;
            }
            let found = line[next..].iter().take(64).position(|cand| {
                cand.pass.kind == PassKind::F
                    && (cand.pass.stage == 0
                        || end
                            .known(Pass::f(cand.pass.stage - 1, cand.pass.mb))
                            .is_some_and(|e| e <= t + EPS))
            });
            let Some(offset) = found else { continue };
            let from = next + offset;
            // Memory: the moved forward is held over positions next..from.
            let mem = costs.stages[line[from].pass.stage as usize].mem;
            if held_max(line, &costs, next, from) + mem > peak[w] + EPS {
                continue;
            }
            let mut moved = line.remove(from);
            moved.end = t + (moved.end - moved.start);
            moved.start = t;
            end.set(moved.pass, moved.end);
            line.insert(next, moved);
        }
        t += 1.0;
    }
    Ok(with_orders(schedule, lines))
}

/// Largest activation memory held just before each of positions `lo..=hi` of a worker.
fn held_max(line: &[TimedPass], costs: &Costs, lo: usize, hi: usize) -> f64 {
    let mut now = 0.0f64;
    let mut best = 0.0f64;
    for (i, p) in line.iter().enumerate().take(hi + 1) {
        let change = costs.memory_change(p.pass);
        // Allocations count from the pass's start, releases from its end.
        if change > 0.0 {
            now += change;
        }
        if i >= lo {
            best = best.max(now);
        }
        if change < 0.0 {
            now += change;
        }
    }
    best
}

/// App. C cool-down reordering under `costs`: the W passes after a worker's last forward
/// are taken out, the rest is squeezed, the W passes go back into the idle gaps (each after
/// its B, only where it fits without moving anything), and the remainder go at the end.
pub fn reorder_cooldown(schedule: Schedule, costs: &Costs) -> Result<Schedule> {
    let mut trimmed = schedule.clone();
    let mut pending: Vec<Vec<Pass>> = Vec::with_capacity(trimmed.workers.len());
    for program in &mut trimmed.workers {
        let last_f = program
            .iter()
            .rposition(|p| p.kind == PassKind::F)
            .map_or(0, |i| i + 1);
        let (keep, ws): (Vec<Pass>, Vec<Pass>) = program[last_f..]
            .iter()
            .partition(|p| p.kind != PassKind::W);
        program.truncate(last_f);
        program.extend(keep);
        program.extend(ws.iter().copied());
        pending.push(ws);
    }
    let sim = simulate(&trimmed, costs)?;
    let mut orders = Vec::with_capacity(trimmed.workers.len());
    for (w, line) in sim.timeline.iter().enumerate() {
        let ws = &pending[w];
        let main = &line[..line.len() - ws.len()];
        let last_f = main
            .iter()
            .rposition(|p| p.pass.kind == PassKind::F)
            .map_or(0, |i| i + 1);
        // Ends of the B passes already in `order`: a W may only follow its own B (with zero
        // or tiny B times, a later B can end by the time an earlier pass starts).
        let mut b_end = PassMap::times(trimmed.placement.stages(), trimmed.microbatches);
        for t in main[..last_f].iter().filter(|t| t.pass.kind == PassKind::B) {
            b_end.set(t.pass, t.end);
        }
        let mut queue: std::collections::VecDeque<Pass> = ws.iter().copied().collect();
        let mut order: Vec<Pass> = main[..last_f].iter().map(|t| t.pass).collect();
        let mut cursor = main[..last_f].last().map_or(0.0, |t| t.end);
        for t in &main[last_f..] {
            // Fill the gap [cursor, t.start) with ready W passes that fit.
            loop {
                let fits = queue.iter().position(|wp| {
                    let ready = b_end
                        .known(Pass::b(wp.stage, wp.mb))
                        .unwrap_or(f64::INFINITY);
                    cursor.max(ready) + costs.duration(PassKind::W, wp.stage) <= t.start + EPS
                });
                let Some(i) = fits else { break };
                let Some(wp) = queue.remove(i) else { break };
                let ready = b_end.known(Pass::b(wp.stage, wp.mb)).unwrap_or(0.0);
                cursor = cursor.max(ready) + costs.duration(PassKind::W, wp.stage);
                order.push(wp);
            }
            order.push(t.pass);
            if t.pass.kind == PassKind::B {
                b_end.set(t.pass, t.end);
            }
            cursor = t.end;
        }
        order.extend(queue);
        orders.push(order);
    }
    trimmed.workers = orders;
    Ok(trimmed)
}

fn with_orders(mut schedule: Schedule, lines: Vec<Vec<TimedPass>>) -> Schedule {
    schedule.workers = lines
        .into_iter()
        .map(|l| l.into_iter().map(|t| t.pass).collect())
        .collect();
    schedule
}
