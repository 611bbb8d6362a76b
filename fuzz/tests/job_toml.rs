//! Fuzz target: a job file through parsing, field checks and planning (`plan_job`), as
//! `pipewise submit` and the coordinator take it. Inputs: the repository's job files and a
//! small job of every schedule, with fields set to boundary values and the text edited.

use pipewise_fuzz::{engine, job, run};

#[test]
fn job_files_are_planned_or_refused_by_field() {
    let report = run("job_toml", |u| match job::mutant_text(u) {
        Ok(text) => {
            engine::show(&text);
            job::check_text(&text)
        }
        Err(e) => Err(format!("generator: {e}").into()),
    });
    assert!(report.cases > 0);
}
