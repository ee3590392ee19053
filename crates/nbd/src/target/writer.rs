//! Sending replies: one lock around the socket's write side, vectored writes so a
//! header and its data (and many small replies) leave in one system call.

use std::io::{self, IoSlice, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, TryLockError};

use std::os::fd::RawFd;

use blockwire_blockdev::MappedRange;

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

    /// Sends a range of a mapped file. Sockets override this with send(2) on the
    /// mapping's address, so the kernel copies from the page cache (and fails with
    /// EFAULT rather than SIGBUS if the file shrank). Other sinks never get mapped
    /// data: a session only makes it for sockets.
    fn send_mapped(&mut self, range: MappedRange) -> io::Result<()> {
        let _ = range;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "mapped reply data on a sink that cannot send it",
        ))
    }

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
///
/// Whoever has replies queues them and then tries to take the socket; whoever holds
/// it sends everything queued, its own replies and those that arrived meanwhile, in
/// one vectored write, and checks the queue once more after letting go. So a thread
/// with a reply never sleeps on the socket: while one worker sends, the others go back
/// to reading the device, and replies that finish together leave together.
pub struct ReplyWriter<W> {
    sink: Mutex<Sending<W>>,
    queued: Mutex<Queue>,
    broken: AtomicBool,
}

/// Something to run once a reply has left (or been dropped because the connection
/// failed): the sender of a worker's reply gives back what the request held, so
/// replies waiting for the socket still count against the connection's limits.
pub type AfterSent = Box<dyn FnOnce() + Send>;

/// Replies waiting for the socket, and what to run once they have gone.
#[derive(Default)]
struct Queue {
    replies: Vec<Reply>,
    after: Vec<AfterSent>,
}

impl Queue {
    fn is_empty(&self) -> bool {
        self.replies.is_empty() && self.after.is_empty()
    }
}

/// What the thread that holds the socket uses.
struct Sending<W> {
    sink: W,
    /// The batch being sent, swapped with the queue; kept to reuse its allocation.
    batch: Queue,
}

impl<W: ReplySink> ReplyWriter<W> {
    pub fn new(sink: W) -> ReplyWriter<W> {
        ReplyWriter {
            sink: Mutex::new(Sending {
                sink,
                batch: Queue::default(),
            }),
            queued: Mutex::new(Queue::default()),
            broken: AtomicBool::new(false),
        }
    }

    /// Whether an earlier send failed (the client went away).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Queues `replies` (taking them out of the vector, in order) and sends them
    /// unless another thread is sending, which then sends them before it lets go.
    /// An error means the connection has failed (now or before), and later replies
    /// are dropped.
    pub fn send(&self, replies: &mut Vec<Reply>) -> io::Result<()> {
        if !replies.is_empty() {
            lock(&self.queued).replies.append(replies);
            self.send_queued();
        }
        self.health()
    }

    /// [`send`](Self::send) for one reply.
    pub fn send_one(&self, reply: Reply) -> io::Result<()> {
        lock(&self.queued).replies.push(reply);
        self.send_queued();
        self.health()
    }

    /// [`send`](Self::send), running `after` once the replies have gone (on
    /// whichever thread sent them).
    pub fn send_then(&self, replies: &mut Vec<Reply>, after: AfterSent) {
        {
            let mut queued = lock(&self.queued);
            queued.replies.append(replies);
            queued.after.push(after);
        }
        self.send_queued();
    }

    /// [`send_one`](Self::send_one), running `after` once the reply has gone (on
    /// whichever thread sent it).
    pub fn send_one_then(&self, reply: Reply, after: AfterSent) {
        {
            let mut queued = lock(&self.queued);
            queued.replies.push(reply);
            queued.after.push(after);
        }
        self.send_queued();
    }

    /// Gives `stream` the sink to itself, for one reply sent in pieces as its data
    /// is produced: nothing else is sent in between. A failure breaks the writer as
    /// in [`send`](Self::send).
    pub fn send_streamed(&self, stream: impl FnOnce(&mut W) -> io::Result<()>) -> io::Result<()> {
        self.health()?;
        {
            let mut sending = lock(&self.sink);
            if let Err(e) = stream(&mut sending.sink) {
                self.fail(&mut sending.sink);
                return Err(e);
            }
        }
        // Replies queued meanwhile found the socket taken.
        self.send_queued();
        self.health()
    }

    /// Sends raw bytes (handshake).
    pub fn send_bytes(&self, bytes: &[u8]) -> io::Result<()> {
        lock(&self.sink).sink.write_all(bytes)
    }

    fn health(&self) -> io::Result<()> {
        if self.is_broken() {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection already failed",
            ));
        }
        Ok(())
    }

    fn fail(&self, sink: &mut W) {
        self.broken.store(true, Ordering::Relaxed);
        sink.abandon();
    }

    /// Sends what is queued if the socket is free, until the queue stays empty.
    fn send_queued(&self) {
        loop {
            let mut guard = match self.sink.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                // The holder checks the queue again after letting go.
                Err(TryLockError::WouldBlock) => return,
            };
            let sending = &mut *guard;
            loop {
                std::mem::swap(&mut *lock(&self.queued), &mut sending.batch);
                if sending.batch.is_empty() {
                    break;
                }
                let replies = &sending.batch.replies;
                if !self.is_broken() && send_all(&mut sending.sink, replies).is_err() {
                    self.fail(&mut sending.sink);
                }
                // Dropping the replies returns their buffers.
                sending.batch.replies.clear();
                for after in sending.batch.after.drain(..) {
                    after();
                }
            }
            drop(guard);
            // A reply queued between the last look and letting go found the socket
            // taken and left it to us.
            if lock(&self.queued).is_empty() {
                return;
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
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
            ReplyData::Mapped(slice) => {
                write_all_vectored(sink, &mut slices, true)?;
                slices.clear();
                sink.send_mapped(slice.range)?;
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
    use std::sync::Arc;

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
        writer.send(&mut replies.into()).unwrap();
        let sending = writer.sink.into_inner().unwrap();
        assert_eq!(sending.sink.0, b"head1data-oneh2");
    }

    /// A sink whose peer has gone.
    struct Gone;

    impl ReplySink for Gone {}

    impl Write for Gone {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn what_follows_a_reply_runs_even_when_the_connection_failed() {
        let writer = ReplyWriter::new(Gone);
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..3 {
            let ran = ran.clone();
            let reply = Reply {
                head: b"head".to_vec(),
                data: ReplyData::None,
            };
            writer.send_one_then(
                reply,
                Box::new(move || {
                    ran.fetch_add(1, Ordering::SeqCst);
                }),
            );
        }
        assert!(writer.is_broken());
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    }

    /// A sink shared with the test, slow enough that senders overlap.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl ReplySink for Shared {}

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            std::thread::yield_now();
            let n = buf.len().min(7);
            self.0.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn replies_from_many_threads_all_leave_whole() {
        let sink = Shared::default();
        let writer = Arc::new(ReplyWriter::new(sink.clone()));
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..200u8 {
                        let reply = Reply {
                            head: vec![b'<', t, i],
                            data: ReplyData::Buffer(IoBuf::from_slice(&[t; 5])),
                        };
                        writer.send_one(reply).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        // Every reply arrived, each in one piece, and each thread's in its order.
        let bytes = sink.0.lock().unwrap().clone();
        assert_eq!(bytes.len(), 8 * 200 * 8);
        let mut next = [0u8; 8];
        for reply in bytes.chunks(8) {
            let (t, i) = (reply[1], reply[2]);
            assert_eq!(reply[0], b'<');
            assert_eq!(&reply[3..], &[t; 5]);
            assert_eq!(i, next[t as usize], "thread {t}'s replies out of order");
            next[t as usize] += 1;
        }
        assert_eq!(next, [200; 8]);
    }
}
