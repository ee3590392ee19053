//! Sessions: what a login creates, shared by the connection's reader and the
//! workers that finish its commands, and the registry that finds a session again
//! when an initiator reinstates it (RFC 7143 §6.3.5).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use blockwire_scsi::{Nexus, ScsiTarget};

use super::io::{PduWriter, Window};
use super::naming;
use super::tasks::Tasks;

/// One logged-in session (blockwire negotiates MaxConnections=1, so a session has
/// one connection at a time).
pub struct Session {
    pub tsih: u16,
    /// The server's number for the connection this session runs on.
    pub connection_id: u64,
    pub nexus: Nexus,
    /// The SCSI target behind the iSCSI target; None for a discovery session.
    pub scsi: Option<Arc<ScsiTarget>>,
    pub writer: Arc<PduWriter>,
    /// The CmdSN window and the commands running on the device.
    pub tasks: Arc<Tasks>,
}

impl Window for Session {
    fn window(&self) -> (u32, u32) {
        self.tasks.window()
    }
}

impl Session {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        tsih: u16,
        connection_id: u64,
        initiator_name: &str,
        isid: u64,
        scsi: Option<Arc<ScsiTarget>>,
        writer: Arc<PduWriter>,
        exp_cmd_sn: u32,
        window: u32,
    ) -> Session {
        let nexus = Nexus {
            initiator_port: naming::initiator_port(initiator_name, isid),
            transport_id: naming::transport_id(initiator_name, isid),
            relative_target_port: 1,
        };
        Session {
            tsih,
            connection_id,
            nexus,
            scsi,
            writer,
            tasks: Arc::new(Tasks::new(exp_cmd_sn, window)),
        }
    }

    /// Marks a command as running off the connection's thread.
    pub fn start_executing(&self, itt: u32) {
        self.tasks.start_executing(itt);
    }

    /// Marks a command as answered.
    pub fn finish_executing(&self, itt: u32) {
        self.tasks.finish_executing(itt);
    }

    /// Waits until the command `itt` (or, with None, every command) is answered.
    pub fn wait_executing(&self, itt: Option<u32>) {
        self.tasks.wait_executing(itt);
    }
}

/// Who a session belongs to: a reinstatement is a new login with the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub initiator_name: String,
    pub isid: u64,
    pub target_name: Option<String>,
}

/// Every session of a target server, by TSIH.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<RegistryInner>,
    changed: Condvar,
}

#[derive(Default)]
struct RegistryInner {
    next_tsih: u16,
    sessions: HashMap<u16, (SessionKey, Arc<Session>)>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, RegistryInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A TSIH no live session uses (never 0, which means "new session").
    pub fn allocate_tsih(&self) -> u16 {
        let mut inner = self.lock();
        loop {
            inner.next_tsih = inner.next_tsih.wrapping_add(1);
            if inner.next_tsih != 0 && !inner.sessions.contains_key(&inner.next_tsih) {
                return inner.next_tsih;
            }
        }
    }

    /// The live session with this key, if any (a login with TSIH 0 and this key
    /// reinstates it: the old one must go first).
    pub fn find(&self, key: &SessionKey) -> Option<Arc<Session>> {
        self.lock()
            .sessions
            .values()
            .find(|(k, _)| k == key)
            .map(|(_, s)| s.clone())
    }

    /// The live session with this TSIH, if any.
    pub fn by_tsih(&self, tsih: u16) -> Option<(SessionKey, Arc<Session>)> {
        self.lock().sessions.get(&tsih).cloned()
    }

    pub fn insert(&self, key: SessionKey, session: Arc<Session>) {
        self.lock().sessions.insert(session.tsih, (key, session));
        self.changed.notify_all();
    }

    /// Removes a session if it is still the one registered under its TSIH.
    pub fn remove(&self, session: &Arc<Session>) {
        let mut inner = self.lock();
        if let Some((_, current)) = inner.sessions.get(&session.tsih) {
            if Arc::ptr_eq(current, session) {
                inner.sessions.remove(&session.tsih);
            }
        }
        drop(inner);
        self.changed.notify_all();
    }

    /// Every live session.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.lock()
            .sessions
            .values()
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// Waits until `session` is no longer registered, at most `timeout`.
    pub fn wait_removed(&self, session: &Arc<Session>, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            let present = inner
                .sessions
                .get(&session.tsih)
                .is_some_and(|(_, s)| Arc::ptr_eq(s, session));
            if !present {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            inner = self
                .changed
                .wait_timeout(inner, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
