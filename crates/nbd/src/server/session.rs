//! The transmission phase of one connection, without sockets: requests in, replies
//! out. The connection driver reads bytes and sends replies; this decides what each
//! request means, checks it against what was negotiated, runs it on the device, and
//! builds the reply.

use std::os::fd::RawFd;
use std::sync::Arc;

use blockwire_blockdev::{Device, Error, ExtentState, IoBuf, WriteFlags, ZeroFlags};

use super::export::Export;
use crate::errors::nbd_error;
use crate::wire::*;

/// A write payload this much larger than the advertised maximum is read and thrown
/// away (answered with EINVAL); anything larger closes the connection.
const DISCARD_LIMIT: u32 = 64 << 20;
/// Reads at least this long first ask the device whether the range is a hole.
const HOLE_CHECK_MIN: u32 = 64 * 1024;

/// Reads at least this long are sent straight from the page cache when they can be
/// (and the session allows it, see [`Session::set_zero_copy_reads`]).
const ZERO_COPY_MIN: u32 = 64 * 1024;

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
    },
    Trim {
        cookie: u64,
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        cookie: u64,
        offset: u64,
        len: u32,
        flags: ZeroFlags,
    },
    Cache {
        cookie: u64,
        offset: u64,
        len: u32,
    },
    BlockStatus {
        cookie: u64,
        offset: u64,
        len: u32,
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
    /// An invalid write whose payload must still be read and dropped before the
    /// reply is sent, to stay in step with the client.
    DiscardPayload { len: u32, reply: Reply },
    /// The request cannot be answered safely: close the connection.
    Hangup(String),
}

/// The negotiated state of one connection in transmission.
#[derive(Debug)]
pub struct Session {
    export: Arc<Export>,
    device: Device,
    structured: bool,
    base_allocation: Option<u32>,
    flags: u16,
    zero_copy_reads: bool,
}

fn unknown_flags(flags: u16, allowed: u16) -> bool {
    flags & !allowed != 0
}

impl Session {
    pub fn new(
        export: Arc<Export>,
        structured: bool,
        base_allocation: Option<u32>,
        flags: u16,
    ) -> Session {
        Session {
            device: export.device.clone(),
            export,
            structured,
            base_allocation,
            flags,
            zero_copy_reads: false,
        }
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

    pub fn export(&self) -> &Arc<Export> {
        &self.export
    }

    /// The transmission flags sent to the client.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    pub fn structured(&self) -> bool {
        self.structured
    }

    /// Whether the device usually finishes without waiting for hardware, so jobs may
    /// run on the connection's own thread.
    fn inline_ok(&self) -> bool {
        self.device.info().completes_inline
    }

    fn max_payload(&self) -> u32 {
        self.device.info().block_sizes.maximum
    }

    /// An error reply for `cookie`: an error chunk with a message when structured
    /// replies were negotiated, a simple reply otherwise.
    pub fn error_reply(&self, cookie: u64, error: u32, message: &str) -> Reply {
        let mut head = Vec::with_capacity(32 + message.len());
        if self.structured {
            encode_error_chunk(&mut head, cookie, error, message);
        } else {
            encode_simple_reply(&mut head, error, cookie);
        }
        Reply::head(head)
    }

    fn device_error_reply(&self, cookie: u64, err: &Error) -> Reply {
        tracing::debug!(export = %self.export.name, "request failed: {err}");
        self.error_reply(cookie, nbd_error(err.kind(), err.op()), &err.to_string())
    }

    fn ok_reply(&self, cookie: u64) -> Reply {
        let mut head = Vec::with_capacity(SIMPLE_REPLY_LEN);
        // Structured replies are only required when there is a payload; a simple
        // reply is shorter and every client accepts it for non-read commands.
        encode_simple_reply(&mut head, 0, cookie);
        Reply::head(head)
    }

    /// Decides what a request header means.
    pub fn classify(&self, request: &Request) -> Action {
        let cookie = request.cookie;
        let invalid = |message: &str| Action::Reply(self.error_reply(cookie, NBD_EINVAL, message));
        let read_only = self.flags & NBD_FLAG_READ_ONLY != 0;
        let refuse_read_only =
            || Action::Reply(self.error_reply(cookie, NBD_EPERM, "export is read-only"));
        // FUA is valid on every command (the spec says clients set it loosely).
        let fua = request.flags & NBD_CMD_FLAG_FUA != 0;
        let (offset, len) = (request.offset, request.len);
        match request.command {
            NBD_CMD_DISC => Action::Disconnect,
            NBD_CMD_READ => {
                let allowed = NBD_CMD_FLAG_FUA | if self.structured { NBD_CMD_FLAG_DF } else { 0 };
                if unknown_flags(request.flags, allowed) {
                    return invalid("flag not valid for NBD_CMD_READ");
                }
                if len > self.max_payload() {
                    return invalid("read larger than the maximum block size");
                }
                Action::Execute(Job::Read {
                    cookie,
                    offset,
                    len,
                })
            }
            NBD_CMD_WRITE => {
                if len > self.max_payload() {
                    if len > DISCARD_LIMIT {
                        return Action::Hangup(format!(
                            "write payload of {len} bytes is far beyond the maximum"
                        ));
                    }
                    let reply = self.error_reply(
                        cookie,
                        NBD_EINVAL,
                        "write larger than the maximum block size",
                    );
                    return Action::DiscardPayload { len, reply };
                }
                let problem = if unknown_flags(request.flags, NBD_CMD_FLAG_FUA) {
                    Some((NBD_EINVAL, "flag not valid for NBD_CMD_WRITE"))
                } else if read_only {
                    Some((NBD_EPERM, "export is read-only"))
                } else {
                    None
                };
                match problem {
                    Some((error, message)) => Action::DiscardPayload {
                        len,
                        reply: self.error_reply(cookie, error, message),
                    },
                    None => Action::ReadPayload(*request),
                }
            }
            NBD_CMD_FLUSH => {
                if self.flags & NBD_FLAG_SEND_FLUSH == 0 {
                    return invalid("flush is not supported by this export");
                }
                if unknown_flags(request.flags, NBD_CMD_FLAG_FUA) {
                    return invalid("flag not valid for NBD_CMD_FLUSH");
                }
                Action::Execute(Job::Flush { cookie })
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
                if self.zero_copy_reads && len >= ZERO_COPY_MIN {
                    if let Ok(Some(fd)) = self.device.cached_file(offset, len.into()) {
                        return Ok(self.file_reply(cookie, offset, len, fd));
                    }
                }
                let mut buf = IoBuf::new(len as usize);
                match self.device.try_read(&mut buf, offset) {
                    Ok(true) => Ok(self.read_reply(cookie, offset, buf)),
                    Ok(false) => Err(Job::Read {
                        cookie,
                        offset,
                        len,
                    }),
                    Err(e) => Ok(self.device_error_reply(cookie, &e)),
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
        let (cookie, result) = match job {
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
            } => (cookie, device.write(&data, offset, WriteFlags { fua })),
            Job::Flush { cookie } => (cookie, device.flush()),
            Job::Trim {
                cookie,
                offset,
                len,
                fua,
            } => (cookie, device.trim(offset, len.into(), WriteFlags { fua })),
            Job::WriteZeroes {
                cookie,
                offset,
                len,
                flags,
            } => (cookie, device.write_zeroes(offset, len.into(), flags)),
            Job::Cache {
                cookie,
                offset,
                len,
            } => (cookie, device.cache(offset, len.into())),
        };
        match result {
            Ok(()) => self.ok_reply(cookie),
            Err(e) => self.device_error_reply(cookie, &e),
        }
    }

    fn read(&self, cookie: u64, offset: u64, len: u32) -> Reply {
        if self.structured
            && len >= HOLE_CHECK_MIN
            && matches!(self.device.is_hole(offset, len.into()), Ok(true))
        {
            let mut head = Vec::with_capacity(CHUNK_HEADER_LEN + 12);
            encode_offset_hole(&mut head, cookie, offset, len, true);
            return Reply::head(head);
        }
        let mut buf = IoBuf::new(len as usize);
        match self.device.read(&mut buf, offset) {
            Ok(()) => self.read_reply(cookie, offset, buf),
            Err(e) => self.device_error_reply(cookie, &e),
        }
    }

    fn read_head(&self, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
        let mut head = Vec::with_capacity(CHUNK_HEADER_LEN + 8);
        if !self.structured {
            encode_simple_reply(&mut head, 0, cookie);
        } else if len == 0 {
            encode_none_chunk(&mut head, cookie);
        } else {
            encode_offset_data_header(&mut head, cookie, offset, len, true);
        }
        head
    }

    fn read_reply(&self, cookie: u64, offset: u64, data: IoBuf) -> Reply {
        Reply {
            head: self.read_head(cookie, offset, data.len() as u32),
            data: ReplyData::Buffer(data),
        }
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

    fn block_status(&self, cookie: u64, offset: u64, len: u32, req_one: bool) -> Reply {
        let Some(context) = self.base_allocation else {
            return self.error_reply(cookie, NBD_EINVAL, "no metadata context was negotiated");
        };
        let extents = match self.device.extents(offset, len.into()) {
            Ok(extents) => extents,
            Err(e) => return self.device_error_reply(cookie, &e),
        };
        let take = if req_one { 1 } else { extents.len() };
        let descriptors: Vec<(u32, u32)> = extents
            .iter()
            .take(take)
            .map(|extent| {
                let status = match extent.state {
                    ExtentState::Data => 0,
                    ExtentState::Zero => NBD_STATE_ZERO,
                    ExtentState::Hole => NBD_STATE_HOLE | NBD_STATE_ZERO,
                };
                // Extents are clipped to the request, whose length is a u32.
                (extent.len as u32, status)
            })
            .collect();
        let mut head = Vec::with_capacity(CHUNK_HEADER_LEN + 4 + 8 * descriptors.len());
        encode_block_status(&mut head, cookie, context, &descriptors, true);
        Reply::head(head)
    }
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
