//! Streamed reads and writes for clients that never learned our maximum payload:
//! through `transmit` from a byte stream, and piece by piece against a device that
//! fails part way.

use std::collections::HashMap;
use std::io::{self, Cursor, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use blockwire_blockdev::workers::WorkerPool;
use blockwire_blockdev::{
    BlockDevice, Device, DeviceInfo, Error, ErrorKind, MemoryDevice, Op, Result as DeviceResult,
    WriteFlags,
};

use super::*;
use crate::target::connection::{transmit, Ending};
use crate::target::export::Export;
use crate::target::negotiation::transmission_flags;
use crate::target::session::Action;

const MIB: u64 = 1 << 20;

/// Memory that fails every read or write reaching `fail_from` and counts flushes
/// and FUA writes.
struct Flaky {
    inner: MemoryDevice,
    fail_from: u64,
    /// Report no flush (FUA stays native).
    no_flush: bool,
    flushes: AtomicUsize,
    fua_writes: AtomicUsize,
}

impl Flaky {
    fn new(size: u64, fail_from: u64) -> Arc<Flaky> {
        Arc::new(Flaky {
            inner: MemoryDevice::new(size),
            fail_from,
            no_flush: false,
            flushes: AtomicUsize::new(0),
            fua_writes: AtomicUsize::new(0),
        })
    }

    fn check(&self, op: Op, offset: u64, len: usize) -> DeviceResult<()> {
        if offset + len as u64 > self.fail_from {
            return Err(Error::new(ErrorKind::Io, op, offset, len as u64));
        }
        Ok(())
    }
}

impl BlockDevice for Flaky {
    fn info(&self) -> DeviceInfo {
        let mut info = self.inner.info();
        if self.no_flush {
            info.capabilities.flush = blockwire_blockdev::Support::None;
        }
        info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DeviceResult<()> {
        self.check(Op::Read, offset, buf.len())?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> DeviceResult<()> {
        self.check(Op::Write, offset, buf.len())?;
        if flags.fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.write_at(buf, offset, flags)
    }

    fn flush(&self) -> DeviceResult<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
}

/// A session for a client that did not negotiate block sizes.
fn unnegotiated(device: Device, framing: Framing) -> Session {
    let export = Arc::new(Export::new("disk", "", device));
    let flags = transmission_flags(export.device.info(), framing.chunked());
    let mut session = Session::new(export, framing, None, flags);
    session.set_sizes_negotiated(false);
    session
}

fn request(command: u16, flags: u16, cookie: u64, offset: u64, len: u64) -> Request {
    Request {
        flags,
        command,
        cookie,
        offset,
        len,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ ((i >> 12) as u8).wrapping_add(seed))
        .collect()
}

/// Everything written to it, for replies.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ReplySink for Sink {}

/// Splits a reply stream into (error, data) per cookie; `reads` gives the length of
/// each read, which simple replies need.
fn replies(mut bytes: &[u8], reads: &HashMap<u64, usize>) -> HashMap<u64, (u32, Vec<u8>)> {
    let mut out: HashMap<u64, (u32, Vec<u8>)> = HashMap::new();
    while !bytes.is_empty() {
        let (header, used) = ReplyHeader::decode(bytes).unwrap().expect("whole header");
        bytes = &bytes[used..];
        let (cookie, kind, len) = match header {
            ReplyHeader::Simple { error, cookie } => {
                let len = if error == 0 {
                    reads.get(&cookie).copied().unwrap_or(0)
                } else {
                    0
                };
                out.insert(cookie, (error, bytes[..len].to_vec()));
                bytes = &bytes[len..];
                continue;
            }
            ReplyHeader::Chunk {
                cookie, kind, len, ..
            } => (cookie, kind, len as usize),
            ReplyHeader::Extended {
                cookie, kind, len, ..
            } => (cookie, kind, len as usize),
        };
        let payload = &bytes[..len];
        bytes = &bytes[len..];
        let entry = out.entry(cookie).or_default();
        match kind {
            NBD_REPLY_TYPE_OFFSET_DATA => entry.1.extend_from_slice(&payload[8..]),
            NBD_REPLY_TYPE_NONE => {}
            kind if kind & 0x8000 != 0 => entry.0 = decode_error_payload(payload).unwrap().0,
            other => panic!("unexpected chunk type {other}"),
        }
    }
    out
}

#[test]
fn unnegotiated_clients_get_large_reads_and_writes_streamed() {
    for framing in [Framing::Simple, Framing::Structured, Framing::Extended] {
        let device = Device::from_device(MemoryDevice::new(128 * MIB));
        let session = Arc::new(unnegotiated(device.clone(), framing));
        let payload_flag = if framing == Framing::Extended {
            NBD_CMD_FLAG_PAYLOAD_LEN
        } else {
            0
        };
        let data = pattern(40 * MIB as usize, 5);
        let mut input = Vec::new();
        let encode = |input: &mut Vec<u8>, request: Request| request.encode_framed(framing, input);
        encode(
            &mut input,
            request(
                NBD_CMD_WRITE,
                payload_flag | NBD_CMD_FLAG_FUA,
                1,
                4096,
                40 * MIB,
            ),
        );
        input.extend_from_slice(&data);
        encode(&mut input, request(NBD_CMD_READ, 0, 2, 4096, 40 * MIB));
        // Above the 64 MiB limit: refused, its payload dropped, the connection in step.
        encode(
            &mut input,
            request(NBD_CMD_WRITE, payload_flag, 3, 0, 66 * MIB),
        );
        input.resize(input.len() + 66 * MIB as usize, 0xee);
        encode(&mut input, request(NBD_CMD_READ, 0, 4, 0, 66 * MIB));
        encode(&mut input, request(NBD_CMD_READ, 0, 5, 4096, 4096));
        encode(&mut input, request(NBD_CMD_DISC, 0, 6, 0, 0));

        let sink = Sink::default();
        let writer = Arc::new(ReplyWriter::new(sink.clone()));
        let pool = WorkerPool::new("test-worker", 1);
        let ending = transmit(session, Cursor::new(input), writer, &pool);
        assert!(
            matches!(ending, Ending::Disconnect),
            "{framing:?}: {ending:?}"
        );

        let reads = HashMap::from([(2, 40 * MIB as usize), (4, 66 * MIB as usize), (5, 4096)]);
        let output = sink.0.lock().unwrap().clone();
        let replies = replies(&output, &reads);
        assert_eq!(replies[&1].0, 0, "{framing:?}: 40 MiB write");
        assert_eq!(replies[&2].0, 0, "{framing:?}: 40 MiB read");
        assert!(
            replies[&2].1 == data,
            "{framing:?}: 40 MiB read returned other bytes"
        );
        assert_eq!(replies[&3].0, NBD_EINVAL, "{framing:?}: 66 MiB write");
        let too_big_read = if framing.chunked() {
            NBD_EOVERFLOW
        } else {
            NBD_EINVAL
        };
        assert_eq!(replies[&4].0, too_big_read, "{framing:?}: 66 MiB read");
        assert_eq!(replies[&5], (0, data[..4096].to_vec()), "{framing:?}");
        let mut first = vec![1u8; 4096];
        device.read(&mut first, 0).unwrap();
        assert_eq!(
            first,
            vec![0u8; 4096],
            "{framing:?}: the refused write landed"
        );
    }
}

#[test]
fn clients_that_negotiated_sizes_keep_the_advertised_maximum() {
    let device = Device::from_device(MemoryDevice::new(128 * MIB));
    let export = Arc::new(Export::new("disk", "", device));
    let flags = transmission_flags(export.device.info(), false);
    let session = Session::new(export, Framing::Simple, None, flags);
    match session.classify(&request(NBD_CMD_WRITE, 0, 1, 0, 40 * MIB)) {
        Action::DiscardPayload { len, .. } => assert_eq!(len, 40 * MIB),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        session.classify(&request(NBD_CMD_READ, 0, 1, 0, 40 * MIB)),
        Action::Reply(_)
    ));
    // Unnegotiated: streamed, unless the range is wrong, which is refused up front.
    let mut session = session;
    session.set_sizes_negotiated(false);
    assert!(matches!(
        session.classify(&request(NBD_CMD_WRITE, 0, 1, 0, 40 * MIB)),
        Action::StreamWrite(_)
    ));
    assert!(matches!(
        session.classify(&request(NBD_CMD_READ, 0, 1, 0, 40 * MIB)),
        Action::StreamRead(_)
    ));
    assert!(matches!(
        session.classify(&request(NBD_CMD_WRITE, 0, 1, 100 * MIB, 40 * MIB)),
        Action::DiscardPayload { .. }
    ));
    assert!(matches!(
        session.classify(&request(NBD_CMD_READ, 0, 1, u64::MAX - MIB, 40 * MIB)),
        Action::Reply(_)
    ));
    // Far above the limit: not worth reading.
    assert!(matches!(
        session.classify(&request(NBD_CMD_WRITE, 0, 1, 0, 1 << 30)),
        Action::Hangup(_)
    ));
    session.set_unnegotiated_payload_limit(32 << 20);
    assert!(matches!(
        session.classify(&request(NBD_CMD_WRITE, 0, 1, 0, 40 * MIB)),
        Action::DiscardPayload { .. }
    ));
}

#[test]
fn a_device_error_mid_write_still_drains_the_payload() {
    let flaky = Flaky::new(64 * MIB, 20 * MIB);
    let session = unnegotiated(Device::new(flaky.clone()), Framing::Structured);
    let data = pattern(40 * MIB as usize, 9);
    let mut socket = Cursor::new(data.clone());
    let write = request(NBD_CMD_WRITE, 0, 7, 0, 40 * MIB);
    let reply = stream_write(&session, &write, |piece| socket.read_exact(piece)).unwrap();
    assert_eq!(socket.position(), 40 * MIB, "payload not drained");
    let (header, used) = ReplyHeader::decode(&reply.head).unwrap().unwrap();
    assert!(matches!(
        header,
        ReplyHeader::Chunk {
            kind: NBD_REPLY_TYPE_ERROR,
            cookie: 7,
            ..
        }
    ));
    assert_eq!(
        decode_error_payload(&reply.head[used..]).unwrap().0,
        NBD_EIO
    );
    // The pieces before the failure were written; nothing after it.
    let mut head = vec![0u8; 4096];
    flaky.inner.read_at(&mut head, 0).unwrap();
    assert_eq!(head, data[..4096]);
    flaky.inner.read_at(&mut head, 36 * MIB).unwrap();
    assert_eq!(head, vec![0u8; 4096]);

    // A socket that ends mid-payload ends the connection.
    let mut short = Cursor::new(vec![0u8; MIB as usize]);
    let error = stream_write(&session, &write, |piece| short.read_exact(piece));
    assert!(error.is_err());
}

#[test]
fn fua_on_a_streamed_write_covers_every_piece_with_one_flush() {
    let flaky = Flaky::new(64 * MIB, u64::MAX);
    let session = unnegotiated(Device::new(flaky.clone()), Framing::Simple);
    let write = request(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 1, 0, 40 * MIB);
    let mut socket = Cursor::new(pattern(40 * MIB as usize, 1));
    let reply = stream_write(&session, &write, |piece| socket.read_exact(piece)).unwrap();
    assert!(matches!(
        ReplyHeader::decode(&reply.head).unwrap().unwrap().0,
        ReplyHeader::Simple { error: 0, .. }
    ));
    assert_eq!(flaky.flushes.load(Ordering::Relaxed), 1);
    assert_eq!(flaky.fua_writes.load(Ordering::Relaxed), 0);
    // Without FUA, no flush.
    let write = request(NBD_CMD_WRITE, 0, 2, 0, 40 * MIB);
    let mut socket = Cursor::new(pattern(40 * MIB as usize, 2));
    stream_write(&session, &write, |piece| socket.read_exact(piece)).unwrap();
    assert_eq!(flaky.flushes.load(Ordering::Relaxed), 1);

    // A device with FUA but no flush gets FUA on every piece.
    let no_flush = Arc::new(Flaky {
        inner: MemoryDevice::new(64 * MIB),
        fail_from: u64::MAX,
        no_flush: true,
        flushes: AtomicUsize::new(0),
        fua_writes: AtomicUsize::new(0),
    });
    let session = unnegotiated(Device::new(no_flush.clone()), Framing::Simple);
    let write = request(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 3, 0, 40 * MIB);
    let mut socket = Cursor::new(pattern(40 * MIB as usize, 3));
    stream_write(&session, &write, |piece| socket.read_exact(piece)).unwrap();
    assert_eq!(no_flush.flushes.load(Ordering::Relaxed), 0);
    let pieces = (40 * MIB).div_ceil(STREAM_PIECE as u64) as usize;
    assert_eq!(no_flush.fua_writes.load(Ordering::Relaxed), pieces);
}

#[test]
fn a_device_error_mid_read_ends_a_chunked_reply_with_an_error_and_a_simple_one_with_a_hangup() {
    let read = request(NBD_CMD_READ, 0, 3, 0, 40 * MIB);
    let reads = HashMap::from([(3, 40 * MIB as usize)]);

    // Chunked: the data chunk is completed with zeroes, then the error chunk.
    for framing in [Framing::Structured, Framing::Extended] {
        let flaky = Flaky::new(64 * MIB, 20 * MIB);
        let session = unnegotiated(Device::new(flaky), framing);
        let sink = Sink::default();
        let writer = ReplyWriter::new(sink.clone());
        stream_read(&session, &read, &writer).unwrap();
        assert!(!writer.is_broken());
        let output = sink.0.lock().unwrap().clone();
        let replies = replies(&output, &reads);
        let (error, data) = &replies[&3];
        assert_eq!(*error, NBD_EIO, "{framing:?}");
        assert_eq!(
            data.len(),
            40 * MIB as usize,
            "{framing:?}: chunk not completed"
        );
    }

    // Simple: the header promised all the data; the connection must end.
    let flaky = Flaky::new(64 * MIB, 20 * MIB);
    let session = unnegotiated(Device::new(flaky), Framing::Simple);
    let sink = Sink::default();
    let writer = ReplyWriter::new(sink.clone());
    assert!(stream_read(&session, &read, &writer).is_err());
    assert!(writer.is_broken());
    let sent = sink.0.lock().unwrap().len();
    assert!(
        sent < SIMPLE_REPLY_LEN + 40 * MIB as usize,
        "{sent} bytes sent"
    );

    // A failure in the first piece, before any header: an ordinary error reply.
    let flaky = Flaky::new(64 * MIB, 0);
    let session = unnegotiated(Device::new(flaky), Framing::Simple);
    let sink = Sink::default();
    let writer = ReplyWriter::new(sink.clone());
    stream_read(&session, &read, &writer).unwrap();
    let output = sink.0.lock().unwrap().clone();
    assert_eq!(output.len(), SIMPLE_REPLY_LEN);
    assert_eq!(replies(&output, &reads)[&3].0, NBD_EIO);
}
