//! The 1F1B family on one stage per worker or a loop placement: GPipe, 1F1B, eager 1F1B,
//! interleaved 1F1B (Megatron's order), looped BFS, ZB-H1 and ZB-H2.
//!
//! Every one of them is "a warm-up of forwards, then one forward / one backward, then the
//! remaining backwards" with a per-worker warm-up length and an optional B/W split; ZB-H1 and
//! ZB-H2 then reorder the cool-down (seed 000, App. C).

use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::placement::Placement;
use crate::schedule::Schedule;

/// How a worker's backward is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backward {
    /// One fused BW pass.
    Fused,
    /// B immediately followed by W.
    Split,
}

/// Emits the 1F1B pattern for every worker.
///
/// `forwards[w]` / `backwards[w]` are the (stage, mb) orders of worker `w`; `warmup(w)` is
/// how many forwards run before the first backward.
pub(crate) fn one_f_one_b(
    name: &str,
    placement: Placement,
    n: u32,
    backward: Backward,
    forwards: impl Fn(u32) -> Vec<(u32, u32)>,
    backwards: impl Fn(u32) -> Vec<(u32, u32)>,
    warmup: impl Fn(u32) -> usize,
) -> Schedule {
    let mut schedule = Schedule::empty(name, placement, n);
    let emit_backward = |out: &mut Vec<Pass>, (s, mb): (u32, u32)| match backward {
        Backward::Fused => out.push(Pass::bw(s, mb)),
        Backward::Split => {
            out.push(Pass::b(s, mb));
            out.push(Pass::w(s, mb));
        }
    };
    for (w, out) in schedule.workers.iter_mut().enumerate() {
        let w = w as u32;
        let (fwd, bwd) = (forwards(w), backwards(w));
        let warm = warmup(w).min(fwd.len());
        out.extend(fwd[..warm].iter().map(|&(s, mb)| Pass::f(s, mb)));
        let mut b_iter = bwd.into_iter();
        for &(s, mb) in &fwd[warm..] {
            out.push(Pass::f(s, mb));
            if let Some(b) = b_iter.next() {
                emit_backward(out, b);
            }
        }
        for b in b_iter {
            emit_backward(out, b);
        }
    }
    schedule
}

fn in_order(n: u32, stage: u32) -> Vec<(u32, u32)> {
    (0..n).map(|mb| (stage, mb)).collect()
}

/// [`one_f_one_b`] on `d` workers of one stage each, every worker's microbatches in order.
fn one_per_worker(
    name: &str,
    (d, n): (u32, u32),
    backward: Backward,
    warmup: impl Fn(u32) -> usize,
) -> Schedule {
    let placement = Placement::OnePerWorker { workers: d };
    let order = |w| in_order(n, w);
    one_f_one_b(name, placement, n, backward, order, order, warmup)
}

/// GPipe: all forwards, then all (fused) backwards.
pub(crate) fn gpipe(d: u32, n: u32) -> Schedule {
    one_per_worker("gpipe", (d, n), Backward::Fused, |_| n as usize)
}

/// 1F1B (PipeDream-flush): `d − w − 1` warm-up forwards on worker `w`.
pub(crate) fn one_f1b(d: u32, n: u32) -> Schedule {
    one_per_worker("1f1b", (d, n), Backward::Fused, |w| (d - w - 1) as usize)
}

/// Eager 1F1B: the forward offset of the building block doubled, so worker `w` runs
/// `(4(d − w) − 1) / 3` warm-up forwards (≈ 4/3 of 1F1B's memory) and sends overlap compute.
pub(crate) fn eager_1f1b(d: u32, n: u32) -> Schedule {
    one_per_worker("eager-1f1b", (d, n), Backward::Fused, |w| {
        ((4 * (d - w) - 1) / 3) as usize
    })
}

/// ZB-H1 (zero-bubble paper): 1F1B with B/W split and the cool-down W passes moved into
/// the cool-down bubbles; the same peak memory as 1F1B.
pub(crate) fn zb_h1(d: u32, n: u32) -> Schedule {
    one_per_worker("zb-h1", (d, n), Backward::Split, |w| (d - w - 1) as usize)
}

/// ZB-H2: ZB-H1 with `2(d − w) − 2` warm-up forwards (`2(d − w) − 1` before the first B), which fill the warm-up bubble
/// (twice 1F1B's memory).
pub(crate) fn zb_h2(d: u32, n: u32) -> Schedule {
    one_per_worker("zb-h2", (d, n), Backward::Split, |w| {
        (2 * (d - w) - 2) as usize
    })
}

/// Interleaved 1F1B with `v` chunks per worker in Megatron-LM's order: microbatches go in
/// groups of `d`; within a group, chunk by chunk; warm-up `2(d − w − 1) + (v − 1)·d`.
pub(crate) fn interleaved(d: u32, n: u32, v: u32) -> Result<Schedule> {
    if v == 0 {
        return Err(Error::InvalidArgument {
            field: "chunks",
            reason: "must be at least 1".into(),
        });
    }
    if v > 1 && !n.is_multiple_of(d) {
        return Err(Error::Unsupported {
            schedule: "interleaved-1f1b".into(),
            reason: format!(
                "{n} microbatches on {d} workers: Megatron's interleaved order needs the microbatch count to be a multiple of the worker count (try {})",
                n.div_ceil(d) * d
            ),
        });
    }
    let placement = Placement::Loop {
        workers: d,
        chunks: v,
    };
    let order = move |w: u32, reverse: bool| -> Vec<(u32, u32)> {
        (0..n * v)
            .map(|k| {
                let group = k / (d * v);
                let in_group = k % (d * v);
                let chunk = in_group / d;
                let chunk = if reverse { v - 1 - chunk } else { chunk };
                (chunk * d + w, group * d + in_group % d)
            })
            .collect()
    };
    Ok(one_f_one_b(
        "interleaved-1f1b",
        placement,
        n,
        Backward::Fused,
        |w| order(w, false),
        |w| order(w, true),
        |w| (2 * (d - w - 1) + (v - 1) * d) as usize,
    ))
}

/// Looped BFS (breadth-first): every chunk's forwards for all microbatches, chunk by chunk,
/// then the backwards in reverse chunk order.
pub(crate) fn looped_bfs(d: u32, n: u32, v: u32) -> Result<Schedule> {
    if v == 0 {
        return Err(Error::InvalidArgument {
            field: "chunks",
            reason: "must be at least 1".into(),
        });
    }
    let placement = Placement::Loop {
        workers: d,
        chunks: v,
    };
    let mut schedule = Schedule::empty("looped-bfs", placement, n);
    for (w, out) in schedule.workers.iter_mut().enumerate() {
        let w = w as u32;
        for c in 0..v {
            out.extend((0..n).map(|mb| Pass::f(c * d + w, mb)));
        }
        for c in (0..v).rev() {
            out.extend((0..n).map(|mb| Pass::bw(c * d + w, mb)));
        }
    }
    Ok(schedule)
}
