//! A connected socket, TCP or Unix, behind one type.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use blockwire_blockdev::MappedRange;

use super::connection::RequestSource;
use super::writer::{short_file, ReplySink};
use crate::tls::TlsStream;

/// A client connection.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        }
    }

    /// How long one send may make no progress before it fails (SO_SNDTIMEO).
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(timeout),
            Stream::Unix(s) => s.set_write_timeout(timeout),
        }
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(timeout),
            Stream::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    /// Sets SO_SNDBUF (the kernel caps it at net.core.wmem_max). Best effort: a
    /// smaller buffer only costs throughput.
    pub fn set_send_buffer(&self, bytes: usize) {
        let bytes = bytes.min(libc::c_int::MAX as usize) as libc::c_int;
        // SAFETY: setsockopt reads one int from the pointer.
        let rc = unsafe {
            libc::setsockopt(
                self.raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&bytes as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!("SO_SNDBUF not set: {}", io::Error::last_os_error());
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    /// Whether the peer is on another machine: a TCP peer whose address is neither
    /// loopback nor this end's own address. Unix socket peers are local.
    pub fn peer_is_remote(&self) -> bool {
        let Stream::Tcp(s) = self else {
            return false;
        };
        match (s.peer_addr(), s.local_addr()) {
            (Ok(peer), Ok(local)) => is_remote(peer.ip(), local.ip()),
            // Unknown: copying is correct either way, only slower for a remote peer.
            _ => false,
        }
    }

    /// The client's IP address (`None` for a Unix socket).
    pub fn peer_ip(&self) -> Option<std::net::IpAddr> {
        match self {
            Stream::Tcp(s) => s.peer_addr().ok().map(|a| a.ip()),
            Stream::Unix(_) => None,
        }
    }

    /// Who is on the other end, for logs.
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "tcp peer".into()),
            Stream::Unix(_) => "unix socket peer".into(),
        }
    }
}

/// Whether a TCP peer at `peer`, seen from our end at `local`, is another machine. A
/// dual-stack listener sees IPv4 peers as IPv4-mapped IPv6 addresses
/// (`::ffff:127.0.0.1`), so both are compared in their canonical form.
fn is_remote(peer: IpAddr, local: IpAddr) -> bool {
    let (peer, local) = (peer.to_canonical(), local.to_canonical());
    !peer.is_loopback() && peer != local
}

impl ReplySink for Stream {
    fn abandon(&mut self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }

    fn write_vectored_more(&mut self, slices: &[io::IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: msghdr is plain data; zeroed is a valid empty header.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec on Unix.
        message.msg_iov = slices.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = slices.len().min(1024) as _;
        // SAFETY: the iovecs point into `slices`, alive for the call.
        let n =
            unsafe { libc::sendmsg(self.raw_fd(), &message, libc::MSG_MORE | libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    fn send_mapped(&mut self, range: MappedRange) -> io::Result<()> {
        let mut left = range;
        while !left.is_empty() {
            // SAFETY: the range lies in a mapping its reply keeps alive; only the
            // kernel reads it.
            let n = unsafe {
                libc::send(
                    self.raw_fd(),
                    left.as_ptr().cast(),
                    left.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // The file shrank under the mapping.
                    Some(libc::EFAULT) => return Err(short_file(0)),
                    _ => return Err(err),
                }
            }
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            left = left.skip(n as usize);
        }
        Ok(())
    }

    fn send_file(&mut self, fd: RawFd, offset: u64, len: usize) -> io::Result<()> {
        let socket = self.raw_fd();
        let mut position = offset as libc::off_t;
        let mut left = len;
        while left > 0 {
            // SAFETY: both descriptors are open; sendfile advances `position`.
            let n = unsafe { libc::sendfile(socket, fd, &mut position, left) };
            if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if n <= 0 {
                return Err(short_file(n));
            }
            left -= n as usize;
        }
        Ok(())
    }
}

/// A connection's write side inside TLS. Replies go through the seal; file data is
/// read and sealed (the default `send_file`), never sent with sendfile(2).
impl ReplySink for TlsStream<Stream> {
    fn abandon(&mut self) {
        let _ = self.socket().shutdown(std::net::Shutdown::Both);
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl RequestSource for Stream {
    fn input_pending(&self) -> bool {
        let mut pending: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, the bytes waiting in the receive queue.
        let rc = unsafe { libc::ioctl(self.raw_fd(), libc::FIONREAD, &mut pending) };
        rc == 0 && pending > 0
    }
}

/// Inside TLS, requests may wait already decrypted (or as ciphertext) in the
/// session as well as in the socket.
impl RequestSource for TlsStream<Stream> {
    fn input_pending(&self) -> bool {
        self.session().has_buffered_input() || self.socket().input_pending()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    use super::{is_remote, Stream};

    #[test]
    fn loopback_and_unix_peers_are_local() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        assert!(!Stream::Tcp(server_side).peer_is_remote());
        assert!(!Stream::Tcp(client).peer_is_remote());
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(!Stream::Unix(a).peer_is_remote());
    }

    #[test]
    fn only_a_peer_at_another_address_is_remote() {
        let ip = |text: &str| text.parse().unwrap();
        assert!(is_remote(ip("192.0.2.7"), ip("192.0.2.1")));
        assert!(is_remote(ip("2001:db8::7"), ip("2001:db8::1")));
        assert!(!is_remote(ip("192.0.2.1"), ip("192.0.2.1")));
        assert!(!is_remote(ip("127.0.0.5"), ip("192.0.2.1")));
        assert!(!is_remote(ip("::1"), ip("::1")));
        // An IPv4 client of a dual-stack listener.
        assert!(!is_remote(ip("::ffff:127.0.0.1"), ip("::ffff:127.0.0.1")));
        assert!(!is_remote(ip("::ffff:127.0.0.1"), ip("::ffff:192.0.2.1")));
        assert!(is_remote(ip("::ffff:192.0.2.7"), ip("::ffff:192.0.2.1")));
    }
}
