//! Pending unit attention conditions, per I_T nexus (SAM-5 5.14). A counter lets
//! every command skip the lock when nothing is pending, the usual case.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::nexus::{Nexus, NexusKey};
use crate::sense::Code;

/// Conditions kept per nexus; older ones are dropped beyond this (SAM-5 allows
/// reporting only the most recent when they pile up).
const MAX_PER_NEXUS: usize = 8;

#[derive(Debug, Default)]
pub(crate) struct UnitAttentions {
    pending: AtomicUsize,
    queues: Mutex<HashMap<NexusKey, VecDeque<Code>>>,
}

impl UnitAttentions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NexusKey, VecDeque<Code>>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn recount(&self, queues: &HashMap<NexusKey, VecDeque<Code>>) {
        let total = queues.values().map(VecDeque::len).sum();
        self.pending.store(total, Ordering::Release);
    }

    /// Queues `code` for `nexus`, once.
    pub(crate) fn add(&self, nexus: NexusKey, code: Code) {
        let mut queues = self.lock();
        let queue = queues.entry(nexus).or_default();
        if !queue.contains(&code) {
            if queue.len() == MAX_PER_NEXUS {
                queue.pop_front();
            }
            queue.push_back(code);
        }
        self.recount(&queues);
    }

    /// Whether any condition is pending, for any nexus (one atomic load).
    pub(crate) fn any(&self) -> bool {
        self.pending.load(Ordering::Acquire) != 0
    }

    /// The oldest condition pending for `nexus`, removed.
    pub(crate) fn take(&self, nexus: &Nexus) -> Option<Code> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut queues = self.lock();
        let key = nexus.key();
        let code = queues.get_mut(&key).and_then(VecDeque::pop_front);
        if queues.get(&key).is_some_and(VecDeque::is_empty) {
            queues.remove(&key);
        }
        self.recount(&queues);
        code
    }

    /// Forgets what was pending for `nexus` (it is gone).
    pub(crate) fn clear(&self, nexus: &Nexus) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut queues = self.lock();
        queues.remove(&nexus.key());
        self.recount(&queues);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::codes;

    #[test]
    fn queued_once_in_order_per_nexus() {
        let ua = UnitAttentions::default();
        let a = Nexus {
            initiator_port: "a".into(),
            transport_id: vec![],
            relative_target_port: 1,
        };
        let b = Nexus {
            initiator_port: "b".into(),
            ..a.clone()
        };
        assert_eq!(ua.take(&a), None);
        ua.add(a.key(), codes::BUS_DEVICE_RESET);
        ua.add(a.key(), codes::BUS_DEVICE_RESET);
        ua.add(a.key(), codes::RESERVATIONS_RELEASED);
        assert_eq!(ua.take(&b), None);
        assert_eq!(ua.take(&a), Some(codes::BUS_DEVICE_RESET));
        assert_eq!(ua.take(&a), Some(codes::RESERVATIONS_RELEASED));
        assert_eq!(ua.take(&a), None);
        ua.add(b.key(), codes::POWER_ON_OR_RESET);
        ua.clear(&b);
        assert_eq!(ua.take(&b), None);
    }
}
