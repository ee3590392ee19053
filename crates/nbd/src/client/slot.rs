//! One request in flight: what it expects, where read data goes, and the place its
//! caller waits for the result.
//!
//! Ownership rule: a slot is completed exactly once, and only by the connection's
//! reader thread (a reply, or the connection's end). So the read buffer a slot points
//! into is written only by that thread, and only before it completes the slot; the
//! caller, which lent the buffer, waits for completion before it touches it again.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Error, Op};

use super::reply::{Expect, Outcome};

/// The caller's read buffer, lent to the reader thread for the life of the request.
struct ReadBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is dereferenced only by the reader thread while the lending
// caller is blocked in `Slot::wait` (see the module comment).
unsafe impl Send for ReadBuffer {}
// SAFETY: as above; no two threads access the buffer at once.
unsafe impl Sync for ReadBuffer {}

/// A request waiting for its reply.
pub(crate) struct Slot {
    pub expect: Expect,
    /// For error messages: the operation and byte range of the request.
    pub op: Op,
    buffer: Option<ReadBuffer>,
    result: Mutex<Option<Result<Outcome, Error>>>,
    ready: Condvar,
}

impl Slot {
    /// A slot for a request; `read_into` is the buffer a read fills.
    pub fn new(expect: Expect, op: Op, read_into: Option<&mut [u8]>) -> Slot {
        Slot {
            expect,
            op,
            buffer: read_into.map(|buf| ReadBuffer {
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
            }),
            result: Mutex::new(None),
            ready: Condvar::new(),
        }
    }

    /// `len` bytes of the lent buffer at `at`.
    ///
    /// # Safety
    ///
    /// Only the reader thread may call this, and only before it completes the slot;
    /// the range must lie within the buffer (the reply state checked it against
    /// the request, whose length is the buffer's).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn data(&self, at: usize, len: usize) -> &mut [u8] {
        let buffer = self.buffer.as_ref().expect("a read has a buffer");
        assert!(at.checked_add(len).is_some_and(|end| end <= buffer.len));
        // SAFETY: in bounds (checked above); the caller's exclusive borrow is lent to
        // this thread until completion (module comment).
        unsafe { std::slice::from_raw_parts_mut(buffer.ptr.add(at), len) }
    }

    /// Delivers the result and wakes the caller.
    pub fn complete(&self, result: Result<Outcome, Error>) {
        let mut slot = self.result.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            *slot = Some(result);
            self.ready.notify_one();
        }
    }

    /// Blocks until the reader thread completes this slot.
    pub fn wait(&self) -> Result<Outcome, Error> {
        let mut slot = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            slot = self.ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Like [`wait`](Self::wait), but gives up after `limit` and returns `None`
    /// (the slot is then still lent to the reader thread).
    pub fn wait_timeout(&self, limit: Duration) -> Option<Result<Outcome, Error>> {
        let deadline = Instant::now() + limit;
        let mut slot = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(result) = slot.take() {
                return Some(result);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            slot = self
                .ready
                .wait_timeout(slot, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
