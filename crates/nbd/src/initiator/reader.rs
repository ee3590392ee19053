//! The read half of one connection: reads reply headers and payloads, lets the
//! reply state of each request decide what they mean, puts read data straight into
//! the caller's buffer and completes requests by cookie. When the stream ends or
//! breaks the protocol it fails everything in flight.
//!
//! Who reads: the connection's reader thread, except while a request queue uses the
//! connection. A queue reads its replies on its own thread, as libnbd's event loop
//! does, and the reader thread stays away from the socket meanwhile ("parked").
//! Each reply then costs one wake-up (the queue's thread, if it sleeps at all)
//! instead of two, and the queue's sends no longer contend for the socket with a
//! second thread reading it. Whoever reads holds [`ReadSide`]'s lock, so readers
//! never interleave within the stream; a caller that waits for its own reply while
//! the reader thread is parked reads for itself (`Connection::request`).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use blockwire_blockdev::{Error, ErrorKind};

use super::connection::{Closed, Shared};
use super::error::error_name;
use super::reply::{Completion, Next, Outcome, ReplyState, Violation};
use super::slot::Slot;
use super::socket::{wait_readable, Socket};
use crate::errors::error_kind;
use crate::wire::*;

/// Buffer for reply headers and small replies; large read data bypasses it.
const READ_BUFFER: usize = 64 * 1024;
/// A payload scratch buffer larger than this is freed after use.
const KEEP_SCRATCH: usize = 1 << 20;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why reading stopped.
enum End {
    /// The server closed the connection between replies.
    Closed,
    Failed(io::Error),
    Violation(String),
}

/// What a call to [`ReadSide::pump`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pumped {
    /// Read this many reply messages (maybe none) and stopped where no more had
    /// arrived.
    Read(usize),
    /// Another thread is reading (only when asked not to wait for the lock).
    Busy,
    /// The connection has ended; every request on it has been failed.
    Ended,
}

/// The state of reading one connection's stream.
struct Reader {
    input: BufReader<Socket>,
    /// Requests whose structured reply has begun but not ended.
    active: HashMap<u64, (Arc<Slot>, ReplyState)>,
    scratch: Vec<u8>,
    /// NBD_ESHUTDOWN was received: disconnect once nothing is in flight.
    server_shutting_down: bool,
}

/// The read half of a connection and who may read it.
pub(crate) struct ReadSide {
    /// `None` once the connection has ended.
    reader: Mutex<Option<Reader>>,
    fd: RawFd,
    /// Keeps `fd` open after the reader (with its socket) is gone, so the number
    /// never names another connection's socket: a thread still waiting on it would
    /// otherwise wait on, or read from, the wrong connection.
    _fd_owner: Socket,
    ended: AtomicBool,
    /// Request queues reading this connection themselves.
    queues: Mutex<usize>,
    unparked: Condvar,
}

impl ReadSide {
    /// The read half of `socket`; `fd_owner` is another handle on it.
    pub fn new(socket: Socket, fd_owner: Socket) -> ReadSide {
        ReadSide {
            fd: fd_owner.as_raw_fd(),
            _fd_owner: fd_owner,
            reader: Mutex::new(Some(Reader {
                input: BufReader::with_capacity(READ_BUFFER, socket),
                active: HashMap::new(),
                scratch: Vec::new(),
                server_shutting_down: false,
            })),
            ended: AtomicBool::new(false),
            queues: Mutex::new(0),
            unparked: Condvar::new(),
        }
    }

    /// The socket, to wait on for replies.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Whether the connection has ended (and everything on it has been failed).
    pub fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// A request queue starts reading this connection itself.
    pub fn park(&self) {
        *lock(&self.queues) += 1;
    }

    /// A request queue stops reading this connection.
    pub fn unpark(&self) {
        let mut queues = lock(&self.queues);
        *queues -= 1;
        if *queues == 0 {
            self.unparked.notify_all();
        }
    }

    /// Whether a request queue reads this connection (so the reader thread does not).
    pub fn parked(&self) -> bool {
        *lock(&self.queues) > 0
    }

    fn wait_unparked(&self) {
        let mut queues = lock(&self.queues);
        while *queues > 0 {
            queues = self
                .unparked
                .wait(queues)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Takes the reader out for good and fails everything in flight for `end`.
    fn end(&self, reader: &mut Option<Reader>, shared: &Shared, end: End) {
        if let Some(reader) = reader.take() {
            self.ended.store(true, Ordering::Release);
            reader.finish(shared, end);
        }
    }
}

/// Reads and acts on every reply message of `shared`'s connection that has begun to
/// arrive, and returns when none has; a message that has begun is read to its end,
/// waiting for it. With `wait_for_lock` false, returns [`Pumped::Busy`] instead of
/// waiting for another thread that reads.
pub(crate) fn pump(shared: &Shared, wait_for_lock: bool) -> Pumped {
    let side = &shared.read_side;
    let mut guard = if wait_for_lock {
        lock(&side.reader)
    } else {
        match side.reader.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return Pumped::Busy,
        }
    };
    let mut read = 0;
    loop {
        let Some(reader) = guard.as_mut() else {
            return Pumped::Ended;
        };
        let buffered =
            !reader.input.buffer().is_empty() || reader.input.get_ref().has_buffered_input();
        if !buffered && !readable_now(side.fd) {
            return Pumped::Read(read);
        }
        let step = match reader.input.fill_buf() {
            // End of stream between replies is a close, not a failure.
            Ok([]) => Err(End::Closed),
            Ok(_) => reader.message(shared),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(End::Failed(e)),
        };
        if let Err(end) = step {
            side.end(&mut guard, shared, end);
            return Pumped::Ended;
        }
        read += 1;
        if reader.server_shutting_down && reader.idle(shared) {
            tracing::info!("{}: server is shutting down; disconnecting", shared.name);
            shared.disconnect();
        }
    }
}

/// Whether the socket has data (or its end, or an error) to read now.
fn readable_now(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: a one-byte buffer of ours; MSG_PEEK leaves the data in the socket.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
}

/// The reader thread: reads replies until the connection ends, staying away from
/// the socket while a request queue reads it.
pub(crate) fn run(shared: Arc<Shared>) {
    let side = &shared.read_side;
    let _fail_on_panic = FailOnPanic(&shared);
    loop {
        side.wait_unparked();
        // Wait without the reader lock, which a queue may take meanwhile.
        if let Err(e) = wait_readable(side.fd(), None) {
            tracing::debug!("{}: waiting for replies: {e}", shared.name);
            std::thread::sleep(Duration::from_millis(1));
        }
        if side.parked() {
            continue;
        }
        if pump(&shared, true) == Pumped::Ended {
            return;
        }
    }
}

/// Fails everything in flight if the reader thread panics, so no caller waits for
/// a reply nobody will read.
struct FailOnPanic<'a>(&'a Shared);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let side = &self.0.read_side;
            let stopped = io::Error::other("the reader thread stopped");
            side.end(&mut lock(&side.reader), self.0, End::Failed(stopped));
        }
    }
}

impl Reader {
    /// Closes the connection for `end` and fails every request still in flight.
    fn finish(mut self, shared: &Shared, end: End) {
        let mut kind = ErrorKind::Disconnected;
        let reason = match end {
            End::Closed => "the server closed the connection".to_string(),
            End::Failed(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                kind = ErrorKind::TimedOut;
                "the server stopped in the middle of a reply for longer than the request \
                 timeout; connection closed"
                    .to_string()
            }
            End::Failed(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                "the server closed the connection in the middle of a reply".to_string()
            }
            End::Failed(e) => format!("connection failed: {e}"),
            End::Violation(reason) => {
                shared.broken.store(true, Ordering::Release);
                format!("protocol violation by the server: {reason}")
            }
        };
        let reason = format!("{}: {reason}", shared.name);
        if shared.close(kind, reason.clone()) {
            tracing::warn!("{reason}");
        }
        // A hard disconnect if the server is still there (a protocol violation).
        shared.shutdown();
        let (closed, pending): (Closed, Vec<_>) = {
            let mut table = lock(&shared.table);
            let closed = table.closed.clone().expect("closed above");
            (
                closed,
                table.pending.drain().map(|(_, slot)| slot).collect(),
            )
        };
        let active = self.active.drain().map(|(_, (slot, _))| slot);
        for slot in pending.into_iter().chain(active) {
            let expect = slot.expect;
            slot.complete(Err(closed.error(slot.op, expect.offset, expect.len.into())));
        }
    }
}

/// The device error for an error the server reported.
fn server_error(slot: &Slot, error: super::reply::ServerError) -> Error {
    let mut detail = format!("server replied {}", error_name(error.error));
    if !error.message.is_empty() {
        detail.push_str(": ");
        detail.push_str(&error.message);
    }
    if let Some(offset) = error.offset {
        detail.push_str(&format!(" (at offset {offset})"));
    }
    Error::new(
        error_kind(error.error),
        slot.op,
        slot.expect.offset,
        slot.expect.len.into(),
    )
    .with_detail(detail)
}

impl Reader {
    fn idle(&self, shared: &Shared) -> bool {
        self.active.is_empty() && lock(&shared.table).pending.is_empty()
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), End> {
        self.input.read_exact(buf).map_err(End::Failed)
    }

    /// Reads one reply message (a simple reply or one chunk) and acts on it.
    fn message(&mut self, shared: &Shared) -> Result<(), End> {
        // The shortest header first; its magic says how long the header is.
        let mut bytes = [0u8; EXTENDED_REPLY_LEN];
        self.read_exact(&mut bytes[..SIMPLE_REPLY_LEN])?;
        let header = match ReplyHeader::decode(&bytes[..SIMPLE_REPLY_LEN]) {
            Ok(Some((header, _))) => header,
            Ok(None) => {
                let magic = u32::from_be_bytes(bytes[..4].try_into().unwrap());
                let len = if magic == NBD_EXTENDED_REPLY_MAGIC {
                    EXTENDED_REPLY_LEN
                } else {
                    CHUNK_HEADER_LEN
                };
                self.read_exact(&mut bytes[SIMPLE_REPLY_LEN..len])?;
                match ReplyHeader::decode(&bytes[..len]) {
                    Ok(Some((header, _))) => header,
                    _ => unreachable!("a whole reply header decodes"),
                }
            }
            Err(e) => return Err(End::Violation(format!("reply header has {e}"))),
        };
        let cookie = header.cookie();
        let (slot, mut state) = match self.active.remove(&cookie) {
            Some(entry) => entry,
            None => {
                let taken = lock(&shared.table).pending.remove(&cookie);
                match taken {
                    Some(slot) => {
                        let state = ReplyState::new(slot.expect);
                        (slot, state)
                    }
                    None => {
                        return Err(End::Violation(format!(
                            "reply for cookie {cookie:#x}, which no request in flight has"
                        )))
                    }
                }
            }
        };
        // Until it is completed or put back, the slot is only here: if this
        // returns early, fail it as the connection's end fails the others.
        let result = self.drive(&slot, &mut state, header);
        match result {
            Ok(Some(completion)) => {
                self.complete(shared, &slot, completion);
                Ok(())
            }
            Ok(None) => {
                self.active.insert(cookie, (slot, state));
                Ok(())
            }
            Err(end) => {
                self.active.insert(cookie, (slot, state));
                Err(end)
            }
        }
    }

    /// Feeds one message into a request's reply state; `Some` when the reply is
    /// complete.
    fn drive(
        &mut self,
        slot: &Slot,
        state: &mut ReplyState,
        header: ReplyHeader,
    ) -> Result<Option<Completion>, End> {
        let violation = |Violation(reason)| End::Violation(reason);
        let mut next = match header {
            ReplyHeader::Simple { error, .. } => state.simple(error),
            ReplyHeader::Chunk {
                flags, kind, len, ..
            } => state.chunk(flags, kind, len),
            ReplyHeader::Extended {
                flags,
                kind,
                offset,
                len,
                ..
            } => state.extended_chunk(flags, kind, offset, len),
        }
        .map_err(violation)?;
        loop {
            next = match next {
                Next::Payload(n) => {
                    let mut scratch = std::mem::take(&mut self.scratch);
                    scratch.resize(n, 0);
                    let read = self.read_exact(&mut scratch);
                    let next = read.and_then(|()| state.payload(&scratch).map_err(violation));
                    if scratch.capacity() <= KEEP_SCRATCH {
                        self.scratch = scratch;
                    }
                    next?
                }
                Next::Data { at, len } => {
                    // SAFETY: this thread holds the reader lock and the slot is not completed;
                    // the reply state checked `at + len` against the request's length.
                    let buf = unsafe { slot.data(at, len) };
                    self.read_exact(buf)?;
                    state.data_done().map_err(violation)?
                }
                Next::Zeroes { at, len } => {
                    // SAFETY: as for Data.
                    unsafe { slot.data(at, len) }.fill(0);
                    state.data_done().map_err(violation)?
                }
                Next::More => return Ok(None),
                Next::Complete(completion) => return Ok(Some(completion)),
            };
        }
    }

    fn complete(&mut self, shared: &Shared, slot: &Slot, completion: Completion) {
        let result: Result<Outcome, Error> = completion.map_err(|error| {
            if error.error == NBD_ESHUTDOWN && !self.server_shutting_down {
                // proto.md: a client receiving NBD_ESHUTDOWN must disconnect softly.
                self.server_shutting_down = true;
                shared.close(
                    ErrorKind::ShuttingDown,
                    format!("{}: the server is shutting down", shared.name),
                );
            }
            server_error(slot, error)
        });
        slot.complete(result);
    }
}
