//! Replacing a running server's exports (`serve --config` on SIGHUP).
//!
//! New connections negotiate against the new set at once. An export that is no
//! longer in it (the same `Arc`, not the same name: a changed definition is a new
//! export) is retired: its connections answer every new request with NBD_ESHUTDOWN,
//! which obliges the client to disconnect (proto.md, "Terminating the transmission
//! phase"). A client that does not leave within the grace period stops being read
//! (requests already read are still answered) and is closed; one that still holds
//! the connection after a second grace period is cut off. Then the retired export
//! is flushed.

use std::net::Shutdown;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::export::{Export, ExportSet};
use super::Shared;

/// Replaces the exports of a running [`super::NbdTarget`]. Cheap to clone.
#[derive(Clone)]
pub struct ReloadHandle {
    shared: Arc<Shared>,
    grace: Duration,
}

impl ReloadHandle {
    pub(super) fn new(shared: Arc<Shared>, grace: Duration) -> ReloadHandle {
        ReloadHandle { shared, grace }
    }

    /// The exports served now.
    pub fn exports(&self) -> Arc<ExportSet> {
        self.shared.current_exports()
    }

    /// Serves `exports` from now on. Exports of the old set that `exports` does not
    /// hold (by identity) are retired and their connections drained on a thread of
    /// their own; they are returned, and the thread's handle with them, which ends
    /// once every connection on them has closed and their devices are flushed.
    pub fn replace(&self, exports: ExportSet) -> (Vec<Arc<Export>>, thread::JoinHandle<()>) {
        let exports = Arc::new(exports);
        let old = {
            let mut current = self
                .shared
                .exports
                .write()
                .unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *current, exports.clone())
        };
        let retired: Vec<Arc<Export>> = old
            .iter()
            .filter(|e| !exports.iter().any(|n| Arc::ptr_eq(n, e)))
            .cloned()
            .collect();
        // Retired after the swap: a connection that negotiated against the old set
        // and enters transmission later finds the flag set and closes itself.
        for export in &retired {
            export.retire();
        }
        let (shared, grace, draining) = (self.shared.clone(), self.grace, retired.clone());
        let drain = thread::Builder::new()
            .name("nbd-drain".into())
            .spawn(move || drain(&shared, &draining, grace))
            .unwrap_or_else(|e| {
                // No thread: the connections still get ESHUTDOWN and leave; only the
                // forced close after the grace period is lost.
                tracing::error!("cannot start the drain thread: {e}");
                thread::spawn(|| {})
            });
        (retired, drain)
    }
}

/// Waits for the connections on `retired` exports to close, closing them after
/// `grace` and cutting them off after twice that, then flushes the exports.
fn drain(shared: &Shared, retired: &[Arc<Export>], grace: Duration) {
    if retired.is_empty() {
        return;
    }
    let on_retired = |export: &Option<Arc<Export>>| {
        export
            .as_ref()
            .is_some_and(|e| retired.iter().any(|r| Arc::ptr_eq(r, e)))
    };
    let started = Instant::now();
    let mut step = 0;
    let mut connections = shared.lock_connections();
    loop {
        let open: Vec<u64> = connections
            .iter()
            .filter(|(_, tracked)| on_retired(&tracked.export))
            .map(|(id, _)| *id)
            .collect();
        if open.is_empty() {
            break;
        }
        let elapsed = started.elapsed();
        if step < 2 && elapsed >= grace * (step + 1) {
            // First no more reading (what was read is answered), then no more at all.
            let (how, what) = if step == 0 {
                (Shutdown::Read, "did not disconnect; closing them")
            } else {
                (Shutdown::Both, "still open; cutting them off")
            };
            tracing::warn!("{} connection(s) on removed export(s) {what}", open.len());
            for id in &open {
                let _ = connections[id].stream.shutdown(how);
            }
            step += 1;
        }
        if step == 2 && elapsed >= grace * 3 {
            // Threads stuck in a device call: give up waiting, not the flush.
            tracing::warn!(
                "{} connection(s) on removed export(s) did not end",
                open.len()
            );
            break;
        }
        connections = shared
            .connections_changed
            .wait_timeout(connections, Duration::from_millis(200))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
    drop(connections);
    for export in retired {
        let info = export.device.info();
        if !info.read_only && info.capabilities.flush.available() {
            if let Err(e) = export.device.flush() {
                tracing::error!(export = %export.name, "flush of the removed export failed: {e}");
            }
        }
        tracing::info!(export = %export.name, "removed export drained");
    }
}
