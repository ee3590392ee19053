//! The initiator's request queue: one thread keeps many reads and writes in flight,
//! as libnbd's event loop does, instead of one blocked thread per request.
//!
//! Submitting registers the request on the least-loaded connection and gathers it
//! with the others submitted since the queue last sent: they leave in one vectored
//! write when the queue's thread asks for completions, or as soon as a connection's
//! gathered requests reach [`SEND_BYTES`] (so large writes stream without waiting).
//! A burst of small requests then costs one system call here and arrives at the
//! server in one read. The connections' reader threads put completions in one list,
//! and the queue's thread takes every completion there is whenever it asks, sleeping
//! only while none is ready. So a reader thread that takes several replies from one
//! socket read wakes the queue's thread at most once for all of them. Before it
//! sleeps, the queue's thread polls a moment for the completion it waits for, while
//! the requests are small and polling keeps paying ([`PollBudget`]): that spares
//! the wake-up, which at small requests is much of the round trip.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use blockwire_blockdev::{Completion, Op, QueuedOp, RequestQueue, Submission};

use super::connection::Unsent;
use super::device::{fua, NbdClient};
use super::poll_budget::PollBudget;
use super::slot::QueueShared;
use crate::wire::{NBD_CMD_READ, NBD_CMD_WRITE};

/// Gathered requests for one connection are sent once they hold this many bytes...
const SEND_BYTES: usize = 128 * 1024;
/// ...or this many requests: enough to spare most system calls, few enough that the
/// server starts on a burst while the rest of it is still being submitted (a whole
/// burst sent at once would alternate the two sides instead of overlapping them).
const SEND_REQUESTS: usize = 4;
/// The queue's thread polls for completions (see `poll_budget.rs`) only while the
/// requests in flight average at most this many bytes.
const POLL_REQUEST_BYTES: usize = 64 * 1024;

/// A request queue on an [`NbdClient`]'s connections.
pub(crate) struct NbdQueue<'a> {
    client: &'a NbdClient,
    shared: Arc<QueueShared>,
    in_flight: usize,
    /// Per connection, the requests submitted but not yet written.
    unsent: Vec<Unsent>,
    /// Bytes of the requests in flight.
    in_flight_bytes: usize,
    /// How long to poll for completions before sleeping.
    poll: PollBudget,
}

impl<'a> NbdQueue<'a> {
    pub fn new(client: &'a NbdClient) -> NbdQueue<'a> {
        NbdQueue {
            client,
            shared: Arc::new(QueueShared::default()),
            in_flight: 0,
            unsent: (0..client.connections())
                .map(|_| Unsent::default())
                .collect(),
            in_flight_bytes: 0,
            poll: PollBudget::default(),
        }
    }

    /// Writes every gathered request.
    fn send_all(&mut self) {
        for (index, unsent) in self.unsent.iter_mut().enumerate() {
            self.client.connection(index).send_unsent(unsent);
        }
    }

    fn done(&self) -> MutexGuard<'_, Vec<(usize, Completion)>> {
        self.shared.done.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RequestQueue for NbdQueue<'_> {
    fn submit(&mut self, submission: Submission) {
        let Submission {
            tag,
            op,
            buf,
            offset,
        } = submission;
        self.in_flight += 1;
        self.in_flight_bytes += buf.len();
        let index = self.client.pick_index();
        let (op, command, flags) = match op {
            QueuedOp::Read => (Op::Read, NBD_CMD_READ, 0),
            QueuedOp::Write(flags) => (Op::Write, NBD_CMD_WRITE, fua(flags)),
        };
        if buf.is_empty() {
            // Nothing to send; NBD has no use for empty requests.
            let completion = Completion {
                tag,
                buf,
                result: Ok(()),
            };
            self.client.connection(index).started();
            self.done().push((index, completion));
            return;
        }
        let connection = self.client.connection(index);
        let unsent = &mut self.unsent[index];
        connection.enqueue(
            op,
            command,
            flags,
            offset,
            buf,
            &self.shared,
            tag,
            index,
            unsent,
        );
        if unsent.bytes >= SEND_BYTES || unsent.requests() >= SEND_REQUESTS {
            connection.send_unsent(unsent);
        }
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        // Nothing gathered may wait behind this thread's sleep (and payload memory
        // must not be handed back before it is sent).
        self.send_all();
        let want = min.min(self.in_flight);
        let timeout = self.client.connection(0).request_timeout();
        let mut waited_since = Instant::now();
        // A handle of our own: the lock guard must not borrow `self`.
        let shared = Arc::clone(&self.shared);
        let done_list = || shared.done.lock().unwrap_or_else(|e| e.into_inner());
        let mut done = done_list();
        // Only small requests: a large one's transfer dwarfs a wake-up, and a
        // polling thread would take CPU from the transfer (and, on loopback, from
        // the server) instead.
        let small = self.in_flight_bytes <= self.in_flight * POLL_REQUEST_BYTES;
        if done.len() < want && small {
            let budget = self.poll.next();
            if !budget.is_zero() {
                // Poll without the lock, which the reader threads take to deliver.
                let until = shared.delivered.load(Ordering::Acquire) + (want - done.len()) as u64;
                drop(done);
                let polled = Instant::now();
                while shared.delivered.load(Ordering::Acquire) < until && polled.elapsed() < budget
                {
                    std::hint::spin_loop();
                }
                done = done_list();
                self.poll.record(done.len() >= want);
            }
        }
        while done.len() < want {
            shared.sleeping.store(true, Ordering::Relaxed);
            match timeout {
                None => {
                    done = self
                        .shared
                        .ready
                        .wait(done)
                        .unwrap_or_else(|e| e.into_inner());
                    shared.sleeping.store(false, Ordering::Relaxed);
                }
                Some(limit) => {
                    let before = done.len();
                    done = self
                        .shared
                        .ready
                        .wait_timeout(done, limit)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    shared.sleeping.store(false, Ordering::Relaxed);
                    if done.len() > before {
                        waited_since = Instant::now();
                    } else if waited_since.elapsed() >= limit {
                        // Nothing came back for a whole timeout: close every
                        // connection, so that the reader threads fail what is in
                        // flight and hand it back.
                        drop(done);
                        for index in 0..self.client.connections() {
                            let connection = self.client.connection(index);
                            connection.time_out(format!(
                                "no reply to any of {} queued requests within {limit:?}; \
                                 connection closed",
                                self.in_flight
                            ));
                        }
                        waited_since = Instant::now();
                        done = done_list();
                    }
                }
            }
        }
        let client = self.client;
        let taken = done.len();
        for (index, completion) in done.drain(..) {
            client.connection(index).finished();
            self.in_flight_bytes = self.in_flight_bytes.saturating_sub(completion.buf.len());
            out.push(completion);
        }
        drop(done);
        self.in_flight -= taken;
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for NbdQueue<'_> {
    fn drop(&mut self) {
        // Requests submitted and never waited for still reach the server.
        self.send_all();
    }
}
