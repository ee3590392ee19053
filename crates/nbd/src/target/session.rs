//! The transmission phase of one connection, without sockets: requests in, replies
//! out. The connection driver reads bytes and sends replies; this decides what each
//! request means, checks it against what was negotiated, runs it on the device, and
//! builds the reply.

use std::os::fd::RawFd;
use std::sync::Arc;

use blockwire_blockdev::{Device, Error, ExtentState, IoBuf, MappedRange, WriteFlags, ZeroFlags};

use super::export::Export;
use crate::errors::nbd_error;
use crate::wire::*;

/// A write payload this much larger than the advertised maximum is read and thrown
/// away (answered with EINVAL); anything larger closes the connection. For a client
/// that never learned our maximum, the limit is twice its own payload limit (see
/// [`Session::set_unnegotiated_payload_limit`]).
const DISCARD_LIMIT: u64 = 64 << 20;
/// The payload limit for clients that did not learn our block sizes, unless the
/// server is configured otherwise: twice the protocol's portable 32 MiB, which
/// covers the 40 MiB requests nbd-server and nbdkit serve.
pub const DEFAULT_UNNEGOTIATED_PAYLOAD_LIMIT: u32 = 64 << 20;
/// Reads at least this long first ask the device whether the range is a hole.
const HOLE_CHECK_MIN: u32 = 64 * 1024;

/// Reads at least this long are sent straight from the page cache when they can be
/// (and the session allows it, see [`Session::set_zero_copy_reads`]).
const ZERO_COPY_MIN: u32 = 64 * 1024;

/// Reads at least this long are sent from a mapping of the cached file when they can
/// be (and the session allows it, see [`Session::set_mapped_reads`]); shorter ones
/// are copied, which lets many of them leave in one vectored write.
const MAPPED_MIN: u32 = 64 * 1024;

/// Reply data that is a range of an open file, sent without copying it through user
/// space. Holds the device so the descriptor stays open until the reply is sent.
#[derive(Debug)]
pub struct FileSlice {
    pub fd: RawFd,
    pub offset: u64,
    pub len: usize,
    _device: Device,
}

/// What follows a reply header.
#[derive(Debug)]
pub enum ReplyData {
    None,
    Buffer(IoBuf),
    File(FileSlice),
    Mapped(MappedSlice),
}

/// Reply data that is a range of a mapped file, copied by the kernel from the page
/// cache into the socket. Holds the device so the mapping lives until it is sent.
#[derive(Debug)]
pub struct MappedSlice {
    pub range: MappedRange,
    _device: Device,
}

/// A reply ready to send: a header and maybe data that follows it.
#[derive(Debug)]
pub struct Reply {
    pub head: Vec<u8>,
    pub data: ReplyData,
}

impl Reply {
    fn head(head: Vec<u8>) -> Reply {
        Reply {
            head,
            data: ReplyData::None,
        }
    }

    /// Bytes this reply puts on the wire.
    pub fn wire_len(&self) -> usize {
        self.head.len()
            + match &self.data {
                ReplyData::None => 0,
                ReplyData::Buffer(buf) => buf.len(),
                ReplyData::File(slice) => slice.len,
                ReplyData::Mapped(slice) => slice.range.len(),
            }
    }
}

/// A request that passed validation and is ready to run on the device.
#[derive(Debug)]
pub enum Job {
    Read {
        cookie: u64,
        offset: u64,
        len: u32,
    },
    Write {
        cookie: u64,
        offset: u64,
        data: IoBuf,
        fua: bool,
    },
    Flush {
        cookie: u64,
        offset: u64,
    },
    Trim {
        cookie: u64,
        offset: u64,
        len: u64,
        fua: bool,
    },
    WriteZeroes {
        cookie: u64,
        offset: u64,
        len: u64,
        flags: ZeroFlags,
    },
    Cache {
        cookie: u64,
        offset: u64,
        len: u64,
    },
    BlockStatus {
        cookie: u64,
        offset: u64,
        len: u64,
        req_one: bool,
    },
}

/// What the connection must do with a request header.
#[derive(Debug)]
pub enum Action {
    /// NBD_CMD_DISC: finish what is in flight and close.
    Disconnect,
    /// Already answered (the request was invalid).
    Reply(Reply),
    /// Run this on the device.
    Execute(Job),
    /// A valid write: read `len` payload bytes, then call [`Session::write_job`].
    ReadPayload(Request),
    /// A valid write larger than the advertised maximum, from a client that never
    /// learned it: stream the payload into the device piece by piece
    /// ([`super::large`]).
    StreamWrite(Request),
    /// A valid read larger than the advertised maximum, from a client that never
    /// learned it: stream the data out piece by piece ([`super::large`]).
    StreamRead(Request),
    /// An invalid request whose payload must still be read and dropped before the
    /// reply is sent, to stay in step with the client.
    DiscardPayload { len: u64, reply: Reply },
    /// The request cannot be answered safely: close the connection.
    Hangup(String),
}

/// The negotiated state of one connection in transmission.
#[derive(Debug)]
pub struct Session {
    export: Arc<Export>,
    device: Device,
    framing: Framing,
    base_allocation: Option<u32>,
    flags: u16,
    zero_copy_reads: bool,
    mapped_reads: bool,
    /// The client asked for NBD_INFO_BLOCK_SIZE in its NBD_OPT_GO, so it promised
    /// to keep to our maximum payload.
    sizes_negotiated: bool,
    /// The largest read or write served to a client that did not negotiate sizes.
    unnegotiated_payload_limit: u32,
}

fn unknown_flags(flags: u16, allowed: u16) -> bool {
    flags & !allowed != 0
}

impl Session {
    /// A session framed as negotiated, for a client that learned our block sizes
    /// (see [`set_sizes_negotiated`](Self::set_sizes_negotiated)).
    pub fn new(
        export: Arc<Export>,
        framing: Framing,
        base_allocation: Option<u32>,
        flags: u16,
    ) -> Session {
        Session {
            device: export.device.clone(),
            export,
            framing,
            base_allocation,
            flags,
            zero_copy_reads: false,
            mapped_reads: false,
            sizes_negotiated: true,
            unnegotiated_payload_limit: DEFAULT_UNNEGOTIATED_PAYLOAD_LIMIT,
        }
    }

    /// Whether the client learned our block sizes (NBD_OPT_GO asking for
    /// NBD_INFO_BLOCK_SIZE). One that did not (NBD_OPT_EXPORT_NAME, or GO without
    /// that request) never promised to keep to our maximum payload; proto.md asks
    /// servers to serve such clients up to the 32 MiB default at least, and peers
    /// serve more, so it gets [`set_unnegotiated_payload_limit`] instead.
    ///
    /// [`set_unnegotiated_payload_limit`]: Self::set_unnegotiated_payload_limit
    pub fn set_sizes_negotiated(&mut self, negotiated: bool) {
        self.sizes_negotiated = negotiated;
    }

    /// The largest read or write served to a client that did not learn our block
    /// sizes ([`DEFAULT_UNNEGOTIATED_PAYLOAD_LIMIT`] unless set). Payloads above the
    /// device's maximum are streamed through bounded buffers, never held whole.
    pub fn set_unnegotiated_payload_limit(&mut self, limit: u32) {
        self.unnegotiated_payload_limit = limit;
    }

    /// Lets large reads of cached file data leave with sendfile(2) instead of being
    /// copied out of the page cache first. Worth it only when the client is on
    /// another machine: a NIC sends the pages without any CPU copy. A client on this
    /// machine then has to copy the page-cache pages itself, cold, on its own CPU:
    /// with fio on loopback that halved sequential-read throughput (1.1-1.4 GB/s
    /// against 2.9-3.2 GB/s copying here, fio at 99% of a core), so it is off unless
    /// the connection says the peer is remote.
    pub fn set_zero_copy_reads(&mut self, on: bool) {
        self.zero_copy_reads = on;
    }

    /// Lets large reads of cached file data go from a mapping of the file to the
    /// socket: one copy, made by the kernel, instead of a pread into a buffer and a
    /// send from it. Only for sinks that send mapped data themselves (plain sockets,
    /// see [`ReplySink::send_mapped`](super::ReplySink::send_mapped)).
    pub fn set_mapped_reads(&mut self, on: bool) {
        self.mapped_reads = on;
    }

    /// The device this session serves.
    pub(super) fn device(&self) -> &Device {
        &self.device
    }

    pub fn export(&self) -> &Arc<Export> {
        &self.export
    }

    /// The transmission flags sent to the client.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    /// Whether replies are chunked (structured replies or extended headers).
    pub fn structured(&self) -> bool {
        self.framing.chunked()
    }

    /// How requests and replies are framed on this connection.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Whether the client learned our block sizes.
    pub fn sizes_negotiated(&self) -> bool {
        self.sizes_negotiated
    }

    /// Whether the device usually finishes without waiting for hardware, so jobs may
    /// run on the connection's own thread.
    fn inline_ok(&self) -> bool {
        self.device.info().completes_inline
    }

    /// The advertised maximum payload: the device's.
    pub(super) fn max_payload(&self) -> u32 {
        self.device.info().block_sizes.maximum
    }

    /// The largest read or write this client is served: the advertised maximum
    /// when it learned it, else the (larger) unnegotiated limit.
    fn payload_limit(&self) -> u64 {
        if self.sizes_negotiated {
            self.max_payload().into()
        } else {
            self.max_payload()
                .max(self.unnegotiated_payload_limit)
                .into()
        }
    }

    /// Payloads above the limit but up to this are read and dropped; larger ones
    /// close the connection.
    fn discard_limit(&self) -> u64 {
        if self.sizes_negotiated {
            DISCARD_LIMIT
        } else {
            DISCARD_LIMIT.max(2 * self.payload_limit())
        }
    }

    /// The chunk framing of the reply to the request `cookie` at `offset`; `None`
    /// for simple replies.
    pub(super) fn chunk_frame(&self, cookie: u64, offset: u64) -> Option<ChunkFrame> {
        match self.framing {
            Framing::Simple => None,
            Framing::Structured => Some(ChunkFrame::structured(cookie)),
            Framing::Extended => Some(ChunkFrame::extended(cookie, offset)),
        }
    }

    /// An error reply for the request `cookie` at `offset`: an error chunk with a
    /// message when replies are chunked, a simple reply otherwise.
    pub fn error_reply(&self, cookie: u64, offset: u64, error: u32, message: &str) -> Reply {
        let mut head = Vec::with_capacity(40 + message.len());
        match self.chunk_frame(cookie, offset) {
            Some(frame) => frame.error(&mut head, error, message),
            None => encode_simple_reply(&mut head, error, cookie),
        }
        Reply::head(head)
    }

    pub(super) fn device_error_reply(&self, cookie: u64, offset: u64, err: &Error) -> Reply {
        tracing::debug!(export = %self.export.name, "request failed: {err}");
        let error = nbd_error(err.kind(), err.op());
        self.error_reply(cookie, offset, error, &err.to_string())
    }

    pub(super) fn ok_reply(&self, cookie: u64, offset: u64) -> Reply {
        let mut head = Vec::with_capacity(EXTENDED_REPLY_LEN);
        match self.framing {
            // Extended headers forbid simple replies altogether.
            Framing::Extended => ChunkFrame::extended(cookie, offset).none(&mut head),
            // Structured replies are only required when there is a payload; a
            // simple reply is shorter and every client accepts it for non-read
            // commands.
            _ => encode_simple_reply(&mut head, 0, cookie),
        }
        Reply::head(head)
    }

    /// Decides what a request header means.
    pub fn classify(&self, request: &Request) -> Action {
        let (cookie, offset) = (request.cookie, request.offset);
        if self.export.is_retired() && request.command != NBD_CMD_DISC {
            // proto.md, "Terminating the transmission phase": a server going away
            // answers new requests with ESHUTDOWN, and the client must then
            // disconnect softly. A write's payload is still read to stay in step.
            let message = "export removed from the server; disconnect";
            return if request.command == NBD_CMD_WRITE {
                self.refuse_payload(request, NBD_ESHUTDOWN, message)
            } else {
                Action::Reply(self.error_reply(cookie, offset, NBD_ESHUTDOWN, message))
            };
        }
        let payload_len =
            self.framing == Framing::Extended && request.flags & NBD_CMD_FLAG_PAYLOAD_LEN != 0;
        if payload_len && request.command != NBD_CMD_WRITE {
            // No other command has a payload form we serve (we do not advertise
            // NBD_FLAG_BLOCK_STATUS_PAYLOAD): consume the payload, then EINVAL.
            return self.refuse_payload(request, NBD_EINVAL, "command takes no payload here");
        }
        let invalid =
            |message: &str| Action::Reply(self.error_reply(cookie, offset, NBD_EINVAL, message));
        let read_only = self.flags & NBD_FLAG_READ_ONLY != 0;
        let refuse_read_only =
            || Action::Reply(self.error_reply(cookie, offset, NBD_EPERM, "export is read-only"));
        // FUA is valid on every command (the spec says clients set it loosely).
        let fua = request.flags & NBD_CMD_FLAG_FUA != 0;
        let len = request.len;
        match request.command {
            NBD_CMD_DISC => Action::Disconnect,
            NBD_CMD_READ => {
                let allowed = NBD_CMD_FLAG_FUA
                    | if self.framing.chunked() {
                        NBD_CMD_FLAG_DF
                    } else {
                        0
                    };
                if unknown_flags(request.flags, allowed) {
                    return invalid("flag not valid for NBD_CMD_READ");
                }
                if len > self.payload_limit() {
                    // proto.md lets a server refuse a large chunked read up front
                    // with EOVERFLOW ("retry with smaller requests"); a client that
                    // agreed to our maximum broke its word, which is EINVAL.
                    let error = if self.sizes_negotiated || !self.framing.chunked() {
                        NBD_EINVAL
                    } else {
                        NBD_EOVERFLOW
                    };
                    let reply = self.error_reply(
                        cookie,
                        offset,
                        error,
                        "read larger than the maximum block size",
                    );
                    return Action::Reply(reply);
                }
                if len > self.max_payload().into() {
                    return match self.refuse_large(request) {
                        None => Action::StreamRead(*request),
                        Some(reply) => Action::Reply(reply),
                    };
                }
                Action::Execute(Job::Read {
                    cookie,
                    offset,
                    len: len as u32,
                })
            }
            NBD_CMD_WRITE => {
                // A write's length is its payload's, with extended headers too,
                // NBD_CMD_FLAG_PAYLOAD_LEN or not: the extension's draft asks
                // clients to set the flag, but qemu (8.2 to 10.x) never does.
                if len > self.payload_limit() {
                    return self.refuse_payload(
                        request,
                        NBD_EINVAL,
                        "write larger than the maximum block size",
                    );
                }
                let flags = if payload_len {
                    request.flags & !NBD_CMD_FLAG_PAYLOAD_LEN
                } else {
                    request.flags
                };
                if unknown_flags(flags, NBD_CMD_FLAG_FUA) {
                    return self.refuse_payload(
                        request,
                        NBD_EINVAL,
                        "flag not valid for NBD_CMD_WRITE",
                    );
                }
                if read_only {
                    return self.refuse_payload(request, NBD_EPERM, "export is read-only");
                }
                if len > self.max_payload().into() {
                    return match self.refuse_large(request) {
                        None => Action::StreamWrite(*request),
                        Some(reply) => Action::DiscardPayload { len, reply },
                    };
                }
                Action::ReadPayload(*request)
            }
            NBD_CMD_FLUSH => {
                if self.flags & NBD_FLAG_SEND_FLUSH == 0 {
                    return invalid("flush is not supported by this export");
                }
                if unknown_flags(request.flags, NBD_CMD_FLAG_FUA) {
                    return invalid("flag not valid for NBD_CMD_FLUSH");
                }
                Action::Execute(Job::Flush { cookie, offset })
            }
            NBD_CMD_TRIM => {
                if read_only {
                    return refuse_read_only();
                }
                if self.flags & NBD_FLAG_SEND_TRIM == 0 {
                    return invalid("trim is not supported by this export");
                }
                if unknown_flags(request.flags, NBD_CMD_FLAG_FUA) {
                    return invalid("flag not valid for NBD_CMD_TRIM");
                }
                Action::Execute(Job::Trim {
                    cookie,
                    offset,
                    len,
                    fua,
                })
            }
            NBD_CMD_WRITE_ZEROES => {
                if read_only {
                    return refuse_read_only();
                }
                if self.flags & NBD_FLAG_SEND_WRITE_ZEROES == 0 {
                    return invalid("write-zeroes is not supported by this export");
                }
                let mut allowed = NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE;
                if self.flags & NBD_FLAG_SEND_FAST_ZERO != 0 {
                    allowed |= NBD_CMD_FLAG_FAST_ZERO;
                }
                if unknown_flags(request.flags, allowed) {
                    return invalid("flag not valid for NBD_CMD_WRITE_ZEROES");
                }
                let flags = ZeroFlags {
                    fua,
                    no_hole: request.flags & NBD_CMD_FLAG_NO_HOLE != 0,
                    fast: request.flags & NBD_CMD_FLAG_FAST_ZERO != 0,
                };
                Action::Execute(Job::WriteZeroes {
                    cookie,
                    offset,
                    len,
                    flags,
                })
            }
            NBD_CMD_CACHE => {
                if unknown_flags(request.flags, NBD_CMD_FLAG_FUA) {
                    return invalid("flag not valid for NBD_CMD_CACHE");
                }
                Action::Execute(Job::Cache {
                    cookie,
                    offset,
                    len,
                })
            }
            NBD_CMD_BLOCK_STATUS => {
                if self.base_allocation.is_none() {
                    return invalid("no metadata context was negotiated");
                }
                if unknown_flags(request.flags, NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE) {
                    return invalid("flag not valid for NBD_CMD_BLOCK_STATUS");
                }
                if len == 0 {
                    return invalid("block status of zero bytes");
                }
                let req_one = request.flags & NBD_CMD_FLAG_REQ_ONE != 0;
                Action::Execute(Job::BlockStatus {
                    cookie,
                    offset,
                    len,
                    req_one,
                })
            }
            other => invalid(&format!("unknown command {other}")),
        }
    }

    /// Refuses a request that carries a payload: the payload is read and dropped
    /// (so the connection stays in step) unless it is so large that reading it would
    /// only serve an attack, in which case the connection is closed.
    fn refuse_payload(&self, request: &Request, error: u32, message: &str) -> Action {
        let len = request.len;
        if len > self.discard_limit() {
            return Action::Hangup(format!("payload of {len} bytes is far beyond the maximum"));
        }
        let reply = self.error_reply(request.cookie, request.offset, error, message);
        Action::DiscardPayload { len, reply }
    }

    /// Checks a read or write to be streamed before any byte of it moves: range and
    /// alignment, so that only a failing device can stop it half way. Returns the
    /// error reply for a request that fails them.
    fn refuse_large(&self, request: &Request) -> Option<Reply> {
        let (op, past_end) = if request.command == NBD_CMD_WRITE {
            (blockwire_blockdev::Op::Write, NBD_ENOSPC)
        } else {
            (blockwire_blockdev::Op::Read, NBD_EINVAL)
        };
        let (cookie, offset, len) = (request.cookie, request.offset, request.len);
        let end = offset.checked_add(len);
        if end.is_none_or(|end| end > self.device.size()) {
            let message = format!(
                "{op} of {len} bytes at offset {offset}: range beyond the end of the device \
                 (device size is {})",
                self.device.size()
            );
            return Some(self.error_reply(cookie, offset, past_end, &message));
        }
        let minimum = u64::from(self.device.info().block_sizes.minimum);
        if !offset.is_multiple_of(minimum) || !len.is_multiple_of(minimum) {
            let message =
                format!("{op} of {len} bytes at offset {offset}: minimum block size is {minimum}");
            return Some(self.error_reply(cookie, offset, NBD_EINVAL, &message));
        }
        None
    }

    /// The job for a write whose payload has been read.
    pub fn write_job(&self, request: &Request, data: IoBuf) -> Job {
        Job::Write {
            cookie: request.cookie,
            offset: request.offset,
            data,
            fua: request.flags & NBD_CMD_FLAG_FUA != 0,
        }
    }

    /// Runs a job if it can finish without blocking on hardware; otherwise hands it
    /// back so the caller can pass it to a worker.
    pub fn execute_inline(&self, job: Job) -> Result<Reply, Job> {
        match job {
            Job::Read {
                cookie,
                offset,
                len,
            } => {
                // Both ask cachestat(2) whether the range is cached: one asks.
                if self.zero_copy_reads && len >= ZERO_COPY_MIN {
                    if let Ok(Some(fd)) = self.device.cached_file(offset, len.into()) {
                        return Ok(self.file_reply(cookie, offset, len, fd));
                    }
                } else if let Some(reply) = self.mapped_reply(cookie, offset, len) {
                    return Ok(reply);
                }
                let mut buf = IoBuf::new(len as usize);
                match self.device.try_read(&mut buf, offset) {
                    Ok(true) => Ok(self.read_reply(cookie, offset, buf)),
                    Ok(false) => Err(Job::Read {
                        cookie,
                        offset,
                        len,
                    }),
                    Err(e) => Ok(self.device_error_reply(cookie, offset, &e)),
                }
            }
            Job::Write { fua: false, .. }
            | Job::Trim { fua: false, .. }
            | Job::BlockStatus { .. }
                if self.inline_ok() =>
            {
                Ok(self.execute(job))
            }
            Job::WriteZeroes { flags, .. } if !flags.fua && self.inline_ok() => {
                Ok(self.execute(job))
            }
            other => Err(other),
        }
    }

    /// Runs a job, blocking as long as the device needs.
    pub fn execute(&self, job: Job) -> Reply {
        let device = &self.device;
        let (cookie, offset, result) = match job {
            Job::Read {
                cookie,
                offset,
                len,
            } => return self.read(cookie, offset, len),
            Job::BlockStatus {
                cookie,
                offset,
                len,
                req_one,
            } => return self.block_status(cookie, offset, len, req_one),
            Job::Write {
                cookie,
                offset,
                data,
                fua,
            } => (
                cookie,
                offset,
                device.write(&data, offset, WriteFlags { fua }),
            ),
            Job::Flush { cookie, offset } => (cookie, offset, device.flush()),
            Job::Trim {
                cookie,
                offset,
                len,
                fua,
            } => (cookie, offset, device.trim(offset, len, WriteFlags { fua })),
            Job::WriteZeroes {
                cookie,
                offset,
                len,
                flags,
            } => (cookie, offset, device.write_zeroes(offset, len, flags)),
            Job::Cache {
                cookie,
                offset,
                len,
            } => (cookie, offset, device.cache(offset, len)),
        };
        match result {
            Ok(()) => self.ok_reply(cookie, offset),
            Err(e) => self.device_error_reply(cookie, offset, &e),
        }
    }

    fn read(&self, cookie: u64, offset: u64, len: u32) -> Reply {
        if let Some(frame) = self.chunk_frame(cookie, offset) {
            if len >= HOLE_CHECK_MIN && matches!(self.device.is_hole(offset, len.into()), Ok(true))
            {
                let mut head = Vec::with_capacity(frame.header_len() + 12);
                frame.offset_hole(&mut head, offset, len, true);
                return Reply::head(head);
            }
        }
        if let Some(reply) = self.mapped_reply(cookie, offset, len) {
            return reply;
        }
        let mut buf = IoBuf::new(len as usize);
        match self.device.read(&mut buf, offset) {
            Ok(()) => self.read_reply(cookie, offset, buf),
            Err(e) => self.device_error_reply(cookie, offset, &e),
        }
    }

    fn read_head(&self, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut head = Vec::with_capacity(EXTENDED_REPLY_LEN + 8);
        match self.chunk_frame(cookie, offset) {
            None => encode_simple_reply(&mut head, 0, cookie),
            Some(frame) if len == 0 => frame.none(&mut head),
            Some(frame) => frame.offset_data_header(&mut head, offset, len, true),
        }
        head
    }

    pub(super) fn read_reply(&self, cookie: u64, offset: u64, data: IoBuf) -> Reply {
        Reply {
            head: self.read_head(cookie, offset, data.len() as u32),
            data: ReplyData::Buffer(data),
        }
    }

    /// A read reply whose data stays in the page cache until the send copies it, when
    /// the session allows it and the range is large and cached.
    fn mapped_reply(&self, cookie: u64, offset: u64, len: u32) -> Option<Reply> {
        if !self.mapped_reads || len < MAPPED_MIN {
            return None;
        }
        let range = self.device.mapped_cached(offset, len.into()).ok()??;
        Some(Reply {
            head: self.read_head(cookie, offset, len),
            data: ReplyData::Mapped(MappedSlice {
                range,
                _device: self.device.clone(),
            }),
        })
    }

    fn file_reply(&self, cookie: u64, offset: u64, len: u32, fd: RawFd) -> Reply {
        let slice = FileSlice {
            fd,
            offset,
            len: len as usize,
            _device: self.device.clone(),
        };
        Reply {
            head: self.read_head(cookie, offset, len),
            data: ReplyData::File(slice),
        }
    }

    fn block_status(&self, cookie: u64, offset: u64, len: u64, req_one: bool) -> Reply {
        let (Some(context), Some(frame)) = (self.base_allocation, self.chunk_frame(cookie, offset))
        else {
            return self.error_reply(
                cookie,
                offset,
                NBD_EINVAL,
                "no metadata context was negotiated",
            );
        };
        let extents = match self.device.extents(offset, len) {
            Ok(extents) => extents,
            Err(e) => return self.device_error_reply(cookie, offset, &e),
        };
        let take = if req_one { 1 } else { extents.len() };
        let descriptors: Vec<(u64, u32)> = extents
            .iter()
            .take(take)
            .map(|extent| {
                let status = match extent.state {
                    ExtentState::Data => 0,
                    ExtentState::Zero => NBD_STATE_ZERO,
                    ExtentState::Hole => NBD_STATE_HOLE | NBD_STATE_ZERO,
                };
                // Extents are clipped to the request, whose length is 32 bits unless
                // extended headers (and with them 64-bit descriptors) are in use.
                (extent.len, status)
            })
            .collect();
        let mut head = Vec::with_capacity(frame.header_len() + 8 + 16 * descriptors.len());
        frame.block_status(&mut head, context, &descriptors, true);
        Reply::head(head)
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
