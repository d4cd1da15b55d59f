//! The command line's log output on stderr: `--log-format text` (the default; colours
//! only when stderr is a terminal, so files and pipes get plain text) or `--log-format
//! json` (one JSON object per line, for log shippers). `RUST_LOG` filters, `info` by
//! default.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal only.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the
    /// event's fields at the top level.
    Json,
}

/// Installs the process's log subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}
