//! Sending replies: one lock around the socket's write side, vectored writes so a
//! header and its data (and many small replies) leave in one system call.

use std::io::{self, IoSlice, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use std::os::fd::RawFd;

use super::session::{Reply, ReplyData};

/// Where replies go: a byte stream that can also send a range of a file.
pub trait ReplySink: Write {
    /// Like `write_vectored`, but hints that more data follows at once (MSG_MORE), so
    /// a header is not sent as a packet of its own before file data.
    fn write_vectored_more(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        self.write_vectored(slices)
    }

    /// Gives up on the connection after a failed send, so that whoever waits on its
    /// other direction (the connection thread reading requests) wakes up too.
    /// Sockets shut down both ways; the default does nothing.
    fn abandon(&mut self) {}

    /// Sends `len` bytes of the file `fd` from `offset`. Sockets override this with
    /// sendfile(2), which hands page-cache pages to the socket without a copy; the
    /// default reads and writes.
    fn send_file(&mut self, fd: RawFd, offset: u64, len: usize) -> io::Result<()> {
        let mut buf = vec![0u8; len.min(1 << 20)];
        let mut done = 0usize;
        while done < len {
            let want = (len - done).min(buf.len());
            // SAFETY: buf has room for `want` bytes.
            let n = unsafe {
                libc::pread(
                    fd,
                    buf.as_mut_ptr().cast(),
                    want,
                    (offset + done as u64) as i64,
                )
            };
            if n <= 0 {
                return Err(short_file(n));
            }
            self.write_all(&buf[..n as usize])?;
            done += n as usize;
        }
        Ok(())
    }
}

/// The error for a file that ended (or failed) before a reply's data was sent; the
/// reply header already promised the bytes, so the connection cannot continue.
pub fn short_file(n: isize) -> io::Error {
    if n < 0 {
        io::Error::last_os_error()
    } else {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file shrank while its data was being sent",
        )
    }
}

/// Replies batched on the connection thread are sent when they reach this size.
pub const BATCH_BYTES: usize = 256 * 1024;
/// ... or this many replies.
pub const BATCH_REPLIES: usize = 64;

/// The write side of a connection, shared by the connection thread and workers.
pub struct ReplyWriter<W> {
    sink: Mutex<W>,
    broken: AtomicBool,
}

impl<W: ReplySink> ReplyWriter<W> {
    pub fn new(sink: W) -> ReplyWriter<W> {
        ReplyWriter {
            sink: Mutex::new(sink),
            broken: AtomicBool::new(false),
        }
    }

    /// Whether an earlier send failed (the client went away).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Sends replies in order, all or nothing as far as the caller is concerned: after
    /// an error the writer is broken and later sends do nothing.
    pub fn send(&self, replies: &[Reply]) -> io::Result<()> {
        if replies.is_empty() {
            return Ok(());
        }
        if self.is_broken() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection already failed",
            ));
        }
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        let result = send_all(&mut *sink, replies);
        if result.is_err() {
            self.broken.store(true, Ordering::Relaxed);
            sink.abandon();
        }
        result
    }

    /// Gives `stream` the sink to itself, for one reply sent in pieces as its data
    /// is produced: nothing else is sent in between. A failure breaks the writer as
    /// in [`send`](Self::send).
    pub fn send_streamed(&self, stream: impl FnOnce(&mut W) -> io::Result<()>) -> io::Result<()> {
        if self.is_broken() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection already failed",
            ));
        }
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        let result = stream(&mut sink);
        if result.is_err() {
            self.broken.store(true, Ordering::Relaxed);
            sink.abandon();
        }
        result
    }

    /// Sends raw bytes (handshake).
    pub fn send_bytes(&self, bytes: &[u8]) -> io::Result<()> {
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        sink.write_all(bytes)
    }
}

/// Writes replies with as few system calls as possible: buffers are gathered into
/// one vectored write, interrupted only where a reply's data comes from a file.
fn send_all(sink: &mut impl ReplySink, replies: &[Reply]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(replies.len() * 2);
    for reply in replies {
        slices.push(IoSlice::new(&reply.head));
        match &reply.data {
            ReplyData::None => {}
            ReplyData::Buffer(buf) => {
                if !buf.is_empty() {
                    slices.push(IoSlice::new(buf));
                }
            }
            ReplyData::File(slice) => {
                write_all_vectored(sink, &mut slices, true)?;
                slices.clear();
                sink.send_file(slice.fd, slice.offset, slice.len)?;
            }
        }
    }
    write_all_vectored(sink, &mut slices, false)
}

/// Writes every slice; with `more`, hints that data follows at once (MSG_MORE).
fn write_all_vectored(
    sink: &mut impl ReplySink,
    mut slices: &mut [IoSlice<'_>],
    more: bool,
) -> io::Result<()> {
    while !slices.is_empty() {
        let written = if more {
            sink.write_vectored_more(slices)
        } else {
            sink.write_vectored(slices)
        };
        match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::IoBuf;

    /// A sink that accepts at most 5 bytes per call, to exercise partial writes.
    struct Trickle(Vec<u8>);

    impl ReplySink for Trickle {}

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(5);
            self.0.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_keep_order() {
        let writer = ReplyWriter::new(Trickle(Vec::new()));
        let replies = [
            Reply {
                head: b"head1".to_vec(),
                data: ReplyData::Buffer(IoBuf::from_slice(b"data-one")),
            },
            Reply {
                head: b"h2".to_vec(),
                data: ReplyData::None,
            },
        ];
        writer.send(&replies).unwrap();
        let sink = writer.sink.into_inner().unwrap();
        assert_eq!(sink.0, b"head1data-oneh2");
    }
}
