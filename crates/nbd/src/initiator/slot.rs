//! One request in flight: what it expects, where read data goes, and who learns the
//! result — a caller waiting in `Connection::request`, or a request queue.
//!
//! Ownership rule: a slot is completed exactly once, and only by a thread holding
//! the connection's reader lock (for a reply, or the connection's end: reader.rs).
//! So the read buffer a slot points into is written only by that thread, and only
//! before it completes the slot. A waiting caller lent the buffer and touches it
//! again only after completion; a queued request's buffer is owned by the slot and
//! handed to the queue on completion.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
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

// SAFETY: the pointer is dereferenced only under the reader lock, before completion,
// while its memory is lent or owned by the slot (see the module comment).
unsafe impl Send for ReadBuffer {}
// SAFETY: as above; no two threads access the buffer at once.
unsafe impl Sync for ReadBuffer {}

/// Completions of one request queue's requests (tagged with the queue's own
/// numbers for them), as the read sides deliver them.
pub(crate) struct QueueShared {
    pub done: Mutex<Vec<Completion>>,
    /// The queue's thread is waiting on its sockets (set and read in sequentially
    /// consistent order around `done`): a completion another thread delivers must
    /// then wake it through `wake`.
    pub sleeping: AtomicBool,
    /// An eventfd the queue's thread waits on beside its sockets.
    pub wake: OwnedFd,
}

impl QueueShared {
    pub fn new() -> io::Result<QueueShared> {
        // SAFETY: eventfd has no memory arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(QueueShared {
            done: Mutex::new(Vec::new()),
            sleeping: AtomicBool::new(false),
            // SAFETY: a fresh descriptor that nothing else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn wake_up(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live array. A full counter (EAGAIN) still
        // leaves the eventfd readable, which is all the waiter needs.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Resets the wake-up after the queue's thread woke.
    pub fn clear_wake(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live array; non-blocking.
        unsafe {
            libc::read(
                self.wake.as_raw_fd(),
                count.as_mut_ptr().cast(),
                count.len(),
            )
        };
    }
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
                buf: Mutex::new(Some(buf)),
            },
        }
    }

    /// `len` bytes of the lent buffer at `at`.
    ///
    /// # Safety
    ///
    /// Only the thread holding the reader lock may call this, and only before it
    /// completes the slot; the range must lie within the buffer (the reply state
    /// checked it against the request, whose length is the buffer's).
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
            Waiter::Queue { queue, tag, buf } => {
                let Some(buf) = lock(buf).take() else {
                    return;
                };
                let completion = Completion {
                    tag: *tag,
                    buf,
                    result: outcome.map(drop),
                };
                lock(&queue.done).push(completion);
                if queue.sleeping.load(Ordering::SeqCst) {
                    queue.wake_up();
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

    /// The result, if the slot has been completed (not for queued slots).
    pub fn try_take(&self) -> Option<Result<Outcome, Error>> {
        lock(self.thread_waiter().0).take()
    }

    /// Blocks until the slot is completed or `limit` passes, and returns `None` then
    /// (the slot is then still lent to the read side). Not for queued slots.
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
