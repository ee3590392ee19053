//! The initiator's request queue: one thread keeps many reads and writes in flight,
//! as libnbd's event loop does, instead of one blocked thread per request.
//!
//! Submitting registers the request on the least-loaded connection and gathers it
//! with the others submitted since the queue last sent: they leave in one vectored
//! write when the queue's thread asks for completions, or as soon as a connection's
//! gathered requests reach [`SEND_BYTES`] (so large writes stream without waiting).
//! A burst of small requests then costs one system call here and arrives at the
//! server in one read.
//!
//! For as long as it exists, the queue reads its connections' replies on its own
//! thread and their reader threads stay parked (reader.rs): when it asks for
//! completions, it reads every reply that has arrived, and sleeps only in `poll` on
//! the sockets themselves, so a reply wakes it directly instead of through a reader
//! thread. Its sends never block: while a socket is full they read replies instead.
//! Before sleeping it polls the sockets a moment for the completion it waits for,
//! while the requests are small and polling keeps paying ([`PollBudget`]): that
//! spares the wake-up, which at small requests is much of the round trip.
//!
//! When a connection drops, the requests it had not answered come back failed; with
//! reconnecting on, the queue waits for a new connection (reconnect.rs) and submits
//! them again, and its caller only ever sees them succeed (or fail for good).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Completion, IoBuf, Op, QueuedOp, RequestQueue, Submission};

use super::connection::{Connection, Unsent};
use super::device::{fua, NbdClient};
use super::poll_budget::PollBudget;
use super::reader::Pumped;
use super::reconnect;
use super::slot::QueueShared;
use super::socket::poll;
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
/// Longest sleep while another thread holds a connection's reader lock (a caller
/// reading its own reply): then the socket's readiness says nothing to us.
const BUSY_WAIT: Duration = Duration::from_millis(1);

/// A request in flight, under the queue's own number for it.
struct Queued {
    /// The submitter's tag.
    tag: u64,
    op: QueuedOp,
    offset: u64,
    /// The connection it was sent on.
    connection: Arc<Connection>,
    /// Times it was sent again after a reconnect.
    replays: u32,
}

/// A request queue on an [`NbdClient`]'s connections.
pub(crate) struct NbdQueue<'a> {
    client: &'a NbdClient,
    shared: Arc<QueueShared>,
    /// The connections this queue reads itself (their reader threads parked), by
    /// index: the client's, until a reconnect puts a new one in place.
    parked: Vec<Arc<Connection>>,
    /// Requests in flight by the queue's number for them (the tag their slots
    /// carry), and the numbers free for reuse.
    requests: Vec<Option<Queued>>,
    free: Vec<usize>,
    in_flight: usize,
    /// Per connection, the requests submitted but not yet written.
    unsent: Vec<Unsent>,
    /// Bytes of the requests in flight.
    in_flight_bytes: usize,
    /// How long to poll for completions before sleeping.
    poll: PollBudget,
    /// What [`sleep`](Self::sleep) waits on, kept between sleeps.
    pollfds: Vec<libc::pollfd>,
}

impl<'a> NbdQueue<'a> {
    /// A queue on `client`'s connections; `None` if the kernel refuses the eventfd
    /// it needs (the caller then falls back to one thread per request).
    pub fn new(client: &'a NbdClient) -> Option<NbdQueue<'a>> {
        let shared = match QueueShared::new() {
            Ok(shared) => Arc::new(shared),
            Err(e) => {
                tracing::warn!("NBD request queue unavailable: eventfd: {e}");
                return None;
            }
        };
        let parked: Vec<_> = (0..client.connections())
            .map(|index| client.connection(index))
            .collect();
        for connection in &parked {
            connection.read_side().park();
        }
        Some(NbdQueue {
            client,
            shared,
            unsent: parked.iter().map(|_| Unsent::default()).collect(),
            pollfds: Vec::with_capacity(parked.len() + 1),
            parked,
            requests: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            in_flight_bytes: 0,
            poll: PollBudget::default(),
        })
    }

    /// Starts reading `connection` in place of the one at its index, if it is new
    /// (a reconnect replaced the old one): what was gathered for the old one is
    /// written first (or fails with it), and its reader thread may finish.
    fn adopt(&mut self, connection: &Arc<Connection>) {
        let index = connection.index();
        if Arc::ptr_eq(&self.parked[index], connection) {
            return;
        }
        self.parked[index].send_unsent(&mut self.unsent[index]);
        connection.read_side().park();
        let old = std::mem::replace(&mut self.parked[index], connection.clone());
        old.read_side().unpark();
    }

    /// Adopts every connection a reconnect has replaced.
    fn adopt_all(&mut self) {
        for index in 0..self.parked.len() {
            let current = self.client.connection(index);
            self.adopt(&current);
        }
    }

    /// Sends a request on the least-loaded connection (gathered with others, see
    /// the module comment).
    fn start(&mut self, tag: u64, op: QueuedOp, buf: IoBuf, offset: u64, replays: u32) {
        let connection = self.client.pick();
        self.adopt(&connection);
        let number = self.free.pop().unwrap_or_else(|| {
            self.requests.push(None);
            self.requests.len() - 1
        });
        self.requests[number] = Some(Queued {
            tag,
            op,
            offset,
            connection: connection.clone(),
            replays,
        });
        let (op, command, flags) = match op {
            QueuedOp::Read => (Op::Read, NBD_CMD_READ, 0),
            QueuedOp::Write(flags) => (Op::Write, NBD_CMD_WRITE, fua(flags)),
        };
        if buf.is_empty() {
            // Nothing to send; NBD has no use for empty requests.
            let completion = Completion {
                tag: number as u64,
                buf,
                result: Ok(()),
            };
            connection.started();
            self.done().push(completion);
            return;
        }
        let unsent = &mut self.unsent[connection.index()];
        connection.enqueue(
            op,
            command,
            flags,
            offset,
            buf,
            &self.shared,
            number as u64,
            unsent,
        );
        if unsent.bytes >= SEND_BYTES || unsent.requests() >= SEND_REQUESTS {
            connection.send_unsent(unsent);
        }
    }

    /// Writes every gathered request.
    fn send_all(&mut self) {
        for (connection, unsent) in self.parked.iter().zip(&mut self.unsent) {
            connection.send_unsent(unsent);
        }
    }

    fn done(&self) -> MutexGuard<'_, Vec<Completion>> {
        self.shared.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn done_count(&self) -> usize {
        self.done().len()
    }

    /// Reads every reply that has arrived on any live connection; returns whether
    /// another thread held a connection's reader lock.
    fn read_replies(&self) -> bool {
        let mut busy = false;
        for connection in &self.parked {
            if !connection.read_side().ended() {
                busy |= connection.read_replies(false) == Pumped::Busy;
            }
        }
        busy
    }

    /// Sleeps until a live connection has something to read, another thread hands
    /// this queue a completion (beyond the `seen` it already has), or `limit`
    /// passes. With `busy` (another thread holds a reader lock), the sockets are
    /// left out: their data may be that thread's to read, and waiting on them would
    /// spin.
    fn sleep(&mut self, limit: Option<Duration>, busy: bool, seen: usize) {
        let mut fds = std::mem::take(&mut self.pollfds);
        fds.clear();
        if !busy {
            for connection in &self.parked {
                let side = connection.read_side();
                if !side.ended() {
                    fds.push(libc::pollfd {
                        fd: side.fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
            }
        }
        fds.push(libc::pollfd {
            fd: self.shared.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let limit = if busy {
            Some(limit.map_or(BUSY_WAIT, |limit| limit.min(BUSY_WAIT)))
        } else {
            limit
        };
        self.shared.sleeping.store(true, Ordering::SeqCst);
        // A completion delivered before `sleeping` was seen set is in the list.
        if self.done_count() == seen {
            if let Err(e) = poll(&mut fds, limit) {
                tracing::debug!("NBD request queue: poll: {e}");
                std::thread::sleep(BUSY_WAIT);
            }
        }
        self.shared.sleeping.store(false, Ordering::SeqCst);
        self.shared.clear_wake();
        self.pollfds = fds;
    }

    /// Reads replies until at least `want` completions are waiting.
    fn wait_for(&mut self, want: usize) {
        let timeout = self.client.options.request_timeout;
        let mut waited_since = Instant::now();
        let mut had = self.done_count();
        // Only small requests: a large one's transfer dwarfs a wake-up, and a
        // polling thread would take CPU from the transfer (and, on loopback, from
        // the server) instead.
        let small = self.in_flight_bytes <= self.in_flight * POLL_REQUEST_BYTES;
        let mut polled = false;
        loop {
            let busy = self.read_replies();
            let count = self.done_count();
            if count >= want {
                return;
            }
            if count > had {
                had = count;
                waited_since = Instant::now();
            }
            if small && !polled {
                polled = true;
                let budget = self.poll.next();
                if !budget.is_zero() {
                    let started = Instant::now();
                    while self.done_count() < want && started.elapsed() < budget {
                        self.read_replies();
                        std::hint::spin_loop();
                    }
                    self.poll.record(self.done_count() >= want);
                    continue;
                }
            }
            let left = timeout.map(|limit| limit.saturating_sub(waited_since.elapsed()));
            match left {
                Some(left) if left.is_zero() => {
                    // Nothing came back for a whole timeout: close every
                    // connection, so that reading fails what is in flight and hands
                    // it back.
                    for connection in &self.parked {
                        connection.time_out(format!(
                            "no reply to any of {} queued requests within {:?}; \
                             connection closed",
                            self.in_flight,
                            timeout.unwrap_or_default()
                        ));
                    }
                    waited_since = Instant::now();
                }
                _ => self.sleep(left, busy, count),
            }
        }
    }

    /// Hands the waiting completions to `out`, except those of requests a dropped
    /// connection failed: once a new connection is in place, they are submitted
    /// again. Returns how many went to `out`.
    fn take_done(&mut self, out: &mut Vec<Completion>) -> usize {
        let done = std::mem::take(&mut *self.done());
        let mut delivered = 0;
        for completion in done {
            let number = completion.tag as usize;
            let request = self.requests[number]
                .take()
                .expect("a completion belongs to a request in flight");
            self.free.push(number);
            request.connection.finished();
            let result = match completion.result {
                Err(error) if reconnect::worth_it(&error) => {
                    let connection = &request.connection;
                    match reconnect::recover(self.client, connection, error, request.replays) {
                        Ok(()) => {
                            let buf = completion.buf;
                            let replays = request.replays + 1;
                            self.start(request.tag, request.op, buf, request.offset, replays);
                            continue;
                        }
                        Err(error) => Err(error),
                    }
                }
                result => result,
            };
            self.in_flight -= 1;
            self.in_flight_bytes = self.in_flight_bytes.saturating_sub(completion.buf.len());
            delivered += 1;
            out.push(Completion {
                tag: request.tag,
                buf: completion.buf,
                result,
            });
        }
        delivered
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
        self.start(tag, op, buf, offset, 0);
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        let want = min.min(self.in_flight);
        let mut delivered = 0;
        loop {
            self.adopt_all();
            // Nothing gathered may wait behind this thread's sleep (and payload
            // memory must not be handed back before it is sent).
            self.send_all();
            self.wait_for(want - delivered);
            delivered += self.take_done(out);
            if delivered >= want {
                return;
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for NbdQueue<'_> {
    fn drop(&mut self) {
        // Requests submitted and never waited for still reach the server; their
        // replies are the reader threads' again.
        self.send_all();
        for connection in &self.parked {
            connection.read_side().unpark();
        }
    }
}
