//! `pipewise`: the command-line front end of the pipewise pipeline-parallel training planner.
//!
//! `pipewise plan` generates a schedule (or imports one from torchtitan / PyTorch CSV),
//! simulates it under a cost model and prints a report or a rendering; `pipewise plan
//! --compare` does so for every known schedule on one shape. See `pipewise plan --help`.
//!
//! # Layout
//!
//! One module per command, each with its arguments (the clap definitions) next to the code
//! that runs them, and the pieces several commands share in their own files:
//!
//! - `main.rs`: parses the command line, runs the command, prints errors and sets the exit
//!   status (0 on success, 1 on a planning or input error, 2 on a command-line usage error).
//! - [`cli`]: the top-level parser and the list of subcommands.
//! - Commands: [`plan`] (its flags in `plan::args`, checked into a request in
//!   `plan::request`; `--auto` in `plan::auto`), [`local`] (a coordinator and N workers in
//!   one process), [`coordinator`] and [`worker`] (the two kinds of process of a cluster),
//!   [`submit`], [`status`], [`watch`], [`cancel`] and [`trace`] (clients of a running
//!   coordinator), [`certs`] (a CA and certificates for TLS), [`completions`] (shell
//!   completion scripts), [`relay`] (a delaying TCP relay between an emulated cluster's
//!   nodes).
//! - Shared flags and value parsers: [`values`] (numbers, times, byte counts, dtypes),
//!   [`schedule_name`] (schedule names, with "did you mean"), [`device`] (`--device`),
//!   [`text_file`] (reading a file the user names).
//! - Process setup: [`logging`], [`runtime`] (the async runtime), [`connection`] (reaching
//!   a coordinator: `--coordinator`, `PIPEWISE_COORDINATOR`), [`security`] (the TLS and
//!   token flags and files), [`progress`] (what the job commands print) and
//!   [`progress_bar`] (its bar on a terminal), [`metrics`] (the Prometheus exporter,
//!   `--metrics-listen`), [`signal`] (SIGTERM / SIGINT stop the coordinator and workers
//!   gracefully).
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

mod cancel;
mod certs;
mod cli;
mod completions;
mod connection;
mod coordinator;
mod device;
mod eval;
mod export;
mod local;
mod logging;
mod metrics;
mod plan;
mod progress;
mod progress_bar;
mod relay;
mod runtime;
mod schedule_name;
mod security;
mod signal;
mod status;
mod submit;
mod text_file;
mod trace;
mod values;
mod watch;
mod worker;

use std::io::Write as _;
use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _};

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    // Before any thread starts (see `pipewise_worker::alloc`; `PIPEWISE_MALLOC=default`
    // keeps the allocator's defaults; and `settle_thread_count`).
    // SAFETY: no thread has started yet.
    #[allow(unsafe_code)]
    unsafe {
        pipewise_worker::set_up_process();
    }
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // Which of `local`'s flags were typed (a job file's fields give way only to those).
    let given = |id: &str| {
        matches
            .subcommand_matches("local")
            .and_then(|m| m.value_source(id))
            .is_some_and(|s| s != clap::parser::ValueSource::DefaultValue)
    };
    let outcome = match cli.command {
        Command::Plan(args) => plan::run(args),
        Command::Local(args) => local::run(&args, &given),
        Command::Eval(args) => eval::run_eval(&args),
        Command::Generate(args) => eval::run_generate(&args),
        Command::Export(args) => export::run(&args),
        Command::Coordinator(args) => coordinator::run(&args),
        Command::Worker(args) => worker::run(&args),
        Command::Submit(args) => submit::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Watch(args) => watch::run(&args),
        Command::Cancel(args) => cancel::run(&args),
        Command::Trace(args) => trace::run(&args),
        Command::Certs(args) => certs::run(&args),
        Command::Relay(args) => relay::run(&args),
        Command::Completions(args) => completions::run(&args, Cli::command()),
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
