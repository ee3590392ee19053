//! Adding and removing targets while the target server runs (`serve --config` on
//! SIGHUP).
//!
//! Logins see the new targets at once: a removed target is "not found" (status
//! 0x0203) and no longer listed by SendTargets. A target is removed when its SCSI
//! target (the same `Arc`) is no longer served, so a changed definition counts as a
//! removal and an addition. Each session on a removed target is asked to log out
//! (AsyncEvent 1, with the grace period in Parameter3, RFC 7143 §11.9.1); its
//! connection is closed when the grace period ends without a logout.

use std::sync::Arc;
use std::thread;
use std::time::Instant;

use blockwire_scsi::ScsiTarget;

use super::session::Session;
use super::{request_logout, Served, Shared, TargetDefinition};

/// Replaces the targets of a running [`super::IscsiTarget`]. Cheap to clone.
#[derive(Clone)]
pub struct ReloadHandle(Arc<Shared>);

impl ReloadHandle {
    pub(super) fn new(shared: Arc<Shared>) -> ReloadHandle {
        ReloadHandle(shared)
    }

    /// The targets served now.
    pub fn targets(&self) -> Vec<TargetDefinition> {
        self.0.served().targets.clone()
    }

    /// Serves `targets` from now on. Returns the names of the targets removed (a
    /// target whose SCSI target `targets` does not hold) and a thread that ends once
    /// their sessions have logged out or been closed.
    pub fn replace(&self, targets: Vec<TargetDefinition>) -> (Vec<String>, thread::JoinHandle<()>) {
        let removed: Vec<(String, Arc<ScsiTarget>)> = {
            let mut served = self.0.served.write().unwrap_or_else(|e| e.into_inner());
            let removed = served
                .targets
                .iter()
                .filter(|old| !targets.iter().any(|t| Arc::ptr_eq(&t.scsi, &old.scsi)))
                .map(|old| (old.name.clone(), old.scsi.clone()))
                .collect();
            *served = Served::new(targets, &self.0.config);
            removed
        };
        let names = removed.iter().map(|(name, _)| name.clone()).collect();
        let shared = self.0.clone();
        let drain = thread::Builder::new()
            .name("iscsi-drain".into())
            .spawn(move || drain(&shared, &removed))
            .unwrap_or_else(|e| {
                tracing::error!("cannot start the iSCSI drain thread: {e}");
                thread::spawn(|| {})
            });
        (names, drain)
    }
}

/// The live sessions on any of `removed`.
fn sessions_on(shared: &Shared, removed: &[(String, Arc<ScsiTarget>)]) -> Vec<Arc<Session>> {
    shared
        .registry
        .all()
        .into_iter()
        .filter(|s| {
            s.scsi
                .as_ref()
                .is_some_and(|scsi| removed.iter().any(|(_, r)| Arc::ptr_eq(r, scsi)))
        })
        .collect()
}

/// Asks every session on `removed` to log out, waits the grace period for them,
/// then closes the connections of those still there.
fn drain(shared: &Shared, removed: &[(String, Arc<ScsiTarget>)]) {
    if removed.is_empty() {
        return;
    }
    let grace = shared.config.shutdown_grace;
    let sessions = sessions_on(shared, removed);
    for session in &sessions {
        tracing::info!(
            tsih = session.tsih,
            "target removed: asking the initiator to log out within {} s",
            grace.as_secs()
        );
        request_logout(session, grace);
    }
    let deadline = Instant::now() + grace;
    for session in &sessions {
        shared
            .registry
            .wait_removed(session, deadline.saturating_duration_since(Instant::now()));
    }
    // Scanned again: a login that raced the reload may have made a session since.
    let left = sessions_on(shared, removed);
    if !left.is_empty() {
        tracing::warn!(
            "{} session(s) on removed target(s) did not log out; closing them",
            left.len()
        );
        let connections = shared.lock_connections();
        for session in &left {
            if let Some((stream, _)) = connections.get(&session.connection_id) {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
    for (name, _) in removed {
        tracing::info!(iqn = %name, "removed iSCSI target drained");
    }
}
