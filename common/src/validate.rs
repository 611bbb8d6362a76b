//! The validator: every generator's output and every imported schedule goes through it.
//!
//! Rules: each (stage, microbatch) has exactly one F and either one BW or one B and one W;
//! each stage runs on the worker the placement gives it; on a worker, dependencies that live
//! on the same worker come first (F(s) before F(s+1), B(s+1) before B(s), F before B before
//! W); and the workers, each following its own order, never wait on each other forever.

use std::fmt::Write as _;

use crate::error::{Cell, Error, Result, Rule};
use crate::pass::{Pass, PassKind};
use crate::schedule::Schedule;

const ABSENT: u32 = u32::MAX;

/// Position of every pass of a schedule, indexed by (kind, stage, microbatch).
#[derive(Debug, Clone)]
pub struct PassIndex {
    stages: u32,
    microbatches: u32,
    pos: Vec<u32>,
}

impl PassIndex {
    /// Index of `pass` among every pass the shape could hold (`0..self.slots()`).
    pub(crate) fn slot(&self, pass: Pass) -> usize {
        (pass.kind.index() * self.stages as usize + pass.stage as usize)
            * self.microbatches as usize
            + pass.mb as usize
    }

    /// How many slots [`PassIndex::slot`] numbers.
    pub(crate) fn slots(&self) -> usize {
        self.pos.len()
    }

    /// Position of `pass` in its worker's program, if present.
    pub fn position(&self, pass: Pass) -> Option<u32> {
        let p = self.pos[self.slot(pass)];
        (p != ABSENT).then_some(p)
    }

    /// The pass that produces the input gradient of (stage, mb): `B` if present, else `BW`.
    pub fn input_backward(&self, stage: u32, mb: u32) -> Pass {
        let b = Pass::b(stage, mb);
        if self.position(b).is_some() {
            b
        } else {
            Pass::bw(stage, mb)
        }
    }

    /// The passes `pass` depends on, with the rule each dependency enforces.
    pub fn deps(&self, pass: Pass) -> impl Iterator<Item = (Pass, Rule)> + '_ {
        let (s, mb) = (pass.stage, pass.mb);
        let mut out: [Option<(Pass, Rule)>; 2] = [None, None];
        match pass.kind {
            PassKind::F => {
                if s > 0 {
                    out[0] = Some((Pass::f(s - 1, mb), Rule::ForwardChain));
                }
            }
            PassKind::B | PassKind::BW => {
                out[0] = Some((Pass::f(s, mb), Rule::ForwardBeforeBackward));
                if s + 1 < self.stages {
                    out[1] = Some((self.input_backward(s + 1, mb), Rule::BackwardChain));
                }
            }
            PassKind::W => out[0] = Some((Pass::b(s, mb), Rule::InputBeforeWeight)),
        }
        out.into_iter().flatten()
    }
}

/// Checks `schedule` and returns the index of its passes.
pub fn validate(schedule: &Schedule) -> Result<PassIndex> {
    let index = check_structure(schedule)?;
    check_progress(schedule, &index)?;
    Ok(index)
}

/// Rules 1–3 of [`validate`] (shape, completeness, same-worker order): the index of a
/// schedule that [`check_progress`] has yet to run.
pub(crate) fn check_structure(schedule: &Schedule) -> Result<PassIndex> {
    let placement = &schedule.placement;
    placement.check()?;
    if schedule.num_workers() != placement.workers() {
        return Err(Error::WorkerCount {
            got: schedule.num_workers(),
            expected: placement.workers(),
        });
    }
    let stages = placement.stages();
    let n = schedule.microbatches;
    if n == 0 {
        return Err(Error::InvalidArgument {
            field: "microbatches",
            reason: "must be at least 1".into(),
        });
    }
    let mut index = PassIndex {
        stages,
        microbatches: n,
        pos: vec![ABSENT; 4 * stages as usize * n as usize],
    };

    // Stage → worker as a table: this runs for every pass of every candidate a search
    // simulates.
    let worker_of = placement.table();
    // Membership: ranges, placement, duplicates.
    for (w, passes) in schedule.workers.iter().enumerate() {
        for (p, &pass) in passes.iter().enumerate() {
            let at = Cell {
                worker: w as u32,
                pos: p as u32,
                pass,
            };
            if pass.stage >= stages {
                return Err(Error::UnknownStage { at, stages });
            }
            if pass.mb >= n {
                return Err(Error::MicrobatchOutOfRange {
                    at,
                    microbatches: n,
                });
            }
            let expected = worker_of[pass.stage as usize];
            if expected != at.worker {
                return Err(Error::WrongWorker { at, expected });
            }
            let slot = index.slot(pass);
            if index.pos[slot] != ABSENT {
                let first = Cell {
                    worker: at.worker,
                    pos: index.pos[slot],
                    pass,
                };
                return Err(Error::DuplicatePass { at, first });
            }
            index.pos[slot] = p as u32;
        }
    }

    // Completeness: one F, and BW xor (B and W).
    for s in 0..stages {
        let w = worker_of[s as usize];
        for mb in 0..n {
            let here = |pass: Pass| {
                index.position(pass).map(|pos| Cell {
                    worker: w,
                    pos,
                    pass,
                })
            };
            if here(Pass::f(s, mb)).is_none() {
                return Err(Error::MissingPass {
                    pass: Pass::f(s, mb),
                });
            }
            let (b, wt, bw) = (
                here(Pass::b(s, mb)),
                here(Pass::w(s, mb)),
                here(Pass::bw(s, mb)),
            );
            match (b, wt, bw) {
                (None, None, Some(_)) | (Some(_), Some(_), None) => {}
                (Some(at), _, Some(_)) | (_, Some(at), Some(_)) => {
                    return Err(Error::MixedBackward { at });
                }
                (Some(_), None, None) => {
                    return Err(Error::MissingPass {
                        pass: Pass::w(s, mb),
                    });
                }
                (None, Some(_), None) => {
                    return Err(Error::MissingPass {
                        pass: Pass::b(s, mb),
                    });
                }
                (None, None, None) => {
                    return Err(Error::MissingPass {
                        pass: Pass::bw(s, mb),
                    });
                }
            }
        }
    }

    // Same-worker ordering.
    for (w, passes) in schedule.workers.iter().enumerate() {
        for (p, &pass) in passes.iter().enumerate() {
            for (dep, rule) in index.deps(pass) {
                let dep_worker = worker_of[dep.stage as usize];
                let Some(dep_pos) = index.position(dep) else {
                    continue;
                };
                if dep_worker == w as u32 && dep_pos > p as u32 {
                    return Err(Error::OutOfOrder {
                        at: Cell {
                            worker: w as u32,
                            pos: p as u32,
                            pass,
                        },
                        needs: Cell {
                            worker: dep_worker,
                            pos: dep_pos,
                            pass: dep,
                        },
                        rule,
                    });
                }
            }
        }
    }

    Ok(index)
}

/// Rule 4 of [`validate`] on a schedule that passed [`check_structure`] into `index`:
/// every worker, following its order with any durations, finishes.
pub(crate) fn check_progress(schedule: &Schedule, index: &PassIndex) -> Result<()> {
    let worker_of = schedule.placement.table();
    // Progress: run every worker's order with any durations; all must finish.
    let mut done = vec![false; index.slots()];
    let head = run_in_order(
        schedule,
        |p| worker_of[p.stage as usize] as usize,
        |_, pass| {
            if let Some((dep, _)) = index.deps(pass).find(|(dep, _)| !done[index.slot(*dep)]) {
                return Some(dep);
            }
            done[index.slot(pass)] = true;
            None
        },
    );
    let stuck: Vec<(Cell, Pass)> = schedule
        .workers
        .iter()
        .enumerate()
        .filter_map(|(w, passes)| {
            let pass = *passes.get(head[w])?;
            let waits = index
                .deps(pass)
                .map(|(d, _)| d)
                .find(|d| !done[index.slot(*d)])?;
            Some((
                Cell {
                    worker: w as u32,
                    pos: head[w] as u32,
                    pass,
                },
                waits,
            ))
        })
        .collect();
    if !stuck.is_empty() {
        return Err(Error::Deadlock { stuck });
    }
    Ok(())
}

/// Runs every worker's program in order, each pass after its dependencies:
/// `step(worker, pass)` runs `pass` and returns `None`, or returns a dependency that has not
/// run yet, and the worker then waits until the worker of that dependency runs a pass.
/// Returns how many passes of each worker ran (fewer than its program's length when it
/// deadlocked).
///
/// A waiting worker is stepped again only when the worker it waits on has moved, so the
/// work grows with the passes and the wake-ups, not with the workers times the longest
/// chain (sweeping every worker until none moved took `stages × workers` steps on a looped
/// schedule of 4096 workers).
pub(crate) fn run_in_order(
    schedule: &Schedule,
    placement_of: impl Fn(Pass) -> usize,
    mut step: impl FnMut(usize, Pass) -> Option<Pass>,
) -> Vec<usize> {
    const NONE: u32 = u32::MAX;
    let workers = schedule.workers.len();
    let mut head = vec![0usize; workers];
    // The workers waiting on each worker, as lists threaded through `next_waiter` (a worker
    // waits on one worker at a time).
    let mut first_waiter = vec![NONE; workers];
    let mut next_waiter = vec![NONE; workers];
    let mut ready: Vec<u32> = (0..workers as u32).rev().collect();
    while let Some(w) = ready.pop() {
        let w = w as usize;
        let mut moved = false;
        while let Some(&pass) = schedule.workers[w].get(head[w]) {
            if let Some(dep) = step(w, pass) {
                let v = placement_of(dep);
                next_waiter[w] = first_waiter[v];
                first_waiter[v] = w as u32;
                break;
            }
            head[w] += 1;
            moved = true;
        }
        if moved {
            let mut v = std::mem::replace(&mut first_waiter[w], NONE);
            while v != NONE {
                ready.push(v);
                v = std::mem::replace(&mut next_waiter[v as usize], NONE);
            }
        }
    }
    head
}

/// Renders the step-by-worker grid (columns are positions in each worker's program) with
/// the cells named by `error` marked `>…<`. Long programs are cut to a window around the
/// first marked cell.
pub fn error_grid(schedule: &Schedule, error: &Error) -> String {
    let marked = error.cells();
    let longest = schedule.workers.iter().map(Vec::len).max().unwrap_or(0);
    let centre = marked.first().map(|c| c.pos as usize).unwrap_or(0);
    let lo = centre.saturating_sub(8);
    let hi = (centre + 9).max(lo + 17).min(longest);
    let width = schedule
        .workers
        .iter()
        .flat_map(|ps| ps.iter().map(|p| p.to_string().len()))
        .max()
        .unwrap_or(3)
        + 2;
    let mut out = String::new();
    let _ = write!(out, "{:>10}", "step");
    for pos in lo..hi {
        let _ = write!(out, " {pos:^width$}");
    }
    out.push('\n');
    for (w, passes) in schedule.workers.iter().enumerate() {
        let _ = write!(out, "{:>10}", format!("worker {w}"));
        for pos in lo..hi {
            let text = passes.get(pos).map(Pass::to_string).unwrap_or_default();
            let hit = marked
                .iter()
                .any(|c| c.worker as usize == w && c.pos as usize == pos);
            let cell = if hit { format!(">{text}<") } else { text };
            let _ = write!(out, " {cell:^width$}");
        }
        out.push('\n');
    }
    if let Some(first) = marked.first() {
        let _ = writeln!(
            out,
            "<-- ERROR HERE: {error} (cell {} of worker {})",
            first.pos, first.worker
        );
    }
    out
}
