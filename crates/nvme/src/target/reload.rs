//! Adding and removing subsystems while the target runs (`serve --config` on
//! SIGHUP).
//!
//! Connects see the new set at once and the discovery log changes (its
//! generation counter too, and discovery controllers that asked get an event).
//! A subsystem is removed when no subsystem in the new set is the same `Arc`
//! with its NQN; one whose NQN stays with a new definition is swapped in under
//! its controllers. Either way its controllers get a namespace-changed event;
//! those of removed subsystems are closed after the removal grace.

use std::sync::Arc;
use std::thread;

use super::Shared;
use crate::controller::Subsystem;

/// Replaces the subsystems of a running [`super::NvmeTarget`]. Cheap to clone.
#[derive(Clone)]
pub struct ReloadHandle(Arc<Shared>);

impl ReloadHandle {
    pub(super) fn new(shared: Arc<Shared>) -> ReloadHandle {
        ReloadHandle(shared)
    }

    /// The subsystems served now.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.0.core.subsystems()
    }

    /// Serves `subsystems` from now on. Returns the NQNs removed and a thread that
    /// ends once their controllers have been closed.
    pub fn replace(
        &self,
        subsystems: Vec<Arc<Subsystem>>,
    ) -> (Vec<String>, thread::JoinHandle<()>) {
        let removed = self.0.core.replace_subsystems(subsystems);
        let shared = self.0.clone();
        let nqns = removed.clone();
        let drain = thread::Builder::new()
            .name("nvme-drain".into())
            .spawn(move || {
                if nqns.is_empty() {
                    return;
                }
                thread::sleep(shared.config.removal_grace);
                for controller in shared.core.controllers() {
                    if nqns.contains(&controller.subnqn) && controller.subsystem().is_none() {
                        controller.end();
                    }
                }
                shared.close_expired(std::time::Instant::now());
            })
            .unwrap_or_else(|e| {
                tracing::error!("cannot start the NVMe drain thread: {e}");
                thread::spawn(|| {})
            });
        (removed, drain)
    }
}
