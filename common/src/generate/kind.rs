//! The schedules pipewise can generate: their names, aliases and placements.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::placement::Placement;

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
