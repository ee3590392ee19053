//! One command in flight: where its Data-In goes, where its Data-Out comes from,
//! and who learns the result — a caller blocked in `Connection::execute`, or a
//! request queue.
//!
//! Ownership rule: a task is completed exactly once, by the connection's reader
//! thread (for a response, or for the connection's end). Its buffers are written
//! (Data-In) or read (R2T Data-Out) only by that thread before completion, and by
//! the submitting thread while it sends the command's unsolicited data. A waiting
//! caller lent its buffers and touches them again only after completion; a queued
//! request's buffer is owned by the task and handed back with the completion, on a
//! channel that only the submitting thread reads, after its send returned.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Completion, Error, IoBuf, Op};
use crossbeam_channel::Sender;

use super::scsi;
use super::session::Outcome;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer lent to the task (see the module comment).
#[derive(Clone, Copy)]
struct RawBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: dereferenced only by the threads the module comment names, while the
// memory is lent to or owned by the task.
unsafe impl Send for RawBuf {}
// SAFETY: as above; Data-In writes happen on the reader thread only.
unsafe impl Sync for RawBuf {}

/// Who learns a task's result.
enum Waiter {
    Thread {
        result: Mutex<Option<Result<Outcome, Error>>>,
        ready: Condvar,
    },
    Queue {
        done: Sender<Completion>,
        tag: u64,
        buf: Mutex<Option<IoBuf>>,
    },
}

/// Completions of queued tasks the reader thread has not handed over yet: one
/// wake-up of a queue's thread for everything read in one go, instead of one per
/// command. Handed over by [`flush`](Gathered::flush), and when dropped.
#[derive(Default)]
pub(crate) struct Gathered(Vec<(Sender<Completion>, Completion)>);

impl Gathered {
    /// Hands every gathered completion to its queue.
    pub fn flush(&mut self) {
        for (done, completion) in self.0.drain(..) {
            // A queue dropped with requests in flight frees the buffer.
            let _ = done.send(completion);
        }
    }
}

impl Drop for Gathered {
    fn drop(&mut self) {
        self.flush();
    }
}

/// A command waiting for its status.
pub(crate) struct Task {
    /// For error messages: the operation and byte range the command serves.
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    read: Option<RawBuf>,
    write: Option<RawBuf>,
    /// Data-In bytes received (written by the reader thread only).
    received: AtomicU32,
    /// The CDB and LUN field, kept to send the command again after a reconnect.
    command: OnceLock<(Vec<u8>, u64)>,
    /// When the command was submitted (for the request timeout).
    started: Instant,
    /// Sending threads reading the buffers now, and a completion waiting for them
    /// (see [`Task::lend`]).
    lent: Mutex<(usize, Option<Result<Outcome, Error>>)>,
    /// Whether the command went out on the current connection (exactly one
    /// sender claims it: the submitter, or a replay after a reconnect).
    sent: AtomicBool,
    waiter: Waiter,
}

impl Task {
    /// A task for a caller that waits; `read` is filled by Data-In, `write` is the
    /// data-out.
    pub fn new(
        op: Op,
        offset: u64,
        len: u64,
        read: Option<&mut [u8]>,
        write: Option<&[u8]>,
    ) -> Task {
        Task {
            op,
            offset,
            len,
            read: read.map(|buf| RawBuf {
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
            }),
            write: write.map(|buf| RawBuf {
                ptr: buf.as_ptr().cast_mut(),
                len: buf.len(),
            }),
            received: AtomicU32::new(0),
            command: OnceLock::new(),
            sent: AtomicBool::new(false),
            started: Instant::now(),
            lent: Mutex::new((0, None)),
            waiter: Waiter::Thread {
                result: Mutex::new(None),
                ready: Condvar::new(),
            },
        }
    }

    /// A task for a queued read (`writes` false) or write that owns `buf` until
    /// its completion goes to `done`.
    pub fn queued(
        op: Op,
        offset: u64,
        mut buf: IoBuf,
        writes: bool,
        done: Sender<Completion>,
        tag: u64,
    ) -> Task {
        let raw = RawBuf {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        };
        Task {
            op,
            offset,
            len: buf.len() as u64,
            read: (!writes).then_some(raw),
            write: writes.then_some(raw),
            received: AtomicU32::new(0),
            command: OnceLock::new(),
            sent: AtomicBool::new(false),
            started: Instant::now(),
            lent: Mutex::new((0, None)),
            waiter: Waiter::Queue {
                done,
                tag,
                buf: Mutex::new(Some(buf)),
            },
        }
    }

    /// How long since the command was submitted.
    pub fn age(&self) -> Duration {
        self.started.elapsed()
    }

    /// Records the command's CDB and LUN field (once, at registration).
    pub fn set_command(&self, cdb: &[u8], lun_field: u64) {
        let _ = self.command.set((cdb.to_vec(), lun_field));
    }

    /// The CDB and LUN field.
    pub fn command(&self) -> (&[u8], u64) {
        self.command
            .get()
            .map_or((&[][..], 0), |(cdb, lun)| (cdb.as_slice(), *lun))
    }

    /// Claims the right to send the command on the current connection; false if
    /// another thread already did.
    pub fn claim_send(&self) -> bool {
        !self.sent.swap(true, Ordering::AcqRel)
    }

    /// Readies the command to be sent again on a new connection (the reader
    /// thread, holding the writer lock, before any replay).
    pub fn reset_for_replay(&self) {
        self.received.store(0, Ordering::Relaxed);
        self.sent.store(false, Ordering::Release);
    }

    /// Counts Data-In bytes received.
    pub fn add_received(&self, len: u32) {
        self.received.fetch_add(len, Ordering::Relaxed);
    }

    /// Data-In bytes received so far.
    pub fn received(&self) -> u32 {
        self.received.load(Ordering::Relaxed)
    }

    /// Expected Data-In bytes, if the command reads.
    pub fn read_len(&self) -> Option<u32> {
        self.read.map(|b| b.len as u32)
    }

    /// Data-out bytes, if the command writes.
    pub fn write_len(&self) -> Option<u32> {
        self.write.map(|b| b.len as u32)
    }

    /// `len` bytes of the read buffer at `at`.
    ///
    /// # Safety
    ///
    /// Only the reader thread may call this, before it completes the task; the
    /// range must have passed `session::check_data_in`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn read_buf(&self, at: usize, len: usize) -> &mut [u8] {
        let buf = self.read.expect("checked: the task reads");
        assert!(at.checked_add(len).is_some_and(|end| end <= buf.len));
        // SAFETY: in bounds; the buffer is lent to this thread until completion.
        unsafe { std::slice::from_raw_parts_mut(buf.ptr.add(at), len) }
    }

    /// `len` bytes of the write buffer at `at`.
    ///
    /// # Safety
    ///
    /// Only before completion, by the submitting thread or the reader thread; the
    /// range must lie within the buffer.
    pub unsafe fn write_buf(&self, at: usize, len: usize) -> &[u8] {
        let buf = self.write.expect("checked: the task writes");
        assert!(at.checked_add(len).is_some_and(|end| end <= buf.len));
        // SAFETY: in bounds; the memory stays lent or owned until completion and
        // nobody writes it meanwhile.
        unsafe { std::slice::from_raw_parts(buf.ptr.add(at), len) }
    }

    /// Marks the task's data-out as being read by a sending thread: a completion
    /// that arrives meanwhile (a target may answer before it has read everything)
    /// waits until [`unlend`](Self::unlend), so the buffer is not handed back — and
    /// freed — while a replay still sends from it.
    pub fn lend(&self) {
        lock(&self.lent).0 += 1;
    }

    /// The sending thread is done with the buffer; delivers a completion that
    /// waited for it.
    pub fn unlend(&self) {
        let deferred = {
            let mut lent = lock(&self.lent);
            lent.0 = lent.0.saturating_sub(1);
            if lent.0 == 0 {
                lent.1.take()
            } else {
                None
            }
        };
        if let Some(result) = deferred {
            self.deliver(result);
        }
    }

    /// Delivers the result (first call only): wakes the caller, or hands the
    /// completion with its buffer to the queue — once no sender reads the buffer.
    pub fn complete(&self, result: Result<Outcome, Error>) {
        if let Some(result) = self.unless_lent(result) {
            self.deliver(result);
        }
    }

    /// [`complete`](Self::complete), except that a queued task's completion joins
    /// `gathered`, which the reader thread hands over when it has read everything
    /// that arrived: the queue's thread then wakes once for the lot.
    pub fn complete_gathered(&self, result: Result<Outcome, Error>, gathered: &mut Gathered) {
        let Some(result) = self.unless_lent(result) else {
            return;
        };
        if let Some((done, completion)) = self.queued_completion(result) {
            gathered.0.push((done.clone(), completion));
        }
    }

    /// The result, unless a sender still reads the buffer: then it waits for
    /// [`unlend`](Self::unlend).
    fn unless_lent(&self, result: Result<Outcome, Error>) -> Option<Result<Outcome, Error>> {
        let mut lent = lock(&self.lent);
        if lent.0 > 0 {
            if lent.1.is_none() {
                lent.1 = Some(result);
            }
            return None;
        }
        Some(result)
    }

    /// For a queued task, its completion (first call only) and where it goes; a
    /// waiting caller is woken here instead.
    fn queued_completion(
        &self,
        result: Result<Outcome, Error>,
    ) -> Option<(&Sender<Completion>, Completion)> {
        match &self.waiter {
            Waiter::Thread { .. } => {
                self.deliver(result);
                None
            }
            Waiter::Queue { done, tag, buf } => {
                let buf = lock(buf).take()?;
                let result = result
                    .and_then(|outcome| scsi::check_io(&outcome, self.op, self.offset, self.len));
                Some((
                    done,
                    Completion {
                        tag: *tag,
                        buf,
                        result,
                    },
                ))
            }
        }
    }

    fn deliver(&self, result: Result<Outcome, Error>) {
        match &self.waiter {
            Waiter::Thread {
                result: slot,
                ready,
            } => {
                let mut slot = lock(slot);
                if slot.is_none() {
                    *slot = Some(result);
                    ready.notify_one();
                }
            }
            Waiter::Queue { .. } => {
                if let Some((done, completion)) = self.queued_completion(result) {
                    // The queue may be gone (dropped with requests in flight): then
                    // the buffer is simply freed.
                    let _ = done.send(completion);
                }
            }
        }
    }

    /// Blocks until the task is completed (not for queued tasks).
    pub fn wait(&self) -> Result<Outcome, Error> {
        let Waiter::Thread { result, ready } = &self.waiter else {
            unreachable!("queued tasks are not waited for");
        };
        let mut slot = lock(result);
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            slot = ready.wait(slot).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_waits_while_a_sender_reads_the_buffer() {
        let (done, completions) = crossbeam_channel::unbounded();
        let task = Task::queued(Op::Write, 0, IoBuf::new(512), true, done, 7);
        task.lend();
        // The target answered before the sender finished with the buffer.
        task.complete(Ok(Outcome::default()));
        assert!(completions.try_recv().is_err());
        task.unlend();
        let completion = completions
            .try_recv()
            .expect("delivered once the sender is done");
        assert_eq!(completion.tag, 7);
        assert!(completion.result.is_ok());
        // Without a sender, at once.
        let (done, completions) = crossbeam_channel::unbounded();
        let task = Task::queued(Op::Read, 0, IoBuf::new(512), false, done, 8);
        task.complete(Ok(Outcome {
            received: 512,
            ..Outcome::default()
        }));
        assert_eq!(completions.try_recv().unwrap().tag, 8);
    }

    #[test]
    fn gathered_completions_wait_for_the_flush() {
        let (done, completions) = crossbeam_channel::unbounded();
        let mut gathered = Gathered::default();
        for tag in 0..3 {
            let task = Task::queued(Op::Read, 0, IoBuf::new(512), false, done.clone(), tag);
            task.complete_gathered(
                Ok(Outcome {
                    received: 512,
                    ..Outcome::default()
                }),
                &mut gathered,
            );
            // A second completion of the same task is ignored.
            task.complete_gathered(Ok(Outcome::default()), &mut gathered);
        }
        assert!(
            completions.try_recv().is_err(),
            "delivered before the flush"
        );
        gathered.flush();
        let tags: Vec<u64> = completions.try_iter().map(|c| c.tag).collect();
        assert_eq!(tags, [0, 1, 2]);
        // Dropping hands over what is left, so no queue waits forever.
        let mut gathered = Gathered::default();
        let task = Task::queued(Op::Read, 0, IoBuf::new(512), false, done, 9);
        task.complete_gathered(Ok(Outcome::default()), &mut gathered);
        drop(gathered);
        assert_eq!(completions.try_recv().unwrap().tag, 9);
    }

    #[test]
    fn a_waiting_caller_is_woken_at_once_by_a_gathered_completion() {
        let task = Task::new(Op::Read, 0, 0, None, None);
        let mut gathered = Gathered::default();
        task.complete_gathered(Ok(Outcome::default()), &mut gathered);
        assert!(task.wait().is_ok());
    }
}
