//! Zero-copy write payloads: socket → pipe → file with splice(2).
//!
//! A buffered write otherwise costs two copies on the server (socket into a buffer,
//! buffer into the page cache); splicing skips the first. The whole payload is
//! queued in the pipe before anything reaches the file, so a client that disconnects
//! mid-payload still changes nothing. When the pipe cannot hold the payload the bytes
//! already queued are read back and the normal path continues.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A pipe used to carry write payloads from a socket into a file.
pub struct SplicePipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

/// How filling the pipe from the socket ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Filled {
    /// All requested bytes are in the pipe.
    All,
    /// The pipe filled up after `queued` bytes.
    Full { queued: usize },
    /// The socket reached end of stream after `queued` bytes.
    Closed { queued: usize },
}

fn retry<T: PartialOrd + Default>(mut call: impl FnMut() -> T) -> io::Result<T> {
    loop {
        let result = call();
        if result >= T::default() {
            return Ok(result);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

impl SplicePipe {
    /// A pipe of about `want` bytes; the kernel may give less (pipe-max-size for an
    /// unprivileged process), which [`capacity`](Self::capacity) reports.
    pub fn new(want: usize) -> io::Result<SplicePipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        retry(|| unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        for size in [want, 1 << 20] {
            let size = size.min(libc::c_int::MAX as usize) as libc::c_int;
            // SAFETY: plain fcntl on our own pipe.
            if unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size) } > 0 {
                break;
            }
        }
        // SAFETY: plain fcntl on our own pipe.
        let capacity =
            retry(|| unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) })? as usize;
        Ok(SplicePipe {
            read,
            write,
            capacity,
        })
    }

    /// Bytes the pipe can hold (at best: payload fragments smaller than a page use a
    /// whole slot, so a nearly full pipe can report [`Filled::Full`] earlier).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Moves up to `len` bytes from `socket` into the pipe, waiting for the socket
    /// but never for room in the pipe.
    pub fn fill_from(&self, socket: RawFd, len: usize) -> io::Result<Filled> {
        let mut queued = 0;
        while queued < len {
            let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
            // SAFETY: splice between descriptors we hold; null offsets (socket, pipe).
            let n = unsafe {
                libc::splice(
                    socket,
                    std::ptr::null_mut(),
                    self.write.as_raw_fd(),
                    std::ptr::null_mut(),
                    len - queued,
                    flags,
                )
            };
            match n {
                0 => return Ok(Filled::Closed { queued }),
                n if n > 0 => queued += n as usize,
                _ => {
                    let err = io::Error::last_os_error();
                    match err.raw_os_error() {
                        Some(libc::EINTR) => {}
                        Some(libc::EAGAIN) => return Ok(Filled::Full { queued }),
                        _ => return Err(err),
                    }
                }
            }
        }
        Ok(Filled::All)
    }

    /// Reads exactly `out.len()` queued bytes back out of the pipe.
    pub fn drain_into(&self, out: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < out.len() {
            let rest = &mut out[done..];
            // SAFETY: reading into `rest`, which is valid for its length.
            let n = retry(|| unsafe {
                libc::read(self.read.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len())
            })?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done += n as usize;
        }
        Ok(())
    }

    /// The end a device takes the queued bytes from.
    pub fn read_end(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// Throws away whatever is queued, leaving the pipe empty for the next payload.
    pub fn clear(&self) -> io::Result<()> {
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, the bytes waiting in the pipe.
        retry(|| unsafe { libc::ioctl(self.read.as_raw_fd(), libc::FIONREAD, &mut queued) })?;
        let mut scratch = vec![0u8; (queued as usize).min(1 << 20)];
        let mut left = queued as usize;
        while left > 0 {
            let chunk = left.min(scratch.len());
            self.drain_into(&mut scratch[..chunk])?;
            left -= chunk;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn payload_moves_from_socket_to_file() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(1 << 20).unwrap();
        let options = blockwire_blockdev::FileOptions::default();
        let device = blockwire_blockdev::Device::from_device(
            blockwire_blockdev::FileDevice::open(file.path(), options).unwrap(),
        );
        let pipe = SplicePipe::new(1 << 20).unwrap();
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        client.write_all(&payload).unwrap();
        assert_eq!(
            pipe.fill_from(server.as_raw_fd(), payload.len()).unwrap(),
            Filled::All
        );
        device
            .write_from_pipe(pipe.read_end(), 4096, payload.len() as u64)
            .unwrap();
        let mut back = vec![0u8; payload.len()];
        std::os::unix::fs::FileExt::read_exact_at(file.as_file(), &mut back, 4096).unwrap();
        assert_eq!(back, payload);
    }

    #[test]
    fn a_closed_socket_is_reported_and_queued_bytes_can_be_dropped() {
        let (mut client, server) = UnixStream::pair().unwrap();
        let pipe = SplicePipe::new(1 << 20).unwrap();
        client.write_all(&[1u8; 1000]).unwrap();
        drop(client);
        let filled = pipe.fill_from(server.as_raw_fd(), 5000).unwrap();
        assert_eq!(filled, Filled::Closed { queued: 1000 });
        pipe.clear().unwrap();
        // The pipe is empty again: a fresh payload comes through whole.
        let (mut client, server) = UnixStream::pair().unwrap();
        client.write_all(b"next").unwrap();
        assert_eq!(pipe.fill_from(server.as_raw_fd(), 4).unwrap(), Filled::All);
        let mut out = [0u8; 4];
        pipe.drain_into(&mut out).unwrap();
        assert_eq!(&out, b"next");
    }
}
