//! Fuzz harnesses of pipewise that run on the stable toolchain, under plain `cargo test`.
//!
//! Each target is a test file (`tests/*.rs`) that hands [`engine::run`] a case function:
//! the case reads structured input from an [`arbitrary::Unstructured`] (a valid job file,
//! CSV schedule, chunk sequence or message, then mutated) and checks the properties: no
//! panic on any thread, no hang, and every refusal names its field. The budget, the seed
//! and a replayed case come from the environment ([`engine::Settings`]); see
//! `docs/fuzzing.md`.
//!
//! - [`engine`]: seeds, the budget, panic and hang watch, the report;
//! - [`mutate`]: boundary numbers and edits of text and bytes;
//! - [`job`]: job-file seeds and mutants, and the properties of the TOML → plan path.

pub mod engine;
pub mod job;
pub mod mutate;

pub use arbitrary::{self, Unstructured};
pub use engine::{Error, Report, Settings, Verdict, run};
