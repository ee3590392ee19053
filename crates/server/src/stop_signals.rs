//! SIGINT/SIGTERM for the long-running commands (`serve`, `netserve`).

use anyhow::{Context, Result};
use signal_hook::iterator::Signals;

/// Installs the handlers. Call it before starting anything, so a signal during
/// start-up still stops cleanly.
pub fn install() -> Result<Signals> {
    Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .context("cannot install signal handlers")
}

/// Blocks until the first signal and logs it.
pub fn wait(signals: &mut Signals) {
    if let Some(signal) = signals.forever().next() {
        tracing::info!("received signal {signal}");
    }
}

/// Runs `stop` on a thread of its own once the first signal arrives.
pub fn on_first(mut signals: Signals, stop: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            wait(&mut signals);
            stop();
        })?;
    Ok(())
}
