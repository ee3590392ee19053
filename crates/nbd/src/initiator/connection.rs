//! One connection in transmission: a writer shared by every calling thread and a
//! read side that completes requests as their replies arrive, in any order (read by
//! the connection's reader thread, or by a request queue's thread: reader.rs).
//!
//! A caller registers its request (a [`Slot`]) under a fresh cookie, writes header
//! and payload in one vectored write while holding the writer lock, and blocks until
//! the slot is completed. A request queue instead registers several requests and
//! writes them together ([`Connection::enqueue`], [`Connection::send_unsent`]),
//! reading replies whenever the socket is too full to take more. When the
//! connection ends — the server closes it, a write fails, a reply breaks the
//! protocol — the read side fails every request still in flight with
//! [`ErrorKind::Disconnected`], and requests made afterwards fail at once the same
//! way: nothing waits for a server that is gone.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Error, ErrorKind, IoBuf, Op};

use super::details::ExportDetails;
use super::reader::{self, ReadSide};
use super::reply::{Expect, Outcome};
use super::slot::{QueueShared, Slot};
use super::socket::{poll, wait_readable, Socket};
use crate::wire::*;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a connection takes no more requests.
#[derive(Debug, Clone)]
pub(crate) struct Closed {
    pub kind: ErrorKind,
    pub reason: String,
}

impl Closed {
    pub fn error(&self, op: Op, offset: u64, len: u64) -> Error {
        Error::new(self.kind, op, offset, len).with_detail(self.reason.clone())
    }
}

/// Queued requests registered on a connection but not yet written: their headers
/// back to back and, per request, where its header ends and its write payload.
#[derive(Default)]
pub(crate) struct Unsent {
    heads: Vec<u8>,
    requests: Vec<(usize, *const u8, usize)>,
    /// Header and payload bytes waiting.
    pub bytes: usize,
}

impl Unsent {
    /// Requests waiting.
    pub fn requests(&self) -> usize {
        self.requests.len()
    }
}

// SAFETY: the payload pointers are only read by the thread that owns the queue (and
// with it this value); the buffers they point into belong to registered requests and
// stay put until those complete (see `Connection::enqueue`).
unsafe impl Send for Unsent {}

/// Requests registered but not yet taken up by the read side.
#[derive(Default)]
pub(crate) struct Table {
    pub pending: HashMap<u64, Arc<Slot>>,
    pub closed: Option<Closed>,
}

/// How often a caller waiting for its reply checks whether a request queue has
/// parked the reader thread (and it must read for itself).
const PARK_CHECK: Duration = Duration::from_millis(10);
/// How long a caller reading for itself waits for the socket at a time, so that a
/// request queue's thread gets the reader lock in between.
const SELF_READ_WAIT: Duration = Duration::from_millis(1);

/// State the callers and the read side share.
pub(crate) struct Shared {
    /// The write side: one request (header and payload) at a time.
    pub writer: Mutex<Socket>,
    /// The read side.
    pub read_side: ReadSide,
    /// A handle to shut the socket down without waiting for the writer lock.
    control: Socket,
    pub table: Mutex<Table>,
    dead: AtomicBool,
    /// The server broke the protocol: a reconnect would likely meet the same.
    pub broken: AtomicBool,
    next_cookie: AtomicU64,
    /// How requests are framed (compact or extended headers).
    framing: Framing,
    /// "connection N to ADDRESS", for messages.
    pub name: String,
}

impl Shared {
    /// Closes the connection for new requests (first reason wins); returns whether
    /// this call closed it.
    pub fn close(&self, kind: ErrorKind, reason: String) -> bool {
        let mut table = lock(&self.table);
        self.dead.store(true, Ordering::Release);
        if table.closed.is_some() {
            return false;
        }
        table.closed = Some(Closed { kind, reason });
        true
    }

    /// Hard disconnect: the read side sees the end and fails what is in flight.
    pub fn kill(&self, reason: String) {
        self.close(ErrorKind::Disconnected, reason);
        self.shutdown();
    }

    /// Shuts the socket down both ways: blocked reads and writes return at once.
    pub fn shutdown(&self) {
        let _ = self.control.shutdown(Shutdown::Both);
    }

    /// Soft disconnect (proto.md, "Terminating the transmission phase"): send
    /// NBD_CMD_DISC, then close our side.
    pub fn disconnect(&self) {
        let mut head = Vec::with_capacity(EXTENDED_REQUEST_LEN);
        Request {
            flags: 0,
            command: NBD_CMD_DISC,
            cookie: self.next_cookie.fetch_add(1, Ordering::Relaxed),
            offset: 0,
            len: 0,
        }
        .encode_framed(self.framing, &mut head);
        let mut writer = lock(&self.writer);
        if writer.write_all_vectored(&head, &[]).is_ok() {
            // proto.md: the TLS session closes before the connection.
            writer.close_tls();
        }
        drop(writer);
        self.shutdown();
    }
}

/// One negotiated connection.
pub(crate) struct Connection {
    /// Which of its client's connections this is.
    index: usize,
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
    in_flight: AtomicUsize,
    /// How long a request may wait for its reply before the connection is closed.
    request_timeout: Option<Duration>,
    framing: Framing,
    context: Option<u32>,
}

impl Connection {
    /// Starts transmission on a negotiated socket.
    pub fn start(
        socket: Socket,
        details: &ExportDetails,
        address: &str,
        index: usize,
        request_timeout: Option<Duration>,
    ) -> io::Result<Connection> {
        let reader_socket = socket.try_clone()?;
        // Replies are read only once the socket has data, so a read that waits this
        // long is a server stuck in the middle of a reply. Whoever reads — a queue's
        // thread included — must not wait past the request timeout there.
        reader_socket.set_read_timeout(request_timeout)?;
        let control = socket.try_clone()?;
        let read_side = ReadSide::new(reader_socket, socket.try_clone()?);
        let framing = details.framing();
        let shared = Arc::new(Shared {
            writer: Mutex::new(socket),
            read_side,
            control,
            table: Mutex::new(Table::default()),
            dead: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            next_cookie: AtomicU64::new(1),
            framing,
            name: format!("connection {index} to {address}"),
        });
        let reader = thread::Builder::new()
            .name(format!("nbd-initiator-{index}"))
            .spawn({
                let shared = shared.clone();
                move || reader::run(shared)
            })?;
        Ok(Connection {
            index,
            shared,
            reader: Some(reader),
            in_flight: AtomicUsize::new(0),
            request_timeout,
            framing,
            context: details.base_allocation_id,
        })
    }

    /// Which of its client's connections this is.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The read side, for a request queue that reads its replies itself.
    pub fn read_side(&self) -> &ReadSide {
        &self.shared.read_side
    }

    /// Reads the replies that have arrived (see [`reader::pump`]), for a request
    /// queue that reads its replies itself.
    pub fn read_replies(&self, wait_for_lock: bool) -> reader::Pumped {
        reader::pump(&self.shared, wait_for_lock)
    }

    /// Whether the connection ended because the server broke the protocol.
    pub fn broke_protocol(&self) -> bool {
        self.shared.broken.load(Ordering::Acquire)
    }

    /// Whether the connection still takes requests.
    pub fn alive(&self) -> bool {
        !self.shared.dead.load(Ordering::Acquire)
    }

    /// Requests in flight, for spreading load across connections.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Sends one request and waits for its reply. A read's data lands in
    /// `read_into`, which must be `len` bytes long.
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &self,
        op: Op,
        command: u16,
        flags: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> Result<Outcome, Error> {
        debug_assert!(read_into.as_ref().is_none_or(|b| b.len() == len as usize));
        let expect = Expect {
            command,
            offset,
            len,
            structured: self.framing.chunked(),
            extended: self.framing == Framing::Extended,
            context: self.context,
        };
        // `read_into` stays borrowed until this function returns, which is after
        // the slot has been completed (slot.rs, ownership rule).
        let slot = Arc::new(Slot::new(expect, op, read_into));
        self.send(&slot, flags, payload)?;
        let result = self.wait(&slot, op, offset);
        self.finished();
        result
    }

    /// Waits for `slot`'s reply: from the reader thread, or, while a request queue
    /// has parked it, read by this thread itself. Closes the connection when the
    /// request timeout passes, which fails the request.
    fn wait(&self, slot: &Slot, op: Op, offset: u64) -> Result<Outcome, Error> {
        let side = &self.shared.read_side;
        let since = Instant::now();
        let mut timed_out = false;
        loop {
            let result = if side.parked() && !side.ended() {
                match slot.try_take() {
                    Some(result) => Some(result),
                    None => {
                        let _ = wait_readable(side.fd(), Some(SELF_READ_WAIT));
                        reader::pump(&self.shared, true);
                        slot.try_take()
                    }
                }
            } else {
                slot.wait_timeout(PARK_CHECK)
            };
            if let Some(result) = result {
                return result;
            }
            if let Some(limit) = self.request_timeout {
                if !timed_out && since.elapsed() >= limit {
                    // The caller's buffer is lent to the read side: closing the
                    // connection makes it hand every request back, this one with the
                    // timeout as its error.
                    self.time_out(format!(
                        "{}: no reply to {op} at {offset} within {limit:?}; connection closed",
                        self.shared.name
                    ));
                    timed_out = true;
                }
            }
        }
    }

    /// Registers a queued request and adds it to `unsent` without writing it: the
    /// queue writes every request it gathered in one go (see [`send_unsent`]).
    /// A request the connection no longer takes completes at once with the error.
    ///
    /// [`send_unsent`]: Connection::send_unsent
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        op: Op,
        command: u16,
        flags: u16,
        offset: u64,
        buf: IoBuf,
        queue: &Arc<QueueShared>,
        tag: u64,
        unsent: &mut Unsent,
    ) {
        let expect = Expect {
            command,
            offset,
            len: buf.len() as u32,
            structured: self.framing.chunked(),
            extended: self.framing == Framing::Extended,
            context: self.context,
        };
        // The payload stays in the buffer's heap memory, which the slot owns and
        // which only the queue's thread frees, after completion — and the queue
        // sends everything unsent before it takes completions.
        let payload = if op == Op::Write {
            (buf.as_ptr(), buf.len())
        } else {
            (std::ptr::null(), 0)
        };
        let slot = Arc::new(Slot::queued(expect, op, buf, queue.clone(), tag));
        match self.register(&slot, flags, &mut unsent.heads) {
            Ok(()) => {
                unsent
                    .requests
                    .push((unsent.heads.len(), payload.0, payload.1));
                unsent.bytes += self.framing.request_len() + payload.1;
            }
            Err(closed) => {
                // Counted like any request, so that the queue's `finished` balances it.
                self.started();
                slot.complete(Err(closed));
            }
        }
    }

    /// Writes every request in `unsent` (headers and payloads), in as few system
    /// calls as the socket allows, and empties it. While the socket is too full to
    /// take more, reads replies instead of blocking: the server may be waiting for
    /// room to send them before it reads more requests (the read side is parked
    /// while a queue uses the connection, so nobody else would read them).
    pub fn send_unsent(&self, unsent: &mut Unsent) {
        if unsent.requests.is_empty() {
            return;
        }
        let mut slices = Vec::with_capacity(unsent.requests.len() * 2);
        let mut head_start = 0;
        for &(head_end, payload, len) in &unsent.requests {
            slices.push(IoSlice::new(&unsent.heads[head_start..head_end]));
            if len > 0 {
                // SAFETY: a registered write's buffer stays allocated and unchanged
                // until its completion is taken, which is after this send (`enqueue`).
                slices.push(IoSlice::new(unsafe {
                    std::slice::from_raw_parts(payload, len)
                }));
            }
            head_start = head_end;
        }
        let sent = self.send_draining(&mut slices);
        drop(slices);
        if let Err(e) = sent {
            // The read side fails these requests along with the others.
            self.shared.kill(format!(
                "{}: sending requests failed: {e}",
                self.shared.name
            ));
        }
        unsent.heads.clear();
        unsent.requests.clear();
        unsent.bytes = 0;
    }

    fn send_draining(&self, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
        // Held throughout: requests must not interleave in the stream. Reading
        // replies meanwhile cannot need it: the requests being sent are in flight,
        // so the read side never finds the connection idle and disconnects.
        let mut writer = lock(&self.shared.writer);
        // Inside TLS, bytes taken are sealed at once; what the socket did not take
        // yet is still ours to send.
        while !slices.is_empty() || writer.has_unsent() {
            match writer.send_now(slices) {
                Ok(0) if !slices.is_empty() => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut fds = [libc::pollfd {
                        fd: writer.as_raw_fd(),
                        events: libc::POLLOUT | libc::POLLIN,
                        revents: 0,
                    }];
                    poll(&mut fds, None)?;
                    if fds[0].revents & libc::POLLIN != 0
                        && reader::pump(&self.shared, false) == reader::Pumped::Busy
                    {
                        // Someone else reads; let them, and wait for room only.
                        fds[0].events = libc::POLLOUT;
                        poll(&mut fds, Some(SELF_READ_WAIT))?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Registers `slot` under a fresh cookie and appends its request header to
    /// `head`; fails without registering when the connection takes no more requests.
    fn register(&self, slot: &Arc<Slot>, flags: u16, head: &mut Vec<u8>) -> Result<(), Error> {
        let cookie = self.shared.next_cookie.fetch_add(1, Ordering::Relaxed);
        let expect = slot.expect;
        {
            let mut table = lock(&self.shared.table);
            if let Some(closed) = &table.closed {
                return Err(closed.error(slot.op, expect.offset, expect.len.into()));
            }
            table.pending.insert(cookie, slot.clone());
        }
        self.started();
        // With extended headers a payload is announced by NBD_CMD_FLAG_PAYLOAD_LEN;
        // only writes carry one.
        let flags = if self.framing == Framing::Extended && expect.command == NBD_CMD_WRITE {
            flags | NBD_CMD_FLAG_PAYLOAD_LEN
        } else {
            flags
        };
        Request {
            flags,
            command: expect.command,
            cookie,
            offset: expect.offset,
            len: expect.len.into(),
        }
        .encode_framed(self.framing, head);
        Ok(())
    }

    /// Registers `slot` and writes its request (and payload); fails without sending
    /// when the connection takes no more requests.
    fn send(&self, slot: &Arc<Slot>, flags: u16, payload: &[u8]) -> Result<(), Error> {
        let mut head = Vec::with_capacity(EXTENDED_REQUEST_LEN);
        self.register(slot, flags, &mut head)?;
        let sent = lock(&self.shared.writer).write_all_vectored(&head, payload);
        if let Err(e) = sent {
            // The read side fails this request along with the others.
            self.shared.kill(format!(
                "{}: sending a request failed: {e}",
                self.shared.name
            ));
        }
        Ok(())
    }

    /// A request was given to this connection.
    pub fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A request sent on this connection has been answered and handed back.
    pub fn finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Closes the connection because `reason` (a request waited too long): every
    /// request in flight fails with a timeout.
    pub fn time_out(&self, reason: String) {
        if self.shared.close(ErrorKind::TimedOut, reason.clone()) {
            tracing::warn!("{reason}");
        }
        self.shared.shutdown();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // No caller can be waiting: they all borrow the device this belongs to.
        let reason = format!("{}: closed by the initiator", self.shared.name);
        if self.shared.close(ErrorKind::Disconnected, reason) {
            self.shared.disconnect();
        } else {
            self.shared.shutdown();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}
