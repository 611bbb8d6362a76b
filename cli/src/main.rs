//! `pipewise`: the command-line front end of the pipewise pipeline-parallel training planner.
//!
//! `pipewise plan` generates a schedule (or imports one from torchtitan / PyTorch CSV),
//! simulates it under a cost model and prints a report or a rendering; `pipewise plan
//! --compare` does so for every known schedule on one shape. See `pipewise plan --help`.
//!
//! # Layout
//!
//! - `main.rs`: parses the command line, runs it, prints errors and sets the exit status
//!   (0 on success, 1 on a planning or input error, 2 on a command-line usage error).
//! - [`args`]: the clap definitions (the arguments as typed) and their resolution into a
//!   checked [`args::Plan`]; every input error is reported there, naming its option.
//! - [`plan`]: the `plan` command: generate or import, simulate, time, render, write.
//! - [`local`]: `pipewise local`: a coordinator and N embedded workers training on this machine.
//! - [`auto`]: `plan --auto`: the model-spec flags and the auto-planner's report.
//! - [`cluster`]: `coordinator` and `worker` (the two kinds of process) and `submit`,
//!   `status`, `watch`, `cancel`, `trace` (clients of a running coordinator).
//! - [`metrics`]: the Prometheus exporter (`--metrics-listen`).
//!
//! All planning, rendering and CSV work lives in `pipewise-common`; this crate only does
//! I/O, timing and error reporting.

/// `println!` that never panics: when standard output is closed (e.g. piped into `head`),
/// the line is lost, not the run.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod args;
mod auto;
mod cluster;
mod local;
mod metrics;
mod plan;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    // Before any thread starts (see `pipewise_worker::alloc`; `PIPEWISE_MALLOC=default`
    // keeps the allocator's defaults).
    pipewise_worker::alloc::policy_from_env();
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Plan(args) => args.resolve().and_then(|plan| plan::run(&plan)),
        Command::Local(args) => local::run(&args),
        Command::Coordinator(args) => cluster::coordinator(&args),
        Command::Worker(args) => cluster::worker(&args),
        Command::Submit(args) => cluster::submit(&args),
        Command::Status(args) => cluster::status(&args),
        Command::Watch(args) => cluster::watch(&args),
        Command::Cancel(args) => cluster::cancel(&args),
        Command::Trace(args) => cluster::trace(&args),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Nothing useful is left to do if standard error is closed too.
            let _ = writeln!(
                std::io::stderr(),
                "error: {}",
                pipewise_worker::error::with_causes(err.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}
