//! Reads and writes larger than the advertised maximum payload, for clients that
//! never learned it (NBD_OPT_EXPORT_NAME, or NBD_OPT_GO without
//! NBD_INFO_BLOCK_SIZE). Peers serve such clients 40 MiB requests and more, but hold
//! the whole payload in memory (shared/FINDINGS.md: GiBs with a few clients); here
//! the data moves through one buffer of at most [`STREAM_PIECE`] bytes per
//! connection, between the socket and the device.
//!
//! [`Session::classify`] has checked the range and alignment before anything moves,
//! so only a failing device (or socket) can stop a request half way:
//! - a write keeps reading its payload after a device error (the connection stays in
//!   step) and answers with the error; pieces written before it stay written, as
//!   with any failed write. FUA covers the whole write: one flush after the last
//!   piece, or FUA on every piece when the device cannot flush.
//! - a read reads its first piece before any header leaves, so an early error is an
//!   ordinary error reply. Later, a simple reply has promised all the data and can
//!   only be broken off (proto.md: the server MUST hard-disconnect); a chunked reply
//!   pads its one data chunk with zeroes and ends with an error chunk.

use std::io;

use blockwire_blockdev::{Error, WriteFlags};

use super::session::{Reply, Session};
use super::writer::{ReplySink, ReplyWriter};
use crate::wire::*;

/// Bytes moved between socket and device at a time.
pub const STREAM_PIECE: usize = 4 << 20;

/// Writes a request's payload into the device piece by piece as `read_payload`
/// fills each piece from the socket. Returns the reply, or the socket's error (the
/// connection cannot continue).
pub fn stream_write(
    session: &Session,
    request: &Request,
    mut read_payload: impl FnMut(&mut [u8]) -> io::Result<()>,
) -> io::Result<Reply> {
    let device = session.device();
    let (cookie, offset) = (request.cookie, request.offset);
    let len = usize::try_from(request.len).expect("classify bounds streamed payloads");
    let fua = request.flags & NBD_CMD_FLAG_FUA != 0;
    // A flush after the last piece makes every piece durable at once; a device that
    // cannot flush gets FUA on each piece instead.
    let flush_at_end = fua && device.info().capabilities.flush.is_native();
    let piece_flags = WriteFlags {
        fua: fua && !flush_at_end,
    };
    let mut buf = vec![0u8; STREAM_PIECE.min(len)];
    let mut failed: Option<Error> = None;
    let mut done = 0usize;
    while done < len {
        let piece = &mut buf[..(len - done).min(STREAM_PIECE)];
        read_payload(piece)?;
        if failed.is_none() {
            let at = offset + done as u64;
            failed = device.write(piece, at, piece_flags).err();
        }
        done += piece.len();
    }
    if failed.is_none() && flush_at_end {
        failed = device.flush().err();
    }
    Ok(match failed {
        None => session.ok_reply(cookie, offset),
        Some(e) => session.device_error_reply(cookie, offset, &e),
    })
}

/// Reads a request's range from the device piece by piece and sends it as one
/// reply. Returns an error when the connection must end: the socket failed, or a
/// simple reply could not be completed.
pub fn stream_read<W: ReplySink>(
    session: &Session,
    request: &Request,
    writer: &ReplyWriter<W>,
) -> io::Result<()> {
    let device = session.device();
    let (cookie, offset) = (request.cookie, request.offset);
    let len = usize::try_from(request.len).expect("classify bounds streamed payloads");
    let mut buf = vec![0u8; STREAM_PIECE.min(len)];
    let first = buf.len();
    if let Err(e) = device.read(&mut buf, offset) {
        return writer.send_one(session.device_error_reply(cookie, offset, &e));
    }
    let frame = session.chunk_frame(cookie, offset);
    writer.send_streamed(|sink| {
        let mut head = Vec::with_capacity(EXTENDED_REPLY_LEN + 8);
        match frame {
            None => encode_simple_reply(&mut head, 0, cookie),
            // Not final: an error chunk may still have to follow.
            Some(frame) => frame.offset_data_header(&mut head, offset, len as u32, false),
        }
        sink.write_all(&head)?;
        sink.write_all(&buf)?;
        let mut done = first;
        while done < len {
            let piece = &mut buf[..(len - done).min(STREAM_PIECE)];
            let at = offset + done as u64;
            if let Err(e) = device.read(piece, at) {
                let Some(frame) = frame else {
                    return Err(io::Error::other(format!(
                        "{e}; the simple reply had begun, so the connection is closed"
                    )));
                };
                // The data chunk promised `len` bytes: zeroes for the rest, then the
                // error (proto.md, structured replies to NBD_CMD_READ).
                buf.fill(0);
                while done < len {
                    let pad = (len - done).min(buf.len());
                    sink.write_all(&buf[..pad])?;
                    done += pad;
                }
                let reply = session.device_error_reply(cookie, offset, &e);
                debug_assert!(reply.head.len() >= frame.header_len());
                return sink.write_all(&reply.head);
            }
            sink.write_all(piece)?;
            done += piece.len();
        }
        if let Some(frame) = frame {
            head.clear();
            frame.none(&mut head);
            sink.write_all(&head)?;
        }
        Ok(())
    })
}

#[cfg(test)]
#[path = "large_tests.rs"]
mod tests;
