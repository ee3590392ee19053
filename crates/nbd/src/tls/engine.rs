//! One TLS session, driven over in-memory buffers so that its two directions can be
//! used from different threads at once.
//!
//! OpenSSL's session object is not safe to use from two threads at once, yet an NBD
//! connection reads on one thread while others write (the target's worker pool
//! sends replies; the initiator's callers send requests while its reader thread
//! waits for replies). Reading a socket can block for as long as the peer stays
//! silent, so the session must never be held across socket I/O. Here the session
//! reads and writes a [`Pipe`] in memory only: ciphertext read from the socket is
//! pushed into the pipe, decrypted under a short lock, and encryption fills the
//! pipe with ciphertext that the writer then sends with the lock released. Writers
//! are already serialised by their callers (one write lock per connection), and
//! each takes out every ciphertext byte produced before its own under the session
//! lock, so records leave in the order they were sealed.

use std::io::{self, IoSlice, Read, Write};
use std::sync::{Mutex, MutexGuard};

use openssl::ssl::{ErrorCode, Ssl, SslStream};

use super::TlsError;

/// Plaintext is sealed into records of at most this size (the TLS maximum): small
/// pieces of one vectored write (a reply header, then its data) are gathered up to
/// it, so they cost one record rather than one each.
const RECORD: usize = 16 * 1024;
/// Ciphertext read from the socket at a time.
const CIPHER_READ: usize = 64 * 1024;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The session's side of the socket: ciphertext that arrived and is not yet
/// decrypted, and ciphertext produced and not yet taken out to be sent.
#[derive(Default)]
struct Pipe {
    incoming: Vec<u8>,
    consumed: usize,
    outgoing: Vec<u8>,
}

impl Pipe {
    fn push(&mut self, cipher: &[u8]) {
        if self.consumed == self.incoming.len() {
            self.incoming.clear();
            self.consumed = 0;
        } else if self.consumed > self.incoming.len() / 2 {
            self.incoming.drain(..self.consumed);
            self.consumed = 0;
        }
        self.incoming.extend_from_slice(cipher);
    }

    fn unread(&self) -> usize {
        self.incoming.len() - self.consumed
    }
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = &self.incoming[self.consumed..];
        if available.is_empty() {
            // OpenSSL reports this as WANT_READ: the caller reads the socket.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = available.len().min(buf.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consumed += n;
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.outgoing.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The sealing state of one session plus a staging buffer for small writes.
struct Engine {
    stream: SslStream<Pipe>,
    stage: Vec<u8>,
}

impl Engine {
    fn seal(&mut self, plain: &[u8]) -> io::Result<()> {
        let mut done = 0;
        while done < plain.len() {
            // The pipe takes every byte, so OpenSSL never asks to wait.
            done += self
                .stream
                .ssl_write(&plain[done..])
                .map_err(tls_io_error)?;
        }
        Ok(())
    }

    /// Decrypts whatever further whole records have already arrived into `buf`, as
    /// a socket read returns all that is there: one record holds only the few
    /// requests the peer sent together, and a reader that came back for each would
    /// answer them in smaller batches. Stops at the first record not all there (an
    /// error or the end stays for the next call, which meets it again).
    fn read_more(&mut self, buf: &mut [u8]) -> usize {
        let mut total = 0;
        while total < buf.len()
            && (self.stream.get_ref().unread() > 0 || self.stream.ssl().pending() > 0)
        {
            match self.stream.ssl_read(&mut buf[total..]) {
                Ok(n) => total += n,
                Err(_) => break,
            }
        }
        total
    }

    fn seal_stage(&mut self) -> io::Result<()> {
        if self.stage.is_empty() {
            return Ok(());
        }
        let stage = std::mem::take(&mut self.stage);
        let result = self.seal(&stage);
        self.stage = stage;
        self.stage.clear();
        result
    }
}

/// An established TLS session, shared by the threads that read and write one
/// connection.
pub struct TlsSession {
    engine: Mutex<Engine>,
    /// The protocol version and cipher, for logs.
    description: String,
    /// Whether the peer showed a certificate.
    peer_certified: bool,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.description)
    }
}

fn tls_io_error(e: openssl::ssl::Error) -> io::Error {
    match e.into_io_error() {
        Ok(e) => e,
        Err(e) => io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")),
    }
}

/// Sends everything the session produced (handshake messages, alerts).
fn send_outgoing<S: Write>(engine: &mut Engine, socket: &mut S) -> io::Result<()> {
    let outgoing = std::mem::take(&mut engine.stream.get_mut().outgoing);
    let result = socket.write_all(&outgoing);
    let pipe = engine.stream.get_mut();
    if pipe.outgoing.is_empty() {
        pipe.outgoing = outgoing;
        pipe.outgoing.clear();
    }
    result
}

/// Runs the handshake of `ssl` (in accept or connect state) over a blocking
/// `socket`, on the calling thread. `describe` turns OpenSSL's error into the one
/// line that is logged or returned (it sees the session, to say which identity or
/// certificate was refused).
pub fn handshake<S: Read + Write>(
    ssl: Ssl,
    socket: &mut S,
    describe: impl Fn(&openssl::ssl::SslRef, &openssl::ssl::Error) -> String,
) -> Result<TlsSession, TlsError> {
    let stream = SslStream::new(ssl, Pipe::default())
        .map_err(|e| TlsError::Handshake(format!("cannot start TLS: {e}")))?;
    let mut engine = Engine {
        stream,
        stage: Vec::with_capacity(RECORD),
    };
    let mut buf = vec![0u8; CIPHER_READ];
    loop {
        match engine.stream.do_handshake() {
            Ok(()) => {
                send_outgoing(&mut engine, socket)
                    .map_err(|e| TlsError::Handshake(format!("sending the handshake: {e}")))?;
                break;
            }
            Err(e) if e.code() == ErrorCode::WANT_READ => {
                send_outgoing(&mut engine, socket)
                    .map_err(|e| TlsError::Handshake(format!("sending the handshake: {e}")))?;
                let n = loop {
                    match socket.read(&mut buf) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        other => break other,
                    }
                };
                match n {
                    Ok(0) => {
                        return Err(TlsError::Handshake(
                            "the peer closed the connection during the TLS handshake".into(),
                        ))
                    }
                    Ok(n) => engine.stream.get_mut().push(&buf[..n]),
                    Err(e) => {
                        return Err(TlsError::Handshake(format!(
                            "reading the TLS handshake: {e}"
                        )))
                    }
                }
            }
            Err(e) => {
                // Best effort: the alert tells the peer why.
                let _ = send_outgoing(&mut engine, socket);
                return Err(TlsError::Handshake(describe(engine.stream.ssl(), &e)));
            }
        }
    }
    let ssl = engine.stream.ssl();
    let description = format!(
        "{} {}",
        ssl.version_str(),
        ssl.current_cipher().map_or("", |c| c.name())
    );
    let peer_certified = ssl.peer_certificate().is_some();
    Ok(TlsSession {
        engine: Mutex::new(engine),
        description,
        peer_certified,
    })
}

impl TlsSession {
    /// Protocol version and cipher, e.g. "TLSv1.3 TLS_AES_256_GCM_SHA384".
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Whether the peer authenticated with a certificate (rather than a key).
    pub fn peer_certified(&self) -> bool {
        self.peer_certified
    }

    /// Decrypts into `buf` what has arrived; reads ciphertext from `socket` (with
    /// the session unlocked) until at least one byte of plaintext is there. `Ok(0)`
    /// at the end of the stream (close_notify, or the socket's end between records).
    pub fn read<S: Read>(
        &self,
        socket: &mut S,
        buf: &mut [u8],
        scratch: &mut Vec<u8>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut engine = lock(&self.engine);
                match engine.stream.ssl_read(buf) {
                    Ok(n) => return Ok(n + engine.read_more(&mut buf[n..])),
                    Err(e) if e.code() == ErrorCode::ZERO_RETURN => return Ok(0),
                    Err(e) if e.code() == ErrorCode::WANT_READ => {}
                    Err(e) => return Err(tls_io_error(e)),
                }
            }
            scratch.resize(CIPHER_READ, 0);
            let n = loop {
                match socket.read(scratch) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    other => break other?,
                }
            };
            if n == 0 {
                if lock(&self.engine).stream.get_ref().unread() > 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection ended in the middle of a TLS record",
                    ));
                }
                return Ok(0);
            }
            lock(&self.engine).stream.get_mut().push(&scratch[..n]);
        }
    }

    /// Whether ciphertext or plaintext is waiting in the session, so that a reader
    /// must not wait for the socket before it has read it.
    pub fn has_buffered_input(&self) -> bool {
        let engine = lock(&self.engine);
        engine.stream.get_ref().unread() > 0 || engine.stream.ssl().pending() > 0
    }

    /// Seals `slices` in order and appends the ciphertext (with any produced before
    /// it, such as an answer to the peer's key update) to `cipher`.
    pub fn seal(&self, slices: &[IoSlice<'_>], cipher: &mut Vec<u8>) -> io::Result<()> {
        let mut engine = lock(&self.engine);
        for slice in slices {
            let mut rest: &[u8] = slice;
            if !engine.stage.is_empty() {
                // Top the staged pieces (a reply header, say) up to a full record
                // with the start of this slice, rather than sealing them alone.
                let room = RECORD.saturating_sub(engine.stage.len()).min(rest.len());
                engine.stage.extend_from_slice(&rest[..room]);
                rest = &rest[room..];
                if engine.stage.len() >= RECORD {
                    engine.seal_stage()?;
                }
            }
            if rest.len() >= RECORD {
                engine.seal(rest)?;
            } else {
                engine.stage.extend_from_slice(rest);
            }
        }
        engine.seal_stage()?;
        take_outgoing(&mut engine, cipher);
        Ok(())
    }

    /// Appends a close_notify alert (the orderly end of the session) to `cipher`.
    pub fn close(&self, cipher: &mut Vec<u8>) {
        let mut engine = lock(&self.engine);
        let _ = engine.stream.shutdown();
        take_outgoing(&mut engine, cipher);
    }
}

fn take_outgoing(engine: &mut Engine, cipher: &mut Vec<u8>) {
    let outgoing = &mut engine.stream.get_mut().outgoing;
    if cipher.is_empty() {
        std::mem::swap(cipher, outgoing);
    } else {
        cipher.append(outgoing);
    }
}

/// One end of a TLS connection over a socket: reads decrypt, writes encrypt and
/// send. Clones of one socket, each with the same shared session, let one thread
/// read while another writes.
pub struct TlsStream<S> {
    socket: S,
    session: std::sync::Arc<TlsSession>,
    scratch: Vec<u8>,
    cipher: Vec<u8>,
    /// Ciphertext sealed but not yet sent ([`send_now`](Self::send_now)), from
    /// `unsent_at` on.
    unsent_at: usize,
}

impl<S> TlsStream<S> {
    /// `socket` (one handle on the connection) read and written through `session`.
    pub fn new(socket: S, session: std::sync::Arc<TlsSession>) -> TlsStream<S> {
        TlsStream {
            socket,
            session,
            scratch: Vec::new(),
            cipher: Vec::new(),
            unsent_at: 0,
        }
    }

    /// The socket underneath, for what bypasses TLS (shutdown, timeouts, polling).
    pub fn socket(&self) -> &S {
        &self.socket
    }

    /// The session, shared with the other handles on the same connection.
    pub fn session(&self) -> &std::sync::Arc<TlsSession> {
        &self.session
    }

    /// Whether sealed ciphertext still waits to be sent (after [`send_now`]).
    ///
    /// [`send_now`]: Self::send_now
    pub fn has_unsent(&self) -> bool {
        self.unsent_at < self.cipher.len()
    }
}

impl<S: Write> TlsStream<S> {
    /// Sends what an earlier [`send_now`](Self::send_now) left, waiting as the
    /// socket does.
    fn flush_unsent(&mut self) -> io::Result<()> {
        if self.has_unsent() {
            self.socket.write_all(&self.cipher[self.unsent_at..])?;
        }
        self.cipher.clear();
        self.unsent_at = 0;
        Ok(())
    }

    /// Ends the session with close_notify (best effort: the connection is closing).
    pub fn close(&mut self) {
        if self.flush_unsent().is_ok() {
            self.session.close(&mut self.cipher);
            let _ = self.socket.write_all(&self.cipher);
        }
        self.cipher.clear();
    }

    /// Seals and sends without waiting for the socket: `try_send` writes what the
    /// socket takes now (an [`io::ErrorKind::WouldBlock`] error when nothing).
    /// Returns the plaintext bytes taken (at most about 256 KiB per call); sealed
    /// bytes the socket did not take are kept and go first on the next call, which
    /// fails with WouldBlock until they are all out. Call with no slices to send
    /// only those.
    pub fn send_now(
        &mut self,
        slices: &[IoSlice<'_>],
        try_send: impl Fn(&S, &[u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        const TAKE: usize = 256 * 1024;
        while self.has_unsent() {
            match try_send(&self.socket, &self.cipher[self.unsent_at..])? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => self.unsent_at += n,
            }
        }
        self.cipher.clear();
        self.unsent_at = 0;
        let mut taken = 0;
        let mut end = 0;
        for slice in slices {
            if taken >= TAKE {
                break;
            }
            taken += slice.len();
            end += 1;
        }
        if taken == 0 {
            return Ok(0);
        }
        self.session.seal(&slices[..end], &mut self.cipher)?;
        match try_send(&self.socket, &self.cipher) {
            Ok(n) => self.unsent_at = n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        Ok(taken)
    }
}

impl<S: Read> Read for TlsStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.session.read(&mut self.socket, buf, &mut self.scratch)
    }
}

impl<S: Write> Write for TlsStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Seals and sends every slice: all or an error, never a short write.
    fn write_vectored(&mut self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        self.flush_unsent()?;
        self.session.seal(slices, &mut self.cipher)?;
        let result = self.socket.write_all(&self.cipher);
        self.cipher.clear();
        result?;
        Ok(slices.iter().map(|s| s.len()).sum())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_unsent()?;
        self.socket.flush()
    }
}
