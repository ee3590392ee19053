//! Reading and writing PDUs on a connection: digests, padding, and the sequence
//! numbers a target stamps on what it sends.
//!
//! The reader hands the header and the data segment over separately so that a
//! Data-Out's data lands straight in its command's buffer. The writer is shared by
//! the connection thread and the workers that finish commands; StatSN is assigned
//! under its lock, in send order, as RFC 7143 §4.2.2.2 wants.

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread::{self, ThreadId};
use std::time::Duration;

use crate::pdu::frame::{Batch, Digests};
use crate::pdu::{digest_value, header_digest, padded, Bhs, BHS_LEN, DIGEST_LEN};

/// What reading a header found.
pub enum Incoming {
    /// A header (and its AHS); the data segment is still to be read.
    Header { bhs: Bhs, ahs: Vec<u8> },
    /// Nothing arrived for the idle interval (only between PDUs).
    Idle,
    /// The peer closed the connection cleanly between PDUs.
    Closed,
}

/// Why a connection must end while reading.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The whole segment was read (the stream is still in step), but its digest
    /// is wrong.
    #[error("data digest mismatch")]
    DataDigest,
    #[error("data segment of {len} bytes exceeds the negotiated {max}")]
    SegmentTooLong { len: u32, max: u32 },
}

/// The receive half of a connection.
pub struct PduReader {
    stream: io::BufReader<TcpStream>,
    header_digest: bool,
    data_digest: bool,
    /// The most data one PDU may carry (what we declared as MaxRecvDataSegmentLength,
    /// or the login phase's 8 KiB default).
    max_data: u32,
}

/// Login PDUs may carry at most 8192 bytes of text before the keys say otherwise
/// (RFC 7143 §13.12: MaxRecvDataSegmentLength's default).
pub const LOGIN_MAX_DATA: u32 = 8192;

impl PduReader {
    pub fn new(stream: TcpStream) -> PduReader {
        PduReader {
            stream: io::BufReader::with_capacity(64 * 1024, stream),
            header_digest: false,
            data_digest: false,
            max_data: LOGIN_MAX_DATA,
        }
    }

    /// Applies what the login negotiated.
    pub fn set_parameters(&mut self, header_digest: bool, data_digest: bool, max_data: u32) {
        self.header_digest = header_digest;
        self.data_digest = data_digest;
        self.max_data = max_data;
    }

    /// Whether a whole header already sits in the buffer (reading it will not
    /// wait for the network).
    pub fn header_buffered(&self) -> bool {
        self.stream.buffer().len() >= BHS_LEN
    }

    /// Whether the initiator has sent more already: a header waiting in the buffer
    /// or bytes in the socket's receive queue.
    pub fn more_waiting(&self) -> bool {
        if self.stream.buffer().len() >= BHS_LEN {
            return true;
        }
        let mut pending: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int, the bytes waiting in the receive queue.
        let rc = unsafe {
            libc::ioctl(
                self.stream.get_ref().as_raw_fd(),
                libc::FIONREAD,
                &mut pending,
            )
        };
        rc == 0 && pending > 0
    }

    /// How long a read may wait between PDUs before [`Incoming::Idle`].
    pub fn set_idle_timeout(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.stream.get_ref().set_read_timeout(timeout)
    }

    /// Reads the next header. A timeout counts only between PDUs: once the first
    /// byte of a header is in, the rest is awaited however long it takes.
    pub fn read_header(&mut self) -> Result<Incoming, ReadError> {
        let mut bhs = Bhs::default();
        let mut filled = 0;
        while filled < BHS_LEN {
            match self.stream.read(&mut bhs.0[filled..]) {
                Ok(0) if filled == 0 => return Ok(Incoming::Closed),
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => filled += n,
                Err(e) if is_timeout(&e) && filled == 0 => return Ok(Incoming::Idle),
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut ahs = vec![0u8; bhs.ahs_len()];
        self.read_exact(&mut ahs)?;
        if self.header_digest {
            let mut digest = [0u8; DIGEST_LEN];
            self.read_exact(&mut digest)?;
            if digest_value(digest) != header_digest(&bhs, &ahs) {
                return Err(ReadError::HeaderDigest);
            }
        }
        let len = bhs.data_len();
        if len > self.max_data {
            return Err(ReadError::SegmentTooLong {
                len,
                max: self.max_data,
            });
        }
        Ok(Incoming::Header { bhs, ahs })
    }

    /// Reads a data segment of `buf.len()` bytes (the header's DataSegmentLength)
    /// into `buf`, then its padding and digest.
    pub fn read_data(&mut self, buf: &mut [u8]) -> Result<(), ReadError> {
        self.read_exact(buf)?;
        let mut pad = [0u8; 3];
        let pad_len = padded(buf.len()) - buf.len();
        self.read_exact(&mut pad[..pad_len])?;
        if self.data_digest && !buf.is_empty() {
            let mut digest = [0u8; DIGEST_LEN];
            self.read_exact(&mut digest)?;
            let computed = crate::pdu::crc32c_append(crate::pdu::crc32c(buf), &pad[..pad_len]);
            if digest_value(digest) != computed {
                return Err(ReadError::DataDigest);
            }
        }
        Ok(())
    }

    /// Reads a data segment into a new vector.
    pub fn read_data_vec(&mut self, len: u32) -> Result<Vec<u8>, ReadError> {
        let mut data = vec![0u8; len as usize];
        self.read_data(&mut data)?;
        Ok(data)
    }

    /// Reads and drops a data segment of `len` bytes.
    pub fn skip_data(&mut self, len: u32) -> Result<(), ReadError> {
        let mut remaining = len as usize;
        let mut scratch = [0u8; 4096];
        // Checking the digest of data we drop buys nothing: read it as plain bytes.
        let total = padded(remaining)
            + if self.data_digest && len > 0 {
                DIGEST_LEN
            } else {
                0
            };
        remaining = total;
        while remaining > 0 {
            let n = remaining.min(scratch.len());
            self.read_exact(&mut scratch[..n])?;
            remaining -= n;
        }
        Ok(())
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let mut filled = 0;
        while filled < buf.len() {
            match self.stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => filled += n,
                Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// How a sent PDU treats StatSN (RFC 7143 §4.2.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatSn {
    /// A status the initiator acknowledges: takes the next StatSN.
    Advance,
    /// Carries the current StatSN without taking one (R2T, a target's NOP-In ping).
    Current,
    /// The field is reserved (Data-In without status).
    Reserved,
}

/// The command window a session grants, read when a PDU is stamped.
pub trait Window: Send + Sync {
    /// (ExpCmdSN, MaxCmdSN).
    fn window(&self) -> (u32, u32);
}

struct WriterState {
    stream: TcpStream,
    stat_sn: u32,
    scratch: Vec<u8>,
    /// The thread whose small sends are held (see [`PduWriter::hold`]).
    holder: Option<ThreadId>,
    /// PDUs held, encoded, in send order.
    held: Vec<u8>,
}

/// Held PDUs go out once they reach this many bytes; a larger send is not held.
const HOLD_LIMIT: usize = 64 * 1024;

/// The send half of a connection, shared by every thread that answers on it.
pub struct PduWriter {
    state: Mutex<WriterState>,
    header_digest: AtomicBool,
    data_digest: AtomicBool,
    /// Largest data segment the initiator accepts in one PDU.
    max_data: AtomicU32,
}

/// One PDU to send: its encoded header, how it takes StatSN, and its data.
pub struct Outgoing<'a> {
    pub bhs: Bhs,
    pub ahs: &'a [u8],
    pub stat_sn: StatSn,
    pub data: &'a [u8],
}

impl PduWriter {
    pub fn new(stream: TcpStream, stat_sn: u32) -> PduWriter {
        PduWriter {
            state: Mutex::new(WriterState {
                stream,
                stat_sn,
                scratch: Vec::new(),
                holder: None,
                held: Vec::new(),
            }),
            header_digest: AtomicBool::new(false),
            data_digest: AtomicBool::new(false),
            max_data: AtomicU32::new(LOGIN_MAX_DATA),
        }
    }

    /// Applies what the login negotiated (after the last login response is sent).
    pub fn set_parameters(
        &self,
        header_digest: bool,
        data_digest: bool,
        max_data: u32,
        stat_sn: u32,
    ) {
        self.header_digest.store(header_digest, Ordering::Relaxed);
        self.data_digest.store(data_digest, Ordering::Relaxed);
        self.max_data.store(max_data, Ordering::Relaxed);
        self.lock().stat_sn = stat_sn;
    }

    /// Largest data segment the initiator accepts in one PDU.
    pub fn max_data(&self) -> u32 {
        self.max_data.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a PDU as encoded, without stamping sequence numbers (login responses,
    /// whose numbers the login machine keeps; digests are not on yet).
    pub fn send_unstamped(&self, bhs: &Bhs, data: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        let mut batch = Batch::new();
        batch.push_parts(bhs, &[], data, Digests::default());
        batch.send(&mut state.stream)
    }

    /// Sends one PDU.
    pub fn send(&self, pdu: Outgoing<'_>, window: &dyn Window) -> io::Result<()> {
        self.send_all(std::slice::from_mut(&mut { pdu }), window)
    }

    /// Sends several PDUs back to back in as few system calls as the kernel allows,
    /// stamping sequence numbers in order.
    pub fn send_all(&self, pdus: &mut [Outgoing<'_>], window: &dyn Window) -> io::Result<()> {
        let digests = Digests {
            header: self.header_digest.load(Ordering::Relaxed),
            data: self.data_digest.load(Ordering::Relaxed),
        };
        let mut state = self.lock();
        let (exp_cmd_sn, max_cmd_sn) = window.window();
        // The writer keeps one scratch buffer for headers, digests and padding.
        let mut batch = Batch::reusing(std::mem::take(&mut state.scratch));
        for pdu in pdus.iter_mut() {
            match pdu.stat_sn {
                StatSn::Advance => {
                    pdu.bhs.put_u32(24, state.stat_sn);
                    state.stat_sn = state.stat_sn.wrapping_add(1);
                }
                StatSn::Current => pdu.bhs.put_u32(24, state.stat_sn),
                StatSn::Reserved => {}
            }
            pdu.bhs.put_u32(28, exp_cmd_sn);
            pdu.bhs.put_u32(32, max_cmd_sn);
            batch.push_parts(&pdu.bhs, pdu.ahs, pdu.data, digests);
        }
        let bytes: usize = pdus
            .iter()
            .map(|pdu| BHS_LEN + pdu.ahs.len() + padded(pdu.data.len()) + 2 * DIGEST_LEN)
            .sum();
        let state = &mut *state;
        let holds =
            state.holder == Some(thread::current().id()) && state.held.len() + bytes <= HOLD_LIMIT;
        let sent = if holds {
            batch.send(&mut state.held)
        } else {
            // Whatever was held goes first: the wire keeps StatSN order.
            Self::send_held(state).and_then(|()| batch.send(&mut state.stream))
        };
        state.scratch = batch.into_scratch();
        sent
    }

    /// Holds this thread's small sends until [`release`](Self::release): a
    /// connection thread answering a run of commands that arrived together sends
    /// the answers in one system call, and the initiator reads them in one. Sends
    /// by other threads are not held (they push out what was held first).
    pub fn hold(&self) {
        self.lock().holder = Some(thread::current().id());
    }

    /// Sends what was held and stops holding.
    pub fn release(&self) -> io::Result<()> {
        let mut state = self.lock();
        state.holder = None;
        Self::send_held(&mut state)
    }

    fn send_held(state: &mut WriterState) -> io::Result<()> {
        if state.held.is_empty() {
            return Ok(());
        }
        let sent = io::Write::write_all(&mut state.stream, &state.held);
        state.held.clear();
        sent
    }

    /// Closes both directions of the socket (wakes a blocked reader too).
    pub fn shutdown(&self) {
        let _ = self.lock().stream.shutdown(std::net::Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};

    use super::*;

    struct FixedWindow;

    impl Window for FixedWindow {
        fn window(&self) -> (u32, u32) {
            (1, 10)
        }
    }

    /// A writer on one end of a loopback connection, and the other end.
    fn pair() -> (PduWriter, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        (PduWriter::new(ours, 7), peer)
    }

    fn send(writer: &PduWriter, data: &[u8]) {
        let pdu = Outgoing {
            bhs: Bhs::default(),
            ahs: &[],
            stat_sn: StatSn::Advance,
            data,
        };
        writer.send(pdu, &FixedWindow).unwrap();
    }

    /// Whether the peer has bytes to read now.
    fn readable(peer: &TcpStream) -> bool {
        peer.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let ready = peer.peek(&mut byte).is_ok();
        peer.set_nonblocking(false).unwrap();
        ready
    }

    /// The StatSN of each of `count` PDUs of `data_len` bytes the peer reads.
    fn stat_sns(peer: &mut TcpStream, count: usize, data_len: usize) -> Vec<u32> {
        let mut out = Vec::new();
        for _ in 0..count {
            let mut bhs = Bhs::default();
            peer.read_exact(&mut bhs.0).unwrap();
            let mut data = vec![0u8; padded(data_len)];
            peer.read_exact(&mut data).unwrap();
            out.push(bhs.u32_at(24));
        }
        out
    }

    #[test]
    fn held_answers_leave_together_when_released() {
        let (writer, mut peer) = pair();
        writer.hold();
        for _ in 0..3 {
            send(&writer, &[1u8; 6]);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(!readable(&peer), "held PDUs were sent before the release");
        writer.release().unwrap();
        assert_eq!(stat_sns(&mut peer, 3, 6), [7, 8, 9]);
        // Released: the next send leaves at once.
        send(&writer, &[2u8; 4]);
        assert_eq!(stat_sns(&mut peer, 1, 4), [10]);
    }

    #[test]
    fn another_threads_send_pushes_out_what_was_held_first() {
        let (writer, mut peer) = pair();
        writer.hold();
        send(&writer, &[1u8; 8]);
        std::thread::scope(|s| {
            s.spawn(|| send(&writer, &[2u8; 8]));
        });
        // Both on the wire, in StatSN order, without a release.
        assert_eq!(stat_sns(&mut peer, 2, 8), [7, 8]);
    }

    #[test]
    fn a_large_answer_is_not_held() {
        let (writer, mut peer) = pair();
        writer.hold();
        send(&writer, &[1u8; 4]);
        let large = vec![3u8; HOLD_LIMIT];
        send(&writer, &large);
        assert_eq!(stat_sns(&mut peer, 1, 4), [7]);
        assert_eq!(stat_sns(&mut peer, 1, HOLD_LIMIT), [8]);
    }
}
