//! The reader thread of one connection: reads reply headers and payloads, lets the
//! reply state of each request decide what they mean, puts read data straight into
//! the caller's buffer and completes requests by cookie. When the stream ends or
//! breaks the protocol it fails everything in flight; it is the only thread that
//! completes requests (slot.rs).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read};
use std::sync::Arc;

use blockwire_blockdev::{Error, ErrorKind};

use super::connection::Shared;
use super::error::error_name;
use super::reply::{Completion, Next, Outcome, ReplyState, Violation};
use super::slot::Slot;
use super::socket::Socket;
use crate::errors::error_kind;
use crate::wire::*;

/// Buffer for reply headers and small replies; large read data bypasses it.
const READ_BUFFER: usize = 64 * 1024;
/// A payload scratch buffer larger than this is freed after use.
const KEEP_SCRATCH: usize = 1 << 20;

/// Why the reader stopped.
enum End {
    /// The server closed the connection between replies.
    Closed,
    Failed(io::Error),
    Violation(String),
}

struct Reader {
    shared: Arc<Shared>,
    input: BufReader<Socket>,
    /// Requests whose structured reply has begun but not ended.
    active: HashMap<u64, (Arc<Slot>, ReplyState)>,
    scratch: Vec<u8>,
    /// NBD_ESHUTDOWN was received: disconnect once nothing is in flight.
    server_shutting_down: bool,
}

/// Runs the reader until the connection ends.
pub(crate) fn run(shared: Arc<Shared>, socket: Socket) {
    let mut reader = Reader {
        shared,
        input: BufReader::with_capacity(READ_BUFFER, socket),
        active: HashMap::new(),
        scratch: Vec::new(),
        server_shutting_down: false,
    };
    let reason = match reader.serve() {
        End::Closed => "the server closed the connection".to_string(),
        End::Failed(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            "the server closed the connection in the middle of a reply".to_string()
        }
        End::Failed(e) => format!("connection failed: {e}"),
        End::Violation(reason) => format!("protocol violation by the server: {reason}"),
    };
    let reason = format!("{}: {reason}", reader.shared.name);
    if reader.shared.close(ErrorKind::Disconnected, reason.clone()) {
        tracing::warn!("{reason}");
    }
    // Dropping the reader fails what is left.
}

impl Drop for Reader {
    /// Fails every request still in flight, also if the thread panicked.
    fn drop(&mut self) {
        let closed = {
            let mut table = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
            let closed = table
                .closed
                .get_or_insert_with(|| super::connection::Closed {
                    kind: ErrorKind::Disconnected,
                    reason: format!("{}: the reader thread stopped", self.shared.name),
                })
                .clone();
            let pending: Vec<_> = table.pending.drain().map(|(_, slot)| slot).collect();
            (closed, pending)
        };
        // A hard disconnect if the server is still there (a protocol violation).
        self.shared.shutdown();
        let (closed, pending) = closed;
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
    fn serve(&mut self) -> End {
        loop {
            // End of stream between replies is a close, not a failure.
            match self.input.fill_buf() {
                Ok([]) => return End::Closed,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return End::Failed(e),
            }
            match self.message() {
                Ok(()) => {}
                Err(end) => return end,
            }
            if self.server_shutting_down && self.idle() {
                tracing::info!(
                    "{}: server is shutting down; disconnecting",
                    self.shared.name
                );
                self.shared.disconnect();
            }
        }
    }

    fn idle(&self) -> bool {
        self.active.is_empty()
            && self
                .shared
                .table
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pending
                .is_empty()
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), End> {
        self.input.read_exact(buf).map_err(End::Failed)
    }

    /// Reads one reply message (a simple reply or one chunk) and acts on it.
    fn message(&mut self) -> Result<(), End> {
        let mut bytes = [0u8; CHUNK_HEADER_LEN];
        self.read_exact(&mut bytes[..SIMPLE_REPLY_LEN])?;
        let header = match ReplyHeader::decode(&bytes[..SIMPLE_REPLY_LEN]) {
            Ok(Some((header, _))) => header,
            Ok(None) => {
                self.read_exact(&mut bytes[SIMPLE_REPLY_LEN..])?;
                match ReplyHeader::decode(&bytes) {
                    Ok(Some((header, _))) => header,
                    _ => unreachable!("a whole chunk header decodes"),
                }
            }
            Err(e) => return Err(End::Violation(format!("reply header has {e}"))),
        };
        let cookie = match header {
            ReplyHeader::Simple { cookie, .. } | ReplyHeader::Chunk { cookie, .. } => cookie,
        };
        let (slot, mut state) = match self.active.remove(&cookie) {
            Some(entry) => entry,
            None => {
                let taken = self
                    .shared
                    .table
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pending
                    .remove(&cookie);
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
                self.complete(&slot, completion);
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
                    // SAFETY: this is the reader thread and the slot is not completed;
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

    fn complete(&mut self, slot: &Slot, completion: Completion) {
        let result: Result<Outcome, Error> = completion.map_err(|error| {
            if error.error == NBD_ESHUTDOWN && !self.server_shutting_down {
                // proto.md: a client receiving NBD_ESHUTDOWN must disconnect softly.
                self.server_shutting_down = true;
                self.shared.close(
                    ErrorKind::ShuttingDown,
                    format!("{}: the server is shutting down", self.shared.name),
                );
            }
            server_error(slot, error)
        });
        slot.complete(result);
    }
}
