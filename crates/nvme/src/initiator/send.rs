//! The sending side of one initiator connection.
//!
//! Three kinds of thread write to the socket: submitters (their capsules, when
//! the socket is free), the reader thread (H2CData answering an R2T) and the
//! connection's writer thread (whatever the others could not send at once). The
//! reader thread must never block on a full socket: the target may be blocked
//! sending to us, and only the reader drains that. So the reader sends its H2CData
//! only without waiting (`MSG_DONTWAIT`); when the socket takes part of it, the
//! rest is left in the [`Link`] as its `resume`, and the writer thread, woken for
//! it, finishes it. Whoever holds the link finishes a resume before writing
//! anything else, and a submitter that finds one queues its bytes instead, so
//! PDUs never interleave on the wire.

use std::io::{IoSlice, Write};
use std::net::{Shutdown, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};

use blockwire_blockdev::IoBuf;

use crate::pdu::DIGEST_LEN;

/// PDUs at least this long are written from their own buffer, not copied into a
/// batch.
const WRITE_ALONE: usize = 64 * 1024;
/// Small PDUs are gathered up to this many bytes per write.
const BATCH: usize = 256 * 1024;
/// Buffers per system call at most (Linux takes 1024).
const MAX_PARTS: usize = 512;

/// The socket's sending side and what a holder must finish first.
pub(crate) struct Link {
    pub stream: TcpStream,
    /// H2CData the reader thread began without waiting: its PDUs and how many of
    /// their bytes are on the wire.
    resume: Option<(Outgoing, usize)>,
}

impl Link {
    pub fn new(stream: TcpStream) -> Link {
        Link {
            stream,
            resume: None,
        }
    }

    /// Whether nothing begun waits to be finished: a new PDU may start.
    pub fn free(&self) -> bool {
        self.resume.is_none()
    }

    /// Finishes what the reader thread began (waiting on the socket as needed).
    fn finish_resume(&mut self) -> std::io::Result<()> {
        if let Some((outgoing, skip)) = self.resume.take() {
            write_all_parts(&mut self.stream, &skipped(&outgoing.parts(), skip))?;
        }
        Ok(())
    }
}

pub(crate) fn lock(link: &Mutex<Link>) -> MutexGuard<'_, Link> {
    link.lock().unwrap_or_else(|e| e.into_inner())
}

/// One H2CData sent from a shared buffer: its header (with digest and padding),
/// the range of the buffer it carries, and its data digest.
pub(crate) struct SharedFrame {
    pub head: Vec<u8>,
    pub data: Range<usize>,
    pub digest: Option<[u8; DIGEST_LEN]>,
}

/// Bytes for the writer thread.
pub(crate) enum Outgoing {
    Bytes(Vec<u8>),
    Pooled(IoBuf),
    /// H2CData PDUs whose data is in a write's buffer.
    Shared {
        buf: Arc<IoBuf>,
        frames: Vec<SharedFrame>,
    },
    /// Nothing new: the link holds a resume to finish.
    Resume,
}

impl Outgoing {
    /// The bytes when they are in one piece.
    fn contiguous(&self) -> Option<&[u8]> {
        match self {
            Outgoing::Bytes(b) => Some(b),
            Outgoing::Pooled(b) => Some(b),
            Outgoing::Shared { .. } | Outgoing::Resume => None,
        }
    }

    /// Every byte, in order, as the buffers that hold them.
    fn parts(&self) -> Vec<&[u8]> {
        match self {
            Outgoing::Bytes(b) => vec![b],
            Outgoing::Pooled(b) => vec![b],
            Outgoing::Shared { buf, frames } => {
                let mut parts = Vec::with_capacity(frames.len() * 3);
                for f in frames {
                    parts.push(&f.head[..]);
                    parts.push(&buf[f.data.clone()]);
                    if let Some(d) = &f.digest {
                        parts.push(&d[..]);
                    }
                }
                parts
            }
            Outgoing::Resume => Vec::new(),
        }
    }
}

/// `parts` without their first `skip` bytes.
fn skipped<'a>(parts: &[&'a [u8]], mut skip: usize) -> Vec<&'a [u8]> {
    let mut rest = Vec::with_capacity(parts.len());
    for part in parts {
        if skip >= part.len() {
            skip -= part.len();
        } else {
            rest.push(&part[skip..]);
            skip = 0;
        }
    }
    rest
}

/// Sends `outgoing` (H2CData, from the reader thread) if the socket is free,
/// without waiting for room: `Ok(Ok(false))` when all of it is on the wire,
/// `Ok(Ok(true))` when the rest is left in the link for the writer thread (then
/// [`Outgoing::Resume`] must be queued to wake it), `Ok(Err(_))` handed back when
/// the socket is busy, `Err` when the socket failed.
pub(crate) fn send_without_waiting(
    link: &Mutex<Link>,
    outgoing: Outgoing,
) -> std::io::Result<Result<bool, Outgoing>> {
    let mut link = match link.try_lock() {
        Ok(link) => link,
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return Ok(Err(outgoing)),
    };
    if !link.free() {
        return Ok(Err(outgoing));
    }
    let parts = outgoing.parts();
    if parts.len() > MAX_PARTS {
        return Ok(Err(outgoing));
    }
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut sent = 0;
    while sent < total {
        match send_some(&link.stream, &skipped(&parts, sent)) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    drop(parts);
    if sent == total {
        return Ok(Ok(false));
    }
    link.resume = Some((outgoing, sent));
    Ok(Ok(true))
}

/// One `sendmsg` that does not wait for room in the socket.
fn send_some(stream: &TcpStream, parts: &[&[u8]]) -> std::io::Result<usize> {
    let iovecs: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: msghdr is plain data; zeroed is an empty header.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = iovecs.as_ptr() as *mut libc::iovec;
    message.msg_iovlen = iovecs.len() as _;
    // SAFETY: every iovec points into a live buffer of `parts` for the whole call,
    // which the kernel only reads.
    let n = unsafe {
        libc::sendmsg(
            stream.as_raw_fd(),
            &message,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Writes every part, in order, with as few system calls as the socket takes.
fn write_all_parts(stream: &mut TcpStream, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut parts: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    let mut first = 0;
    while first < parts.len() {
        let last = parts.len().min(first + MAX_PARTS);
        let slices: Vec<IoSlice<'_>> = parts[first..last].iter().map(|p| IoSlice::new(p)).collect();
        let mut written = match stream.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while first < parts.len() && written >= parts[first].len() {
            written -= parts[first].len();
            first += 1;
        }
        if written > 0 {
            parts[first] = &parts[first][written..];
        }
    }
    Ok(())
}

/// Writes `parts` on the link once what was begun there is finished.
fn write_on(link: &Mutex<Link>, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut link = lock(link);
    link.finish_resume()?;
    write_all_parts(&mut link.stream, parts)
}

/// The writer thread: writes whatever is queued, small PDUs that pile up gathered
/// into one write, large ones from their own buffers.
pub(crate) fn write_loop(link: Arc<Mutex<Link>>, queued: Receiver<Outgoing>) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Ok(first) = queued.recv() {
        let mut next = Some(first);
        let mut written = Ok(());
        while let Some(outgoing) = next.take() {
            match outgoing.contiguous() {
                Some(bytes) if bytes.len() < WRITE_ALONE => batch.extend_from_slice(bytes),
                _ => {
                    if !batch.is_empty() {
                        written = written.and_then(|()| write_on(&link, &[&batch]));
                        batch.clear();
                    }
                    written = written.and_then(|()| write_on(&link, &outgoing.parts()));
                }
            }
            // The shared buffer goes back to its command before the answer
            // can arrive (almost always).
            drop(outgoing);
            if batch.len() < BATCH {
                next = queued.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            written = written.and_then(|()| write_on(&link, &[&batch]));
            batch.clear();
        }
        if written.is_err() {
            // The reader sees the shutdown and fails what is in flight.
            let _ = lock(&link).stream.shutdown(Shutdown::Both);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipping_cuts_across_parts() {
        let parts: [&[u8]; 3] = [b"abc", b"defg", b"h"];
        assert_eq!(skipped(&parts, 0), parts.to_vec());
        assert_eq!(skipped(&parts, 3), vec![&b"defg"[..], b"h"]);
        assert_eq!(skipped(&parts, 5), vec![&b"fg"[..], b"h"]);
        assert!(skipped(&parts, 8).is_empty());
    }
}
