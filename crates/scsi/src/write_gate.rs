//! The logical unit's write lock, for writes that run in a thread and for writes
//! handed to a device's request queue. Writes share it; COMPARE AND WRITE, ORWRITE
//! and a write of a cut last block hold it alone, so their read and write are
//! atomic against every other write (SBC-3 5.2).
//!
//! A queued write runs after the thread that started it has moved on, so it cannot
//! hold a lock guard: it holds a [`QueuedWriteTicket`] instead, taken only while no
//! one holds the lock alone. An exclusive holder waits for the tickets out before
//! it starts, and no new ticket is given meanwhile.

use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

#[derive(Default)]
pub(crate) struct WriteGate {
    lock: RwLock<()>,
    /// Queued writes in flight.
    queued: Mutex<usize>,
    drained: Condvar,
}

impl WriteGate {
    /// For a write on this thread: shared with every other write.
    pub(crate) fn shared(&self) -> RwLockReadGuard<'_, ()> {
        self.lock.read().unwrap_or_else(|e| e.into_inner())
    }

    /// For a read-modify-write: alone, once the queued writes have finished.
    pub(crate) fn exclusive(&self) -> RwLockWriteGuard<'_, ()> {
        let guard = self.lock.write().unwrap_or_else(|e| e.into_inner());
        let mut queued = self.queued.lock().unwrap_or_else(|e| e.into_inner());
        while *queued > 0 {
            queued = self.drained.wait(queued).unwrap_or_else(|e| e.into_inner());
        }
        guard
    }

    /// A share for a queued write, unless someone holds (or waits for) the lock
    /// alone: then the write takes the ordinary path and waits its turn there.
    pub(crate) fn try_queued(self: &Arc<Self>) -> Option<QueuedWriteTicket> {
        let _shared = self.lock.try_read().ok()?;
        *self.queued.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Some(QueuedWriteTicket(self.clone()))
    }
}

/// A queued write's share of the write lock, given back when dropped.
pub struct QueuedWriteTicket(Arc<WriteGate>);

impl std::fmt::Debug for QueuedWriteTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QueuedWriteTicket")
    }
}

impl Drop for QueuedWriteTicket {
    fn drop(&mut self) {
        let mut queued = self.0.queued.lock().unwrap_or_else(|e| e.into_inner());
        *queued -= 1;
        if *queued == 0 {
            self.0.drained.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn an_exclusive_holder_waits_for_queued_writes_and_stops_new_ones() {
        let gate = Arc::new(WriteGate::default());
        let ticket = gate.try_queued().expect("nobody holds the lock alone");
        let started = Arc::new(AtomicBool::new(false));
        let (g, s) = (gate.clone(), started.clone());
        let exclusive = std::thread::spawn(move || {
            let _alone = g.exclusive();
            s.store(true, Ordering::SeqCst);
            // While held alone, no queued write may start.
            assert!(g.try_queued().is_none());
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !started.load(Ordering::SeqCst),
            "the exclusive holder ran beside a queued write"
        );
        drop(ticket);
        exclusive.join().unwrap();
        assert!(started.load(Ordering::SeqCst));
        // Free again: shares and tickets both.
        drop(gate.shared());
        assert!(gate.try_queued().is_some());
    }
}
