//! Replies in transmission, without I/O (proto.md, "Simple reply message",
//! "Structured reply chunk message", "Extended reply chunk message", "Structured
//! reply types").
//!
//! A [`ReplyState`] follows the reply to one request. The reader decodes a reply
//! header, hands it in, and is told what to do next: read so many payload bytes and
//! hand them in, read data straight into the request's buffer, fill a hole with
//! zeroes, wait for the next chunk, or complete the request. Anything the protocol
//! forbids — a chunk outside the request, overlapping data, a chunk type the command
//! cannot have, a read that ends with bytes missing — is a [`Violation`], after which
//! the connection cannot be trusted and is dropped.

use std::collections::BTreeMap;

use crate::wire::*;

/// Largest BLOCK_STATUS payload accepted: the protocol asks servers for at most 2^20
/// descriptors per chunk (8 MiB + 4); a little slack beyond that.
const MAX_STATUS_PAYLOAD: u32 = 4 + 8 * (1 << 20) + 4096;
/// The same for BLOCK_STATUS_EXT, whose descriptors take 16 bytes.
const MAX_STATUS_EXT_PAYLOAD: u32 = 8 + 16 * (1 << 20) + 4096;
/// Largest error chunk accepted: a 4 KiB message plus the fixed fields, with slack
/// for unknown error types that carry more.
const MAX_ERROR_PAYLOAD: u32 = 64 * 1024;

/// What a request expects back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// NBD_CMD_*.
    pub command: u16,
    pub offset: u64,
    pub len: u32,
    /// Structured replies (or extended headers) were negotiated on this connection.
    pub structured: bool,
    /// Extended headers were negotiated: every reply is an extended chunk.
    pub extended: bool,
    /// The `base:allocation` context id, for block status.
    pub context: Option<u32>,
}

/// An error the server reported for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// The NBD error value (NBD_EIO, ...).
    pub error: u32,
    /// The human-readable message of an error chunk (empty for simple replies).
    pub message: String,
    /// Where the error happened (NBD_REPLY_TYPE_ERROR_OFFSET).
    pub offset: Option<u64>,
}

/// A request's successful result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Block status descriptors: (length, status flags), from the request's offset.
    /// Status flags beyond 32 bits (extended descriptors) are dropped: no context we
    /// select defines them, and clients must ignore unknown flags.
    Extents(Vec<(u64, u32)>),
}

/// How a request ended.
pub type Completion = Result<Outcome, ServerError>;

/// What the reader does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Read this many payload bytes and pass them to [`ReplyState::payload`].
    Payload(usize),
    /// Read `len` bytes of data into the request's buffer at `at`, then call
    /// [`ReplyState::data_done`].
    Data { at: usize, len: usize },
    /// Fill `len` bytes of the request's buffer at `at` with zeroes, then call
    /// [`ReplyState::data_done`].
    Zeroes { at: usize, len: usize },
    /// This chunk is over; more chunks of the same reply follow.
    More,
    /// The reply is complete.
    Complete(Completion),
}

/// A reply the protocol forbids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Violation(pub String);

fn violation<T>(reason: impl Into<String>) -> Result<T, Violation> {
    Err(Violation(reason.into()))
}

#[derive(Debug, Clone, Copy)]
struct Chunk {
    flags: u16,
    kind: u16,
    len: u32,
}

/// The reply to one request, followed chunk by chunk.
#[derive(Debug)]
pub struct ReplyState {
    expect: Expect,
    /// A structured reply has begun: simple replies are no longer valid.
    started: bool,
    /// A simple reply to a read, whose data is being read.
    simple_read: bool,
    /// The chunk whose payload is expected next.
    chunk: Option<Chunk>,
    /// Content ranges received (start -> end), to refuse overlaps.
    covered: BTreeMap<u64, u64>,
    covered_bytes: u64,
    error: Option<ServerError>,
    extents: Option<Vec<(u64, u32)>>,
}

fn command_name(command: u16) -> &'static str {
    match command {
        NBD_CMD_READ => "read",
        NBD_CMD_WRITE => "write",
        NBD_CMD_FLUSH => "flush",
        NBD_CMD_TRIM => "trim",
        NBD_CMD_CACHE => "cache",
        NBD_CMD_WRITE_ZEROES => "write-zeroes",
        NBD_CMD_BLOCK_STATUS => "block status",
        _ => "unknown command",
    }
}

fn be_u64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().unwrap())
}

fn be_u32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes[..4].try_into().unwrap())
}

impl ReplyState {
    pub fn new(expect: Expect) -> ReplyState {
        ReplyState {
            expect,
            started: false,
            simple_read: false,
            chunk: None,
            covered: BTreeMap::new(),
            covered_bytes: 0,
            error: None,
            extents: None,
        }
    }

    fn name(&self) -> &'static str {
        command_name(self.expect.command)
    }

    /// A simple reply header with `error` arrived.
    pub fn simple(&mut self, error: u32) -> Result<Next, Violation> {
        let command = self.expect.command;
        if self.expect.extended {
            return violation("simple reply after extended headers were negotiated");
        }
        if self.started {
            return violation(format!(
                "simple reply in the middle of the structured reply to a {}",
                self.name()
            ));
        }
        if self.expect.structured && command == NBD_CMD_READ {
            return violation("simple reply to a read after structured replies were negotiated");
        }
        if error != 0 {
            return Ok(Next::Complete(Err(ServerError {
                error,
                message: String::new(),
                offset: None,
            })));
        }
        match command {
            NBD_CMD_BLOCK_STATUS => violation("block status answered by a simple reply"),
            NBD_CMD_READ if self.expect.len > 0 => {
                self.simple_read = true;
                Ok(Next::Data {
                    at: 0,
                    len: self.expect.len as usize,
                })
            }
            _ => Ok(Next::Complete(Ok(Outcome::Done))),
        }
    }

    /// A structured reply chunk header arrived.
    pub fn chunk(&mut self, flags: u16, kind: u16, len: u32) -> Result<Next, Violation> {
        if !self.expect.structured {
            return violation("structured reply chunk, but structured replies were not negotiated");
        }
        if self.expect.extended {
            return violation("structured reply chunk after extended headers were negotiated");
        }
        self.any_chunk(flags, kind, len)
    }

    /// An extended reply chunk header arrived: its offset must repeat the request's,
    /// and its length, 64 bits on the wire, is only ever a payload length (proto.md:
    /// never above 32 bits in practice).
    pub fn extended_chunk(
        &mut self,
        flags: u16,
        kind: u16,
        offset: u64,
        len: u64,
    ) -> Result<Next, Violation> {
        if !self.expect.extended {
            return violation("extended reply chunk, but extended headers were not negotiated");
        }
        if offset != self.expect.offset {
            return violation(format!(
                "extended reply chunk for offset {offset}, but the request was at {}",
                self.expect.offset
            ));
        }
        let Ok(len) = u32::try_from(len) else {
            return violation(format!("extended reply chunk of {len} bytes"));
        };
        self.any_chunk(flags, kind, len)
    }

    fn any_chunk(&mut self, flags: u16, kind: u16, len: u32) -> Result<Next, Violation> {
        self.started = true;
        let command = self.expect.command;
        let wrong_command = || {
            violation(format!(
                "chunk type {kind} in the reply to a {}",
                command_name(command)
            ))
        };
        let need = match kind {
            NBD_REPLY_TYPE_NONE => {
                if len != 0 {
                    return violation(format!("NONE chunk with {len} bytes of payload"));
                }
                if flags & NBD_REPLY_FLAG_DONE == 0 {
                    return violation("NONE chunk without the DONE flag");
                }
                return self.finish();
            }
            NBD_REPLY_TYPE_OFFSET_DATA => {
                if command != NBD_CMD_READ {
                    return wrong_command();
                }
                if len < 9 || len - 8 > self.expect.len {
                    return violation(format!(
                        "data chunk of {len} bytes for a read of {}",
                        self.expect.len
                    ));
                }
                // The offset first; the data goes straight to the caller's buffer.
                8
            }
            NBD_REPLY_TYPE_OFFSET_HOLE => {
                if command != NBD_CMD_READ {
                    return wrong_command();
                }
                if len != 12 {
                    return violation(format!("hole chunk of {len} bytes (must be 12)"));
                }
                12
            }
            NBD_REPLY_TYPE_BLOCK_STATUS => {
                if command != NBD_CMD_BLOCK_STATUS {
                    return wrong_command();
                }
                if self.expect.extended {
                    return violation("32-bit block status chunk with extended headers");
                }
                if len < 12 || !(len - 4).is_multiple_of(8) || len > MAX_STATUS_PAYLOAD {
                    return violation(format!("block status chunk of {len} bytes"));
                }
                len
            }
            NBD_REPLY_TYPE_BLOCK_STATUS_EXT => {
                if command != NBD_CMD_BLOCK_STATUS {
                    return wrong_command();
                }
                if !self.expect.extended {
                    return violation("extended block status chunk without extended headers");
                }
                if len < 24 || !(len - 8).is_multiple_of(16) || len > MAX_STATUS_EXT_PAYLOAD {
                    return violation(format!("extended block status chunk of {len} bytes"));
                }
                len
            }
            kind if kind & (1 << 15) != 0 => {
                let minimum = if kind == NBD_REPLY_TYPE_ERROR_OFFSET {
                    14
                } else {
                    6
                };
                if len < minimum || len > MAX_ERROR_PAYLOAD {
                    return violation(format!("error chunk type {kind} of {len} bytes"));
                }
                len
            }
            _ => return violation(format!("unknown chunk type {kind}")),
        };
        self.chunk = Some(Chunk { flags, kind, len });
        Ok(Next::Payload(need as usize))
    }

    /// The payload bytes [`Next::Payload`] asked for.
    pub fn payload(&mut self, bytes: &[u8]) -> Result<Next, Violation> {
        let Some(chunk) = self.chunk else {
            return violation("payload without a chunk");
        };
        match chunk.kind {
            NBD_REPLY_TYPE_OFFSET_DATA => {
                let offset = be_u64(bytes);
                let len = chunk.len - 8;
                let at = self.content(offset, len, "data")?;
                Ok(Next::Data {
                    at,
                    len: len as usize,
                })
            }
            NBD_REPLY_TYPE_OFFSET_HOLE => {
                let offset = be_u64(bytes);
                let len = be_u32(&bytes[8..]);
                if len == 0 {
                    return violation("hole chunk of zero bytes");
                }
                let at = self.content(offset, len, "hole")?;
                Ok(Next::Zeroes {
                    at,
                    len: len as usize,
                })
            }
            NBD_REPLY_TYPE_BLOCK_STATUS => {
                let (context, descriptors) =
                    decode_block_status(bytes).map_err(|e| Violation(e.to_string()))?;
                let descriptors = descriptors
                    .into_iter()
                    .map(|(len, status)| (u64::from(len), status))
                    .collect();
                self.status(context, descriptors)
            }
            NBD_REPLY_TYPE_BLOCK_STATUS_EXT => {
                let (context, descriptors) =
                    decode_block_status_ext(bytes).map_err(|e| Violation(e.to_string()))?;
                let descriptors = descriptors
                    .into_iter()
                    .map(|(len, status)| (len, status as u32))
                    .collect();
                self.status(context, descriptors)
            }
            kind => {
                self.error_chunk(kind, bytes)?;
                self.end_chunk()
            }
        }
    }

    /// A status chunk's descriptors, checked against the request.
    fn status(&mut self, context: u32, descriptors: Vec<(u64, u32)>) -> Result<Next, Violation> {
        if Some(context) != self.expect.context {
            return violation(format!(
                "block status for metadata context {context}, which was not negotiated"
            ));
        }
        if self.extents.is_some() {
            return violation("two block status chunks for one context");
        }
        if descriptors.iter().any(|&(len, _)| len == 0) {
            return violation("block status descriptor of zero length");
        }
        self.extents = Some(descriptors);
        self.end_chunk()
    }

    /// The data or zeroes of the last [`Next::Data`] / [`Next::Zeroes`] are in place.
    pub fn data_done(&mut self) -> Result<Next, Violation> {
        if self.simple_read {
            return Ok(Next::Complete(Ok(Outcome::Done)));
        }
        self.end_chunk()
    }

    /// Checks a content chunk against the request and earlier chunks; returns its
    /// position in the request's buffer.
    fn content(&mut self, offset: u64, len: u32, what: &str) -> Result<usize, Violation> {
        let start = self.expect.offset;
        let end = start + u64::from(self.expect.len);
        let inside = offset
            .checked_add(u64::from(len))
            .filter(|&chunk_end| offset >= start && chunk_end <= end);
        let Some(chunk_end) = inside else {
            return violation(format!(
                "{what} chunk at {offset}+{len} lies outside the read of {start}+{}",
                self.expect.len
            ));
        };
        let before = self.covered.range(..chunk_end).next_back();
        if before.is_some_and(|(_, &prev_end)| prev_end > offset) {
            return violation(format!(
                "{what} chunk at {offset}+{len} overlaps an earlier chunk"
            ));
        }
        self.covered.insert(offset, chunk_end);
        self.covered_bytes += u64::from(len);
        Ok((offset - start) as usize)
    }

    fn error_chunk(&mut self, kind: u16, bytes: &[u8]) -> Result<(), Violation> {
        let error = be_u32(bytes);
        let message_len = u16::from_be_bytes([bytes[4], bytes[5]]) as usize;
        let fixed = if kind == NBD_REPLY_TYPE_ERROR_OFFSET {
            14
        } else {
            6
        };
        if message_len > bytes.len() - fixed {
            return violation(format!(
                "error chunk message of {message_len} bytes in a {}-byte chunk",
                bytes.len()
            ));
        }
        let message = String::from_utf8_lossy(&bytes[6..6 + message_len]).into_owned();
        let offset = if kind == NBD_REPLY_TYPE_ERROR_OFFSET {
            let offset = be_u64(&bytes[6 + message_len..]);
            let start = self.expect.offset;
            let end = start + u64::from(self.expect.len);
            if offset < start || offset >= end.max(start + 1) {
                return violation(format!(
                    "error offset {offset} lies outside the request at {start}+{}",
                    self.expect.len
                ));
            }
            Some(offset)
        } else {
            None
        };
        let error = match error {
            0 if kind == NBD_REPLY_TYPE_ERROR || kind == NBD_REPLY_TYPE_ERROR_OFFSET => {
                return violation("error chunk with error value 0")
            }
            // An unknown error type still fails the request (proto.md).
            0 => NBD_EINVAL,
            error => error,
        };
        // The first error is the one reported.
        self.error.get_or_insert(ServerError {
            error,
            message,
            offset,
        });
        Ok(())
    }

    fn end_chunk(&mut self) -> Result<Next, Violation> {
        let chunk = self.chunk.take();
        if chunk.is_some_and(|c| c.flags & NBD_REPLY_FLAG_DONE != 0) {
            self.finish()
        } else {
            Ok(Next::More)
        }
    }

    /// The final chunk arrived: the request's result.
    fn finish(&mut self) -> Result<Next, Violation> {
        if let Some(error) = self.error.take() {
            return Ok(Next::Complete(Err(error)));
        }
        match self.expect.command {
            NBD_CMD_READ if self.covered_bytes != u64::from(self.expect.len) => violation(format!(
                "read reply ended with {} of {} bytes sent",
                self.covered_bytes, self.expect.len
            )),
            NBD_CMD_BLOCK_STATUS => match self.extents.take() {
                Some(extents) => Ok(Next::Complete(Ok(Outcome::Extents(extents)))),
                None => violation("block status reply without a status chunk"),
            },
            _ => Ok(Next::Complete(Ok(Outcome::Done))),
        }
    }
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
