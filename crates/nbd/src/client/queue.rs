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
//! socket read wakes the queue's thread at most once for all of them.

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use blockwire_blockdev::{Completion, Op, QueuedOp, RequestQueue, Submission};

use super::connection::Unsent;
use super::device::{fua, NbdClient};
use super::slot::QueueShared;
use crate::wire::{NBD_CMD_READ, NBD_CMD_WRITE};

/// Gathered requests for one connection are sent once they hold this many bytes...
const SEND_BYTES: usize = 128 * 1024;
/// ...or this many requests: enough to spare most system calls, few enough that the
/// server starts on a burst while the rest of it is still being submitted (a whole
/// burst sent at once would alternate the two sides instead of overlapping them).
const SEND_REQUESTS: usize = 4;

/// A request queue on an [`NbdClient`]'s connections.
pub(crate) struct NbdQueue<'a> {
    client: &'a NbdClient,
    shared: Arc<QueueShared>,
    in_flight: usize,
    /// Per connection, the requests submitted but not yet written.
    unsent: Vec<Unsent>,
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
        let mut done = self.done();
        while done.len() < want {
            match timeout {
                None => {
                    done = self
                        .shared
                        .ready
                        .wait(done)
                        .unwrap_or_else(|e| e.into_inner());
                }
                Some(limit) => {
                    let before = done.len();
                    done = self
                        .shared
                        .ready
                        .wait_timeout(done, limit)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
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
                        done = self.done();
                    }
                }
            }
        }
        let client = self.client;
        let taken = done.len();
        for (index, completion) in done.drain(..) {
            client.connection(index).finished();
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
