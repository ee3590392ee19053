//! One controller: what a host's admin queue connected to, with its properties
//! (CC, CSTS), features, keep-alive and asynchronous events.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::health::{CommandError, ErrorLog};
use super::subsystem::{Subsystem, NSID};
use crate::cqe::{Cqe, Status};
use crate::fabrics::ConnectData;
use crate::opcodes::log;

/// Delivers a completion that is not an answer to the command just submitted (an
/// Asynchronous Event Request's) to the admin queue's transport.
pub type Notifier = Box<dyn Fn(Cqe) + Send + Sync>;

/// Asynchronous event requests a controller keeps outstanding at most (AERL + 1).
pub const MAX_AERS: usize = 4;

/// Async Event Configuration bit: namespace attribute notices.
pub const AEC_NS_ATTR: u32 = 1 << 8;
/// Async Event Configuration bit: ANA change notices.
pub const AEC_ANA_CHANGE: u32 = 1 << 11;
/// Async Event Configuration bit: discovery log page change notices.
pub const AEC_DISCOVERY_CHANGE: u32 = 1 << 31;

/// Event type "notice", event information "namespace attribute changed", log page
/// "changed namespace list" (the AER completion's dword 0).
const EVENT_NS_CHANGED: u32 = 0x02 | ((log::CHANGED_NAMESPACES as u32) << 16);
/// Event type "notice", information 0xF0 "discovery log page change", log 0x70.
const EVENT_DISCOVERY_CHANGED: u32 = 0x02 | (0xf0 << 8) | ((log::DISCOVERY as u32) << 16);

/// What a controller serves.
#[derive(Debug, Clone)]
pub enum ControllerKind {
    /// An NVM subsystem's controller.
    Nvm,
    /// The discovery controller.
    Discovery,
}

/// A controller, shared by its admin queue and its I/O queues.
pub struct Controller {
    pub cntlid: u16,
    pub kind: ControllerKind,
    pub hostnqn: String,
    pub host_id: [u8; 16],
    /// The subsystem's NQN (the discovery NQN for discovery controllers).
    pub subnqn: String,
    state: Mutex<State>,
    notifier: Mutex<Option<Notifier>>,
    /// Commands that failed, for the Error Information log page.
    errors: Mutex<ErrorLog>,
}

pub(crate) struct State {
    /// The subsystem served (None: removed by a reload; the namespace is gone).
    pub subsystem: Option<Arc<Subsystem>>,
    pub cc: u32,
    pub csts: u32,
    /// Keep-alive timeout (0: none) and when the host was last heard from.
    pub kato: Duration,
    pub last_heard: Instant,
    /// I/O queues granted by Set Features (Number of Queues), and those connected.
    pub io_queues: u16,
    pub connected: BTreeSet<u16>,
    pub aec: u32,
    pub write_cache: bool,
    /// Outstanding Asynchronous Event Requests (their CIDs) and events not yet
    /// reported.
    pub aers: Vec<u16>,
    pub events: VecDeque<u32>,
    /// NSIDs for the Changed Namespace List log page.
    pub changed: BTreeSet<u32>,
    /// Set once the admin queue has gone or keep-alive expired: the I/O queues end.
    pub dead: bool,
}

pub mod cc {
    pub const EN: u32 = 1;
    pub const SHN_MASK: u32 = 0x3 << 14;
    pub fn iosqes(cc: u32) -> u32 {
        (cc >> 16) & 0xf
    }
    pub fn iocqes(cc: u32) -> u32 {
        (cc >> 20) & 0xf
    }
    pub fn mps(cc: u32) -> u32 {
        (cc >> 7) & 0xf
    }
}

pub mod csts {
    pub const RDY: u32 = 1;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_COMPLETE: u32 = 0x2 << 2;
    pub const SHST_MASK: u32 = 0x3 << 2;
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("cntlid", &self.cntlid)
            .field("subnqn", &self.subnqn)
            .field("hostnqn", &self.hostnqn)
            .finish()
    }
}

impl Controller {
    pub(crate) fn new(
        cntlid: u16,
        kind: ControllerKind,
        subsystem: Option<Arc<Subsystem>>,
        connect: &ConnectData,
        kato: Duration,
        now: Instant,
    ) -> Controller {
        Controller {
            cntlid,
            kind,
            hostnqn: connect.hostnqn.clone(),
            host_id: connect.host_id,
            subnqn: connect.subnqn.clone(),
            state: Mutex::new(State {
                subsystem,
                cc: 0,
                csts: 0,
                kato,
                last_heard: now,
                io_queues: 0,
                connected: BTreeSet::new(),
                aec: 0,
                write_cache: true,
                aers: Vec::new(),
                events: VecDeque::new(),
                changed: BTreeSet::new(),
                dead: false,
            }),
            notifier: Mutex::new(None),
            errors: Mutex::new(ErrorLog::default()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a command that completed with an error (Error Information log).
    pub fn record_error(&self, error: CommandError) {
        self.errors().record(error);
    }

    /// The error log (its count, media errors and page).
    pub(crate) fn errors(&self) -> MutexGuard<'_, ErrorLog> {
        self.errors.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_discovery(&self) -> bool {
        matches!(self.kind, ControllerKind::Discovery)
    }

    /// The subsystem served now (None once a reload removed it).
    pub fn subsystem(&self) -> Option<Arc<Subsystem>> {
        self.lock().subsystem.clone()
    }

    /// Whether the controller is enabled and ready (CSTS.RDY).
    pub fn ready(&self) -> bool {
        self.lock().csts & csts::RDY != 0
    }

    /// Whether writes may be acknowledged before they are durable (Volatile Write
    /// Cache feature, on by default).
    pub fn write_cache(&self) -> bool {
        self.lock().write_cache
    }

    /// Whether its queues must end: its admin queue went, keep-alive expired, or
    /// its subsystem was removed.
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Ends the controller: its queues close (the transport's watchdog sees it).
    pub fn end(&self) {
        self.kill();
    }

    pub(crate) fn kill(&self) {
        self.lock().dead = true;
        *self.notifier.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Records that the host was heard from (a Keep Alive, or any admin command).
    pub fn heard(&self, now: Instant) {
        self.lock().last_heard = now;
    }

    /// Whether the keep-alive timeout ran out at `now` (and marks the controller
    /// dead when it did).
    pub fn keep_alive_expired(&self, now: Instant) -> bool {
        let mut state = self.lock();
        if state.kato.is_zero() || state.dead {
            return state.dead;
        }
        if now.saturating_duration_since(state.last_heard) > state.kato {
            state.dead = true;
            return true;
        }
        false
    }

    /// The keep-alive timeout now in force.
    pub fn kato(&self) -> Duration {
        self.lock().kato
    }

    /// Installs the function that delivers AER completions to the admin queue.
    pub fn set_notifier(&self, notifier: Notifier) {
        *self.notifier.lock().unwrap_or_else(|e| e.into_inner()) = Some(notifier);
    }

    /// Takes an Asynchronous Event Request: answered at once when an event waits,
    /// otherwise kept until one happens (None).
    pub(crate) fn async_event_request(&self, cid: u16) -> Option<Result<u32, Status>> {
        let mut state = self.lock();
        if let Some(event) = state.events.pop_front() {
            return Some(Ok(event));
        }
        if state.aers.len() >= MAX_AERS {
            return Some(Err(Status::ASYNC_EVENT_LIMIT_EXCEEDED));
        }
        state.aers.push(cid);
        None
    }

    /// Reports `event` on an outstanding AER, or keeps it for the next one.
    fn raise(&self, event: u32) {
        let delivery = {
            let mut state = self.lock();
            if state.events.contains(&event) {
                return;
            }
            match state.aers.pop() {
                Some(cid) => Some(cid),
                None => {
                    state.events.push_back(event);
                    None
                }
            }
        };
        if let Some(cid) = delivery {
            let cqe = Cqe {
                result: u64::from(event),
                cid,
                ..Cqe::default()
            };
            if let Some(notify) = &*self.notifier.lock().unwrap_or_else(|e| e.into_inner()) {
                notify(cqe);
            }
        }
    }

    /// Reacts to a new set of subsystems (a reload).
    pub(crate) fn subsystems_changed(&self, subsystems: &[Arc<Subsystem>]) {
        if self.is_discovery() {
            if self.lock().aec & AEC_DISCOVERY_CHANGE != 0 {
                self.raise(EVENT_DISCOVERY_CHANGED);
            }
            return;
        }
        let notify = {
            let mut state = self.lock();
            let new = subsystems.iter().find(|s| s.nqn == self.subnqn).cloned();
            let same = match (&state.subsystem, &new) {
                (Some(old), Some(new)) => Arc::ptr_eq(old, new),
                (None, None) => true,
                _ => false,
            };
            if same {
                return;
            }
            state.subsystem = new;
            state.changed.insert(NSID);
            state.aec & AEC_NS_ATTR != 0
        };
        if notify {
            self.raise(EVENT_NS_CHANGED);
        }
    }

    /// Takes the Changed Namespace List (cleared by reading, unless `retain`).
    pub(crate) fn changed_namespaces(&self, retain: bool) -> Vec<u32> {
        let mut state = self.lock();
        let list = state.changed.iter().copied().collect();
        if !retain {
            state.changed.clear();
        }
        list
    }
}
