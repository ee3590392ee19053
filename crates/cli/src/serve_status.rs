//! SIGUSR1 for `serve`: one log line with the process's resident memory, threads,
//! open files and NBD connections, so an operator can look at a server under load
//! without a metrics endpoint (`kill -USR1 PID`, or `systemctl kill -s USR1`).

use anyhow::{Context, Result};
use blockwire_nbd::server::ShutdownHandle;
use signal_hook::iterator::Signals;

use crate::metrics::process::{open_fds, resident_bytes, threads};

/// The status line: what /proc says of this process, and the NBD server's count.
pub fn line(nbd: Option<&ShutdownHandle>) -> String {
    let figure = |value: Option<i64>| value.map_or("?".to_string(), |v| v.to_string());
    let memory = resident_bytes().map_or("?".to_string(), |bytes| {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    });
    let mut line = format!(
        "status: resident memory {memory}, {} threads, {} open files",
        figure(threads()),
        figure(open_fds())
    );
    if let Some(nbd) = nbd {
        line.push_str(&format!(", {} NBD connections", nbd.open_connections()));
    }
    line
}

/// Logs [`line`] on every SIGUSR1, on a thread of its own, for as long as the
/// process runs.
pub fn watch(nbd: Option<ShutdownHandle>) -> Result<()> {
    let mut signals =
        Signals::new([signal_hook::consts::SIGUSR1]).context("cannot handle SIGUSR1")?;
    std::thread::Builder::new()
        .name("status".into())
        .spawn(move || {
            for _ in signals.forever() {
                tracing::info!("{}", line(nbd.as_ref()));
            }
        })?;
    Ok(())
}
