//! `pipewise completions SHELL`: prints a shell completion script for the whole command
//! line (subcommands, flags, and the values of enumerated flags).

use std::io::Write as _;

use anyhow::Result;
use clap::Args;
use clap_complete::Shell;

/// `pipewise completions` arguments.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub(crate) shell: Shell,
}

/// Prints the completion script of `command` (the whole `pipewise` command line, passed
/// in so that this module need not know it) for `args.shell`.
pub(crate) fn run(args: &CompletionsArgs, mut command: clap::Command) -> Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "pipewise", &mut script);
    // A closed standard output (`| head`) loses the script, not the run, as with `outln!`.
    let _ = std::io::stdout().write_all(&script);
    Ok(())
}
