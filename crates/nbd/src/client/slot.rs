//! One request in flight: what it expects, where read data goes, and who learns the
//! result — a caller blocked in [`Slot::wait`], or a request queue.
//!
//! Ownership rule: a slot is completed exactly once, and only by the connection's
//! reader thread (a reply, or the connection's end). So the read buffer a slot points
//! into is written only by that thread, and only before it completes the slot. A
//! waiting caller lent the buffer and touches it again only after completion; a
//! queued request's buffer is owned by the slot and handed to the queue on
//! completion.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Completion, Error, IoBuf, Op};

use super::reply::{Expect, Outcome};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The read buffer: lent by a waiting caller, or owned by a queued request.
struct ReadBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is dereferenced only by the reader thread, before completion,
// while its memory is lent or owned by the slot (see the module comment).
unsafe impl Send for ReadBuffer {}
// SAFETY: as above; no two threads access the buffer at once.
unsafe impl Sync for ReadBuffer {}

/// Completions of one request queue's requests, with the index of the connection
/// each ran on, as the reader threads deliver them.
#[derive(Default)]
pub(crate) struct QueueShared {
    pub done: Mutex<Vec<(usize, Completion)>>,
    pub ready: Condvar,
    /// The queue's thread sleeps on `ready` (set and read with `done` locked): only
    /// then does a completion pay for a wake-up system call.
    pub sleeping: std::sync::atomic::AtomicBool,
    /// Completions delivered so far, for the queue's thread to watch without
    /// taking the lock while it polls.
    pub delivered: std::sync::atomic::AtomicU64,
}

/// Who learns a slot's result.
enum Waiter {
    /// A thread blocked in [`Slot::wait`].
    Thread {
        result: Mutex<Option<Result<Outcome, Error>>>,
        ready: Condvar,
    },
    /// A request queue: the result and the buffer go to its completions.
    Queue {
        queue: Arc<QueueShared>,
        tag: u64,
        connection: usize,
        buf: Mutex<Option<IoBuf>>,
    },
}

/// A request waiting for its reply.
pub(crate) struct Slot {
    pub expect: Expect,
    /// For error messages: the operation and byte range of the request.
    pub op: Op,
    buffer: Option<ReadBuffer>,
    waiter: Waiter,
}

impl Slot {
    /// A slot for a caller that waits; `read_into` is the buffer a read fills.
    pub fn new(expect: Expect, op: Op, read_into: Option<&mut [u8]>) -> Slot {
        Slot {
            expect,
            op,
            buffer: read_into.map(|buf| ReadBuffer {
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
            }),
            waiter: Waiter::Thread {
                result: Mutex::new(None),
                ready: Condvar::new(),
            },
        }
    }

    /// A slot for a queued request that owns `buf` (the data a write sends, or the
    /// space a read fills) until its completion goes to `queue`.
    pub fn queued(
        expect: Expect,
        op: Op,
        mut buf: IoBuf,
        queue: Arc<QueueShared>,
        tag: u64,
        connection: usize,
    ) -> Slot {
        let buffer = (op == Op::Read).then(|| ReadBuffer {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        });
        Slot {
            expect,
            op,
            buffer,
            waiter: Waiter::Queue {
                queue,
                tag,
                connection,
                buf: Mutex::new(Some(buf)),
            },
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

    /// Delivers the result: wakes the caller, or hands the completion (with its
    /// buffer) to the queue. Only the first call counts.
    pub fn complete(&self, outcome: Result<Outcome, Error>) {
        match &self.waiter {
            Waiter::Thread { result, ready } => {
                let mut slot = lock(result);
                if slot.is_none() {
                    *slot = Some(outcome);
                    ready.notify_one();
                }
            }
            Waiter::Queue {
                queue,
                tag,
                connection,
                buf,
            } => {
                let Some(buf) = lock(buf).take() else {
                    return;
                };
                let completion = Completion {
                    tag: *tag,
                    buf,
                    result: outcome.map(drop),
                };
                let mut done = lock(&queue.done);
                done.push((*connection, completion));
                queue
                    .delivered
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
                if queue.sleeping.load(std::sync::atomic::Ordering::Relaxed) {
                    queue.ready.notify_one();
                }
            }
        }
    }

    fn thread_waiter(&self) -> (&Mutex<Option<Result<Outcome, Error>>>, &Condvar) {
        match &self.waiter {
            Waiter::Thread { result, ready } => (result, ready),
            Waiter::Queue { .. } => unreachable!("queued requests are not waited for"),
        }
    }

    /// Blocks until the reader thread completes this slot (not for queued slots).
    pub fn wait(&self) -> Result<Outcome, Error> {
        let (result, ready) = self.thread_waiter();
        let mut slot = lock(result);
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            slot = ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Like [`wait`](Self::wait), but gives up after `limit` and returns `None`
    /// (the slot is then still lent to the reader thread).
    pub fn wait_timeout(&self, limit: Duration) -> Option<Result<Outcome, Error>> {
        let (result, ready) = self.thread_waiter();
        let deadline = Instant::now() + limit;
        let mut slot = lock(result);
        loop {
            if let Some(result) = slot.take() {
                return Some(result);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            slot = ready
                .wait_timeout(slot, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
