//! Drives one client connection: the handshake, then the transmission loop.
//!
//! The connection thread reads requests and asks the request engine
//! ([`blockwire_engine`]) where each goes: those that finish without waiting for
//! hardware (cached reads, buffered writes) run here, their replies batched into one
//! vectored write per burst of requests; those that may block (flush, FUA, cache
//! misses, direct I/O) go to the shared worker pool and are answered from there, out
//! of order, and so do large reads and writes while the client keeps several in
//! flight; a device with its own request queue (an RBD image) takes its I/O on the
//! engine's queue thread. Reads of the socket are buffered, so a burst of small
//! requests costs one system call.

use std::io::{self, Read, Write};
use std::sync::Arc;

use blockwire_blockdev::IoBuf;

use super::export::ExportSet;
use super::large;
use super::negotiation::{Negotiation, Step};
use super::queued;
use super::session::{Action, Reply, Session};
use super::writer::{ReplySink, ReplyWriter, BATCH_BYTES, BATCH_REPLIES};
use crate::tls::{TargetTls, TlsMode, TlsSession, TlsStream};
use crate::wire::*;
use blockwire_engine::{Engine, EngineConfig, Policy, Route, WorkerPool};

/// Option data longer than this is refused with NBD_REP_ERR_TOO_BIG.
const MAX_OPTION_DATA: u32 = 64 * 1024;
/// Option data longer than this closes the connection.
const MAX_OPTION_DISCARD: u32 = 16 << 20;
/// Size of the buffer requests are read into.
const READ_BUFFER: usize = 256 * 1024;
/// Requests one connection may have waiting on workers.
const MAX_IN_FLIGHT: usize = 128;

/// Runs the handshake without TLS. Returns the session when the client entered
/// transmission, `None` when it left or was refused (the reason is logged).
pub fn negotiate<S: Read + Write>(
    stream: &mut S,
    exports: Arc<ExportSet>,
    peer: &str,
) -> io::Result<Option<Session>> {
    Ok(match negotiate_secure(stream, exports, peer, None)? {
        Negotiated::Plain(session) => Some(session),
        // Only a target with TLS credentials starts TLS.
        Negotiated::Refused | Negotiated::Tls(..) => None,
    })
}

/// How a handshake ended.
pub enum Negotiated {
    /// The client left or was refused (the reason is logged).
    Refused,
    /// Transmission in plain text.
    Plain(Session),
    /// Transmission inside TLS: read and write the connection through this session.
    Tls(Session, Arc<TlsSession>),
}

/// Runs the handshake, offering (or requiring) TLS when `tls` is given: after
/// NBD_OPT_STARTTLS the TLS handshake runs and option haggling goes on inside it.
pub fn negotiate_secure<S: Read + Write>(
    stream: &mut S,
    exports: Arc<ExportSet>,
    peer: &str,
    tls: Option<&TargetTls>,
) -> io::Result<Negotiated> {
    let mut out = Vec::with_capacity(256);
    encode_greeting(&mut out, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
    stream.write_all(&out)?;
    let mut client_flags = [0u8; 4];
    stream.read_exact(&mut client_flags)?;
    let mut negotiation = match Negotiation::start(exports, u32::from_be_bytes(client_flags)) {
        Ok(negotiation) => negotiation,
        Err(e) => {
            tracing::warn!(%peer, "refusing client: {e}");
            return Ok(Negotiated::Refused);
        }
    };
    let Some(tls) = tls else {
        return Ok(match haggle(stream, &mut negotiation, peer)? {
            Haggled::Transmission(session) => Negotiated::Plain(session),
            Haggled::Close | Haggled::StartTls => Negotiated::Refused,
        });
    };
    negotiation.offer_tls(tls.mode() == TlsMode::Require);
    match haggle(stream, &mut negotiation, peer)? {
        Haggled::Transmission(session) => return Ok(Negotiated::Plain(session)),
        Haggled::Close => return Ok(Negotiated::Refused),
        Haggled::StartTls => {}
    }
    let session = match tls.accept(stream) {
        Ok(session) => Arc::new(session),
        Err(e) => {
            tracing::warn!(%peer, "{e}");
            return Ok(Negotiated::Refused);
        }
    };
    tracing::debug!(%peer, "TLS started: {}", session.description());
    negotiation.tls_started();
    let mut secure = TlsStream::new(&mut *stream, session.clone());
    match haggle(&mut secure, &mut negotiation, peer)? {
        Haggled::Transmission(transmission) => Ok(Negotiated::Tls(transmission, session)),
        // A second STARTTLS is refused by the negotiation, so this is a close.
        Haggled::Close | Haggled::StartTls => {
            secure.close();
            Ok(Negotiated::Refused)
        }
    }
}

/// Where option haggling stopped.
enum Haggled {
    Close,
    Transmission(Session),
    StartTls,
}

/// Reads options and answers them until the client enters transmission, leaves,
/// or asks for TLS.
fn haggle<S: Read + Write>(
    stream: &mut S,
    negotiation: &mut Negotiation,
    peer: &str,
) -> io::Result<Haggled> {
    let mut out = Vec::with_capacity(256);
    loop {
        let mut header = [0u8; OPTION_HEADER_LEN];
        stream.read_exact(&mut header)?;
        let header = match OptionHeader::decode(&header) {
            Ok(header) => header,
            Err(e) => {
                tracing::warn!(%peer, "closing: bad option header: {e}");
                return Ok(Haggled::Close);
            }
        };
        out.clear();
        if header.len > MAX_OPTION_DATA {
            if header.len > MAX_OPTION_DISCARD {
                tracing::warn!(%peer, "closing: option {} carries {} bytes", header.option, header.len);
                return Ok(Haggled::Close);
            }
            io::copy(
                &mut Read::by_ref(stream).take(header.len.into()),
                &mut io::sink(),
            )?;
            encode_option_reply(
                &mut out,
                header.option,
                NBD_REP_ERR_TOO_BIG,
                b"option data too long",
            );
            stream.write_all(&out)?;
            continue;
        }
        let mut data = vec![0u8; header.len as usize];
        stream.read_exact(&mut data)?;
        let step = negotiation.handle(header.option, &data, &mut out);
        stream.write_all(&out)?;
        match step {
            Step::Continue => {}
            Step::Close => return Ok(Haggled::Close),
            Step::Transmission(session) => return Ok(Haggled::Transmission(session)),
            Step::StartTls => return Ok(Haggled::StartTls),
        }
    }
}

/// Why a transmission loop ended.
#[derive(Debug)]
pub enum Ending {
    /// NBD_CMD_DISC.
    Disconnect,
    /// The client closed its side between requests (or the server shut it down).
    Closed,
    /// A protocol violation; the connection was closed.
    Violation(String),
    /// The socket failed.
    Failed(io::Error),
}

/// Where a connection's requests come from.
pub trait RequestSource: Read {
    /// Whether the client has sent bytes not read yet: more requests behind the one
    /// being handled. The default knows nothing and says no.
    fn input_pending(&self) -> bool {
        false
    }
}

/// Requests from memory (tests, replays): pending while unread bytes remain.
impl<T: AsRef<[u8]>> RequestSource for io::Cursor<T> {
    fn input_pending(&self) -> bool {
        (self.position() as usize) < self.get_ref().as_ref().len()
    }
}

/// Buffered reading of requests and payloads.
struct RequestReader<R> {
    source: R,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl<R: Read> RequestReader<R> {
    fn new(source: R) -> Self {
        RequestReader {
            source,
            buf: vec![0u8; READ_BUFFER].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Reads more bytes; `Ok(false)` at end of stream.
    fn fill(&mut self) -> io::Result<bool> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        loop {
            match self.source.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes a request header of `len` bytes (compact or extended) off the buffer.
    fn take_header(&mut self, len: usize) -> [u8; EXTENDED_REQUEST_LEN] {
        let mut header = [0u8; EXTENDED_REQUEST_LEN];
        header[..len].copy_from_slice(&self.buf[self.start..self.start + len]);
        self.start += len;
        header
    }

    /// Fills `out` with payload: first from the buffer, the rest straight from the
    /// socket, so large writes are not copied twice.
    fn read_payload(&mut self, out: &mut [u8]) -> io::Result<()> {
        let from_buffer = self.buffered().min(out.len());
        out[..from_buffer].copy_from_slice(&self.buf[self.start..self.start + from_buffer]);
        self.start += from_buffer;
        self.source.read_exact(&mut out[from_buffer..])
    }

    fn discard_payload(&mut self, len: u64) -> io::Result<()> {
        let from_buffer = self
            .buffered()
            .min(usize::try_from(len).unwrap_or(usize::MAX));
        self.start += from_buffer;
        let rest = len - from_buffer as u64;
        let copied = io::copy(&mut (&mut self.source).take(rest), &mut io::sink())?;
        if copied < rest {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }
}

/// The transmission loop of one connection. Returns when the client disconnects,
/// the socket fails or the client breaks the protocol; every request that was
/// accepted has been answered (or its reply dropped because the socket failed) by
/// then.
pub fn transmit<R, W>(
    session: Arc<Session>,
    source: R,
    writer: Arc<ReplyWriter<W>>,
    pool: &WorkerPool,
) -> Ending
where
    R: RequestSource,
    W: ReplySink + Send + 'static,
{
    let engine = Engine::new(EngineConfig {
        max_in_flight: MAX_IN_FLIGHT,
        policy: Policy::Measured,
    })
    .with_queue(queued::start(&session, &writer));
    let mut reader = RequestReader::new(source);
    let mut batch: Vec<Reply> = Vec::with_capacity(BATCH_REPLIES);
    let mut batch_bytes = 0usize;
    let framing = session.framing();
    let header_len = framing.request_len();
    let ending = 'requests: loop {
        // Before the thread may block on the socket, send what is ready.
        let mut at_end = false;
        while reader.buffered() < header_len && !at_end {
            let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
            match reader.fill() {
                Ok(more) => at_end = !more,
                Err(e) => break 'requests Ending::Failed(e),
            }
        }
        if writer.is_broken() {
            break Ending::Failed(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "client stopped reading replies",
            ));
        }
        if reader.buffered() < header_len {
            break if reader.buffered() == 0 {
                Ending::Closed
            } else {
                Ending::Violation("connection closed in the middle of a request header".into())
            };
        }
        let header = reader.take_header(header_len);
        let request = match Request::decode_framed(framing, &header[..header_len]) {
            Ok(request) => request,
            Err(e) => break Ending::Violation(format!("bad request: {e}")),
        };
        let job = match session.classify(&request) {
            Action::Disconnect => break Ending::Disconnect,
            Action::Hangup(reason) => break Ending::Violation(reason),
            Action::Reply(reply) => {
                push(&mut batch, &mut batch_bytes, reply);
                None
            }
            Action::DiscardPayload { len, reply } => {
                if (reader.buffered() as u64) < len {
                    let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
                }
                if let Err(e) = reader.discard_payload(len) {
                    break Ending::Violation(format!(
                        "connection closed in the middle of a write payload: {e}"
                    ));
                }
                push(&mut batch, &mut batch_bytes, reply);
                None
            }
            Action::ReadPayload(request) => {
                if reader.buffered() < request.len as usize {
                    let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
                }
                let mut data = IoBuf::new(request.len as usize);
                if let Err(e) = reader.read_payload(&mut data) {
                    // Nothing of a partial payload reaches the device.
                    break Ending::Violation(format!(
                        "connection closed in the middle of a write payload: {e}"
                    ));
                }
                Some(session.write_job(&request, data))
            }
            Action::StreamWrite(request) => {
                // Runs here, piece by piece as the payload arrives; what is batched
                // should not wait for it.
                let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
                match large::stream_write(&session, &request, |piece| reader.read_payload(piece)) {
                    Ok(reply) => push(&mut batch, &mut batch_bytes, reply),
                    Err(e) => {
                        break Ending::Violation(format!(
                            "connection closed in the middle of a write payload: {e}"
                        ))
                    }
                }
                None
            }
            Action::StreamRead(request) => {
                let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
                if let Err(e) = large::stream_read(&session, &request, &writer) {
                    break Ending::Failed(e);
                }
                None
            }
            Action::Execute(job) => Some(job),
        };
        if let Some(job) = job {
            let request = queued::request(&job);
            let more_waiting = || reader.buffered() >= REQUEST_LEN || reader.source.input_pending();
            let route = engine.route(request, more_waiting);
            // A device with a request queue (an RBD image) takes its I/O there; what
            // its thread does not take runs here as on any other device.
            let job = match route {
                Route::Queue => match queued::split(job) {
                    Ok((work, pending)) => {
                        if engine.queue_full() {
                            let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
                        }
                        engine
                            .submit(request, work, pending)
                            .err()
                            .map(|(work, pending)| queued::rejoin(work, pending))
                    }
                    Err(job) => Some(job),
                },
                Route::Inline | Route::Worker => Some(job),
            };
            if let Some(job) = job {
                let inline = match route {
                    Route::Worker => Err(job),
                    Route::Inline | Route::Queue => {
                        engine.inline(request, || session.execute_inline(job))
                    }
                };
                match inline {
                    Ok(reply) => push(&mut batch, &mut batch_bytes, reply),
                    Err(job) => {
                        if engine.workers_full() {
                            let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
                        }
                        let (session, writer) = (session.clone(), writer.clone());
                        engine.offload(pool, request, move |slot| {
                            let reply = slot.run(|| session.execute(job));
                            // The request keeps its slot until its reply has left, so
                            // a client that stops reading stops the server reading its
                            // requests. A failed send marks the writer broken; the
                            // connection thread notices and ends.
                            writer.send_one_then(reply, Box::new(move || drop(slot)));
                        });
                    }
                }
            }
        }
        if batch.len() >= BATCH_REPLIES || batch_bytes >= BATCH_BYTES {
            let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
        }
    };
    let _ = send_batch(&writer, &mut batch, &mut batch_bytes);
    engine.wait_idle();
    ending
}

fn push(batch: &mut Vec<Reply>, bytes: &mut usize, reply: Reply) {
    *bytes += reply.wire_len();
    batch.push(reply);
}

fn send_batch<W: ReplySink>(
    writer: &ReplyWriter<W>,
    batch: &mut Vec<Reply>,
    bytes: &mut usize,
) -> io::Result<()> {
    *bytes = 0;
    writer.send(batch)
}
