//! Schedule generators. Every generator returns a [`Schedule`] that passes the validator.
//!
//! | name | placement | backward | seed |
//! |---|---|---|---|
//! | `gpipe` | one stage per worker | BW | 001, 002 |
//! | `1f1b` | one stage per worker | BW | 001, 002 |
//! | `eager-1f1b` | one stage per worker | BW | 000 Fig. 1(b) |
//! | `interleaved-1f1b` | loop, `v` chunks | BW | Megatron-LM |
//! | `looped-bfs` | loop, `v` chunks | BW | torch.distributed.pipelining |
//! | `zb-h1`, `zb-h2` | one stage per worker | B + W | zero-bubble paper |
//! | `v-min`, `v-half` | V | B + W | 000 Sec. 3, App. F; the better of that and `adaptive-v` at the class's limit ([`class_units`]) |
//! | `v-zb` | V | B + W | 000 Sec. 3, App. F; the better by span bubble of that and [`greedy_v`], then as `v-min` |
//! | `1f1b-v` | V | BW | 000 App. H |
//! | `dualpipe-v` | V | mixed | DeepSeek DualPipeV |
//! | `adaptive-v` | V | B + W | 000 App. A (searched under a memory limit), and list scheduling with the true costs |
//! | `adaptive-zb` | one stage per worker | B + W | zero-bubble paper's ZB-1P / ZB-2P |

mod adaptive;
mod block;
mod classic;
mod compact;
mod counts;
mod finish;
mod fixed_v;
mod greedy_v;
mod kind;
mod list_v;
mod local;
mod order;
mod paper_v;

pub use adaptive::{
    Bounds, LOCAL_SEARCH_BUDGET, Planned, SplitOffsets, adaptive_v, adaptive_zb, block_makespan,
    order_peak, split_candidates, steady_peak,
};
pub use block::{BuildingBlock, Placed, VOffsets, reorder_cooldown, reorder_warmup};
pub use compact::{compact, fill_weights};
pub use fixed_v::{NAMED_SEARCH_PASSES, class_units};
pub use greedy_v::greedy_v;
pub use kind::ScheduleKind;
pub use local::{budget_for, improve};
pub use order::in_microbatch_order;
pub use paper_v::{GREEDY_V_PASSES, hand_built_v, search_v_block};

use crate::cost::{Costs, Times};
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::placement::Placement;
use crate::schedule::Schedule;
use finish::finish;
use fixed_v::fixed_v;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// Which schedule.
    pub kind: ScheduleKind,
    /// Worker count `d`.
    pub workers: u32,
    /// Microbatches per step `n`.
    pub microbatches: u32,
    /// Chunks per worker `v` (interleaved and looped only).
    pub chunks: u32,
    /// Pass times; reordering of zero-bubble and V schedules fills idle time measured with them.
    pub times: Times,
    /// Per-worker activation-memory limit of the adaptive kinds, in the cost model's memory
    /// units; `None` means `d` units (1F1B's peak). Ignored by the fixed kinds.
    pub memory_limit: Option<f64>,
}

impl Request {
    /// A request with unit times and 2 chunks.
    pub fn new(kind: ScheduleKind, workers: u32, microbatches: u32) -> Request {
        Request {
            kind,
            workers,
            microbatches,
            chunks: 2,
            times: Times::UNIT,
            memory_limit: None,
        }
    }
}

/// The largest worker count `pipewise plan` and job specs accept.
pub const MAX_WORKERS: u32 = 4096;
/// The largest microbatch count accepted.
pub const MAX_MICROBATCHES: u32 = 1_000_000;
/// The largest chunk (stage-per-worker) count accepted.
pub const MAX_CHUNKS: u32 = 64;
/// The largest `stages × microbatches` accepted (about a third of the pass count): larger
/// shapes take minutes and gigabytes to plan and render.
pub const MAX_STAGE_MICROBATCHES: u64 = 2_000_000;

/// Generates the schedule `req` asks for, with every stage costed from `req.times`.
pub fn generate(req: &Request) -> Result<Schedule> {
    generate_with(req, &|placement| Costs::uniform(placement, req.times))
}

/// Generates the schedule `req` asks for; the cost-aware steps (reordering, compaction, W
/// filling, the adaptive searches) use `costs_for(placement)`, e.g. measured per-stage times.
pub fn generate_with(
    req: &Request,
    costs_for: &dyn Fn(&Placement) -> Result<Costs>,
) -> Result<Schedule> {
    let (d, n) = (req.workers, req.microbatches);
    counts::check_counts(d, n)?;
    req.times.check()?;
    if let Some(limit) = req.memory_limit
        && (!limit.is_finite() || limit <= 0.0)
    {
        return Err(Error::InvalidArgument {
            field: "memory limit",
            reason: format!("must be a finite number > 0, got {limit}"),
        });
    }
    let min_n = req.kind.min_microbatches(d);
    if n < min_n {
        return Err(Error::Unsupported {
            schedule: req.kind.name().into(),
            reason: format!(
                "{n} microbatches on {d} workers: it needs at least {min_n} (2 × workers)"
            ),
        });
    }
    let limit = req.memory_limit.unwrap_or(f64::from(d));
    generate_kind(req, costs_for, limit).map(in_microbatch_order)
}

/// [`generate_with`] past its checks, before the `W` passes are put in microbatch order.
fn generate_kind(
    req: &Request,
    costs_for: &dyn Fn(&Placement) -> Result<Costs>,
    limit: f64,
) -> Result<Schedule> {
    let (d, n) = (req.workers, req.microbatches);
    match req.kind {
        ScheduleKind::GPipe => Ok(classic::gpipe(d, n)),
        ScheduleKind::OneFOneB => Ok(classic::one_f1b(d, n)),
        ScheduleKind::Eager1F1B => Ok(classic::eager_1f1b(d, n)),
        ScheduleKind::Interleaved1F1B => classic::interleaved(d, n, req.chunks),
        ScheduleKind::LoopedBfs => classic::looped_bfs(d, n, req.chunks),
        ScheduleKind::ZbH1 | ScheduleKind::ZbH2 => {
            let s = if req.kind == ScheduleKind::ZbH1 {
                classic::zb_h1(d, n)
            } else {
                classic::zb_h2(d, n)
            };
            let costs = costs_for(&s.placement)?;
            finish(s, &costs)
        }
        ScheduleKind::VMin | ScheduleKind::VHalf | ScheduleKind::VZb => {
            let costs = costs_for(&Placement::V { workers: d })?;
            fixed_v(req.kind, d, n, &costs, LOCAL_SEARCH_BUDGET).map(|(schedule, _)| schedule)
        }
        ScheduleKind::AdaptiveV => {
            let costs = costs_for(&Placement::V { workers: d })?;
            Ok(adaptive_v(d, n, &costs, Bounds::limit(limit))?.schedule)
        }
        ScheduleKind::AdaptiveZb => {
            let costs = costs_for(&Placement::OnePerWorker { workers: d })?;
            Ok(adaptive_zb(d, n, &costs, Bounds::limit(limit))?.schedule)
        }
        ScheduleKind::OneFOneBV => {
            // The tightest uniform fused block repeats without collision only for d ≤ 2;
            // beyond that the F offsets must grow (see `search_v_block`).
            let offsets = search_v_block(d, [1, 1, 2, 2], true)
                .or_else(|_| search_v_block(d, [2, 4, 2, 4], true))?;
            reorder_warmup(offsets.block(d).repeat("1f1b-v", n)?)
        }
        ScheduleKind::DualPipeV => Ok(dualpipe_v(d, n)),
    }
}

/// DualPipeV (DeepSeek): the V placement run in DualPipe's eight phases on worker `r`:
/// warm-up forwards of chunk 0, paired forwards, B/W-split backwards of chunk 1 with
/// forwards, the steady "F0 with B1, F1 with B0" overlap, then the drain where backwards
/// are split and the weight passes are deferred to fill the tail. Needs `n ≥ 2d`.
fn dualpipe_v(d: u32, n: u32) -> Schedule {
    let mut schedule = Schedule::empty("dualpipe-v", Placement::V { workers: d }, n);
    for r in 0..d {
        let (s0, s1) = (r, 2 * d - 1 - r);
        let mut out: Vec<Pass> = Vec::new();
        let (mut f0, mut f1, mut b0, mut b1) = (0u32, 0u32, 0u32, 0u32);
        let mut deferred: std::collections::VecDeque<Pass> = std::collections::VecDeque::new();
        let fwd = |out: &mut Vec<Pass>, stage: u32, next: &mut u32| {
            out.push(Pass::f(stage, *next));
            *next += 1;
        };
        // `split`: B now, W deferred; otherwise a fused BW.
        let bwd = |out: &mut Vec<Pass>,
                   deferred: &mut std::collections::VecDeque<Pass>,
                   stage: u32,
                   next: &mut u32,
                   split: bool| {
            if split {
                out.push(Pass::b(stage, *next));
                deferred.push_back(Pass::w(stage, *next));
            } else {
                out.push(Pass::bw(stage, *next));
            }
            *next += 1;
        };
        for _ in 0..2 * (d - r - 1) {
            fwd(&mut out, s0, &mut f0);
        }
        for _ in 0..=r {
            fwd(&mut out, s0, &mut f0);
            fwd(&mut out, s1, &mut f1);
        }
        for _ in 0..d - r - 1 {
            bwd(&mut out, &mut deferred, s1, &mut b1, true);
            if let Some(w) = deferred.pop_front() {
                out.push(w);
            }
            fwd(&mut out, s1, &mut f1);
        }
        for _ in 0..n - 2 * d + r + 1 {
            fwd(&mut out, s0, &mut f0);
            bwd(&mut out, &mut deferred, s1, &mut b1, false);
            fwd(&mut out, s1, &mut f1);
            bwd(&mut out, &mut deferred, s0, &mut b0, false);
        }
        for _ in 0..d - r - 1 {
            bwd(&mut out, &mut deferred, s1, &mut b1, false);
            fwd(&mut out, s1, &mut f1);
            bwd(&mut out, &mut deferred, s0, &mut b0, false);
        }
        for _ in 0..=r {
            bwd(&mut out, &mut deferred, s1, &mut b1, true);
            bwd(&mut out, &mut deferred, s0, &mut b0, true);
        }
        for _ in 0..d - r - 1 {
            if let Some(w) = deferred.pop_front() {
                out.push(w);
            }
            bwd(&mut out, &mut deferred, s0, &mut b0, true);
        }
        out.extend(deferred.drain(..));
        schedule.workers[r as usize] = out;
    }
    schedule
}
