//! Log output: human-readable lines on a terminal, the same without timestamps under
//! journald (which stamps every line itself), or one JSON object per line for log
//! shippers (`--log-format json`).

use std::io::IsTerminal;

use clap::ValueEnum;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Lines for people (no timestamps when journald is the reader).
    #[default]
    Text,
    /// One JSON object per event: timestamp, level, fields, message.
    Json,
}

/// Installs the global subscriber writing to stderr. `RUST_LOG` overrides `level`.
pub fn init(level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        // systemd sets JOURNAL_STREAM when stderr is connected to the journal,
        // which stamps and colours nothing itself.
        LogFormat::Text if under_journald() => builder.without_time().with_ansi(false).init(),
        // Colour only for a terminal, not for a file or a pipe.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// Whether stderr is the journal's stream (systemd.exec(5): JOURNAL_STREAM holds
/// the device and inode of that stream).
fn under_journald() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((device, inode)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a stat into the buffer we own; we read it only on success.
    let stat = unsafe {
        if libc::fstat(libc::STDERR_FILENO, stat.as_mut_ptr()) != 0 {
            return false;
        }
        stat.assume_init()
    };
    device.parse() == Ok(stat.st_dev) && inode.parse() == Ok(stat.st_ino)
}
