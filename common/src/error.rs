//! The one error type of `pipewise-common`.

use std::fmt;

use crate::pass::Pass;

/// Which ordering rule a pass breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// `F(s)` must run before `F(s + 1)`.
    ForwardChain,
    /// `B(s + 1)` (or `BW`) must run before `B(s)`.
    BackwardChain,
    /// `F` must run before `B`/`BW` of the same stage and microbatch.
    ForwardBeforeBackward,
    /// `B` must run before `W` of the same stage and microbatch.
    InputBeforeWeight,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::ForwardChain => "F(s) before F(s+1)",
            Rule::BackwardChain => "B(s+1) before B(s)",
            Rule::ForwardBeforeBackward => "F before B on a stage",
            Rule::InputBeforeWeight => "B before W on a stage",
        })
    }
}

/// A pass at a position of a worker's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// Worker index.
    pub worker: u32,
    /// Position in the worker's program (0-based).
    pub pos: u32,
    /// The pass found there.
    pub pass: Pass,
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at worker {} position {}",
            self.pass, self.worker, self.pos
        )
    }
}

/// Everything that can go wrong in the planning core.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The caller raised the planning call's cancellation flag ([`crate::cancel`]).
    #[error("planning was cancelled")]
    Cancelled,
    // === Input errors ===
    /// An argument is out of range or inconsistent.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The offending field or option.
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// A generator does not support this shape.
    #[error("schedule {schedule} does not support {reason}")]
    Unsupported {
        /// Schedule name.
        schedule: String,
        /// What is unsupported and what would work.
        reason: String,
    },
    /// A pass in text form could not be parsed.
    #[error("cannot parse pass {text:?}: expected {expected}")]
    BadPass {
        /// The text given.
        text: String,
        /// The expected shape.
        expected: &'static str,
    },
    /// A CSV schedule could not be read.
    #[error("CSV row {row} column {column} ({cell:?}): {reason}")]
    Csv {
        /// 1-based row (= worker + 1).
        row: usize,
        /// 1-based column.
        column: usize,
        /// The cell text.
        cell: String,
        /// What is wrong with it.
        reason: String,
    },

    // === Validation errors ===
    /// The schedule's worker count differs from the placement's.
    #[error("schedule has {got} worker programs but the placement has {expected} workers")]
    WorkerCount {
        /// Programs in the schedule.
        got: u32,
        /// Workers in the placement.
        expected: u32,
    },
    /// A pass names a stage that does not exist.
    #[error("{at}: stage {} does not exist (the placement has {stages} stages)", at.pass.stage)]
    UnknownStage {
        /// Where.
        at: Cell,
        /// Stage count.
        stages: u32,
    },
    /// A pass names a microbatch out of range.
    #[error("{at}: microbatch {} is out of range (the step has {microbatches})", at.pass.mb)]
    MicrobatchOutOfRange {
        /// Where.
        at: Cell,
        /// Microbatches per step.
        microbatches: u32,
    },
    /// A pass runs on a worker that does not hold its stage.
    #[error("{at}: stage {} belongs to worker {expected}", at.pass.stage)]
    WrongWorker {
        /// Where.
        at: Cell,
        /// The worker holding that stage.
        expected: u32,
    },
    /// A pass appears twice.
    #[error("{at}: duplicate of {first}")]
    DuplicatePass {
        /// The second occurrence.
        at: Cell,
        /// The first occurrence.
        first: Cell,
    },
    /// A (stage, microbatch) has both a fused BW and split B/W passes.
    #[error("{at}: stage {} microbatch {} mixes BW with B/W", at.pass.stage, at.pass.mb)]
    MixedBackward {
        /// Where.
        at: Cell,
    },
    /// A required pass is absent.
    #[error(
        "missing pass {pass} (every stage and microbatch needs one F and either one BW or one B and one W)"
    )]
    MissingPass {
        /// The absent pass.
        pass: Pass,
    },
    /// A pass comes before a pass it depends on, on the same worker.
    #[error("{at} breaks rule \"{rule}\": it needs {needs}, which comes later")]
    OutOfOrder {
        /// The early pass.
        at: Cell,
        /// The pass it depends on.
        needs: Cell,
        /// The broken rule.
        rule: Rule,
    },
    /// Workers following their orders wait on each other forever.
    #[error("deadlock: {}", describe_stuck(.stuck))]
    Deadlock {
        /// For each blocked worker: its next pass and one pass it waits for.
        stuck: Vec<(Cell, Pass)>,
    },

    // === Search errors ===
    /// No building block of the requested family repeats without collision.
    #[error("no collision-free building block for {schedule} with {workers} workers")]
    NoBuildingBlock {
        /// Schedule name.
        schedule: String,
        /// Worker count.
        workers: u32,
    },
    /// No schedule of the family fits the per-worker activation-memory limit.
    #[error(
        "no {schedule} schedule fits the memory limit {}; the smallest limit that fits is {}",
        exact(*limit),
        exact(*smallest)
    )]
    MemoryLimit {
        /// Schedule family.
        schedule: String,
        /// The limit asked for.
        limit: f64,
        /// The smallest limit at which the planner returns a schedule.
        smallest: f64,
    },
}

/// `x` in full precision (it reads back as the same number), with an exponent when it is
/// very small or very large rather than hundreds of digits.
fn exact(x: f64) -> String {
    if x != 0.0 && x.is_finite() && (x.abs() < 1e-4 || x.abs() >= 1e16) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

fn describe_stuck(stuck: &[(Cell, Pass)]) -> String {
    stuck
        .iter()
        .map(|(cell, waits)| format!("{cell} waits for {waits}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Error {
    /// [`Error::InvalidArgument`] naming `field` and why it is rejected.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }

    /// The cells this error points at (for marking a grid).
    pub fn cells(&self) -> Vec<Cell> {
        match self {
            Error::UnknownStage { at, .. }
            | Error::MicrobatchOutOfRange { at, .. }
            | Error::WrongWorker { at, .. }
            | Error::MixedBackward { at } => vec![*at],
            Error::DuplicatePass { at, first } => vec![*first, *at],
            Error::OutOfOrder { at, needs, .. } => vec![*at, *needs],
            Error::Deadlock { stuck } => stuck.iter().map(|(c, _)| *c).collect(),
            _ => Vec::new(),
        }
    }
}

/// Convenient alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
