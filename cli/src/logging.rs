//! Log lines on standard error (`--log-format`, `RUST_LOG`).

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (with the job, step and worker of the enclosing spans).
    Json,
}

/// Logs to standard error, `info` and up unless `RUST_LOG` says otherwise.
pub(crate) fn init_logs(format: LogFormat) {
    init_logs_at(format, "info");
}

/// Logs to standard error, `default` (a level or filter) unless `RUST_LOG` says otherwise.
pub(crate) fn init_logs_at(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file or collector gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    // A second initialisation (none happens in one process) would only be ignored.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}
