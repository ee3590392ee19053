//! What every queue of the target shares: the subsystems served now, the
//! controllers connected to them, the I/O ports discovery lists, and the settings.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::ctrl::Controller;
use super::subsystem::Subsystem;

/// Limits and names the controllers report.
#[derive(Debug, Clone)]
pub struct Settings {
    /// I/O queues a host may open per controller, at most.
    pub max_io_queues: u16,
    /// Entries per submission queue (CAP.MQES + 1), at most.
    pub queue_size: u16,
    /// In-capsule data accepted with a command (Linux nvmet offers 16 KiB).
    pub inline_data_size: u32,
    /// Largest data transfer of one command: 2^mdts pages of 4 KiB.
    pub mdts: u8,
    pub model: String,
    pub firmware: String,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_io_queues: 128,
            queue_size: 1024,
            inline_data_size: 16 * 1024,
            // 1 MiB per command.
            mdts: 8,
            model: "blockwire".into(),
            firmware: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
        }
    }
}

impl Settings {
    /// The largest data transfer of one command, in bytes.
    pub fn max_transfer(&self) -> u32 {
        4096u32 << self.mdts
    }
}

/// The state shared by every queue.
pub struct Core {
    pub settings: Settings,
    subsystems: RwLock<Vec<Arc<Subsystem>>>,
    controllers: Mutex<BTreeMap<u16, Arc<Controller>>>,
    /// The last controller ID given out.
    last_cntlid: Mutex<u16>,
    /// The discovery log's generation counter: it changes with the subsystems.
    genctr: AtomicU64,
    /// The I/O listeners discovery reports.
    ports: RwLock<Vec<SocketAddr>>,
    /// The address discovery reports instead of the listeners' (see
    /// [`Core::set_advertised`]).
    advertised: RwLock<Option<IpAddr>>,
}

/// Controller IDs 0xFFF0 and above are reserved (0xFFFF asks for any).
const MAX_CNTLID: u16 = 0xffef;

impl Core {
    pub fn new(settings: Settings, subsystems: Vec<Arc<Subsystem>>) -> Core {
        Core {
            settings,
            subsystems: RwLock::new(subsystems),
            controllers: Mutex::new(BTreeMap::new()),
            last_cntlid: Mutex::new(0),
            genctr: AtomicU64::new(1),
            ports: RwLock::new(Vec::new()),
            advertised: RwLock::new(None),
        }
    }

    /// The subsystems served now.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|s| s.nqn == nqn)
            .cloned()
    }

    /// Sets the I/O listener addresses discovery reports.
    pub fn set_ports(&self, ports: Vec<SocketAddr>) {
        *self.ports.write().unwrap_or_else(|e| e.into_inner()) = ports;
    }

    pub fn ports(&self) -> Vec<SocketAddr> {
        self.ports.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes discovery report `address` (with each I/O listener's port) instead of
    /// the listeners' own: for hosts that reach the target through NAT (a VM on
    /// user-mode networking reaches a host's 127.0.0.1 as 10.0.2.2), which the
    /// target cannot see.
    pub fn set_advertised(&self, address: Option<IpAddr>) {
        *self.advertised.write().unwrap_or_else(|e| e.into_inner()) = address;
    }

    pub fn advertised(&self) -> Option<IpAddr> {
        *self.advertised.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn genctr(&self) -> u64 {
        self.genctr.load(Ordering::SeqCst)
    }

    pub(crate) fn lock_controllers(&self) -> MutexGuard<'_, BTreeMap<u16, Arc<Controller>>> {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every live controller.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        self.lock_controllers().values().cloned().collect()
    }

    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.lock_controllers().get(&cntlid).cloned()
    }

    /// Registers a controller made by `make` under a free controller ID (None when
    /// all are taken).
    pub(crate) fn add_controller(
        &self,
        make: impl FnOnce(u16) -> Controller,
    ) -> Option<Arc<Controller>> {
        let mut controllers = self.lock_controllers();
        let mut last = self.last_cntlid.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..MAX_CNTLID {
            *last = if *last >= MAX_CNTLID { 1 } else { *last + 1 };
            if let std::collections::btree_map::Entry::Vacant(slot) = controllers.entry(*last) {
                return Some(slot.insert(Arc::new(make(*last))).clone());
            }
        }
        None
    }

    pub(crate) fn remove_controller(&self, cntlid: u16) {
        self.lock_controllers().remove(&cntlid);
    }

    /// Serves `subsystems` from now on. Controllers of a subsystem no longer
    /// served lose their namespace; a subsystem whose NQN stays but whose
    /// definition changed is swapped in. Both raise a namespace-changed event;
    /// discovery controllers get a discovery-log-changed event. Returns the NQNs
    /// removed.
    pub fn replace_subsystems(&self, subsystems: Vec<Arc<Subsystem>>) -> Vec<String> {
        let old = std::mem::replace(
            &mut *self.subsystems.write().unwrap_or_else(|e| e.into_inner()),
            subsystems.clone(),
        );
        let same_set = old.len() == subsystems.len()
            && old
                .iter()
                .all(|o| subsystems.iter().any(|n| Arc::ptr_eq(o, n)));
        if same_set {
            return Vec::new();
        }
        self.genctr.fetch_add(1, Ordering::SeqCst);
        let removed: Vec<String> = old
            .iter()
            .filter(|o| !subsystems.iter().any(|n| n.nqn == o.nqn))
            .map(|o| o.nqn.clone())
            .collect();
        for controller in self.controllers() {
            controller.subsystems_changed(&subsystems);
        }
        removed
    }
}
