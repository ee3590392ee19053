//! SIGHUP for `serve` (`systemctl reload blockwire`): re-reads the configuration
//! file and applies it while clients stay connected ([`crate::reload_apply`]). An
//! invalid file is refused with its reason (and line) in the log and the running
//! configuration keeps serving. systemd hears RELOADING=1, then READY=1 either way.

use std::path::PathBuf;

use anyhow::{Context, Result};
use signal_hook::iterator::Signals;

use crate::reload_apply;
use crate::service;

/// SIGHUP, caught from start-up on (its default action ends the process) and
/// handled once [`Reloader::start`] is called.
pub struct Reloader {
    signals: Signals,
    config: Option<PathBuf>,
}

/// Catches SIGHUP now; signals that arrive before [`Reloader::start`] wait for it.
pub fn install(config: Option<PathBuf>) -> Result<Reloader> {
    let signals = Signals::new([signal_hook::consts::SIGHUP]).context("cannot handle SIGHUP")?;
    Ok(Reloader { signals, config })
}

impl Reloader {
    /// Handles SIGHUP on a thread of its own for as long as the process runs.
    pub fn start(self, live: Option<reload_apply::Shared>) -> Result<()> {
        let Reloader {
            mut signals,
            config,
        } = self;
        std::thread::Builder::new()
            .name("reload".into())
            .spawn(move || {
                for _ in signals.forever() {
                    match (&config, &live) {
                        (Some(path), Some(live)) => reload(path, live),
                        _ => tracing::info!("SIGHUP: nothing to reload (serving without --config)"),
                    }
                }
            })?;
        Ok(())
    }
}

fn reload(path: &std::path::Path, live: &reload_apply::Shared) {
    service::reloading();
    tracing::info!("SIGHUP: re-reading {}", path.display());
    let applied = reload_apply::load(path)
        .and_then(|next| live.lock().unwrap_or_else(|e| e.into_inner()).apply(next));
    let status = match applied {
        Ok(applied) if applied.changed == 0 => {
            tracing::info!("reload: {} applied; nothing changed", path.display());
            "serving; configuration unchanged".to_string()
        }
        Ok(applied) => {
            tracing::info!(
                "reload: {} applied; {} change(s)",
                path.display(),
                applied.changed
            );
            format!("serving; reloaded with {} change(s)", applied.changed)
        }
        Err(e) => {
            tracing::error!("reload refused, the running configuration stays: {e:#}");
            "serving the previous configuration; the new one is invalid".to_string()
        }
    };
    service::reloaded(&status);
}
