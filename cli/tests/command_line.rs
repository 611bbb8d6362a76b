//! The command line itself: shell completions, help wrapped to the terminal, the
//! `PIPEWISE_COORDINATOR` environment variable, and a misspelt schedule name answered with
//! the closest known one.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};

use common::{fails, ok, stderr, stdout};

/// Runs the binary with `args` and the environment variable `var` set to `value`.
fn with_env(var: &str, value: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipewise"))
        .env(var, value)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn completions_cover_the_subcommands() {
    let bash = ok(&["completions", "bash"]);
    for sub in ["plan", "local", "submit", "watch", "completions"] {
        assert!(bash.contains(&format!("pipewise,{sub})")), "{sub}:\n{bash}");
    }
    assert!(bash.contains("complete -F _pipewise"), "{bash}");
    // Flags of a subcommand, and the values of an enumerated one, are completed too.
    assert!(bash.contains("--schedule"), "{bash}");
    assert!(bash.contains("table grid csv svg chrome json"), "{bash}");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let script = ok(&["completions", shell]);
        assert!(script.contains("submit"), "{shell}:\n{script}");
    }
    let err = fails(&["completions", "tcsh"]);
    assert!(err.contains("bash") && err.contains("zsh"), "{err}");
}

/// Help is wrapped to the terminal's width (`COLUMNS` when not a terminal), long flag
/// descriptions included, up to 100 columns.
#[test]
fn help_is_wrapped_to_the_terminal() {
    for sub in ["worker", "local", "plan"] {
        let out = with_env("COLUMNS", "60", &[sub, "--help"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let help = stdout(&out);
        let widest = help.lines().map(|l| l.chars().count()).max().unwrap();
        assert!(widest <= 60, "{sub}: a line of {widest} columns:\n{help}");
        // Wrapped, not cut: the end of a long description is still there.
        if sub == "worker" {
            assert!(help.contains("docs/cuda.md"), "{help}");
        }
    }
    // No wider than 100 columns on a wide terminal.
    let help = stdout(&with_env("COLUMNS", "200", &["worker", "--help"]));
    let widest = help.lines().map(|l| l.chars().count()).max().unwrap();
    assert!((61..=100).contains(&widest), "{widest}:\n{help}");
}

/// Every client's `--coordinator` defaults to `PIPEWISE_COORDINATOR`; the flag wins over it.
#[test]
fn pipewise_coordinator_sets_the_coordinator() {
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [
        &["status"][..],
        &["watch", "1"],
        &["cancel", "1"],
        &["trace", "1"],
    ] {
        let out = with_env("PIPEWISE_COORDINATOR", &url, args);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.contains(&format!("cannot reach the coordinator at {url}")),
            "{args:?}: {err}"
        );
    }
    let other = format!("http://127.0.0.1:{}", common::free_port());
    let out = with_env(
        "PIPEWISE_COORDINATOR",
        &url,
        &["status", "--coordinator", &other],
    );
    let err = stderr(&out);
    assert!(
        err.contains(&format!("cannot reach the coordinator at {other}")),
        "{err}"
    );
    for sub in ["worker", "submit", "status", "watch", "cancel", "trace"] {
        let help = ok(&[sub, "--help"]);
        assert!(
            help.contains("[env: PIPEWISE_COORDINATOR"),
            "{sub}:\n{help}"
        );
    }
}

/// `--schedule vhalf` and its like: an error naming the flag and the closest known name.
#[test]
fn a_misspelt_schedule_gets_a_suggestion() {
    for typed in ["vhalf", "vhaf", "V-HAFL"] {
        let err = fails(&["plan", "--schedule", typed, "-d", "4", "-n", "8"]);
        assert!(
            err.contains(&format!(
                "--schedule: unknown schedule {typed:?}; did you mean v-half?"
            )),
            "{typed}: {err}"
        );
        assert!(err.contains("csv:PATH"), "{err}");
    }
    // A name close to none gets the list alone.
    let err = fails(&["plan", "--schedule", "2f2b", "-d", "4", "-n", "8"]);
    assert!(!err.contains("did you mean"), "{err}");
    // Underscores and case are accepted as they always were.
    ok(&["plan", "--schedule", "V_Half", "-d", "4", "-n", "8"]);

    let err = fails(&["local", "--schedule", "zbh-1", "--steps", "1"]);
    assert!(
        err.contains("--schedule: unknown schedule \"zbh-1\"; did you mean zb-h1?"),
        "{err}"
    );
    assert!(!err.contains("csv:PATH"), "local takes no CSV: {err}");

    // A submit's override is named before the file is read or the coordinator reached.
    let nowhere = format!("http://127.0.0.1:{}", common::free_port());
    let err = fails(&[
        "submit",
        "no-such-job.toml",
        "--schedule",
        "dualpipev2",
        "--coordinator",
        &nowhere,
    ]);
    assert!(
        err.contains("--schedule: unknown schedule \"dualpipev2\"; did you mean dualpipe-v?"),
        "{err}"
    );
}
