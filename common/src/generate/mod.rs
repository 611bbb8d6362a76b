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
//! | `v-min`, `v-half` | V | B + W | 000 Sec. 3, App. F |
//! | `v-zb` | V | B + W | 000 Sec. 3, App. F; the better by span bubble of that and [`greedy_v`] |
//! | `1f1b-v` | V | BW | 000 App. H |
//! | `dualpipe-v` | V | mixed | DeepSeek DualPipeV |
//! | `adaptive-v` | V | B + W | 000 App. A (searched under a memory limit), and list scheduling with the true costs |
//! | `adaptive-zb` | one stage per worker | B + W | zero-bubble paper's ZB-1P / ZB-2P |

mod adaptive;
mod block;
mod classic;
mod compact;
mod greedy_v;
mod list_v;
mod local;

use std::fmt;
use std::str::FromStr;

pub use adaptive::{
    Planned, SplitOffsets, adaptive_v, adaptive_zb, block_makespan, order_peak, split_candidates,
    steady_peak,
};
pub use block::{BuildingBlock, Placed, VOffsets, reorder_cooldown, reorder_warmup};
pub use compact::{compact, fill_weights};
pub use greedy_v::greedy_v;
pub use local::{budget_for, improve};

use crate::cost::{Costs, Times};
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::simulate::{Simulation, simulate};

/// The schedules pipewise can generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// All forwards, then all backwards.
    GPipe,
    /// One forward, one backward (PipeDream-flush).
    OneFOneB,
    /// 1F1B with a doubled forward offset.
    Eager1F1B,
    /// Megatron's interleaved 1F1B.
    Interleaved1F1B,
    /// Breadth-first looped schedule.
    LoopedBfs,
    /// Zero bubble, 1F1B memory.
    ZbH1,
    /// Zero bubble, twice 1F1B memory.
    ZbH2,
    /// V-shape, ~1/3 of 1F1B memory.
    VMin,
    /// V-shape, ~1/2 of 1F1B memory.
    VHalf,
    /// V-shape, 1F1B memory, ~zero bubble.
    VZb,
    /// V-shape without the B/W split (~2/3 of 1F1B memory).
    OneFOneBV,
    /// DeepSeek's DualPipeV.
    DualPipeV,
    /// V placement searched under a memory limit (seed 000, App. A).
    AdaptiveV,
    /// One stage per worker, zero-bubble family searched under a memory limit.
    AdaptiveZb,
}

impl ScheduleKind {
    /// Every kind, in `--compare` order.
    pub const ALL: [ScheduleKind; 14] = [
        ScheduleKind::GPipe,
        ScheduleKind::OneFOneB,
        ScheduleKind::Eager1F1B,
        ScheduleKind::Interleaved1F1B,
        ScheduleKind::LoopedBfs,
        ScheduleKind::ZbH1,
        ScheduleKind::ZbH2,
        ScheduleKind::VMin,
        ScheduleKind::VHalf,
        ScheduleKind::VZb,
        ScheduleKind::OneFOneBV,
        ScheduleKind::DualPipeV,
        ScheduleKind::AdaptiveV,
        ScheduleKind::AdaptiveZb,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::GPipe => "gpipe",
            ScheduleKind::OneFOneB => "1f1b",
            ScheduleKind::Eager1F1B => "eager-1f1b",
            ScheduleKind::Interleaved1F1B => "interleaved-1f1b",
            ScheduleKind::LoopedBfs => "looped-bfs",
            ScheduleKind::ZbH1 => "zb-h1",
            ScheduleKind::ZbH2 => "zb-h2",
            ScheduleKind::VMin => "v-min",
            ScheduleKind::VHalf => "v-half",
            ScheduleKind::VZb => "v-zb",
            ScheduleKind::OneFOneBV => "1f1b-v",
            ScheduleKind::DualPipeV => "dualpipe-v",
            ScheduleKind::AdaptiveV => "adaptive-v",
            ScheduleKind::AdaptiveZb => "adaptive-zb",
        }
    }

    /// True for the kinds whose stage count depends on `--chunks`.
    pub fn uses_chunks(self) -> bool {
        matches!(
            self,
            ScheduleKind::Interleaved1F1B | ScheduleKind::LoopedBfs
        )
    }

    /// True for the kinds planned under a memory limit.
    pub fn is_adaptive(self) -> bool {
        matches!(self, ScheduleKind::AdaptiveV | ScheduleKind::AdaptiveZb)
    }

    /// The placement the kind uses on `d` workers with `chunks` chunks.
    pub fn placement(self, d: u32, chunks: u32) -> Placement {
        match self {
            ScheduleKind::Interleaved1F1B | ScheduleKind::LoopedBfs => {
                Placement::Loop { workers: d, chunks }
            }
            ScheduleKind::VMin
            | ScheduleKind::VHalf
            | ScheduleKind::VZb
            | ScheduleKind::OneFOneBV
            | ScheduleKind::DualPipeV
            | ScheduleKind::AdaptiveV => Placement::V { workers: d },
            _ => Placement::OnePerWorker { workers: d },
        }
    }

    /// The smallest microbatch count the kind supports on `d` workers.
    pub fn min_microbatches(self, d: u32) -> u32 {
        match self {
            ScheduleKind::DualPipeV => 2 * d,
            _ => 1,
        }
    }
}

impl fmt::Display for ScheduleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ScheduleKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        let alias = match wanted.as_str() {
            "pipedream-flush" | "1f1b-flush" => "1f1b",
            "interleaved" | "interleaved1f1b" => "interleaved-1f1b",
            "loopedbfs" => "looped-bfs",
            "zbh1" | "zb1p" => "zb-h1",
            "zbh2" => "zb-h2",
            "zbv" | "zbvzerobubble" => "v-zb",
            "dualpipev" => "dualpipe-v",
            "adaptivev" | "v-adaptive" => "adaptive-v",
            "adaptivezb" | "zb-adaptive" | "zb-2p" | "zb2p" => "adaptive-zb",
            other => other,
        };
        ScheduleKind::ALL
            .into_iter()
            .find(|k| k.name() == alias)
            .ok_or_else(|| Error::InvalidArgument {
                field: "schedule",
                reason: format!(
                    "unknown schedule {s:?}; known: {}",
                    ScheduleKind::ALL.map(ScheduleKind::name).join(", ")
                ),
            })
    }
}

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

/// Simulated passes the local search may spend inside [`generate`] (about 0.1–0.3 s).
pub const LOCAL_SEARCH_BUDGET: u64 = 3_000_000;

/// Largest V-ZB shape (passes, 6dn) on which [`greedy_v`] runs beside the building block
/// (d = 16 up to n = 1024; d = 64 up to n = 256).
pub const GREEDY_V_PASSES: u64 = 100_000;

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
    if d == 0 {
        return Err(Error::InvalidArgument {
            field: "workers",
            reason: "must be at least 1".into(),
        });
    }
    if n == 0 {
        return Err(Error::InvalidArgument {
            field: "microbatches",
            reason: "must be at least 1".into(),
        });
    }
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
            fixed_v(req.kind, d, n, &costs).map(|(schedule, _)| schedule)
        }
        ScheduleKind::AdaptiveV => {
            let costs = costs_for(&Placement::V { workers: d })?;
            Ok(adaptive_v(d, n, &costs, limit, LOCAL_SEARCH_BUDGET)?.schedule)
        }
        ScheduleKind::AdaptiveZb => {
            let costs = costs_for(&Placement::OnePerWorker { workers: d })?;
            Ok(adaptive_zb(d, n, &costs, limit, LOCAL_SEARCH_BUDGET)?.schedule)
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

/// Building block → repeat → squeeze → reorder (warm-up, then [`finish`]).
/// The fixed V-shape schedules (V-Min, V-Half, V-ZB) of seed 000 under `costs` (over the
/// `2d` stages of the V placement), with their simulation: the block of the class repeated,
/// App. C's reorders, then [`finish`]'s compaction or W filling within the class; for V-ZB
/// the greedy V scheduler competes in the same memory class on shapes of up to
/// [`GREEDY_V_PASSES`] passes, and the lower span bubble wins.
pub(crate) fn fixed_v(
    kind: ScheduleKind,
    d: u32,
    n: u32,
    costs: &Costs,
) -> Result<(Schedule, Simulation)> {
    let (name, offsets) = match kind {
        ScheduleKind::VMin => ("v-min", VOffsets::v_min(d)),
        ScheduleKind::VHalf => ("v-half", VOffsets::v_half(d)),
        ScheduleKind::VZb => ("v-zb", search_v_block(d, [4, 2, 4, 2], false)?),
        other => {
            return Err(Error::Unsupported {
                schedule: other.name().into(),
                reason: "not a fixed V-shape schedule".into(),
            });
        }
    };
    let warm = reorder_warmup(offsets.block(d).repeat(name, n)?)?;
    let (block, block_sim) = finish_simulated(warm, costs, None)?;
    // The greedy V scheduler competes in the block schedule's memory class; it wins when few
    // microbatches keep the block schedule out of its steady state, and is skipped on large
    // shapes, where it costs seconds and the block is near zero bubble.
    if kind != ScheduleKind::VZb || 6 * u64::from(d) * u64::from(n) > GREEDY_V_PASSES {
        return Ok((block, block_sim));
    }
    match greedy_v::greedy_v_simulated(d, n, costs, block_sim.max_peak_memory()) {
        Ok((greedy, greedy_sim)) if greedy_v::span_first(&greedy_sim, &block_sim) => {
            Ok((greedy, greedy_sim))
        }
        _ => Ok((block, block_sim)),
    }
}

/// The cost-aware end of the split-backward pipelines: App. C cool-down reorder, then the
/// best of compaction and zero-bubble W filling (both within the memory class: the largest
/// per-worker peak of the reordered schedule).
fn finish(schedule: Schedule, costs: &Costs) -> Result<Schedule> {
    finish_simulated(schedule, costs, None).map(|(schedule, _)| schedule)
}

/// [`finish`] with W filling allowed up to `cap` activation memory per worker instead of
/// the reordered schedule's own peak (when larger), and the winner's simulation.
pub(crate) fn finish_simulated(
    schedule: Schedule,
    costs: &Costs,
    cap: Option<f64>,
) -> Result<(Schedule, Simulation)> {
    let cooled = reorder_cooldown(schedule, costs)?;
    let class = simulate(&cooled, costs)?.max_peak_memory();
    let cap = cap.map_or(class, |c| c.max(class));
    let candidates = [
        compact(cooled.clone(), costs)?,
        fill_weights(&cooled, costs, cap, false)?,
        fill_weights(&cooled, costs, cap, true)?,
    ];
    // The shortest makespan, then the lowest span bubble; the earlier candidate on ties.
    const EPS: f64 = 1e-9;
    let mut best: Option<(Schedule, Simulation)> = None;
    for candidate in candidates {
        let sim = simulate(&candidate, costs)?;
        let better = best.as_ref().is_none_or(|(_, b)| {
            sim.makespan + EPS < b.makespan
                || (sim.makespan <= b.makespan + EPS && sim.bubble_span + EPS < b.bubble_span)
        });
        if better {
            best = Some((candidate, sim));
        }
    }
    best.ok_or(Error::InvalidArgument {
        field: "schedule",
        reason: "no candidate schedule".into(),
    })
}

/// Finds the turn offsets (δ(F_d⁰,F_d¹), δ(F_1¹,B_1¹), δ(B_d¹,B_d⁰)) for V-shape offsets
/// `[f_down, f_up, b_down, b_up]` that repeat without collision, preferring the lowest peak
/// memory (Eq. 1), then the shortest block.
pub fn search_v_block(
    d: u32,
    [f_down, f_up, b_down, b_up]: [i64; 4],
    fused: bool,
) -> Result<VOffsets> {
    let min_b = if fused { 2 } else { 1 };
    let mut best: Option<((i64, i64), VOffsets)> = None;
    for turn_f in 1..=8 {
        for turn_fb in 1..=8 {
            for turn_b in min_b..=8 {
                let o = VOffsets {
                    f_down,
                    f_up,
                    b_down,
                    b_up,
                    turn_f,
                    turn_fb,
                    turn_b,
                    fused,
                };
                let block = o.block(d);
                if !block.collision_free() {
                    continue;
                }
                let length = block
                    .passes
                    .iter()
                    .map(|p| p.cell + p.len)
                    .max()
                    .unwrap_or(0);
                let key = (block.peak_estimate(), length);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, o));
                }
            }
        }
    }
    best.map(|(_, o)| o).ok_or_else(|| Error::NoBuildingBlock {
        schedule: "v-shape".into(),
        workers: d,
    })
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
