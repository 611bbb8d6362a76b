//! How many times this process parsed a job's TOML, by `[job] name`: the measure behind
//! the rule that a process parses a job's TOML at most once (a submission once at the
//! coordinator's edge, an assignment once in its worker). Counted only in builds of tests
//! (`cfg(test)`, or the `parse-count` feature the other crates' tests turn on); elsewhere
//! [`add`] does nothing and the core keeps no state.

#[cfg(any(test, feature = "parse-count"))]
mod counted {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    /// Keyed by name so that tests running side by side, each with its own job name, do
    /// not see each other's parses.
    fn counts() -> &'static Mutex<HashMap<String, usize>> {
        static COUNTS: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
        COUNTS.get_or_init(Default::default)
    }

    pub(crate) fn add(name: &str) {
        let mut counts = counts().lock().unwrap_or_else(|e| e.into_inner());
        *counts.entry(name.to_string()).or_default() += 1;
    }

    /// How many times this process parsed a job named `name` (successfully).
    pub fn parses_of(name: &str) -> usize {
        let counts = counts().lock().unwrap_or_else(|e| e.into_inner());
        counts.get(name).copied().unwrap_or(0)
    }
}

#[cfg(any(test, feature = "parse-count"))]
pub use counted::parses_of;

/// Counts a parse of the job named `name`.
#[cfg(any(test, feature = "parse-count"))]
pub(crate) fn add(name: &str) {
    counted::add(name);
}

/// Counts nothing outside tests.
#[cfg(not(any(test, feature = "parse-count")))]
pub(crate) fn add(_name: &str) {}
