//! Helpers shared by the end-to-end tests of the `pipewise` binary.

#![allow(dead_code, clippy::unwrap_used)]

use std::process::{Command, Output};

/// Runs the built binary with `args`.
pub(crate) fn pipewise(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .args(args)
        .output()
        .expect("runs pipewise")
}

/// Standard output as text.
pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Standard error as text.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs and expects success; returns standard output.
pub(crate) fn ok(args: &[&str]) -> String {
    let out = pipewise(args);
    assert!(
        out.status.success(),
        "pipewise {args:?} failed:\n{}",
        stderr(&out)
    );
    stdout(&out)
}

/// Runs and expects failure; returns standard error.
pub(crate) fn fails(args: &[&str]) -> String {
    let out = pipewise(args);
    assert!(
        !out.status.success(),
        "pipewise {args:?} succeeded:\n{}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    err
}
