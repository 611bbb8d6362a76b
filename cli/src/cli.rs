//! The `pipewise` command line: the top-level parser and its subcommands. Each subcommand's
//! arguments are defined next to the code that runs it (one module per command).

use clap::{Parser, Subcommand};

const ABOUT: &str = "Pipeline-parallel training planner: generate, import, simulate and \
                     render pipeline schedules (1F1B, interleaved, zero-bubble, V-shape, \
                     DualPipeV, …).";

const LONG_ABOUT: &str = "\
Pipeline-parallel training planner.

pipewise generates pipeline-parallel training schedules (GPipe, 1F1B, interleaved 1F1B,
zero-bubble ZB-H1/ZB-H2, the V-shape family and DualPipeV) or imports them from the CSV
form torchtitan and torch.distributed.pipelining use, checks them, simulates them under a
cost model, and reports makespan, bubble rate and peak activation memory, or renders them
as a text grid, CSV, SVG figure or Chrome/Perfetto trace.";

/// The `pipewise` command line.
#[derive(Debug, Parser)]
#[command(
    name = "pipewise",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    arg_required_else_help = true,
    // Wrapped to a narrower terminal, and no wider than 100 columns on a wide one.
    max_term_width = 100,
    propagate_version = true
)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Generate or import a schedule, simulate it, and report or render it.
    ///
    /// Generates the schedule --schedule names for --workers and --microbatches
    /// (or imports one from a CSV file with --schedule csv:PATH), simulates it
    /// under --times or --stage-times, and writes a report (--format table or
    /// json) or a rendering (grid, csv, svg, chrome). With --compare, plans
    /// every known schedule for the same shape, one row per schedule.
    #[command(after_long_help = crate::plan::args::PLAN_AFTER_HELP, verbatim_doc_comment)]
    Plan(crate::plan::args::PlanArgs),
    /// Train on this machine: a coordinator and N workers, the job over gRPC.
    ///
    /// Starts the coordinator and N workers in this process (each worker
    /// with its own gRPC activation service, heartbeats and executor
    /// thread, all on loopback), submits the job, prints a line
    /// per step (loss, tokens/s, planned and measured bubble, peak
    /// activation memory per worker) and a summary. --output-dir DIR
    /// writes summary.json and the final parameters (params.safetensors,
    /// the same tensor names whatever the worker count).
    #[command(verbatim_doc_comment)]
    Local(crate::local::LocalArgs),
    /// The mean token cross-entropy of a model over every window of a text.
    ///
    /// Windows are taken in order (window k: tokens kS..kS+S predict
    /// kS+1..kS+S+1, S = --seq-len), as training takes them; prints
    /// `loss X perplexity Y`.
    #[command(verbatim_doc_comment)]
    Eval(crate::eval::EvalArgs),
    /// Write what a model writes after a prompt.
    ///
    /// Greedy by default; --temperature, --top-k, --top-p and --seed
    /// sample. Prints the prompt and the new text, and with --ids the
    /// new token ids.
    #[command(verbatim_doc_comment)]
    Generate(crate::eval::GenerateArgs),
    /// Write a trained Llama-family model as a Hugging Face directory.
    ///
    /// CHECKPOINT is a step's directory of stage files or the
    /// params.safetensors of `pipewise local --output-dir`; the run's
    /// job.toml (found beside or above it, or --job) gives the model.
    /// Writes DIR/config.json and DIR/model.safetensors (and
    /// tokenizer.json with --tokenizer), which transformers'
    /// from_pretrained loads.
    #[command(verbatim_doc_comment)]
    Export(crate::export::ExportArgs),
    /// Run a coordinator: the job API and the cluster API over gRPC.
    ///
    /// Jobs submitted to it run on the worker processes that register
    /// (`pipewise worker --coordinator URL`). Prints the bound address.
    #[command(verbatim_doc_comment)]
    Coordinator(crate::coordinator::CoordinatorArgs),
    /// Run a worker process: register with a coordinator and run assignments.
    Worker(crate::worker::WorkerArgs),
    /// Submit a job file (TOML) to a coordinator.
    Submit(crate::submit::SubmitArgs),
    /// Show one job, or list every job, of a coordinator.
    Status(crate::status::StatusArgs),
    /// Follow a job's steps until it ends.
    Watch(crate::connection::JobArgs),
    /// Cancel a job (workers stop at the next step boundary).
    Cancel(crate::connection::JobArgs),
    /// Write a recent step's executed timeline next to its plan.
    ///
    /// Asks the coordinator for step K of JOB (default: the latest it
    /// keeps; it keeps the last 64 steps of its last 8 jobs) and writes
    /// OUT/step-K.trace.json (Chrome / Perfetto trace: process 0 planned
    /// on the costs known before the step, process 2 re-simulated with the
    /// step's own pass times, process 1 executed, one thread per worker)
    /// and OUT/step-K.svg (the three on one time axis; waits for peers red,
    /// sends orange, end-of-step sync grey, gradient sums over replicas
    /// purple).
    #[command(verbatim_doc_comment)]
    Trace(crate::trace::TraceArgs),
    /// Write a CA and coordinator / worker certificates for TLS (tests, small clusters).
    ///
    /// Writes DIR/ca.pem, ca.key, coordinator.pem, coordinator.key,
    /// worker.pem and worker.key; the certificates name localhost,
    /// 127.0.0.1, ::1 and every --host. See docs/security.md.
    #[command(verbatim_doc_comment)]
    Certs(crate::certs::CertsArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    ///
    /// For example, for bash:
    ///   pipewise completions bash > ~/.local/share/bash-completion/completions/pipewise
    /// for zsh (a directory on $fpath):
    ///   pipewise completions zsh > ~/.zfunc/_pipewise
    /// for fish:
    ///   pipewise completions fish > ~/.config/fish/completions/pipewise.fish
    #[command(verbatim_doc_comment)]
    Completions(crate::completions::CompletionsArgs),
    /// Relay TCP between an emulated cluster's nodes, delaying each link.
    ///
    /// Listens on each route's address and forwards to its target, every
    /// direction delayed by the link's latency ± jitter (in order), and
    /// black-holes a node's links on `blackhole NODE SECONDS` at --control.
    /// bench/cluster.py runs it between network namespaces; see
    /// docs/cluster-emulation.md.
    #[command(verbatim_doc_comment)]
    Relay(crate::relay::RelayArgs),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn clap_definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    /// Every `--coordinator` flag, on every subcommand, reads `PIPEWISE_COORDINATOR`.
    #[test]
    fn every_coordinator_flag_reads_the_environment() {
        let cli = Cli::command();
        let mut found = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_long() == Some("coordinator") {
                    assert_eq!(
                        arg.get_env().and_then(|e| e.to_str()),
                        Some("PIPEWISE_COORDINATOR"),
                        "pipewise {} --coordinator",
                        sub.get_name()
                    );
                    found.push(sub.get_name().to_string());
                }
            }
        }
        for name in ["worker", "submit", "status", "watch", "cancel", "trace"] {
            assert!(found.iter().any(|f| f == name), "{name}: {found:?}");
        }
    }
}
