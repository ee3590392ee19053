//! One connection in transmission: a writer shared by every calling thread and a
//! reader thread that completes requests as their replies arrive, in any order.
//!
//! A caller registers its request (a [`Slot`]) under a fresh cookie, writes header
//! and payload in one vectored write while holding the writer lock, and blocks until
//! the reader thread completes the slot. When the connection ends — the server
//! closes it, a write fails, a reply breaks the protocol — the reader thread fails
//! every request still in flight with [`ErrorKind::Disconnected`], and requests made
//! afterwards fail at once the same way: nothing waits for a server that is gone.

use std::collections::HashMap;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use blockwire_blockdev::{Error, ErrorKind, IoBuf, Op};

use super::details::ExportDetails;
use super::reader;
use super::reply::{Expect, Outcome};
use super::slot::{QueueShared, Slot};
use super::socket::Socket;
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

/// Requests registered but not yet taken up by the reader thread.
#[derive(Default)]
pub(crate) struct Table {
    pub pending: HashMap<u64, Arc<Slot>>,
    pub closed: Option<Closed>,
}

/// State the callers and the reader thread share.
pub(crate) struct Shared {
    /// The write side: one request (header and payload) at a time.
    pub writer: Mutex<Socket>,
    /// A handle to shut the socket down without waiting for the writer lock.
    control: Socket,
    pub table: Mutex<Table>,
    dead: AtomicBool,
    next_cookie: AtomicU64,
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

    /// Hard disconnect: the reader thread wakes up, fails what is in flight and ends.
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
        let mut head = Vec::with_capacity(REQUEST_LEN);
        Request {
            flags: 0,
            command: NBD_CMD_DISC,
            cookie: self.next_cookie.fetch_add(1, Ordering::Relaxed),
            offset: 0,
            len: 0,
        }
        .encode(&mut head);
        let _ = lock(&self.writer).write_all_vectored(&head, &[]);
        self.shutdown();
    }
}

/// One negotiated connection.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
    in_flight: AtomicUsize,
    /// How long a request may wait for its reply before the connection is closed.
    request_timeout: Option<Duration>,
    structured: bool,
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
        let control = socket.try_clone()?;
        let shared = Arc::new(Shared {
            writer: Mutex::new(socket),
            control,
            table: Mutex::new(Table::default()),
            dead: AtomicBool::new(false),
            next_cookie: AtomicU64::new(1),
            name: format!("connection {index} to {address}"),
        });
        let reader = thread::Builder::new()
            .name(format!("nbd-initiator-{index}"))
            .spawn({
                let shared = shared.clone();
                move || reader::run(shared, reader_socket)
            })?;
        Ok(Connection {
            shared,
            reader: Some(reader),
            in_flight: AtomicUsize::new(0),
            request_timeout,
            structured: details.structured,
            context: details.base_allocation_id,
        })
    }

    /// Whether the connection still takes requests.
    pub fn alive(&self) -> bool {
        !self.shared.dead.load(Ordering::Acquire)
    }

    /// How long a request may wait for its reply (`None`: forever).
    pub fn request_timeout(&self) -> Option<Duration> {
        self.request_timeout
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
            structured: self.structured,
            context: self.context,
        };
        // `read_into` stays borrowed until this function returns, which is after
        // the reader thread has completed the slot (slot.rs, ownership rule).
        let slot = Arc::new(Slot::new(expect, op, read_into));
        self.send(&slot, flags, payload)?;
        let result = match self.request_timeout {
            None => slot.wait(),
            Some(limit) => match slot.wait_timeout(limit) {
                Some(result) => result,
                None => {
                    // The caller's buffer is lent to the reader thread: closing the
                    // connection makes it hand every request back, this one with the
                    // timeout as its error.
                    self.time_out(format!(
                        "{}: no reply to {op} at {offset} within {limit:?}; connection closed",
                        self.shared.name
                    ));
                    slot.wait()
                }
            },
        };
        self.finished();
        result
    }

    /// Sends one request without waiting: `buf` is a write's data or a read's
    /// space, owned by the request until its completion (tagged `tag`, from this
    /// connection, number `index`) reaches `queue`. A request the connection cannot
    /// take completes at once with the reason.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        &self,
        op: Op,
        command: u16,
        flags: u16,
        offset: u64,
        buf: IoBuf,
        queue: &Arc<QueueShared>,
        tag: u64,
        index: usize,
    ) {
        let expect = Expect {
            command,
            offset,
            len: buf.len() as u32,
            structured: self.structured,
            context: self.context,
        };
        // The payload is read from the buffer's heap memory, which the slot owns
        // and which only this thread (the queue's) can free, after completion.
        // SAFETY: the memory stays allocated and unchanged until this returns.
        let payload: &[u8] = if op == Op::Write {
            unsafe { std::slice::from_raw_parts(buf.as_ptr(), buf.len()) }
        } else {
            &[]
        };
        let slot = Arc::new(Slot::queued(expect, op, buf, queue.clone(), tag, index));
        if let Err(closed) = self.send(&slot, flags, payload) {
            // Counted like any request, so that the queue's `finished` balances it.
            self.started();
            slot.complete(Err(closed));
        }
    }

    /// Registers `slot` under a fresh cookie and writes its request (and payload);
    /// fails without sending when the connection takes no more requests.
    fn send(&self, slot: &Arc<Slot>, flags: u16, payload: &[u8]) -> Result<(), Error> {
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
        let mut head = Vec::with_capacity(REQUEST_LEN);
        Request {
            flags,
            command: expect.command,
            cookie,
            offset: expect.offset,
            len: expect.len,
        }
        .encode(&mut head);
        let sent = lock(&self.shared.writer).write_all_vectored(&head, payload);
        if let Err(e) = sent {
            // The reader thread fails this request along with the others.
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
