//! Robustness of the NBD target against clients that misbehave, push limits or
//! pipeline hard: raw NBD spoken over `TcpStream` to the release binary, with every
//! message built and parsed by `blockwire_nbd::wire`.
//!
//! Every socket has a read timeout, so a server that hangs fails the test instead of
//! hanging it.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use blockwire_nbd::wire::*;
use blockwire_tests::{patterned_file, sparse_file, Served};

const EXPORT: &str = "disk";
const SIZE: u64 = 16 << 20;
const MIB: u32 = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(10);

// ------------------------------------------------------------------ raw client

fn connect(port: u16) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to blockwire");
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(TIMEOUT)).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

fn read_bytes(stream: &mut TcpStream, len: usize, what: &str) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    if let Err(e) = stream.read_exact(&mut buf) {
        panic!("reading {what} ({len} bytes) failed: {e}");
    }
    buf
}

/// Asserts that the server closed the connection: a read ends (EOF or reset) rather
/// than returning data or timing out.
fn expect_closed(stream: &mut TcpStream, context: &str) {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => panic!("{context}: expected the server to close, got {n} bytes"),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) =>
            {
                return
            }
            Err(e) => panic!("{context}: expected the server to close, got {e}"),
        }
        assert!(Instant::now() < deadline, "{context}: server did not close");
    }
}

/// Connects, checks the greeting and sends `client_flags`.
fn handshake(port: u16, client_flags: u32) -> TcpStream {
    let mut stream = connect(port);
    let greeting: [u8; GREETING_LEN] = read_bytes(&mut stream, GREETING_LEN, "greeting")
        .try_into()
        .unwrap();
    let flags = decode_greeting(&greeting).expect("valid greeting");
    assert_ne!(
        flags & NBD_FLAG_FIXED_NEWSTYLE,
        0,
        "server is not fixed newstyle"
    );
    stream.write_all(&client_flags.to_be_bytes()).unwrap();
    stream
}

fn fixed_handshake(port: u16) -> TcpStream {
    handshake(port, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)
}

fn send_option(stream: &mut TcpStream, option: &ClientOption) {
    let mut out = Vec::new();
    option.encode(&mut out);
    stream.write_all(&out).unwrap();
}

fn send_raw_option(stream: &mut TcpStream, option: u32, data: &[u8]) {
    let mut out = Vec::new();
    OptionHeader::encode(&mut out, option, data);
    stream.write_all(&out).unwrap();
}

#[derive(Debug)]
struct OptReply {
    header: OptionReplyHeader,
    payload: Vec<u8>,
}

fn read_option_reply(stream: &mut TcpStream) -> OptReply {
    let head: [u8; OPTION_REPLY_HEADER_LEN] =
        read_bytes(stream, OPTION_REPLY_HEADER_LEN, "option reply header")
            .try_into()
            .unwrap();
    let header = OptionReplyHeader::decode(&head).expect("valid option reply header");
    let payload = read_bytes(stream, header.len as usize, "option reply payload");
    OptReply { header, payload }
}

/// Reads the replies to one option until its final reply (ACK or error); returns all.
fn read_option_replies(stream: &mut TcpStream, option: u32) -> Vec<OptReply> {
    let mut replies = Vec::new();
    loop {
        let reply = read_option_reply(stream);
        assert_eq!(
            reply.header.option, option,
            "reply is for the wrong option: {reply:?}"
        );
        let last =
            reply.header.reply == NBD_REP_ACK || reply.header.reply & NBD_REP_FLAG_ERROR != 0;
        replies.push(reply);
        if last {
            return replies;
        }
        assert!(replies.len() < 100, "too many replies to option {option}");
    }
}

/// Sends NBD_OPT_GO asking for the block sizes; returns the export size and
/// transmission flags, or the error reply type.
fn go(stream: &mut TcpStream, name: &str) -> Result<(u64, u16), u32> {
    go_asking(stream, name, vec![NBD_INFO_BLOCK_SIZE])
}

/// NBD_OPT_GO with the information requests `requests`.
fn go_asking(stream: &mut TcpStream, name: &str, requests: Vec<u16>) -> Result<(u64, u16), u32> {
    send_option(
        stream,
        &ClientOption::Go {
            name: name.to_string(),
            requests,
        },
    );
    let mut export = None;
    for reply in read_option_replies(stream, NBD_OPT_GO) {
        match reply.header.reply {
            NBD_REP_INFO => {
                if let InfoReply::Export { size, flags } =
                    InfoReply::decode(&reply.payload).expect("valid NBD_REP_INFO")
                {
                    export = Some((size, flags));
                }
            }
            NBD_REP_ACK => return Ok(export.expect("NBD_INFO_EXPORT before NBD_REP_ACK")),
            error if error & NBD_REP_FLAG_ERROR != 0 => return Err(error),
            other => panic!("unexpected reply {other:#x} to NBD_OPT_GO"),
        }
    }
    unreachable!("read_option_replies ends with ACK or an error")
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    command: u16,
    offset: u64,
    len: u32,
}

/// One complete reply to a request.
#[derive(Debug, Default)]
struct Reply {
    cookie: u64,
    error: u32,
    data: Vec<u8>,
    context: Option<u32>,
    extents: Vec<(u32, u32)>,
}

/// A raw NBD client in transmission.
struct Client {
    stream: TcpStream,
    structured: bool,
    size: u64,
    flags: u16,
    context: Option<u32>,
    pending: HashMap<u64, Pending>,
    partial: HashMap<u64, Reply>,
    next_cookie: u64,
}

impl Client {
    fn open(port: u16) -> Client {
        Client::open_with(port, false, false)
    }

    fn open_structured(port: u16) -> Client {
        Client::open_with(port, true, false)
    }

    /// Handshake, optionally structured replies and `base:allocation`, then GO.
    fn open_with(port: u16, structured: bool, base_allocation: bool) -> Client {
        let mut stream = fixed_handshake(port);
        if structured {
            send_option(&mut stream, &ClientOption::StructuredReply);
            let replies = read_option_replies(&mut stream, NBD_OPT_STRUCTURED_REPLY);
            assert_eq!(replies.len(), 1);
            assert_eq!(replies[0].header.reply, NBD_REP_ACK);
        }
        let mut context = None;
        if base_allocation {
            send_option(
                &mut stream,
                &ClientOption::SetMetaContext {
                    name: EXPORT.into(),
                    queries: vec![BASE_ALLOCATION.into()],
                },
            );
            for reply in read_option_replies(&mut stream, NBD_OPT_SET_META_CONTEXT) {
                match reply.header.reply {
                    NBD_REP_META_CONTEXT => {
                        assert!(reply.payload.len() > 4, "short NBD_REP_META_CONTEXT");
                        let id = u32::from_be_bytes(reply.payload[..4].try_into().unwrap());
                        assert_eq!(&reply.payload[4..], BASE_ALLOCATION.as_bytes());
                        context = Some(id);
                    }
                    NBD_REP_ACK => {}
                    other => panic!("SET_META_CONTEXT failed: {other:#x}"),
                }
            }
            assert!(context.is_some(), "base:allocation was not selected");
        }
        let (size, flags) = go(&mut stream, EXPORT).expect("NBD_OPT_GO");
        Client::in_transmission(stream, structured, size, flags, context)
    }

    /// A client that never learns our block sizes: NBD_OPT_EXPORT_NAME, or (with
    /// `structured`) structured replies and NBD_OPT_GO without NBD_INFO_BLOCK_SIZE.
    fn without_sizes(port: u16, structured: bool) -> Client {
        let mut stream = fixed_handshake(port);
        let (size, flags) = if structured {
            send_option(&mut stream, &ClientOption::StructuredReply);
            let replies = read_option_replies(&mut stream, NBD_OPT_STRUCTURED_REPLY);
            assert_eq!(replies[0].header.reply, NBD_REP_ACK);
            go_asking(&mut stream, EXPORT, vec![]).expect("NBD_OPT_GO")
        } else {
            send_option(&mut stream, &ClientOption::ExportName(EXPORT.into()));
            // NO_ZEROES was negotiated: size and flags only.
            let reply = read_bytes(&mut stream, 10, "NBD_OPT_EXPORT_NAME reply");
            let size = u64::from_be_bytes(reply[..8].try_into().unwrap());
            (size, u16::from_be_bytes([reply[8], reply[9]]))
        };
        Client {
            stream,
            structured,
            size,
            flags,
            context: None,
            pending: HashMap::new(),
            partial: HashMap::new(),
            next_cookie: 0x1a7e_0000_0000_0001,
        }
    }

    fn in_transmission(
        stream: TcpStream,
        structured: bool,
        size: u64,
        flags: u16,
        context: Option<u32>,
    ) -> Client {
        assert_eq!(size, SIZE, "export size");
        assert_ne!(flags & NBD_FLAG_HAS_FLAGS, 0);
        Client {
            stream,
            structured,
            size,
            flags,
            context,
            pending: HashMap::new(),
            partial: HashMap::new(),
            next_cookie: 0x5eed_0000_0000_0001,
        }
    }

    /// Encodes a request (and payload) into `out` and records it as pending.
    fn queue(
        &mut self,
        out: &mut Vec<u8>,
        flags: u16,
        command: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 0x1_0001;
        Request {
            flags,
            command,
            cookie,
            offset,
            len: len.into(),
        }
        .encode(out);
        out.extend_from_slice(payload);
        if command != NBD_CMD_DISC {
            let old = self.pending.insert(
                cookie,
                Pending {
                    command,
                    offset,
                    len,
                },
            );
            assert!(old.is_none());
        }
        cookie
    }

    fn send(&mut self, flags: u16, command: u16, offset: u64, len: u32, payload: &[u8]) -> u64 {
        let mut out = Vec::with_capacity(REQUEST_LEN + payload.len());
        let cookie = self.queue(&mut out, flags, command, offset, len, payload);
        self.stream.write_all(&out).expect("send request");
        cookie
    }

    /// Sends `bytes` from another thread, so that replies can be read meanwhile.
    fn send_in_background(&self, bytes: Vec<u8>) -> JoinHandle<()> {
        let mut stream = self.stream.try_clone().unwrap();
        std::thread::spawn(move || stream.write_all(&bytes).expect("send pipelined requests"))
    }

    /// Reads the next complete reply (simple, or structured chunks up to DONE).
    fn recv(&mut self) -> Reply {
        self.try_recv().expect("the server closed the connection")
    }

    /// Like [`recv`](Self::recv), but `None` when the server closed the connection
    /// between replies.
    fn try_recv(&mut self) -> Option<Reply> {
        loop {
            let mut magic = vec![0u8; 4];
            match self.stream.read_exact(&mut magic) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::UnexpectedEof
                            | ErrorKind::ConnectionReset
                            | ErrorKind::ConnectionAborted
                    ) =>
                {
                    return None
                }
                Err(e) => panic!("reading a reply failed: {e}"),
            }
            let rest = match u32::from_be_bytes(magic[..4].try_into().unwrap()) {
                NBD_SIMPLE_REPLY_MAGIC => SIMPLE_REPLY_LEN - 4,
                NBD_STRUCTURED_REPLY_MAGIC => CHUNK_HEADER_LEN - 4,
                other => panic!("bad reply magic {other:#x}"),
            };
            let mut head = magic;
            head.extend(read_bytes(&mut self.stream, rest, "reply header"));
            let (header, used) = ReplyHeader::decode(&head)
                .expect("valid reply header")
                .expect("complete reply header");
            assert_eq!(used, head.len());
            match header {
                ReplyHeader::Simple { error, cookie } => {
                    let pending = self
                        .pending
                        .remove(&cookie)
                        .unwrap_or_else(|| panic!("simple reply for unknown cookie {cookie:#x}"));
                    assert!(
                        !self.partial.contains_key(&cookie),
                        "simple reply after chunks for cookie {cookie:#x}"
                    );
                    let mut reply = Reply {
                        cookie,
                        error,
                        ..Reply::default()
                    };
                    if pending.command == NBD_CMD_READ {
                        assert!(
                            !self.structured,
                            "simple reply to a read after structured replies were negotiated"
                        );
                        if error == 0 {
                            reply.data =
                                read_bytes(&mut self.stream, pending.len as usize, "read data");
                        }
                    }
                    return Some(reply);
                }
                ReplyHeader::Chunk {
                    flags,
                    kind,
                    cookie,
                    len,
                } => {
                    assert!(self.structured, "structured reply without negotiation");
                    let payload = read_bytes(&mut self.stream, len as usize, "chunk payload");
                    let pending = *self
                        .pending
                        .get(&cookie)
                        .unwrap_or_else(|| panic!("chunk for unknown cookie {cookie:#x}"));
                    let reply = self.partial.entry(cookie).or_insert_with(|| Reply {
                        cookie,
                        data: if pending.command == NBD_CMD_READ {
                            vec![0u8; pending.len as usize]
                        } else {
                            Vec::new()
                        },
                        ..Reply::default()
                    });
                    let in_request = |offset: u64, len: u64| {
                        assert!(
                            offset >= pending.offset
                                && offset + len <= pending.offset + u64::from(pending.len),
                            "chunk {offset}+{len} outside the request {pending:?}"
                        );
                        (offset - pending.offset) as usize
                    };
                    match kind {
                        NBD_REPLY_TYPE_NONE => assert!(payload.is_empty()),
                        NBD_REPLY_TYPE_OFFSET_DATA => {
                            assert_eq!(pending.command, NBD_CMD_READ);
                            assert!(payload.len() >= 8);
                            let offset = u64::from_be_bytes(payload[..8].try_into().unwrap());
                            let data = &payload[8..];
                            let at = in_request(offset, data.len() as u64);
                            reply.data[at..at + data.len()].copy_from_slice(data);
                        }
                        NBD_REPLY_TYPE_OFFSET_HOLE => {
                            assert_eq!(pending.command, NBD_CMD_READ);
                            assert_eq!(payload.len(), 12);
                            let offset = u64::from_be_bytes(payload[..8].try_into().unwrap());
                            let hole = u32::from_be_bytes(payload[8..].try_into().unwrap());
                            let at = in_request(offset, hole.into());
                            reply.data[at..at + hole as usize].fill(0);
                        }
                        NBD_REPLY_TYPE_BLOCK_STATUS => {
                            assert_eq!(pending.command, NBD_CMD_BLOCK_STATUS);
                            let (context, extents) =
                                decode_block_status(&payload).expect("valid block status");
                            reply.context = Some(context);
                            reply.extents.extend(extents);
                        }
                        kind if kind & (1 << 15) != 0 => {
                            let (error, _message) =
                                decode_error_payload(&payload).expect("valid error chunk");
                            assert_ne!(error, 0, "error chunk with error 0");
                            reply.error = error;
                        }
                        other => panic!("unknown chunk type {other}"),
                    }
                    if flags & NBD_REPLY_FLAG_DONE != 0 {
                        self.pending.remove(&cookie);
                        let mut reply = self.partial.remove(&cookie).unwrap();
                        if reply.error != 0 {
                            reply.data.clear();
                        }
                        return Some(reply);
                    }
                }
                ReplyHeader::Extended { .. } => panic!("extended reply chunk, never negotiated"),
            }
        }
    }

    fn request(
        &mut self,
        flags: u16,
        command: u16,
        offset: u64,
        len: u32,
        payload: &[u8],
    ) -> Reply {
        let cookie = self.send(flags, command, offset, len, payload);
        let reply = self.recv();
        assert_eq!(reply.cookie, cookie, "reply for another request");
        reply
    }

    fn read(&mut self, offset: u64, len: u32) -> Reply {
        self.request(0, NBD_CMD_READ, offset, len, &[])
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Reply {
        self.request(0, NBD_CMD_WRITE, offset, data.len() as u32, data)
    }

    fn read_ok(&mut self, offset: u64, len: u32) -> Vec<u8> {
        let reply = self.read(offset, len);
        assert_eq!(reply.error, 0, "read {offset}+{len} failed");
        assert_eq!(reply.data.len(), len as usize);
        reply.data
    }

    fn write_ok(&mut self, offset: u64, data: &[u8]) {
        let reply = self.write(offset, data);
        assert_eq!(reply.error, 0, "write {offset}+{} failed", data.len());
    }

    /// A write and a read back of a fresh pattern: proves the connection works.
    fn check_works(&mut self, offset: u64, seed: u8) {
        let data = pattern(8192, seed);
        self.write_ok(offset, &data);
        assert_eq!(self.read_ok(offset, 8192), data, "read back at {offset}");
    }

    /// NBD_CMD_DISC, then the server closes.
    fn disconnect(mut self) {
        self.send(0, NBD_CMD_DISC, 0, 0, &[]);
        assert!(self.pending.is_empty());
        expect_closed(&mut self.stream, "after NBD_CMD_DISC");
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7) ^ ((i >> 8) as u8).wrapping_add(seed) ^ 0x5a)
        .collect()
}

/// Serves a 16 MiB sparse file as `disk`.
fn serve_sparse(dir: &Path) -> (Served, PathBuf) {
    let path = sparse_file(dir, "disk.img", SIZE);
    let served = Served::start(&[path.to_str().unwrap(), "--name", EXPORT], EXPORT);
    (served, path)
}

fn file_range(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let bytes = std::fs::read(path).expect("read backing file");
    bytes[offset as usize..offset as usize + len].to_vec()
}

// ----------------------------------------------------------------------- tests

#[test]
fn requests_beyond_the_end_fail_and_the_connection_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    for structured in [false, true] {
        let mut client = Client::open_with(served.port, structured, false);
        // Entirely beyond and straddling the end.
        for (offset, len) in [(SIZE, 4096), (SIZE - 4096, 8192)] {
            let read = client.read(offset, len);
            assert_eq!(
                read.error, NBD_EINVAL,
                "read {offset}+{len} (structured {structured})"
            );
            assert!(read.data.is_empty());
            let write = client.write(offset, &vec![0xee; len as usize]);
            assert_eq!(
                write.error, NBD_ENOSPC,
                "write {offset}+{len} (structured {structured})"
            );
        }
        // Large payloads too: the range is checked before any byte moves.
        for (offset, len) in [
            (SIZE, 65536),
            (SIZE - 65536, 131072),
            (SIZE - 4096, 1 << 20),
        ] {
            let write = client.write(offset, &vec![0xee; len as usize]);
            assert_eq!(
                write.error, NBD_ENOSPC,
                "write {offset}+{len} (structured {structured})"
            );
        }
        // An offset where offset + length overflows u64: refused, either way.
        let offset = u64::MAX - 511;
        let read = client.read(offset, 4096);
        assert_eq!(read.error, NBD_EINVAL, "read at {offset:#x}");
        let write = client.write(offset, &[0xee; 4096]);
        assert!(
            matches!(write.error, NBD_EINVAL | NBD_ENOSPC),
            "write at {offset:#x}: error {}",
            write.error
        );
        // The last block is still fine, and so is everything after the errors.
        let last = pattern(4096, 3);
        client.write_ok(SIZE - 4096, &last);
        assert_eq!(client.read_ok(SIZE - 4096, 4096), last);
        client.check_works(1 << 20, structured as u8);
        client.disconnect();
    }
    assert_eq!(served.terminate(), Some(0));
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        SIZE,
        "a write past the end grew the file"
    );
    assert_eq!(file_range(&path, SIZE - 4096, 4096), pattern(4096, 3));
    assert!(
        file_range(&path, SIZE - (1 << 20), (1 << 20) - 4096)
            .iter()
            .all(|&b| b == 0),
        "a write refused with ENOSPC changed the in-range part"
    );
}

#[test]
fn oversized_requests_get_einval_or_close_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    for structured in [false, true] {
        let mut client = Client::open_with(served.port, structured, false);
        let read = client.read(0, 33 * MIB);
        assert_eq!(
            read.error, NBD_EINVAL,
            "33 MiB read (structured {structured})"
        );

        // Above the advertised maximum but below the discard limit: the payload is
        // read and thrown away, and the connection stays in step.
        let big = vec![0xabu8; 40 * MIB as usize];
        let write = client.write(0, &big);
        assert_eq!(
            write.error, NBD_EINVAL,
            "40 MiB write (structured {structured})"
        );
        client.check_works(2 << 20, 10 + structured as u8);
        client.disconnect();
    }
    assert_eq!(
        file_range(&path, 0, 4096),
        vec![0u8; 4096],
        "part of the refused 40 MiB write reached the file"
    );

    // A write header claiming 1 GiB: the server hangs up on this client only.
    let mut bystander = Client::open(served.port);
    let mut client = Client::open(served.port);
    let mut out = Vec::new();
    Request {
        flags: 0,
        command: NBD_CMD_WRITE,
        cookie: 1,
        offset: 0,
        len: 1 << 30,
    }
    .encode(&mut out);
    client.stream.write_all(&out).unwrap();
    expect_closed(&mut client.stream, "write header claiming 1 GiB");

    let mut fresh = Client::open(served.port);
    fresh.check_works(3 << 20, 20);
    assert_eq!(fresh.read_ok(2 << 20, 8192), pattern(8192, 11));
    fresh.disconnect();
    bystander.check_works(4 << 20, 21);
    bystander.disconnect();
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn a_bad_request_magic_closes_only_that_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (served, _path) = serve_sparse(dir.path());
    let mut other = Client::open_structured(served.port);
    other.check_works(0, 1);

    let mut bad = Client::open(served.port);
    bad.check_works(1 << 20, 2);
    let mut out = Vec::new();
    Request {
        flags: 0,
        command: NBD_CMD_READ,
        cookie: 7,
        offset: 0,
        len: 4096,
    }
    .encode(&mut out);
    out[..4].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    bad.stream.write_all(&out).unwrap();
    expect_closed(&mut bad.stream, "bad request magic");

    // The other connection, open all along, still works and sees the bad client's
    // earlier write.
    assert_eq!(other.read_ok(1 << 20, 8192), pattern(8192, 2));
    other.check_works(2 << 20, 3);
    other.disconnect();
    let mut fresh = Client::open(served.port);
    fresh.check_works(3 << 20, 4);
    fresh.disconnect();
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn an_unknown_command_gets_einval() {
    let dir = tempfile::tempdir().unwrap();
    let (served, _path) = serve_sparse(dir.path());
    for structured in [false, true] {
        let mut client = Client::open_with(served.port, structured, false);
        for command in [99u16, 8, 0xffff] {
            let reply = client.request(0, command, 0, 4096, &[]);
            assert_eq!(
                reply.error, NBD_EINVAL,
                "command {command} (structured {structured})"
            );
        }
        client.check_works(0, 5);
        client.disconnect();
    }
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn writes_to_a_read_only_export_get_eperm_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = patterned_file(dir.path(), "ro.img", SIZE as usize, 9);
    let before = std::fs::read(&path).unwrap();
    let served = Served::start(
        &[path.to_str().unwrap(), "--name", EXPORT, "--read-only"],
        EXPORT,
    );
    for structured in [false, true] {
        let mut client = Client::open_with(served.port, structured, false);
        assert_ne!(client.flags & NBD_FLAG_READ_ONLY, 0, "NBD_FLAG_READ_ONLY");
        let write = client.write(4096, &vec![0u8; 8192]);
        assert_eq!(write.error, NBD_EPERM, "write (structured {structured})");
        let fua = client.request(NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, 0, 512, &[0xffu8; 512]);
        assert_eq!(fua.error, NBD_EPERM, "FUA write (structured {structured})");
        for command in [NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES] {
            let reply = client.request(0, command, 0, 65536, &[]);
            assert_eq!(
                reply.error, NBD_EPERM,
                "command {command} on a read-only export"
            );
        }
        // Still in step, and the data is what it was.
        assert_eq!(client.read_ok(0, 16384), before[..16384]);
        client.disconnect();
    }
    assert_eq!(served.terminate(), Some(0));
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the read-only export's file changed"
    );
}

#[test]
fn truncated_handshakes_and_payloads_do_not_hurt_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    let offset = 5u64 << 20;
    let len = 65536usize;

    // Greeting read, then half of the client flags.
    let mut stream = connect(served.port);
    read_bytes(&mut stream, GREETING_LEN, "greeting");
    stream.write_all(&[0, 0]).unwrap();
    drop(stream);
    // Client flags, then half an option header.
    let mut stream = fixed_handshake(served.port);
    stream.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    drop(stream);
    // An option header with a bad magic.
    let mut stream = fixed_handshake(served.port);
    let mut out = Vec::new();
    OptionHeader::encode(&mut out, NBD_OPT_LIST, &[]);
    out[..8].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    stream.write_all(&out).unwrap();
    expect_closed(&mut stream, "option header with a bad magic");

    // A write header and half its payload, then the client goes away: 4 KiB and
    // 64 KiB (within the connection's 256 KiB read buffer), 1 MiB and 8 MiB (larger,
    // read straight into their own buffers) and a FUA write (run on a worker).
    let halves: [(u64, usize, u16); 5] = [
        (offset, len, 0),
        (offset + (1 << 20), 4096, 0),
        (offset + (2 << 20), 1 << 20, 0),
        (0, 8 << 20, 0),
        (offset + (4 << 20), len, NBD_CMD_FLAG_FUA),
    ];
    for (at, size, flags) in halves {
        let mut client = Client::open(served.port);
        let mut out = Vec::new();
        let half = vec![0xaa; size / 2];
        client.queue(&mut out, flags, NBD_CMD_WRITE, at, size as u32, &half);
        client.stream.write_all(&out).unwrap();
        client.stream.shutdown(std::net::Shutdown::Write).unwrap();
        expect_closed(&mut client.stream, "write with half its payload");
    }
    // Half a request header, then the client goes away.
    let mut client = Client::open(served.port);
    let mut out = Vec::new();
    client.queue(&mut out, 0, NBD_CMD_WRITE, offset, 4096, &[0xbb; 4096]);
    client.stream.write_all(&out[..REQUEST_LEN / 2]).unwrap();
    drop(client);

    // The server still serves, and nothing of the half-sent writes reached the device.
    let mut fresh = Client::open(served.port);
    for (at, size, flags) in halves {
        let data = fresh.read_ok(at, size as u32);
        assert!(
            data.iter().all(|&b| b == 0),
            "part of a half-sent {size}-byte write (flags {flags}) reached the device"
        );
    }
    fresh.check_works(12 << 20, 6);
    fresh.disconnect();
    assert_eq!(served.terminate(), Some(0));
    let file = std::fs::read(&path).unwrap();
    assert_eq!(file.len() as u64, SIZE);
    assert!(
        file[..12 << 20].iter().all(|&b| b == 0),
        "a partial write payload reached the backing file"
    );
    assert_eq!(file_range(&path, 12 << 20, 8192), pattern(8192, 6));
}

#[test]
fn bad_and_unsupported_options_get_error_replies_and_negotiation_continues() {
    let dir = tempfile::tempdir().unwrap();
    let (served, _path) = serve_sparse(dir.path());
    let mut stream = fixed_handshake(served.port);

    // GO whose name length runs past the option data.
    let mut data = Vec::new();
    data.extend_from_slice(&100u32.to_be_bytes());
    data.extend_from_slice(EXPORT.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    send_raw_option(&mut stream, NBD_OPT_GO, &data);
    let replies = read_option_replies(&mut stream, NBD_OPT_GO);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].header.reply, NBD_REP_ERR_INVALID);

    // GO whose request count does not match its length.
    let mut data = Vec::new();
    data.extend_from_slice(&(EXPORT.len() as u32).to_be_bytes());
    data.extend_from_slice(EXPORT.as_bytes());
    data.extend_from_slice(&5u16.to_be_bytes());
    data.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
    send_raw_option(&mut stream, NBD_OPT_GO, &data);
    let replies = read_option_replies(&mut stream, NBD_OPT_GO);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].header.reply, NBD_REP_ERR_INVALID);

    // An option the server does not know.
    send_raw_option(&mut stream, 77, b"whatever");
    let replies = read_option_replies(&mut stream, 77);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].header.reply, NBD_REP_ERR_UNSUP);

    // STARTTLS without TLS configured: an error, never an ACK.
    send_option(&mut stream, &ClientOption::StartTls);
    let replies = read_option_replies(&mut stream, NBD_OPT_STARTTLS);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_ne!(replies[0].header.reply, NBD_REP_ACK);
    assert_ne!(replies[0].header.reply & NBD_REP_FLAG_ERROR, 0);

    // Option data far larger than any real option: refused, still in step.
    send_raw_option(&mut stream, NBD_OPT_LIST, &vec![0u8; 100_000]);
    let replies = read_option_replies(&mut stream, NBD_OPT_LIST);
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_ne!(replies[0].header.reply & NBD_REP_FLAG_ERROR, 0);

    // LIST names the export.
    send_option(&mut stream, &ClientOption::List);
    let replies = read_option_replies(&mut stream, NBD_OPT_LIST);
    assert_eq!(replies.last().unwrap().header.reply, NBD_REP_ACK);
    let names: Vec<String> = replies
        .iter()
        .filter(|r| r.header.reply == NBD_REP_SERVER)
        .map(|r| {
            let len = u32::from_be_bytes(r.payload[..4].try_into().unwrap()) as usize;
            String::from_utf8(r.payload[4..4 + len].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, vec![EXPORT.to_string()]);

    // GO for an export that does not exist.
    assert_eq!(go(&mut stream, "no-such-export"), Err(NBD_REP_ERR_UNKNOWN));

    // And after all that, a correct GO enters transmission.
    let (size, flags) = go(&mut stream, EXPORT).expect("GO after errors");
    let mut client = Client::in_transmission(stream, false, size, flags, None);
    assert_eq!(client.size, SIZE);
    client.check_works(0, 7);
    client.disconnect();

    // NBD_OPT_EXPORT_NAME cannot report errors: an unknown name closes the connection.
    let mut stream = fixed_handshake(served.port);
    send_option(
        &mut stream,
        &ClientOption::ExportName("no-such-export".into()),
    );
    expect_closed(&mut stream, "NBD_OPT_EXPORT_NAME for an unknown export");
    // NBD_OPT_ABORT is acknowledged, then the server closes.
    let mut stream = fixed_handshake(served.port);
    send_option(&mut stream, &ClientOption::Abort);
    let replies = read_option_replies(&mut stream, NBD_OPT_ABORT);
    assert_eq!(replies[0].header.reply, NBD_REP_ACK);
    expect_closed(&mut stream, "after NBD_OPT_ABORT");

    let mut client = Client::open(served.port);
    assert_eq!(client.read_ok(0, 8192), pattern(8192, 7));
    client.disconnect();
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn clients_without_fixed_newstyle_are_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let (served, _path) = serve_sparse(dir.path());
    for flags in [
        0u32,
        NBD_FLAG_C_NO_ZEROES,
        NBD_FLAG_C_FIXED_NEWSTYLE | 1 << 7,
    ] {
        let mut stream = handshake(served.port, flags);
        expect_closed(&mut stream, &format!("client flags {flags:#x}"));
    }
    let mut client = Client::open(served.port);
    client.check_works(0, 8);
    client.disconnect();
    assert_eq!(served.terminate(), Some(0));
}

/// Pipelines `COUNT` writes of `LEN` bytes from `base`, reads every reply, then
/// pipelines reads of the same blocks and checks them; replies are matched by cookie.
fn pipeline<const COUNT: usize, const LEN: usize>(
    port: u16,
    structured: bool,
    base: u64,
    seed: u8,
) {
    let mut client = Client::open_with(port, structured, false);
    let block = |i: usize| pattern(LEN, seed.wrapping_add(i as u8));

    // All writes in flight at once; every third one FUA, so some go through the
    // worker pool and may be answered out of order.
    let mut out = Vec::new();
    let mut writes = HashMap::new();
    for i in 0..COUNT {
        let flags = if i % 3 == 1 { NBD_CMD_FLAG_FUA } else { 0 };
        let offset = base + (i * LEN) as u64;
        let cookie = client.queue(
            &mut out,
            flags,
            NBD_CMD_WRITE,
            offset,
            LEN as u32,
            &block(i),
        );
        writes.insert(cookie, i);
    }
    let sender = client.send_in_background(out);
    for _ in 0..COUNT {
        let reply = client.recv();
        let i = writes
            .remove(&reply.cookie)
            .unwrap_or_else(|| panic!("unexpected or repeated cookie {:#x}", reply.cookie));
        assert_eq!(reply.error, 0, "write {i}");
    }
    sender.join().unwrap();
    assert!(writes.is_empty());

    // All reads in flight, in reverse order.
    let mut out = Vec::new();
    let mut reads = HashMap::new();
    for i in (0..COUNT).rev() {
        let offset = base + (i * LEN) as u64;
        let cookie = client.queue(&mut out, 0, NBD_CMD_READ, offset, LEN as u32, &[]);
        reads.insert(cookie, i);
    }
    let sender = client.send_in_background(out);
    for _ in 0..COUNT {
        let reply = client.recv();
        let i = reads
            .remove(&reply.cookie)
            .unwrap_or_else(|| panic!("unexpected or repeated cookie {:#x}", reply.cookie));
        assert_eq!(reply.error, 0, "read {i}");
        assert!(reply.data == block(i), "read {i} returned the wrong data");
    }
    sender.join().unwrap();
    assert!(reads.is_empty());
    assert!(client.pending.is_empty());
    client.disconnect();
}

#[test]
fn many_requests_in_flight_are_all_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    let port = served.port;
    // 64 writes of 4 KiB, then 64 reads.
    pipeline::<64, 4096>(port, false, 6 << 20, 30);
    pipeline::<64, 4096>(port, true, 7 << 20, 130);
    // 32 writes of 256 KiB (as large as the connection's read buffer), then 32 reads.
    pipeline::<32, { 256 << 10 }>(port, false, 8 << 20, 40);
    pipeline::<32, { 256 << 10 }>(port, true, 8 << 20, 140);
    // Two connections at once.
    let threads = [
        std::thread::spawn(move || pipeline::<64, 4096>(port, false, 6 << 20, 60)),
        std::thread::spawn(move || pipeline::<64, 4096>(port, true, 7 << 20, 160)),
    ];
    for thread in threads {
        thread.join().expect("pipeline thread");
    }
    assert_eq!(served.terminate(), Some(0));
    assert_eq!(file_range(&path, 6 << 20, 4096), pattern(4096, 60));
    assert_eq!(file_range(&path, 7 << 20, 4096), pattern(4096, 160));
    assert_eq!(
        file_range(&path, (8 << 20) + (31 << 18), 256 << 10),
        pattern(256 << 10, 140u8.wrapping_add(31))
    );
}

/// One client's random I/O in its own `region` bytes at `base`: every 4 KiB block
/// written once in a shuffled order (every fourth with FUA), all in flight at once,
/// then read back in another order and checked; then the region overwritten by one
/// large write and read back in 64 KiB pieces.
fn verified_random_io(mut client: Client, base: u64, region: usize, seed: u8) {
    const BLOCK: usize = 4096;
    let blocks = region / BLOCK;
    let mut state = u64::from(seed) * 0x9e37_79b9 + 1;
    let mut shuffled = |count: usize| {
        let mut order: Vec<usize> = (0..count).collect();
        for i in (1..count).rev() {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            order.swap(i, (state >> 33) as usize % (i + 1));
        }
        order
    };
    let block = |i: usize| pattern(BLOCK, seed.wrapping_add(i as u8));
    let mut out = Vec::new();
    let mut expected = HashMap::new();
    for (n, i) in shuffled(blocks).into_iter().enumerate() {
        let flags = if n % 4 == 0 { NBD_CMD_FLAG_FUA } else { 0 };
        let offset = base + (i * BLOCK) as u64;
        let cookie = client.queue(
            &mut out,
            flags,
            NBD_CMD_WRITE,
            offset,
            BLOCK as u32,
            &block(i),
        );
        expected.insert(cookie, i);
    }
    let sender = client.send_in_background(out);
    for _ in 0..blocks {
        let reply = client.recv();
        let i = expected
            .remove(&reply.cookie)
            .expect("a reply to a write in flight");
        assert_eq!(reply.error, 0, "client {seed}: write of block {i}");
    }
    sender.join().unwrap();
    let mut out = Vec::new();
    for i in shuffled(blocks) {
        let offset = base + (i * BLOCK) as u64;
        let cookie = client.queue(&mut out, 0, NBD_CMD_READ, offset, BLOCK as u32, &[]);
        expected.insert(cookie, i);
    }
    let sender = client.send_in_background(out);
    for _ in 0..blocks {
        let reply = client.recv();
        let i = expected
            .remove(&reply.cookie)
            .expect("a reply to a read in flight");
        assert_eq!(reply.error, 0, "client {seed}: read of block {i}");
        assert!(
            reply.data == block(i),
            "client {seed}: block {i} read back wrong"
        );
    }
    sender.join().unwrap();

    // NBD lets a server run requests in flight in any order, so the reads of what
    // the large write wrote go out only once it is answered.
    let whole = pattern(region, seed ^ 0xff);
    client.send(0, NBD_CMD_WRITE, base, region as u32, &whole);
    assert_eq!(client.recv().error, 0, "client {seed}: the large write");
    let mut out = Vec::new();
    let pieces = region / (64 << 10);
    for piece in 0..pieces {
        let offset = base + (piece << 16) as u64;
        let cookie = client.queue(&mut out, 0, NBD_CMD_READ, offset, 64 << 10, &[]);
        expected.insert(cookie, piece);
    }
    let sender = client.send_in_background(out);
    for _ in 0..pieces {
        let reply = client.recv();
        let piece = expected.remove(&reply.cookie).expect("a reply to a read");
        assert_eq!(reply.error, 0);
        let at = piece << 16;
        assert!(
            reply.data == whole[at..at + (64 << 10)],
            "client {seed}: piece {piece} after the large write"
        );
    }
    sender.join().unwrap();
    assert!(client.pending.is_empty());
    client.disconnect();
}

/// 64 clients on one export at once, each doing verified random I/O in its own part
/// of it: every request is answered, right, and the file holds what each wrote last.
#[test]
fn sixty_four_clients_doing_verified_random_io_finish_without_error() {
    const CLIENTS: usize = 64;
    let region = (SIZE as usize) / CLIENTS;
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    // Handshakes one after another (one address may hold only 16 unfinished at
    // once); the I/O all at once.
    let clients: Vec<Client> = (0..CLIENTS)
        .map(|c| Client::open_with(served.port, c % 2 == 0, false))
        .collect();
    let start = std::sync::Arc::new(std::sync::Barrier::new(CLIENTS));
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, client)| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                verified_random_io(client, (c * region) as u64, region, c as u8);
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("a client failed");
    }
    assert_eq!(served.terminate(), Some(0));
    for c in 0..CLIENTS {
        let data = file_range(&path, (c * region) as u64, region);
        assert!(
            data == pattern(region, c as u8 ^ 0xff),
            "client {c}'s part of the file"
        );
    }
}

#[test]
fn back_to_back_writes_of_mixed_sizes_land_whole() {
    // Payloads larger than the connection's read buffer are read straight into
    // their own buffers, small ones come out of the read buffer with the headers
    // around them. Interleaving both in one burst checks that every payload lands
    // where its header says, whichever way it came.
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    let mut client = Client::open(served.port);
    let sizes = [
        4096usize,
        1 << 20,
        65536,
        4096,
        2 << 20,
        8192,
        65536,
        3 << 20,
    ];
    let mut out = Vec::new();
    let mut offset = 1u64 << 20;
    let mut expected = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(size, 70 + i as u8);
        client.queue(&mut out, 0, NBD_CMD_WRITE, offset, size as u32, &data);
        expected.push((offset, data));
        offset += size as u64;
    }
    let sender = client.send_in_background(out);
    for _ in &sizes {
        let reply = client.recv();
        assert_eq!(reply.error, 0, "write {:#x}", reply.cookie);
    }
    sender.join().unwrap();
    for (offset, data) in &expected {
        assert!(
            client.read_ok(*offset, data.len() as u32) == *data,
            "{} bytes at {offset} read back wrong",
            data.len()
        );
    }
    client.disconnect();
    assert_eq!(served.terminate(), Some(0));
    for (offset, data) in &expected {
        assert!(file_range(&path, *offset, data.len()) == *data);
    }
}

#[test]
fn sigterm_with_idle_clients_exits_cleanly_and_keeps_acknowledged_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    let offset = 9u64 << 20;
    let data = pattern(256 * 1024, 40);
    let mut client = Client::open(served.port);
    client.write_ok(offset, &data);
    let mut structured = Client::open_structured(served.port);
    structured.write_ok(offset + 1024 * 1024, &data[..4096]);
    // One more client that is idle in the middle of the handshake.
    let mut negotiating = fixed_handshake(served.port);

    let started = Instant::now();
    let code = served.terminate();
    let took = started.elapsed();
    assert_eq!(code, Some(0), "exit status after SIGTERM");
    assert!(
        took < Duration::from_secs(5),
        "exit took {took:?} with idle clients"
    );
    expect_closed(&mut client.stream, "idle client at shutdown");
    expect_closed(&mut structured.stream, "idle structured client at shutdown");
    expect_closed(&mut negotiating, "negotiating client at shutdown");
    assert!(
        file_range(&path, offset, data.len()) == data,
        "acknowledged write missing from the backing file"
    );
    assert_eq!(file_range(&path, offset + 1024 * 1024, 4096), data[..4096]);
}

#[test]
fn flush_and_fua_writes_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    for structured in [false, true] {
        let mut client = Client::open_with(served.port, structured, false);
        assert_ne!(client.flags & NBD_FLAG_SEND_FLUSH, 0, "NBD_FLAG_SEND_FLUSH");
        assert_ne!(client.flags & NBD_FLAG_SEND_FUA, 0, "NBD_FLAG_SEND_FUA");
        let offset = (10u64 << 20) + u64::from(structured) * 65536;
        let data = pattern(65536, 50 + structured as u8);
        let fua = client.request(NBD_CMD_FLAG_FUA, NBD_CMD_WRITE, offset, 65536, &data);
        assert_eq!(fua.error, 0, "FUA write (structured {structured})");
        let flush = client.request(0, NBD_CMD_FLUSH, 0, 0, &[]);
        assert_eq!(flush.error, 0, "flush (structured {structured})");
        assert_eq!(client.read_ok(offset, 65536), data);
        // The data is in the file while the server still runs.
        assert!(file_range(&path, offset, 65536) == data);
        client.disconnect();
    }
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn block_status_reports_holes_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let (served, _path) = serve_sparse(dir.path());
    let mut client = Client::open_with(served.port, true, true);
    let context = client.context.unwrap();
    let offset = 4u64 << 20;
    let len = MIB;

    let status = |client: &mut Client, offset: u64, len: u32, flags: u16| {
        let reply = client.request(flags, NBD_CMD_BLOCK_STATUS, offset, len, &[]);
        assert_eq!(reply.error, 0, "block status {offset}+{len}");
        assert_eq!(reply.context, Some(context), "context ID");
        assert!(!reply.extents.is_empty());
        let total: u64 = reply.extents.iter().map(|&(l, _)| u64::from(l)).sum();
        assert!(
            total > 0 && total <= u64::from(len),
            "extents cover {total} of {len} bytes: {:?}",
            reply.extents
        );
        reply.extents
    };

    let unwritten = status(&mut client, offset, len, 0);
    assert!(
        unwritten
            .iter()
            .all(|&(_, s)| s == NBD_STATE_HOLE | NBD_STATE_ZERO),
        "unwritten range is not a hole: {unwritten:?}"
    );

    client.write_ok(offset, &pattern(65536, 70));
    let written = status(&mut client, offset, 65536, 0);
    assert_eq!(written[0].1, 0, "written range is not data: {written:?}");
    let mixed = status(&mut client, offset, len, 0);
    assert_eq!(mixed[0], (65536, 0), "{mixed:?}");
    assert!(
        mixed[1..].iter().all(|&(_, s)| s & NBD_STATE_ZERO != 0),
        "the rest should read as zero: {mixed:?}"
    );
    let one = status(&mut client, offset, len, NBD_CMD_FLAG_REQ_ONE);
    assert_eq!(one, vec![(65536, 0)], "NBD_CMD_FLAG_REQ_ONE");
    client.disconnect();

    // Without a negotiated context: EINVAL, simple or structured.
    for structured in [false, true] {
        let mut client = Client::open_with(served.port, structured, false);
        let reply = client.request(0, NBD_CMD_BLOCK_STATUS, offset, len, &[]);
        assert_eq!(
            reply.error, NBD_EINVAL,
            "block status without a context (structured {structured})"
        );
        client.check_works(0, 71);
        client.disconnect();
    }
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn sigterm_with_requests_in_flight_keeps_every_acknowledged_write() {
    const COUNT: usize = 256;
    const LEN: usize = 65536;
    let dir = tempfile::tempdir().unwrap();
    let (served, path) = serve_sparse(dir.path());
    let mut client = Client::open(served.port);
    let block = |i: usize| pattern(LEN, 90u8.wrapping_add(i as u8));

    // The whole export in 64 KiB writes, every other one FUA (slow, on the worker
    // pool), all sent at once.
    let mut out = Vec::new();
    let mut writes = HashMap::new();
    for i in 0..COUNT {
        let flags = if i % 2 == 1 { NBD_CMD_FLAG_FUA } else { 0 };
        let offset = (i * LEN) as u64;
        let cookie = client.queue(
            &mut out,
            flags,
            NBD_CMD_WRITE,
            offset,
            LEN as u32,
            &block(i),
        );
        writes.insert(cookie, i);
    }
    let mut stream = client.stream.try_clone().unwrap();
    // Paced, so that SIGTERM arrives while requests are still coming in. The server
    // stops reading at SIGTERM, so sending may fail part way.
    let sender = std::thread::spawn(move || {
        for request in out.chunks(REQUEST_LEN + LEN) {
            if stream.write_all(request).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });

    let mut acknowledged = Vec::new();
    for _ in 0..8 {
        let reply = client.recv();
        assert_eq!(reply.error, 0);
        acknowledged.push(writes.remove(&reply.cookie).expect("known cookie"));
    }
    let started = Instant::now();
    let terminator = std::thread::spawn(move || served.terminate());
    while let Some(reply) = client.try_recv() {
        let i = writes
            .remove(&reply.cookie)
            .unwrap_or_else(|| panic!("unexpected or repeated cookie {:#x}", reply.cookie));
        match reply.error {
            0 => acknowledged.push(i),
            NBD_ESHUTDOWN => {}
            other => panic!("write {i} failed with {other} during shutdown"),
        }
    }
    let code = terminator.join().unwrap();
    let took = started.elapsed();
    sender.join().unwrap();
    assert_eq!(code, Some(0), "exit status after SIGTERM");
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
    eprintln!(
        "{} of {COUNT} writes acknowledged before shutdown",
        acknowledged.len()
    );

    let file = std::fs::read(&path).unwrap();
    assert_eq!(file.len() as u64, SIZE);
    for i in 0..COUNT {
        let got = &file[i * LEN..(i + 1) * LEN];
        if acknowledged.contains(&i) {
            assert!(got == block(i), "acknowledged write {i} is not in the file");
        } else {
            assert!(
                got == block(i) || got.iter().all(|&b| b == 0),
                "write {i} reached the file only in part"
            );
        }
    }
}

/// A TCP connection to 127.0.0.1:`port` from `source` (another loopback address, so
/// the server sees another client).
fn connect_from(source: [u8; 4], port: u16) -> TcpStream {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns until it is
    // handed to the TcpStream; the addresses are live locals of the right size.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let mut local: libc::sockaddr_in = std::mem::zeroed();
        local.sin_family = libc::AF_INET as libc::sa_family_t;
        local.sin_addr.s_addr = u32::from_ne_bytes(source);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let bound = libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len);
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        let mut remote = local;
        remote.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        remote.sin_port = port.to_be();
        let connected = libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len);
        assert_eq!(connected, 0, "connect: {}", std::io::Error::last_os_error());
        TcpStream::from_raw_fd(fd)
    }
}

/// How many of `streams` the server still holds open: after the greeting it sent,
/// a read finds nothing yet (rather than the end).
fn still_open(streams: &[TcpStream]) -> usize {
    let mut open = 0;
    for mut stream in streams {
        stream.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue, // the greeting
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    open += 1;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break, // reset
            }
        }
        stream.set_nonblocking(false).unwrap();
    }
    open
}

/// Waits until the server has taken every one of `idle`, which never finish their
/// handshake: then 16 of them are left open (`max_handshakes_per_address`).
fn settled(idle: &[TcpStream]) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let open = still_open(idle);
        if open <= 16 {
            assert_eq!(open, 16, "handshakes held for one address");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{open} idle connections still open after {TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Shared/FINDINGS.md, 2026-11-25: 500 connections from one address that never
/// finish the handshake locked every other client out. Now that address holds 16
/// handshakes at most (each new one closes its oldest), and everyone else is served.
#[test]
fn half_open_connections_from_one_address_do_not_lock_the_others_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("half-open.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let served = Served::start(&[path.to_str().unwrap(), "--name", EXPORT], EXPORT);
    let port = served.port;
    let idle: Vec<TcpStream> = (0..500)
        .map(|_| connect_from([127, 0, 0, 2], port))
        .collect();
    // The newest 16 are held; the older ones were closed to make room for them.
    settled(&idle);
    // A client from another address is served in full, meanwhile.
    let started = Instant::now();
    let mut client = handshake(port, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    send_option(&mut client, &ClientOption::ExportName(EXPORT.into()));
    let mut export = [0u8; 10];
    client
        .read_exact(&mut export)
        .expect("export size and flags");
    assert_eq!(u64::from_be_bytes(export[..8].try_into().unwrap()), 1 << 20);
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(idle);
}

/// Issue 31: unfinished handshakes from one address kept a good client from the same
/// address out (the 17th was refused at once), where qemu-nbd serves it. Now the
/// good client's connection closes the oldest unfinished one, and is served within
/// a second.
fn a_client_is_served_beside_idle_handshakes_from_its_own_address(idle_count: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (served, _image) = serve_sparse(dir.path());
    let port = served.port;
    let idle: Vec<TcpStream> = (0..idle_count).map(|_| connect(port)).collect();
    settled(&idle);
    let started = Instant::now();
    let mut client = Client::open(port);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "served after {took:?} beside {idle_count} idle handshakes"
    );
    client.check_works(0, 31);
    // The idle ones: the newest 16 were held, and the client took the oldest's place.
    assert_eq!(still_open(&idle), 15, "idle handshakes held");
    client.disconnect();
    drop(idle);
}

#[test]
fn a_client_is_served_beside_50_idle_handshakes_from_its_own_address() {
    a_client_is_served_beside_idle_handshakes_from_its_own_address(50);
}

#[test]
fn a_client_is_served_beside_300_idle_handshakes_from_its_own_address() {
    a_client_is_served_beside_idle_handshakes_from_its_own_address(300);
}

/// `max_connections_per_address` caps the connections of one address, finished
/// handshakes or not; other addresses are still served, and a slot freed is usable.
#[test]
fn one_address_holds_at_most_its_share_of_connections() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "share.img", 1 << 20);
    let config = dir.path().join("share.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\nmax_connections_per_address = 3\n\n\
             [[export]]\nname = \"{EXPORT}\"\npath = \"{}\"\n",
            image.display()
        ),
    )
    .unwrap();
    let served = Served::start_config(&config, EXPORT);
    let port = served.port;
    let in_transmission = |from: [u8; 4]| {
        let mut stream = connect_from(from, port);
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting).ok()?;
        stream
            .write_all(&(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes())
            .ok()?;
        send_option(&mut stream, &ClientOption::ExportName(EXPORT.into()));
        let mut export = [0u8; 10];
        stream.read_exact(&mut export).ok()?;
        Some(stream)
    };
    let mut held: Vec<TcpStream> = (0..3)
        .map(|i| in_transmission([127, 0, 0, 3]).unwrap_or_else(|| panic!("connection {i}")))
        .collect();
    assert!(
        in_transmission([127, 0, 0, 3]).is_none(),
        "a fourth connection from the same address was served"
    );
    assert!(
        in_transmission([127, 0, 0, 4]).is_some(),
        "another address was refused"
    );
    // One leaves; its slot is free again once the server has seen it go.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        if let Some(stream) = in_transmission([127, 0, 0, 3]) {
            break stream;
        }
        assert!(Instant::now() < deadline, "the freed slot was never reused");
        std::thread::sleep(Duration::from_millis(50));
    };
    drop((held, again));
}

/// Shared/FINDINGS.md, 2026-11-25: a client that sends 2000 reads of 1 MiB and never
/// reads a reply stayed connected. Now, once its socket has taken nothing for the
/// send timeout (1 s here), the server cuts it off; another client is served
/// meanwhile.
#[test]
fn a_client_that_never_reads_its_replies_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("unread.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let config = dir.path().join("unread.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\nsend_timeout = 1\n\n\
             [[export]]\nname = \"{EXPORT}\"\npath = \"{}\"\n",
            image.display()
        ),
    )
    .unwrap();
    let served = Served::start_config(&config, EXPORT);
    let port = served.port;
    let mut stalled = handshake(port, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    send_option(&mut stalled, &ClientOption::ExportName(EXPORT.into()));
    let mut export = [0u8; 10];
    stalled.read_exact(&mut export).unwrap();
    // Requests from a thread: once the server stops reading them, the sends block.
    let mut sender = stalled.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        for cookie in 0..2000u64 {
            let mut out = Vec::new();
            Request {
                flags: 0,
                command: NBD_CMD_READ,
                cookie,
                offset: (cookie % 64) << 20,
                len: 1 << 20,
            }
            .encode(&mut out);
            if sender.write_all(&out).is_err() {
                return;
            }
        }
    });
    // The server's end leaves ESTABLISHED when it cuts the connection: 1 s after
    // its sends stop making progress, later on a loaded machine.
    let client_port = stalled.local_addr().unwrap().port();
    assert!(
        tcp_state(port, client_port).is_some(),
        "the connection is not in /proc/net/tcp"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while tcp_state(port, client_port) == Some(TCP_ESTABLISHED) {
        assert!(
            Instant::now() < deadline,
            "the stalled connection is still open after 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Meanwhile another client is served.
    let mut other = handshake(port, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
    send_option(&mut other, &ClientOption::ExportName(EXPORT.into()));
    other.read_exact(&mut export).unwrap();
    // The stalled connection has been shut down: reading now drains what was sent
    // before the cut and then ends, instead of a stream of 2000 MiB of replies.
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let started = Instant::now();
    let mut drained = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match stalled.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still receiving replies after {drained} bytes: not cut off"
        );
    }
    assert!(
        drained < 200 << 20,
        "{drained} bytes of replies: not cut off"
    );
    sending.join().unwrap();
}

/// /proc/net/tcp's code for an established connection.
const TCP_ESTABLISHED: u8 = 1;

/// The state of the loopback connection from local port `local` to `remote`, as
/// /proc/net/tcp lists it; `None` once it is gone.
fn tcp_state(local: u16, remote: u16) -> Option<u8> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let port = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (from, to, state) = (fields.get(1)?, fields.get(2)?, fields.get(3)?);
        (port(from)? == local && port(to)? == remote)
            .then(|| u8::from_str_radix(state, 16).ok())
            .flatten()
    })
}

/// The server's peak resident memory (VmHWM), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

#[test]
fn clients_that_never_learned_the_maximum_get_40_mib_requests_streamed() {
    const BIG: u64 = 192 << 20;
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_file(dir.path(), "big.img", BIG);
    let served = Served::start(&[path.to_str().unwrap(), "--name", EXPORT], EXPORT);
    let baseline = peak_rss(served.pid());
    let forty = 40 * MIB;
    for structured in [false, true] {
        let mut client = Client::without_sizes(served.port, structured);
        assert_eq!(client.size, BIG);
        let offset = u64::from(structured) * 64 * u64::from(MIB) + 4096;
        let data = pattern(forty as usize, 40 + structured as u8);
        client.write_ok(offset, &data);
        let back = client.read_ok(offset, forty);
        assert!(
            back == data,
            "40 MiB read back differs (structured {structured})"
        );

        // Above the 64 MiB default: refused, the payload read and dropped, and the
        // connection still in step.
        let too_big = 80 * MIB;
        let write = client.write(0, &vec![0xeeu8; too_big as usize]);
        assert_eq!(
            write.error, NBD_EINVAL,
            "80 MiB write (structured {structured})"
        );
        let read = client.read(0, too_big);
        let expected = if structured {
            NBD_EOVERFLOW
        } else {
            NBD_EINVAL
        };
        assert_eq!(
            read.error, expected,
            "80 MiB read (structured {structured})"
        );
        client.check_works(120 << 20, 50 + structured as u8);
        client.disconnect();
    }
    assert_eq!(
        file_range(&path, 4096, 8192),
        pattern(forty as usize, 40)[..8192],
        "the streamed write did not reach the file"
    );
    assert_eq!(
        file_range(&path, 0, 4096),
        vec![0u8; 4096],
        "the refused write landed"
    );

    // Four such clients at once: each payload moves through one bounded buffer, so
    // the server's memory grows by far less than the 160 MiB the payloads add up to
    // (a server holding them whole, as nbdkit and nbd-server do, would need it all).
    let writers: Vec<_> = (0..4u8)
        .map(|i| {
            let port = served.port;
            std::thread::spawn(move || {
                let mut client = Client::without_sizes(port, i % 2 == 1);
                let data = pattern(forty as usize, 90 + i);
                let offset = u64::from(i) * u64::from(forty);
                client.write_ok(offset, &data);
                assert!(
                    client.read_ok(offset, forty) == data,
                    "client {i} read back"
                );
                client.disconnect();
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let growth = peak_rss(served.pid()).saturating_sub(baseline);
    eprintln!("server peak RSS grew by {} MiB", growth >> 20);
    assert!(
        growth < 64 << 20,
        "server peak RSS grew by {} MiB for four 40 MiB requests",
        growth >> 20
    );
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn the_unnegotiated_payload_limit_follows_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = sparse_file(dir.path(), "big.img", 128 << 20);
    for (limit, len, expected) in [("32M", 40 * MIB, NBD_EINVAL), ("96M", 80 * MIB, 0)] {
        let config = dir.path().join(format!("limit-{limit}.toml"));
        std::fs::write(
            &config,
            format!(
                "[server]\nlisten = [\"127.0.0.1:0\"]\nunnegotiated_payload_limit = \"{limit}\"\n\
                 [[export]]\nname = \"{EXPORT}\"\npath = \"{}\"\n",
                path.display()
            ),
        )
        .unwrap();
        let served = Served::start_config(&config, EXPORT);
        let mut client = Client::without_sizes(served.port, false);
        let data = pattern(len as usize, 7);
        let write = client.write(0, &data);
        assert_eq!(
            write.error, expected,
            "{len}-byte write with a {limit} limit"
        );
        if expected == 0 {
            assert!(
                client.read_ok(0, len) == data,
                "read back with a {limit} limit"
            );
        }
        client.check_works(100 << 20, 8);
        client.disconnect();
        assert_eq!(served.terminate(), Some(0));
    }
}
