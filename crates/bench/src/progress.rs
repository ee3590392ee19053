//! One progress bar per phase on stderr; hidden when stderr is not a terminal or
//! progress is off, so logs and tests stay clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A cheap, shareable handle to a phase's progress bar.
#[derive(Clone)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar counting bytes up to `total`.
    pub fn bytes(enabled: bool, label: &str, total: u64) -> Progress {
        Progress::new(
            enabled,
            label,
            total,
            "{prefix:26} [{bar:24}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
    }

    /// A bar counting operations (or milliseconds) up to `total`.
    pub fn count(enabled: bool, label: &str, total: u64) -> Progress {
        Progress::new(
            enabled,
            label,
            total,
            "{prefix:26} [{bar:24}] {pos}/{len} {per_sec}",
        )
    }

    /// A bar for a timed phase, counting milliseconds up to `total`.
    pub fn millis(enabled: bool, label: &str, total: u64) -> Progress {
        Progress::new(
            enabled,
            label,
            total,
            "{prefix:26} [{bar:24}] {pos}/{len} ms",
        )
    }

    fn new(enabled: bool, label: &str, total: u64, template: &str) -> Progress {
        let bar = if enabled {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.to_string());
            bar
        } else {
            ProgressBar::hidden()
        };
        Progress { bar }
    }

    pub fn inc(&self, delta: u64) {
        self.bar.inc(delta);
    }

    /// Sets the position to at least `position` (timed phases report elapsed time).
    pub fn set_at_least(&self, position: u64) {
        if position > self.bar.position() {
            self.bar.set_position(position);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
