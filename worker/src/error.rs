//! The one error type of `pipewise-worker`.

use std::path::PathBuf;

/// Everything that can go wrong in stage compute, data loading and checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // === Wrapped errors ===
    /// A tensor operation failed (shapes, dtypes, device).
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model spec (or another planning-core input) is invalid.
    #[error(transparent)]
    Spec(#[from] pipewise_common::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },

    // === Input errors ===
    /// An argument is out of range or inconsistent.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The offending field or argument.
        field: &'static str,
        /// Why it is rejected.
        reason: String,
    },

    // === Pass-order errors ===
    /// A pass came in an order the stage cannot serve (e.g. `B` before `F`, `W` before `B`,
    /// `F` twice for one microbatch).
    #[error("stage {stage}: {pass} of microbatch {mb}: {reason}")]
    PassOrder {
        /// The stage's piece range, as text (`block0..head`).
        stage: String,
        /// The pass (`F`, `B`, `W`).
        pass: &'static str,
        /// The microbatch.
        mb: u32,
        /// What is missing or already there.
        reason: String,
    },

    /// The coordinator cannot be reached or refused this worker.
    #[error("coordinator: {0}")]
    Coordinator(String),

    // === Checkpoint errors ===
    /// A checkpoint does not fit the stage it is loaded into.
    #[error("checkpoint {}: {reason}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`] on `field`.
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field,
            reason: reason.into(),
        }
    }
}

/// Convenient alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes, `: `-separated, without a cause the text before already ends
/// with: an error may say only "transport error", and some libraries' errors repeat their
/// source's text (tonic's transport errors printed "tcp connect error" twice).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.ends_with(&next) {
            text = format!("{text}: {next}");
        }
        cause = c.source();
    }
    text
}
