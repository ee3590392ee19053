//! The transmission phase driven without sockets: requests in, replies out.

use std::io::{self, Cursor, Write};
use std::sync::{Arc, Mutex};

use blockwire_blockdev::{Device, IoBuf, MemoryDevice};

use super::*;
use crate::target::connection::{transmit, Ending};
use crate::target::writer::{ReplySink, ReplyWriter};
use blockwire_blockdev::workers::WorkerPool;

const SIZE: u64 = 4 << 20;

fn session_on(device: Device, structured: bool) -> Session {
    let export = Arc::new(Export::new("disk", "", device));
    let flags = crate::target::negotiation::transmission_flags(export.device.info(), structured);
    let context = structured.then_some(1);
    let framing = if structured {
        Framing::Structured
    } else {
        Framing::Simple
    };
    Session::new(export, framing, context, flags)
}

fn session(structured: bool) -> Session {
    session_on(Device::from_device(MemoryDevice::new(SIZE)), structured)
}

fn request(command: u16, flags: u16, offset: u64, len: u32) -> Request {
    Request {
        flags,
        command,
        cookie: 42,
        offset,
        len: len.into(),
    }
}

/// The NBD error value of a reply (simple or error chunk); 0 for success.
fn error_of(reply: &Reply) -> u32 {
    match ReplyHeader::decode(&reply.head).unwrap().unwrap().0 {
        ReplyHeader::Simple { error, .. } => error,
        ReplyHeader::Chunk { kind, .. } if kind & 0x8000 != 0 => {
            decode_error_payload(&reply.head[CHUNK_HEADER_LEN..])
                .unwrap()
                .0
        }
        ReplyHeader::Chunk { .. } => 0,
        ReplyHeader::Extended { kind, .. } if kind & 0x8000 != 0 => {
            decode_error_payload(&reply.head[EXTENDED_REPLY_LEN..])
                .unwrap()
                .0
        }
        ReplyHeader::Extended { .. } => 0,
    }
}

fn run(session: &Session, request: Request) -> Reply {
    match session.classify(&request) {
        Action::Execute(job) => session.execute(job),
        Action::Reply(reply) => reply,
        other => panic!("unexpected action {other:?}"),
    }
}

fn write(session: &Session, offset: u64, data: &[u8], flags: u16) -> Reply {
    let request = request(NBD_CMD_WRITE, flags, offset, data.len() as u32);
    match session.classify(&request) {
        Action::ReadPayload(request) => {
            session.execute(session.write_job(&request, IoBuf::from_slice(data)))
        }
        Action::DiscardPayload { reply, .. } => reply,
        other => panic!("unexpected action {other:?}"),
    }
}

fn read_data(reply: &Reply) -> Vec<u8> {
    match &reply.data {
        ReplyData::Buffer(buf) => buf.to_vec(),
        other => panic!("no data in reply: {other:?}"),
    }
}

#[test]
fn write_then_read_round_trips() {
    for structured in [false, true] {
        let session = session(structured);
        assert_eq!(error_of(&write(&session, 8192, &[7u8; 4096], 0)), 0);
        let reply = run(&session, request(NBD_CMD_READ, 0, 8192, 4096));
        assert_eq!(error_of(&reply), 0);
        assert_eq!(read_data(&reply), vec![7u8; 4096]);
    }
}

#[test]
fn out_of_range_errors_follow_the_spec() {
    let session = session(false);
    let reply = run(&session, request(NBD_CMD_READ, 0, SIZE - 512, 1024));
    assert_eq!(error_of(&reply), NBD_EINVAL);
    assert_eq!(
        error_of(&write(&session, SIZE - 512, &[1u8; 1024], 0)),
        NBD_ENOSPC
    );
    let reply = run(&session, request(NBD_CMD_TRIM, 0, SIZE, 512));
    assert_eq!(error_of(&reply), NBD_EINVAL);
    let reply = run(&session, request(NBD_CMD_WRITE_ZEROES, 0, u64::MAX, 512));
    assert_eq!(error_of(&reply), NBD_ENOSPC);
}

#[test]
fn structured_errors_carry_a_message() {
    let session = session(true);
    let reply = run(&session, request(NBD_CMD_READ, 0, SIZE, 512));
    let (header, _) = ReplyHeader::decode(&reply.head).unwrap().unwrap();
    assert!(matches!(
        header,
        ReplyHeader::Chunk {
            kind: NBD_REPLY_TYPE_ERROR,
            flags: NBD_REPLY_FLAG_DONE,
            ..
        }
    ));
    let (error, message) = decode_error_payload(&reply.head[CHUNK_HEADER_LEN..]).unwrap();
    assert_eq!(error, NBD_EINVAL);
    assert!(message.contains("beyond the end"), "{message}");
}

#[test]
fn oversized_requests_are_refused_or_hung_up() {
    let session = session(true);
    let reply = run(&session, request(NBD_CMD_READ, 0, 0, (32 << 20) + 1));
    assert_eq!(error_of(&reply), NBD_EINVAL);
    match session.classify(&request(NBD_CMD_WRITE, 0, 0, 40 << 20)) {
        Action::DiscardPayload { len, reply } => {
            assert_eq!(len, 40 << 20);
            assert_eq!(error_of(&reply), NBD_EINVAL);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        session.classify(&request(NBD_CMD_WRITE, 0, 0, u32::MAX)),
        Action::Hangup(_)
    ));
}

#[test]
fn unknown_commands_and_flags_get_einval() {
    let session = session(true);
    assert_eq!(error_of(&run(&session, request(99, 0, 0, 0))), NBD_EINVAL);
    // REQ_ONE belongs to block status, not to read.
    assert_eq!(
        error_of(&run(
            &session,
            request(NBD_CMD_READ, NBD_CMD_FLAG_REQ_ONE, 0, 512)
        )),
        NBD_EINVAL
    );
    assert_eq!(
        error_of(&run(&session, request(NBD_CMD_FLUSH, 0x8000, 0, 0))),
        NBD_EINVAL
    );
    // DF needs structured replies.
    let simple = session_on(Device::from_device(MemoryDevice::new(SIZE)), false);
    assert_eq!(
        error_of(&run(
            &simple,
            request(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512)
        )),
        NBD_EINVAL
    );
    // FUA is accepted on every command.
    assert_eq!(
        error_of(&run(
            &session,
            request(NBD_CMD_READ, NBD_CMD_FLAG_FUA, 0, 512)
        )),
        0
    );
}

#[test]
fn read_only_exports_refuse_writes_with_eperm() {
    let device = Device::from_device(MemoryDevice::new(SIZE));
    let session = session_on(device.read_only(), true);
    assert_eq!(error_of(&write(&session, 0, &[1u8; 512], 0)), NBD_EPERM);
    assert_eq!(
        error_of(&run(&session, request(NBD_CMD_TRIM, 0, 0, 512))),
        NBD_EPERM
    );
    assert_eq!(
        error_of(&run(&session, request(NBD_CMD_WRITE_ZEROES, 0, 0, 512))),
        NBD_EPERM
    );
    let mut buf = [0u8; 512];
    device.read(&mut buf, 0).unwrap();
    assert_eq!(buf, [0u8; 512]);
}

#[test]
fn sparse_reads_become_holes_and_block_status_reports_them() {
    let session = session(true);
    write(&session, 0, &[9u8; 65536], 0);
    let reply = run(&session, request(NBD_CMD_READ, 0, 1 << 20, 1 << 20));
    let (header, _) = ReplyHeader::decode(&reply.head).unwrap().unwrap();
    assert!(matches!(
        header,
        ReplyHeader::Chunk {
            kind: NBD_REPLY_TYPE_OFFSET_HOLE,
            ..
        }
    ));

    let reply = run(&session, request(NBD_CMD_BLOCK_STATUS, 0, 0, 1 << 20));
    let (context, descriptors) = decode_block_status(&reply.head[CHUNK_HEADER_LEN..]).unwrap();
    assert_eq!(context, 1);
    assert_eq!(
        descriptors,
        vec![
            (65536, 0),
            ((1 << 20) - 65536, NBD_STATE_HOLE | NBD_STATE_ZERO)
        ]
    );

    let reply = run(
        &session,
        request(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 0, 1 << 20),
    );
    let (_, descriptors) = decode_block_status(&reply.head[CHUNK_HEADER_LEN..]).unwrap();
    assert_eq!(descriptors, vec![(65536, 0)]);
}

#[test]
fn write_zeroes_flavours() {
    let session = session(true);
    write(&session, 0, &[3u8; 8192], 0);
    let fast = NBD_CMD_FLAG_FAST_ZERO | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FUA;
    assert_eq!(
        error_of(&run(&session, request(NBD_CMD_WRITE_ZEROES, fast, 0, 8192))),
        0
    );
    let reply = run(&session, request(NBD_CMD_READ, 0, 0, 8192));
    assert_eq!(read_data(&reply), vec![0u8; 8192]);
}

/// A reply sink the test can read after the connection ends.
#[derive(Clone, Default)]
struct SharedSink(Arc<Mutex<Vec<u8>>>);

impl Write for SharedSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ReplySink for SharedSink {}

/// Reads every reply in `bytes`: (cookie, error, data of a successful read).
fn parse_replies(mut bytes: &[u8], read_lens: &[(u64, usize)]) -> Vec<(u64, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (header, used) = ReplyHeader::decode(bytes).unwrap().unwrap();
        bytes = &bytes[used..];
        match header {
            ReplyHeader::Simple { error, cookie } => {
                let len = read_lens
                    .iter()
                    .find(|(c, _)| *c == cookie)
                    .map_or(0, |r| r.1);
                let len = if error == 0 { len } else { 0 };
                out.push((cookie, error, bytes[..len].to_vec()));
                bytes = &bytes[len..];
            }
            ReplyHeader::Chunk {
                cookie, len, kind, ..
            } => {
                let payload = &bytes[..len as usize];
                let entry = match kind {
                    NBD_REPLY_TYPE_OFFSET_DATA => (cookie, 0, payload[8..].to_vec()),
                    NBD_REPLY_TYPE_ERROR => {
                        (cookie, decode_error_payload(payload).unwrap().0, Vec::new())
                    }
                    _ => (cookie, 0, Vec::new()),
                };
                out.push(entry);
                bytes = &bytes[len as usize..];
            }
            ReplyHeader::Extended { .. } => panic!("extended reply without extended headers"),
        }
    }
    out
}

#[test]
fn a_connection_runs_from_a_byte_stream_without_sockets() {
    let session = Arc::new(session(true));
    let mut input = Vec::new();
    let mut reads = Vec::new();
    for i in 0..32u64 {
        let write = Request {
            flags: 0,
            command: NBD_CMD_WRITE,
            cookie: i,
            offset: i * 4096,
            len: 4096,
        };
        write.encode(&mut input);
        input.extend(std::iter::repeat_n(i as u8, 4096));
    }
    let flush = Request {
        flags: 0,
        command: NBD_CMD_FLUSH,
        cookie: 100,
        offset: 0,
        len: 0,
    };
    flush.encode(&mut input);
    for i in 0..32u64 {
        let read = Request {
            flags: 0,
            command: NBD_CMD_READ,
            cookie: 200 + i,
            offset: i * 4096,
            len: 4096,
        };
        read.encode(&mut input);
        reads.push((200 + i, 4096));
    }
    let bad = Request {
        flags: 0,
        command: 77,
        cookie: 300,
        offset: 0,
        len: 0,
    };
    bad.encode(&mut input);
    Request {
        flags: 0,
        command: NBD_CMD_DISC,
        cookie: 301,
        offset: 0,
        len: 0,
    }
    .encode(&mut input);
    // Nothing after DISC may be processed.
    Request {
        flags: 0,
        command: NBD_CMD_READ,
        cookie: 302,
        offset: 0,
        len: 512,
    }
    .encode(&mut input);

    let sink = SharedSink::default();
    let writer = Arc::new(ReplyWriter::new(sink.clone()));
    let pool = WorkerPool::new("test-worker", 2);
    let ending = transmit(session, Cursor::new(input), writer, &pool);
    assert!(matches!(ending, Ending::Disconnect), "{ending:?}");

    let output = sink.0.lock().unwrap().clone();
    let replies = parse_replies(&output, &reads);
    assert_eq!(replies.len(), 32 + 1 + 32 + 1);
    for (cookie, error, data) in &replies {
        match cookie {
            0..=31 | 100 => assert_eq!(*error, 0),
            200..=231 => {
                assert_eq!(*error, 0);
                assert_eq!(data, &vec![(cookie - 200) as u8; 4096]);
            }
            300 => assert_eq!(*error, NBD_EINVAL),
            other => panic!("unexpected reply for cookie {other}"),
        }
    }
}

#[test]
fn a_truncated_payload_never_reaches_the_device() {
    let device = Device::from_device(MemoryDevice::new(SIZE));
    let session = Arc::new(session_on(device.clone(), false));
    let mut input = Vec::new();
    Request {
        flags: 0,
        command: NBD_CMD_WRITE,
        cookie: 1,
        offset: 0,
        len: 8192,
    }
    .encode(&mut input);
    input.extend(std::iter::repeat_n(0xEEu8, 5000));
    let writer = Arc::new(ReplyWriter::new(SharedSink::default()));
    let pool = WorkerPool::new("test-worker", 1);
    let ending = transmit(session, Cursor::new(input), writer, &pool);
    assert!(matches!(ending, Ending::Violation(_)), "{ending:?}");
    let mut buf = vec![0u8; 8192];
    device.read(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn a_bad_magic_ends_the_connection() {
    let session = Arc::new(session(false));
    let mut input = Vec::new();
    Request {
        flags: 0,
        command: NBD_CMD_FLUSH,
        cookie: 1,
        offset: 0,
        len: 0,
    }
    .encode(&mut input);
    input[0] ^= 0xff;
    let writer = Arc::new(ReplyWriter::new(SharedSink::default()));
    let pool = WorkerPool::new("test-worker", 1);
    let ending = transmit(session, Cursor::new(input), writer, &pool);
    assert!(
        matches!(ending, Ending::Violation(ref reason) if reason.contains("magic")),
        "{ending:?}"
    );
}

#[test]
fn cached_reads_leave_by_sendfile_only_when_the_session_allows_it() {
    use blockwire_blockdev::{FileDevice, FileOptions};
    let file = tempfile::NamedTempFile::new().unwrap();
    file.as_file().set_len(SIZE).unwrap();
    let device =
        Device::from_device(FileDevice::open(file.path(), FileOptions::default()).unwrap());
    let mut session = session_on(device.clone(), true);
    let data = vec![0x5au8; 256 * 1024];
    assert_eq!(error_of(&write(&session, 0, &data, 0)), 0);
    let read = |session: &Session| {
        let Action::Execute(job) = session.classify(&request(NBD_CMD_READ, 0, 0, 256 * 1024))
        else {
            panic!("a read is a job")
        };
        session
            .execute_inline(job)
            .expect("cached data is read inline")
    };
    // Off by default: the data is copied into the reply.
    let reply = read(&session);
    assert_eq!(read_data(&reply), data);
    session.set_zero_copy_reads(true);
    let reply = read(&session);
    // Without cachestat(2) (Linux < 6.5) residency is unknown and data is copied.
    let resident = matches!(device.cached_file(0, data.len() as u64), Ok(Some(_)));
    match &reply.data {
        ReplyData::File(slice) => assert_eq!((slice.offset, slice.len), (0, data.len())),
        ReplyData::Buffer(buf) if !resident => {
            eprintln!("no cachestat here: copied {} bytes", buf.len())
        }
        other => panic!("resident data should leave by sendfile, got {other:?}"),
    }
}

#[test]
fn mapped_reads_send_the_cached_file_bytes() {
    use crate::target::stream::Stream;
    use crate::wire::SIMPLE_REPLY_LEN;
    use blockwire_blockdev::{FileDevice, FileOptions};
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    let file = tempfile::NamedTempFile::new().unwrap();
    file.as_file().set_len(SIZE).unwrap();
    let device =
        Device::from_device(FileDevice::open(file.path(), FileOptions::default()).unwrap());
    let mut session = session_on(device.clone(), false);
    let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 253) as u8).collect();
    assert_eq!(error_of(&write(&session, 4096, &data, 0)), 0);
    session.set_mapped_reads(true);
    let job = || {
        let Action::Execute(job) =
            session.classify(&request(NBD_CMD_READ, 0, 4096, data.len() as u32))
        else {
            panic!("a read is a job")
        };
        job
    };
    // The connection thread's path and a worker's.
    let mut replies = vec![
        session
            .execute_inline(job())
            .expect("cached data is read inline"),
        session.execute(job()),
    ];
    // Without cachestat(2) (Linux < 6.5) residency is unknown and data is copied.
    if !matches!(device.cached_file(4096, data.len() as u64), Ok(Some(_))) {
        eprintln!("no cachestat here: reads copy");
        return;
    }
    for reply in &replies {
        assert!(matches!(reply.data, ReplyData::Mapped(_)), "{reply:?}");
    }
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).unwrap();
        got
    });
    let writer = ReplyWriter::new(Stream::Unix(ours));
    writer.send(&mut replies).unwrap();
    drop(writer);
    let got = reader.join().unwrap();
    let one = SIMPLE_REPLY_LEN + data.len();
    assert_eq!(got.len(), 2 * one);
    for reply in got.chunks(one) {
        assert_eq!(&reply[SIMPLE_REPLY_LEN..], &data[..]);
    }
}

#[test]
fn extended_headers_frame_every_reply_and_take_payloads_only_on_writes() {
    let export = Arc::new(Export::new(
        "disk",
        "",
        Device::from_device(MemoryDevice::new(SIZE)),
    ));
    let flags = crate::target::negotiation::transmission_flags(export.device.info(), true);
    let session = Session::new(export, Framing::Extended, Some(1), flags);
    let extended = |reply: &Reply| match ReplyHeader::decode(&reply.head).unwrap().unwrap().0 {
        ReplyHeader::Extended {
            kind,
            cookie,
            offset,
            flags,
            ..
        } => (kind, cookie, offset, flags),
        other => panic!("not an extended reply: {other:?}"),
    };

    // A write announces its payload with NBD_CMD_FLAG_PAYLOAD_LEN.
    let write = Request {
        flags: NBD_CMD_FLAG_PAYLOAD_LEN,
        command: NBD_CMD_WRITE,
        cookie: 42,
        offset: 8192,
        len: 4096,
    };
    let Action::ReadPayload(request) = session.classify(&write) else {
        panic!("write with PAYLOAD_LEN not accepted");
    };
    let reply = session.execute(session.write_job(&request, IoBuf::from_slice(&[9u8; 4096])));
    // No simple replies: success is a NONE chunk carrying the request's offset.
    assert_eq!(
        extended(&reply),
        (NBD_REPLY_TYPE_NONE, 42, 8192, NBD_REPLY_FLAG_DONE)
    );
    // qemu sends writes without the flag; the payload follows all the same.
    let bare = Request { flags: 0, ..write };
    assert!(matches!(session.classify(&bare), Action::ReadPayload(_)));

    // Reads come back as extended OFFSET_DATA chunks.
    let reply = run(
        &session,
        Request {
            flags: 0,
            command: NBD_CMD_READ,
            cookie: 43,
            offset: 8192,
            len: 4096,
        },
    );
    assert_eq!(
        extended(&reply),
        (NBD_REPLY_TYPE_OFFSET_DATA, 43, 8192, NBD_REPLY_FLAG_DONE)
    );
    assert_eq!(read_data(&reply), vec![9u8; 4096]);

    // A payload on a command that takes none is consumed and refused.
    let trim = Request {
        flags: NBD_CMD_FLAG_PAYLOAD_LEN,
        command: NBD_CMD_TRIM,
        cookie: 44,
        offset: 0,
        len: 16,
    };
    match session.classify(&trim) {
        Action::DiscardPayload { len, reply } => {
            assert_eq!(len, 16);
            assert_eq!(error_of(&reply), NBD_EINVAL);
        }
        other => panic!("unexpected {other:?}"),
    }

    // Block status answers with 64-bit descriptors, and takes a 64-bit effect length.
    let status = Request {
        flags: 0,
        command: NBD_CMD_BLOCK_STATUS,
        cookie: 45,
        offset: 0,
        len: SIZE,
    };
    let reply = run(&session, status);
    assert_eq!(extended(&reply).0, NBD_REPLY_TYPE_BLOCK_STATUS_EXT);
    let (context, descriptors) =
        decode_block_status_ext(&reply.head[EXTENDED_REPLY_LEN..]).unwrap();
    assert_eq!(context, 1);
    assert_eq!(descriptors.iter().map(|d| d.0).sum::<u64>(), SIZE);
    assert!(
        descriptors.iter().any(|&(_, status)| status == 0),
        "no data extent"
    );
    let huge = run(
        &session,
        Request {
            len: 1 << 40,
            ..status
        },
    );
    assert_eq!(error_of(&huge), NBD_EINVAL);

    // Flush echoes its offset too.
    let flush = Request {
        flags: 0,
        command: NBD_CMD_FLUSH,
        cookie: 46,
        offset: 0,
        len: 0,
    };
    assert_eq!(extended(&run(&session, flush)).0, NBD_REPLY_TYPE_NONE);
}

#[test]
fn an_extended_session_reads_32_byte_headers_and_refuses_compact_ones() {
    let export = Arc::new(Export::new(
        "disk",
        "",
        Device::from_device(MemoryDevice::new(SIZE)),
    ));
    let flags = crate::target::negotiation::transmission_flags(export.device.info(), true);
    let session = Arc::new(Session::new(export, Framing::Extended, None, flags));
    let request = |command, cookie, len| Request {
        flags: 0,
        command,
        cookie,
        offset: 4096,
        len,
    };
    // A write (its payload follows the 32-byte header), a read, then a compact
    // header, which is garbage here: the connection ends after two replies.
    let mut input = Vec::new();
    request(NBD_CMD_WRITE, 1, 512).encode_extended(&mut input);
    input.extend_from_slice(&[3u8; 512]);
    request(NBD_CMD_READ, 2, 512).encode_extended(&mut input);
    request(NBD_CMD_FLUSH, 3, 0).encode(&mut input);
    input.extend_from_slice(&[0u8; 4]);
    let sink = SharedSink::default();
    let writer = Arc::new(ReplyWriter::new(sink.clone()));
    let pool = WorkerPool::new("test-worker", 1);
    let ending = transmit(session, Cursor::new(input), writer, &pool);
    assert!(
        matches!(ending, Ending::Violation(ref reason) if reason.contains("magic")),
        "{ending:?}"
    );
    let output = sink.0.lock().unwrap().clone();
    let (first, used) = ReplyHeader::decode(&output).unwrap().unwrap();
    assert!(matches!(
        first,
        ReplyHeader::Extended {
            kind: NBD_REPLY_TYPE_NONE,
            cookie: 1,
            offset: 4096,
            ..
        }
    ));
    let (second, at) = ReplyHeader::decode(&output[used..]).unwrap().unwrap();
    let ReplyHeader::Extended {
        kind, cookie, len, ..
    } = second
    else {
        panic!("not extended: {second:?}");
    };
    assert_eq!(
        (kind, cookie, len),
        (NBD_REPLY_TYPE_OFFSET_DATA, 2, 512 + 8)
    );
    assert_eq!(&output[used + at + 8..], &[3u8; 512]);
}

#[test]
fn a_retired_export_answers_eshutdown_and_still_disconnects() {
    for structured in [false, true] {
        let session = session(structured);
        assert_eq!(error_of(&write(&session, 0, &[7u8; 512], 0)), 0);
        session.export().retire();
        let read = session.classify(&request(NBD_CMD_READ, 0, 0, 512));
        assert!(
            matches!(&read, Action::Reply(reply) if error_of(reply) == NBD_ESHUTDOWN),
            "{read:?}"
        );
        // The payload is read and dropped: the connection stays in step.
        match session.classify(&request(NBD_CMD_WRITE, 0, 0, 512)) {
            Action::DiscardPayload { len, reply } => {
                assert_eq!(len, 512);
                assert_eq!(error_of(&reply), NBD_ESHUTDOWN);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            session.classify(&request(NBD_CMD_DISC, 0, 0, 0)),
            Action::Disconnect
        ));
        // What was written before is untouched.
        let mut data = vec![0u8; 512];
        session.export().device.read(&mut data, 0).unwrap();
        assert_eq!(data, [7u8; 512]);
    }
}
