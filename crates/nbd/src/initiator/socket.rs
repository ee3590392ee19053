//! The initiator's end of a connection, TCP or Unix, in plain text or inside TLS,
//! behind one type.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::error::ClientError;
use super::handshake::StartTls;
use super::uri::{Endpoint, NbdUri};
use crate::tls::{InitiatorTls, TlsStream};

/// A connected socket.
pub(crate) enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A socket after NBD_OPT_STARTTLS: reads decrypt, writes seal (tls/engine.rs).
    Tls(Box<TlsStream<Socket>>),
}

impl std::fmt::Debug for Socket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Socket::Tcp(s) => s.fmt(f),
            Socket::Unix(s) => s.fmt(f),
            Socket::Tls(s) => write!(f, "TLS ({:?}) over {:?}", s.session(), s.socket()),
        }
    }
}

/// The most slices one `sendmsg` takes on Linux; the rest go in the next call.
const IOV_MAX: usize = 1024;

/// How long a TCP connect may take per address before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `host:port` or the socket path, for messages.
pub(crate) fn address_of(uri: &NbdUri) -> String {
    match &uri.endpoint {
        Endpoint::Tcp { host, port } if host.contains(':') => format!("[{host}]:{port}"),
        Endpoint::Tcp { host, port } => format!("{host}:{port}"),
        Endpoint::Unix { socket } => socket.display().to_string(),
    }
}

/// The TLS credentials an `nbds` URI names, loaded (`None` for plain `nbd`).
pub(crate) fn initiator_tls(uri: &NbdUri) -> Result<Option<InitiatorTls>, ClientError> {
    let Some(settings) = &uri.tls else {
        return Ok(None);
    };
    let host = match &uri.endpoint {
        Endpoint::Tcp { host, .. } => Some(host.as_str()),
        Endpoint::Unix { .. } => None,
    };
    InitiatorTls::load(settings, host)
        .map(Some)
        .map_err(|e| ClientError::Tls {
            address: address_of(uri),
            reason: e.to_string(),
        })
}

/// Connects to the server `uri` names and runs `negotiate` on the socket, handing
/// it the TLS upgrade when the URI asks for TLS.
pub(crate) fn connect_and<T>(
    uri: &NbdUri,
    handshake_timeout: Duration,
    negotiate: impl FnOnce(&mut Socket, &str, Option<StartTls<'_, Socket>>) -> Result<T, ClientError>,
) -> Result<(Socket, T), ClientError> {
    let address = address_of(uri);
    let tls = initiator_tls(uri)?;
    let mut socket = Socket::connect(uri)?;
    socket
        .set_read_timeout(Some(handshake_timeout))
        .map_err(|source| ClientError::Io {
            address: address.clone(),
            source,
        })?;
    let mut upgrade = |socket: &mut Socket| match &tls {
        Some(tls) => socket.start_tls(tls, &address),
        None => Ok(()),
    };
    let starttls: Option<StartTls<'_, Socket>> = match tls {
        Some(_) => Some(&mut upgrade),
        None => None,
    };
    let negotiated = negotiate(&mut socket, &address, starttls)?;
    Ok((socket, negotiated))
}

impl Socket {
    /// Connects to the server a URI names, trying each address a host resolves to.
    pub(crate) fn connect(uri: &NbdUri) -> Result<Socket, ClientError> {
        let address = address_of(uri);
        let failed = |source| ClientError::Connect {
            address: address.clone(),
            source,
        };
        match &uri.endpoint {
            Endpoint::Unix { socket } => UnixStream::connect(socket)
                .map(Socket::Unix)
                .map_err(failed),
            Endpoint::Tcp { host, port } => {
                let mut last =
                    io::Error::new(io::ErrorKind::NotFound, "name resolves to no address");
                for addr in (host.as_str(), *port).to_socket_addrs().map_err(failed)? {
                    match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                        Ok(stream) => {
                            // Requests are written whole; never hold a small one back
                            // waiting for an acknowledgement (proto.md, "Protocol phases").
                            stream.set_nodelay(true).map_err(failed)?;
                            return Ok(Socket::Tcp(stream));
                        }
                        Err(e) => last = e,
                    }
                }
                Err(failed(last))
            }
        }
    }

    /// Another handle on the same connection (and TLS session).
    pub(crate) fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
            Socket::Tls(s) => Socket::Tls(Box::new(TlsStream::new(
                s.socket().try_clone()?,
                s.session().clone(),
            ))),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.shutdown(how),
            Socket::Unix(s) => s.shutdown(how),
            Socket::Tls(s) => s.socket().shutdown(how),
        }
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(timeout),
            Socket::Unix(s) => s.set_read_timeout(timeout),
            Socket::Tls(s) => s.socket().set_read_timeout(timeout),
        }
    }

    /// Upgrades the connection to TLS (after the server acknowledged
    /// NBD_OPT_STARTTLS): runs the handshake and from then on reads and writes
    /// through the session.
    pub(crate) fn start_tls(
        &mut self,
        tls: &InitiatorTls,
        address: &str,
    ) -> Result<(), ClientError> {
        if matches!(self, Socket::Tls(_)) {
            return Ok(());
        }
        let session = tls.connect(self).map_err(|e| ClientError::Tls {
            address: address.to_string(),
            reason: e.to_string(),
        })?;
        tracing::debug!("{address}: TLS started: {}", session.description());
        let plain = self.try_clone().map_err(|source| ClientError::Io {
            address: address.to_string(),
            source,
        })?;
        *self = Socket::Tls(Box::new(TlsStream::new(
            plain,
            std::sync::Arc::new(session),
        )));
        Ok(())
    }

    /// Whether data already read from the socket waits inside TLS, so that a reader
    /// must not wait for the socket before taking it.
    pub(crate) fn has_buffered_input(&self) -> bool {
        match self {
            Socket::Tls(s) => s.session().has_buffered_input(),
            _ => false,
        }
    }

    /// Whether sealed bytes from an earlier [`send_now`](Self::send_now) are still
    /// waiting to be sent (call it again, with no slices if need be).
    pub(crate) fn has_unsent(&self) -> bool {
        match self {
            Socket::Tls(s) => s.has_unsent(),
            _ => false,
        }
    }

    /// Ends a TLS session with close_notify; nothing for plain sockets.
    pub(crate) fn close_tls(&mut self) {
        if let Socket::Tls(s) = self {
            s.close();
        }
    }

    /// Writes what the socket takes now of `slices`, without waiting; returns the
    /// bytes written (an [`io::ErrorKind::WouldBlock`] error when none fit). Inside
    /// TLS the bytes taken are sealed at once and what the socket does not take
    /// waits for the next call ([`has_unsent`](Self::has_unsent)).
    pub(crate) fn send_now(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        if let Socket::Tls(s) = self {
            return s.send_now(slices, |socket, cipher| {
                socket.send_plain_now(&[IoSlice::new(cipher)])
            });
        }
        self.send_plain_now(slices)
    }

    fn send_plain_now(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is ABI-compatible with iovec.
        message.msg_iov = slices.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = slices.len().min(IOV_MAX) as _;
        loop {
            // SAFETY: the msghdr points at `slices`, which outlive the call.
            let n = unsafe {
                libc::sendmsg(
                    self.as_raw_fd(),
                    &message,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Writes every byte of `head` then `data` with as few system calls as the
    /// kernel allows (one, usually).
    pub(crate) fn write_all_vectored(&mut self, head: &[u8], data: &[u8]) -> io::Result<()> {
        let total = head.len() + data.len();
        let mut written = 0;
        while written < total {
            let n = if written < head.len() {
                self.write_vectored(&[IoSlice::new(&head[written..]), IoSlice::new(data)])
            } else {
                self.write(&data[written - head.len()..])
            };
            match n {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
            Socket::Tls(s) => s.socket().as_raw_fd(),
        }
    }
}

/// Waits until one of `fds` is ready for its events or `timeout` passes (`None`:
/// no limit); returns how many are ready. An interrupted wait counts as a timeout.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let millis = timeout.map_or(-1, |t| {
        // Round up: a zero-millisecond wait for a sub-millisecond timeout would spin.
        i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
    });
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()` entries.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(n as usize)
}

/// Waits until `fd` has something to read (data, its end or an error), or
/// `timeout` passes; returns whether it has.
pub(crate) fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let mut fds = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    Ok(poll(&mut fds, timeout)? > 0)
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
            Socket::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
            Socket::Tls(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write_vectored(bufs),
            Socket::Unix(s) => s.write_vectored(bufs),
            Socket::Tls(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
