//! The initiator's end of a connection, TCP or Unix, behind one type.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::error::ClientError;
use super::uri::{Endpoint, NbdUri};

/// A connected socket.
#[derive(Debug)]
pub(crate) enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

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

    pub(crate) fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.shutdown(how),
            Socket::Unix(s) => s.shutdown(how),
        }
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => s.set_read_timeout(timeout),
            Socket::Unix(s) => s.set_read_timeout(timeout),
        }
    }

    /// Writes every byte of `slices`, in order, with as few system calls as the
    /// kernel allows.
    pub(crate) fn write_all_slices(&mut self, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
        // IOV_MAX on Linux.
        const MAX_SLICES: usize = 1024;
        while !slices.is_empty() {
            let take = slices.len().min(MAX_SLICES);
            match self.write_vectored(&slices[..take]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut slices, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
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

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.read(buf),
            Socket::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write(buf),
            Socket::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => s.write_vectored(bufs),
            Socket::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
