//! Fuzz target: a job file through parsing, field checks and planning (`plan_job`), as
//! `pipewise submit` and the coordinator take it. Inputs: the repository's job files and a
//! small job of every schedule, with fields set to boundary values and the text edited.

use pipewise_fuzz::{engine, job, run};

/// Cases `cargo test` runs (a few seconds in a debug build, the same cases every run); longer
/// runs set `PIPEWISE_FUZZ_SECS` or `PIPEWISE_FUZZ_CASES` (docs/fuzzing.md).
const CASES: u64 = 1_000;

#[test]
fn job_files_are_planned_or_refused_by_field() {
    let report = run("job_toml", CASES, |u| match job::mutant_text(u) {
        Ok(text) => {
            engine::show(&text);
            job::check_text(&text)
        }
        Err(e) => Err(format!("generator: {e}").into()),
    });
    assert!(report.cases > 0);
}
