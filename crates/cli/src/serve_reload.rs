//! SIGHUP for `serve` (`systemctl reload blockwire`): re-reads the configuration
//! file and checks it. An invalid file is refused with its reason in the log and
//! the running configuration keeps serving. A valid file that differs is reported;
//! exports are not yet added or removed while serving, so applying it takes a
//! restart (said in the log, and in the status systemd shows).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use signal_hook::iterator::Signals;

use crate::config::Config;
use crate::service;

/// Handles SIGHUP on a thread of its own for as long as the process runs.
pub fn watch(config: Option<PathBuf>) -> Result<()> {
    let mut signals =
        Signals::new([signal_hook::consts::SIGHUP]).context("cannot handle SIGHUP")?;
    let running = config
        .as_ref()
        .map(|path| std::fs::read_to_string(path).unwrap_or_default());
    std::thread::Builder::new()
        .name("reload".into())
        .spawn(move || {
            for _ in signals.forever() {
                match (&config, &running) {
                    (Some(path), Some(running)) => reload(path, running),
                    _ => tracing::info!("SIGHUP: nothing to reload (serving without --config)"),
                }
            }
        })?;
    Ok(())
}

fn reload(path: &Path, running: &str) {
    service::reloading();
    tracing::info!("SIGHUP: re-reading {}", path.display());
    let status = match check(path, running) {
        Ok(Outcome::Unchanged) => {
            tracing::info!("reload: {} is unchanged", path.display());
            "serving; configuration unchanged"
        }
        Ok(Outcome::Changed) => {
            tracing::warn!(
                "reload: {} is valid but differs from what is served; \
                 restart the service to apply it (exports are not yet changed while serving)",
                path.display()
            );
            "serving the previous configuration; restart to apply the new one"
        }
        Err(e) => {
            tracing::error!("reload refused, the running configuration stays: {e:#}");
            "serving the previous configuration; the new one is invalid"
        }
    };
    service::reloaded(status);
}

enum Outcome {
    Unchanged,
    Changed,
}

fn check(path: &Path, running: &str) -> Result<Outcome> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    if let Err(located) = crate::check_config::check(&text) {
        let at = located.line.map(|l| format!(":{l}")).unwrap_or_default();
        anyhow::bail!("{}{at}: {}", path.display(), located.message);
    }
    // Parsed again as `serve` would, so nothing passes here that serve refuses.
    Config::load(path)?;
    Ok(if text == running {
        Outcome::Unchanged
    } else {
        Outcome::Changed
    })
}
