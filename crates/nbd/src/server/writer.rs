//! Sending replies: one lock around the socket's write side, vectored writes so a
//! header and its data (and many small replies) leave in one system call.

use std::io::{self, IoSlice, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::session::Reply;

/// Replies batched on the connection thread are sent when they reach this size.
pub const BATCH_BYTES: usize = 256 * 1024;
/// ... or this many replies.
pub const BATCH_REPLIES: usize = 64;

/// The write side of a connection, shared by the connection thread and workers.
pub struct ReplyWriter<W> {
    sink: Mutex<W>,
    broken: AtomicBool,
}

impl<W: Write> ReplyWriter<W> {
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
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(replies.len() * 2);
        for reply in replies {
            slices.push(IoSlice::new(&reply.head));
            if let Some(data) = &reply.data {
                if !data.is_empty() {
                    slices.push(IoSlice::new(data));
                }
            }
        }
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        let result = write_all_vectored(&mut *sink, &mut slices);
        if result.is_err() {
            self.broken.store(true, Ordering::Relaxed);
        }
        result
    }

    /// Sends raw bytes (handshake).
    pub fn send_bytes(&self, bytes: &[u8]) -> io::Result<()> {
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        sink.write_all(bytes)
    }
}

fn write_all_vectored(sink: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    while !slices.is_empty() {
        match sink.write_vectored(slices) {
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
                data: Some(IoBuf::from_slice(b"data-one")),
            },
            Reply {
                head: b"h2".to_vec(),
                data: None,
            },
        ];
        writer.send(&replies).unwrap();
        let sink = writer.sink.into_inner().unwrap();
        assert_eq!(sink.0, b"head1data-oneh2");
    }
}
