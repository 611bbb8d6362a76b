//! Activation recomputation: what a stage's forward keeps for its backward, and what the
//! backward redoes first.
//!
//! | mode | F keeps per microbatch | B first redoes |
//! |---|---|---|
//! | `none` | the whole stash ([`ModelSpec::piece_activation_bytes`]) | nothing |
//! | `selective` | each block's input, its attention output (before the projection) and attention's log-sum-exp; the embedding's and head's whole stash | each block's linear layers and norms (QKV, projection, MLP) |
//! | `full` | the stage's input only | the stage's whole forward |
//!
//! Selective keeps the attention output and its log-sum-exp because they are what the
//! attention core's backward needs besides Q, K and V (flash attention's backward: the
//! probabilities come back from Q, K and the log-sum-exp, which pipewise's `B` already
//! does without recomputation); so selective never redoes the `t × t` products, only the
//! linear layers that rebuild Q, K, V and the MLP's activations from the block's input.
//!
//! The redone forward is time on the worker but not training work: the simulator counts
//! it as idle in both bubble rates, as seed 000's Table 4 counts 1F1B-R's (its bubble rate
//! is `1 − Σ(F + B + W) / (workers × makespan)`: 63.0 % at d = n = 16, where 1F1B's is
//! 50.1 %).

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{ModelSpec, Piece};

/// How much of its forward a stage recomputes in its backward (ordered by how much).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every activation the backward needs.
    #[default]
    None,
    /// Keep each block's input, attention output and log-sum-exp; redo the rest.
    Selective,
    /// Keep only the stage's input; redo the whole forward.
    Full,
}

impl Recompute {
    /// Every mode, in order of memory saved.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// The name in job files and on the command line (torchtitan's).
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Recompute {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let wanted = s.trim().to_ascii_lowercase();
        Recompute::ALL
            .into_iter()
            .find(|m| m.name() == wanted)
            .ok_or_else(|| {
                Error::invalid(
                    "recompute",
                    format!("unknown mode {s:?}; known: none, selective, full"),
                )
            })
    }
}

/// What recomputing costs one stage, as shares of its own forward time and stash.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RecomputeShares {
    /// Share of the forward's time that selective redoes in each backward.
    pub selective_time: f64,
    /// Share of the stash that selective keeps from F to B.
    pub selective_keep: f64,
    /// Share of the stash that full keeps from F to B (the stage's input).
    pub full_keep: f64,
}

impl RecomputeShares {
    /// The shares without a model (`pipewise plan --times`): a GPT block at large hidden
    /// size `h` and sequences short against it, whose stash is about `16h` values a token
    /// (input `h`, attention output `h`), and whose forward is almost all linear layers.
    pub const WITHOUT_MODEL: RecomputeShares = RecomputeShares {
        selective_time: 1.0,
        selective_keep: 2.0 / 16.0,
        full_keep: 1.0 / 16.0,
    };

    /// The shares of the stage holding `pieces` (indices into [`ModelSpec::pieces`]) of
    /// `model`, from its activation bytes and FLOPs at `microbatch_size`: full keeps the
    /// stage's input (token ids on the first stage, `N·h` values after it); selective keeps
    /// per block token `2h` values and the `a` f32 log-sum-exps, and redoes each block's
    /// forward but its `4·b·t²·h` attention products. A stage without a stash or without
    /// work keeps and redoes all of it.
    pub fn of_stage(
        model: &ModelSpec,
        pieces: Range<usize>,
        microbatch_size: u32,
    ) -> RecomputeShares {
        let all = model.pieces();
        let stage = &all[pieces.start.min(all.len())..pieces.end.min(all.len())];
        let (b, t, h) = (
            f64::from(microbatch_size),
            f64::from(model.seq_len),
            f64::from(model.hidden),
        );
        let tokens = b * t;
        let element = model.dtype.bytes() as f64;
        let stash_of = |p: Piece| {
            model
                .piece_activation_bytes(p, microbatch_size)
                .after_forward as f64
        };
        let stash: f64 = stage.iter().map(|&p| stash_of(p)).sum();
        let input = match stage.first() {
            Some(&first @ Piece::Embedding) => stash_of(first),
            Some(_) => tokens * h * element,
            None => 0.0,
        };
        let selective_kept: f64 = stage
            .iter()
            .map(|&p| match p {
                Piece::Block(_) => tokens * (2.0 * h * element + 4.0 * f64::from(model.heads)),
                other => stash_of(other),
            })
            .sum();
        let flops: f64 = stage
            .iter()
            .map(|&p| model.piece_flops(p, microbatch_size))
            .sum();
        let redone: f64 = stage
            .iter()
            .filter(|p| matches!(p, Piece::Block(_)))
            .map(|&p| model.piece_flops(p, microbatch_size) - 4.0 * b * t * t * h)
            .sum();
        let share = |part: f64, whole: f64| {
            if whole > 0.0 {
                (part / whole).clamp(0.0, 1.0)
            } else {
                1.0
            }
        };
        RecomputeShares {
            selective_time: share(redone, flops),
            selective_keep: share(selective_kept, stash),
            full_keep: share(input, stash),
        }
    }

    /// Rejects shares outside `[0, 1]`.
    pub fn check(&self) -> Result<()> {
        let all = [self.selective_time, self.selective_keep, self.full_keep];
        if all.iter().any(|x| !(0.0..=1.0).contains(x)) {
            return Err(Error::invalid(
                "recompute shares",
                format!("every share must lie in [0, 1], got {self:?}"),
            ));
        }
        Ok(())
    }

    /// Share of the forward's time `mode` redoes in each backward.
    pub fn time(&self, mode: Recompute) -> f64 {
        match mode {
            Recompute::None => 0.0,
            Recompute::Selective => self.selective_time,
            Recompute::Full => 1.0,
        }
    }

    /// Share of the stash `mode` keeps from F to B.
    pub fn keep(&self, mode: Recompute) -> f64 {
        match mode {
            Recompute::None => 1.0,
            Recompute::Selective => self.selective_keep,
            Recompute::Full => self.full_keep,
        }
    }
}

/// A stage's recomputation as its costs carry it ([`crate::Costs::recomputing`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recomputation {
    /// The stage's mode.
    pub mode: Recompute,
    /// Time of the forward redone inside each of the stage's `B` (or `BW`) passes.
    pub redo: f64,
    /// The whole stash of a microbatch (what `none` keeps): rebuilt during `B`, and what
    /// the stage holds from `B` until `W` needs it.
    pub stash: f64,
}

impl Recomputation {
    /// No recomputation on a stage whose forward keeps `stash`.
    pub fn none(stash: f64) -> Recomputation {
        Recomputation {
            mode: Recompute::None,
            redo: 0.0,
            stash,
        }
    }
}

/// The `(stage, microbatch)` pairs of one worker's `program` whose `B` (or `BW`) is the
/// very next pass after their `F`. Nothing runs between the two, so a recomputing stage keeps
/// their whole stash: its `B` would rebuild it at once, holding the kept part beside it, for
/// no memory saved (1F1B's last stage: every microbatch). The workers keep them, and the
/// job's predicted peaks count them so.
pub fn backward_follows(program: &[crate::pass::Pass]) -> std::collections::BTreeSet<(u32, u32)> {
    use crate::pass::PassKind;
    program
        .windows(2)
        .filter(|w| {
            w[0].kind == PassKind::F
                && matches!(w[1].kind, PassKind::B | PassKind::BW)
                && (w[0].stage, w[0].mb) == (w[1].stage, w[1].mb)
        })
        .map(|w| (w[0].stage, w[0].mb))
        .collect()
}

/// The schedules named with their recomputation: seed 000's `1f1b-r` is 1F1B with full
/// recomputation on every stage.
pub const RECOMPUTING_SCHEDULES: [(&str, crate::ScheduleKind, Recompute); 1] =
    [("1f1b-r", crate::ScheduleKind::OneFOneB, Recompute::Full)];

/// The schedule and mode of a name in [`RECOMPUTING_SCHEDULES`] (any case, `_` for `-`).
pub fn recomputing_schedule(name: &str) -> Option<(crate::ScheduleKind, Recompute)> {
    let wanted = name.trim().to_ascii_lowercase().replace('_', "-");
    RECOMPUTING_SCHEDULES
        .into_iter()
        .find(|(n, _, _)| *n == wanted)
        .map(|(_, kind, mode)| (kind, mode))
}
