//! The initiator's request queue: one thread keeps many reads and writes in flight,
//! as libnbd's event loop does, instead of one blocked thread per request.
//!
//! Submitting writes the request (and a write's payload) on the least-loaded
//! connection at once; the connections' reader threads put completions in one list,
//! and the queue's thread takes every completion there is whenever it asks, sleeping
//! only while none is ready. So a reader thread that takes several replies from one
//! socket read wakes the queue's thread at most once for all of them.

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use blockwire_blockdev::{Completion, Op, QueuedOp, RequestQueue, Submission};

use super::device::{fua, NbdClient};
use super::slot::QueueShared;
use crate::wire::{NBD_CMD_READ, NBD_CMD_WRITE};

/// A request queue on an [`NbdClient`]'s connections.
pub(crate) struct NbdQueue<'a> {
    client: &'a NbdClient,
    shared: Arc<QueueShared>,
    in_flight: usize,
}

impl<'a> NbdQueue<'a> {
    pub fn new(client: &'a NbdClient) -> NbdQueue<'a> {
        NbdQueue {
            client,
            shared: Arc::new(QueueShared::default()),
            in_flight: 0,
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
        self.client.connection(index).submit(
            op,
            command,
            flags,
            offset,
            buf,
            &self.shared,
            tag,
            index,
        );
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
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
