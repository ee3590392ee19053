//! The initiator against our own target, in one process: the device conformance
//! suite through NBD (one and four connections, with and without structured replies,
//! TCP and Unix sockets), read-only exports, server errors, and what happens when the
//! server goes away or breaks the protocol, and blocking callers beside busy request
//! queues on the same connections.

use std::net::TcpListener;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use blockwire_blockdev::conformance::{self, pattern};
use blockwire_blockdev::{
    BlockDevice, Device, DeviceInfo, ErrorKind, Extent, IoBuf, MemoryDevice, QueuedOp,
    Result as DevResult, Submission, WriteFlags, ZeroFlags,
};
use blockwire_nbd::initiator::fake_server::{self, FakeExport, FakeServer, Peer};
use blockwire_nbd::initiator::{list_exports, ClientOptions, NbdClient, NbdUri};
use blockwire_nbd::target::ShutdownHandle;
use blockwire_nbd::wire::*;
use blockwire_nbd::{Export, ExportSet, NbdConfig, NbdTarget};

const SIZE: u64 = 16 << 20;

/// Our target serving `exports` on 127.0.0.1 (and a Unix socket when given), in a
/// thread; stopped and joined on drop.
struct Target {
    port: u16,
    shutdown: ShutdownHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
}

impl Target {
    fn start(exports: ExportSet, unix: Option<std::path::PathBuf>) -> Target {
        let config = NbdConfig {
            tcp: vec!["127.0.0.1:0".parse().unwrap()],
            unix: unix.into_iter().collect(),
            ..NbdConfig::default()
        };
        let server = NbdTarget::bind(exports, config).expect("bind");
        let port = server.tcp_addrs()[0].port();
        let shutdown = server.shutdown_handle();
        let thread = Some(thread::spawn(move || server.run()));
        Target {
            port,
            shutdown,
            thread,
        }
    }

    fn uri(&self, export: &str) -> NbdUri {
        NbdUri::tcp("127.0.0.1", self.port, export)
    }

    fn stop(&mut self) {
        self.shutdown.shutdown();
        if let Some(thread) = self.thread.take() {
            let result = thread.join().expect("server thread");
            // A test that already failed must not panic again while unwinding.
            if !thread::panicking() {
                result.expect("server run");
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A target with a writable memory export "disk", a read-only view of the same
/// memory "ro", and the memory itself for checking from outside.
fn memory_target(unix: Option<std::path::PathBuf>) -> (Target, Device) {
    let memory = Device::from_device(MemoryDevice::new(SIZE));
    let mut exports = ExportSet::new();
    exports
        .add(Export::new("disk", "writable memory", memory.clone()))
        .unwrap();
    exports
        .add(Export::new("ro", "read-only view", memory.read_only()))
        .unwrap();
    (Target::start(exports, unix), memory)
}

fn connect(uri: &NbdUri, connections: usize, structured: bool) -> NbdClient {
    let options = ClientOptions {
        connections,
        structured,
        // Most tests here check what a dropped connection does to its requests;
        // reconnecting has tests of its own (reconnect.rs).
        reconnect: None,
        ..ClientOptions::default()
    };
    NbdClient::connect(uri, options).unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

fn conformance_through(connections: usize, structured: bool) {
    let (target, _memory) = memory_target(None);
    let client = connect(&target.uri("disk"), connections, structured);
    assert_eq!(client.connections(), connections);
    assert_eq!(client.details().structured, structured);
    assert_eq!(client.details().base_allocation(), structured);
    let device = Device::new(Arc::new(client));
    assert!(!device.info().completes_inline);
    conformance::run_all(&device);
}

#[test]
fn conformance_one_connection_structured() {
    conformance_through(1, true);
}

#[test]
fn conformance_one_connection_simple_replies() {
    conformance_through(1, false);
}

#[test]
fn conformance_four_connections_structured() {
    conformance_through(4, true);
}

#[test]
fn conformance_four_connections_simple_replies() {
    conformance_through(4, false);
}

#[test]
fn conformance_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    let (_target, _memory) = memory_target(Some(socket.clone()));
    let uri: NbdUri = format!("nbd+unix:///disk?socket={}", socket.display())
        .parse()
        .unwrap();
    let client = connect(&uri, 2, true);
    assert_eq!(client.connections(), 2);
    conformance::run_all(&Device::new(Arc::new(client)));
}

#[test]
fn read_only_export() {
    let (target, memory) = memory_target(None);
    for structured in [true, false] {
        let client = connect(&target.uri("ro"), 1, structured);
        assert!(client.details().read_only());
        let device = Device::new(Arc::new(client));
        conformance::run_read_only(&device, &memory);
    }
}

#[test]
fn details_and_capabilities_follow_the_export() {
    let (target, _memory) = memory_target(None);
    let client = connect(&target.uri("disk"), 1, true);
    let details = client.details();
    assert_eq!(details.name, "disk");
    assert_eq!(details.description.as_deref(), Some("writable memory"));
    assert_eq!(details.size, SIZE);
    assert!(details.used_go && details.structured);
    assert_eq!(details.contexts, vec!["base:allocation".to_string()]);
    for word in [
        "flush",
        "fua",
        "trim",
        "zero",
        "fast-zero",
        "multi-conn",
        "cache",
        "df",
    ] {
        assert!(details.flag_words().contains(&word), "{word} missing");
    }
    let info = client.info();
    assert!(info.capabilities.extents.is_native() && info.capabilities.trim.is_native());
    assert_eq!(info.block_sizes.maximum, 32 << 20);
    assert!(info.consistent_across_handles);
}

#[test]
fn lists_exports_with_descriptions() {
    let (target, _memory) = memory_target(None);
    let exports = list_exports(&target.uri("")).unwrap();
    assert_eq!(
        exports,
        vec![
            ("disk".to_string(), "writable memory".to_string()),
            ("ro".to_string(), "read-only view".to_string()),
        ]
    );
}

#[test]
fn unknown_export_and_unreachable_server_fail_clearly() {
    let (target, _memory) = memory_target(None);
    let err = NbdClient::connect(&target.uri("nope"), ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    let unused = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = unused.local_addr().unwrap().port();
    drop(unused);
    let err = NbdClient::connect(
        &NbdUri::tcp("127.0.0.1", port, ""),
        ClientOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("cannot connect"), "{err}");
}

/// A memory device that does not promise consistency across connections, so its
/// export does not advertise CAN_MULTI_CONN.
struct SingleHandle(MemoryDevice);

impl BlockDevice for SingleHandle {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            consistent_across_handles: false,
            ..self.0.info()
        }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> DevResult<()> {
        self.0.write_at(buf, offset, flags)
    }
    fn flush(&self) -> DevResult<()> {
        self.0.flush()
    }
    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> DevResult<()> {
        self.0.trim(offset, len, flags)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> DevResult<()> {
        self.0.write_zeroes(offset, len, flags)
    }
    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> DevResult<()> {
        self.0.extents(offset, len, out)
    }
}

#[test]
fn without_multi_conn_one_connection_is_used() {
    let mut exports = ExportSet::new();
    let device = Device::from_device(SingleHandle(MemoryDevice::new(SIZE)));
    exports.add(Export::new("one", "", device)).unwrap();
    let target = Target::start(exports, None);
    let client = connect(&target.uri("one"), 4, true);
    assert!(!client.details().flag_words().contains(&"multi-conn"));
    assert_eq!(client.connections(), 1);
    conformance::run_all(&Device::new(Arc::new(client)));
}

#[test]
fn many_threads_many_requests_out_of_order() {
    let (target, memory) = memory_target(None);
    let device = Device::new(Arc::new(connect(&target.uri("disk"), 4, true)));
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let device = device.clone();
            // Sizes vary so that replies overtake each other.
            thread::spawn(move || write_and_read_back(&device, t, 40, &[512, 4096, 65536, 200_704]))
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_same_as_memory(&device, &memory, 5 << 20, 1 << 20);
}

/// Thread `t`'s share of a concurrency test: `rounds` writes into its own MiB at
/// `t` MiB, sizes taken in turn from `lens`, FUA on every seventh and a flush after
/// every fiftieth, each read back at once and checked.
fn write_and_read_back(device: &Device, t: u64, rounds: u64, lens: &[usize]) {
    let base = t << 20;
    for round in 0..rounds {
        let len = lens[round as usize % lens.len()];
        let offset = base + (round * 4096) % ((1 << 20) - len as u64);
        let data = pattern(t * 1000 + round, offset, len);
        let fua = WriteFlags {
            fua: round % 7 == 0,
        };
        device.write(&data, offset, fua).unwrap();
        let mut back = vec![0u8; len];
        device.read(&mut back, offset).unwrap();
        assert!(back == data, "thread {t} round {round}: data differs");
        if round % 50 == 49 {
            device.flush().unwrap();
        }
    }
}

/// What the initiator reads at `offset` is what the target's memory holds.
fn assert_same_as_memory(device: &Device, memory: &Device, offset: u64, len: usize) {
    let mut through_nbd = vec![0u8; len];
    let mut direct = vec![0u8; len];
    device.read(&mut through_nbd, offset).unwrap();
    memory.read(&mut direct, offset).unwrap();
    assert!(through_nbd == direct);
}

#[test]
fn server_errors_map_to_kinds_with_the_servers_message() {
    let (target, _memory) = memory_target(None);
    // Straight to the client, past the checked handle, so the server sees the
    // requests and answers with its errors.
    for structured in [true, false] {
        let client = connect(&target.uri("ro"), 1, structured);
        let err = client
            .write_at(&[1u8; 4096], 0, WriteFlags::NONE)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ReadOnly, "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("write of 4096 bytes at offset 0"),
            "{text}"
        );
        assert!(text.contains("NBD_EPERM"), "{text}");
        if structured {
            assert!(text.contains("read-only"), "{text}");
        }

        let mut buf = vec![0u8; 8192];
        let err = client.read_at(&mut buf, SIZE - 4096).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        if structured {
            assert!(err.to_string().contains("beyond the end"), "{err}");
        }
        // The connection is still fine afterwards.
        client.read_at(&mut buf, 0).unwrap();
    }
    let client = connect(&target.uri("disk"), 1, true);
    let err = client
        .write_at(&[1u8; 4096], SIZE - 2048, WriteFlags::NONE)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoSpace, "{err}");
}

#[test]
fn target_shutdown_fails_later_requests_with_disconnected() {
    let (mut target, _memory) = memory_target(None);
    let device = Device::new(Arc::new(connect(&target.uri("disk"), 2, true)));
    let mut buf = vec![0u8; 4096];
    device.read(&mut buf, 0).unwrap();
    target.stop();
    let started = Instant::now();
    loop {
        match device.read(&mut buf, 0) {
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Disconnected, "{e}");
                break;
            }
            Ok(()) => {
                assert!(started.elapsed() < Duration::from_secs(5), "still reading");
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
    // And at once, every time.
    let started = Instant::now();
    for _ in 0..3 {
        let err = device.write(&buf, 0, WriteFlags::NONE).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    }
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// The crate's scripted server (`client::fake_server`) for one connection, which
/// must have negotiated structured replies, handed to `transmission`.
fn fake_server(transmission: impl FnOnce(Peer) + Send + 'static) -> FakeServer<()> {
    let export = FakeExport {
        size: SIZE,
        flags: 0,
    };
    fake_server::start(export, 1, |mut peers, _| {
        let peer = peers.pop().expect("one connection");
        assert!(peer.structured);
        transmission(peer);
    })
}

#[test]
fn dropped_connection_fails_requests_in_flight_promptly() {
    let server = fake_server(|mut peer| {
        // Take four reads and answer none of them, then hang up.
        for _ in 0..4 {
            peer.request();
        }
        thread::sleep(Duration::from_millis(200));
    });
    let device = Device::new(Arc::new(connect(&server.uri, 1, true)));
    let started = Instant::now();
    let readers: Vec<_> = (0..4u64)
        .map(|i| {
            let device = device.clone();
            thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                device.read(&mut buf, i * 4096).unwrap_err()
            })
        })
        .collect();
    for reader in readers {
        let err = reader.join().unwrap();
        assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
        assert!(err.to_string().contains("closed the connection"), "{err}");
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    server.join();
    let mut buf = vec![0u8; 512];
    let err = device.read(&mut buf, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
}

/// Runs one read against a server that answers it with `reply(request)`; returns
/// the error the read failed with.
fn read_answered_by(reply: fn(&Request) -> Vec<u8>) -> blockwire_blockdev::Error {
    let server = fake_server(move |mut peer| {
        let request = peer.request();
        peer.send(&reply(&request));
        peer.until_closed();
    });
    let device = Device::new(Arc::new(connect(&server.uri, 1, true)));
    let mut buf = vec![0u8; 4096];
    let err = device.read(&mut buf, 8192).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    assert!(err.to_string().contains("protocol violation"), "{err}");
    // The connection is gone for later requests too.
    let again = device.read(&mut buf, 0).unwrap_err();
    assert_eq!(again.kind(), ErrorKind::Disconnected, "{again}");
    drop(device);
    server.join();
    err
}

#[test]
fn reply_for_an_unknown_cookie_drops_the_connection() {
    let err = read_answered_by(|request| {
        let mut out = Vec::new();
        encode_offset_data_header(&mut out, request.cookie + 1000, request.offset, 4096, true);
        out.extend_from_slice(&[0u8; 4096]);
        out
    });
    assert!(err.to_string().contains("cookie"), "{err}");
}

#[test]
fn bad_reply_magic_drops_the_connection() {
    let err = read_answered_by(|_| vec![0x12; 32]);
    assert!(err.to_string().contains("magic"), "{err}");
}

#[test]
fn chunk_beyond_the_request_drops_the_connection() {
    let err = read_answered_by(|request| {
        let mut out = Vec::new();
        encode_offset_data_header(&mut out, request.cookie, request.offset + 4096, 4096, true);
        out.extend_from_slice(&[0u8; 4096]);
        out
    });
    assert!(err.to_string().contains("outside"), "{err}");
}

#[test]
fn simple_reply_to_a_structured_read_drops_the_connection() {
    let err = read_answered_by(|request| {
        let mut out = Vec::new();
        encode_simple_reply(&mut out, 0, request.cookie);
        out.extend_from_slice(&[0u8; 4096]);
        out
    });
    assert!(err.to_string().contains("simple reply"), "{err}");
}

#[test]
fn eshutdown_ends_the_connection_softly() {
    let server = fake_server(|mut peer| {
        let request = peer.request();
        let mut out = Vec::new();
        encode_error_chunk(&mut out, request.cookie, NBD_ESHUTDOWN, "going down");
        peer.send(&out);
        // proto.md: the client must answer NBD_ESHUTDOWN with a soft disconnect.
        let next = peer.request();
        assert_eq!(next.command, NBD_CMD_DISC);
    });
    let device = Device::new(Arc::new(connect(&server.uri, 1, true)));
    let mut buf = vec![0u8; 4096];
    let err = device.read(&mut buf, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShuttingDown, "{err}");
    assert!(err.to_string().contains("going down"), "{err}");
    server.join();
    let err = device.read(&mut buf, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShuttingDown, "{err}");
}

/// Blocks one queue writes and reads back in one pass, each in a slot of its own
/// (overlapping writes in flight together have no order).
const QUEUED_BLOCKS: u64 = 32;
const SLOT: u64 = 128 * 1024;

/// One pass of one thread's queue over its own 4 MiB: writes [`QUEUED_BLOCKS`]
/// blocks of mixed sizes, 16 in flight, then reads them back the same way and checks
/// every one.
fn queued_round_trip(device: &Device, owner: u64, pass: u64) {
    let base = owner * QUEUED_BLOCKS * SLOT;
    let len_of = |i: u64| [4096usize, 65536, 131_072][((i + pass) % 3) as usize];
    let offset_of = |i: u64| base + i * SLOT;
    let data_of = |i: u64| pattern(owner * 10_000 + pass * 100 + i, offset_of(i), len_of(i));
    let mut queue = device.queue().expect("the NBD initiator has a queue");
    let mut done = Vec::new();
    for reading in [false, true] {
        let mut next = 0;
        let mut completed = 0;
        while completed < QUEUED_BLOCKS {
            while next < QUEUED_BLOCKS && queue.in_flight() < 16 {
                let (op, buf) = if reading {
                    (QueuedOp::Read, IoBuf::zeroed(len_of(next)))
                } else {
                    (
                        QueuedOp::Write(WriteFlags::NONE),
                        IoBuf::from_slice(&data_of(next)),
                    )
                };
                queue.submit(Submission {
                    tag: next,
                    op,
                    buf,
                    offset: offset_of(next),
                });
                next += 1;
            }
            queue.complete(1, &mut done);
            for completion in done.drain(..) {
                let i = completion.tag;
                completion
                    .result
                    .unwrap_or_else(|e| panic!("queue {owner}, pass {pass}, block {i}: {e}"));
                if reading {
                    assert!(
                        completion.buf[..] == data_of(i)[..],
                        "queue {owner}, pass {pass}, block {i}: data differs"
                    );
                }
                completed += 1;
            }
        }
    }
}

#[test]
fn blocking_callers_and_busy_queues_share_connections() {
    // While a queue exists its thread reads the connections' replies and the reader
    // threads stay parked; callers waiting for their own replies meanwhile read for
    // themselves. Mixed on the same connections, every request must still get its
    // own reply and data.
    let (target, memory) = memory_target(None);
    let device = Device::new(Arc::new(connect(&target.uri("disk"), 2, true)));
    let queues: Vec<_> = (0..2u64)
        .map(|owner| {
            let device = device.clone();
            thread::spawn(move || {
                for pass in 0..20 {
                    queued_round_trip(&device, owner, pass);
                }
            })
        })
        .collect();
    // Queues own 0-8 MiB; each blocking thread one MiB above.
    let blocking: Vec<_> = (8..12u64)
        .map(|t| {
            let device = device.clone();
            thread::spawn(move || write_and_read_back(&device, t, 150, &[512, 4096, 65536]))
        })
        .collect();
    for thread in queues.into_iter().chain(blocking) {
        thread.join().unwrap();
    }
    assert_same_as_memory(&device, &memory, 0, 12 << 20);
}

#[test]
fn fua_writes_and_flushes_are_acknowledged_only_once_durable() {
    use blockwire_blockdev::durability::{acknowledgements, Trial};
    use blockwire_blockdev::{VolatileCache, WriteLog};
    let disk = Arc::new(VolatileCache::new(SIZE));
    let log = Arc::new(WriteLog::new(Device::new(disk.clone())));
    let mut exports = ExportSet::new();
    exports
        .add(Export::new(
            "disk",
            "volatile cache",
            Device::new(log.clone()),
        ))
        .unwrap();
    let target = Target::start(exports, None);
    for connections in [1, 4] {
        let client = Device::new(Arc::new(connect(&target.uri("disk"), connections, true)));
        assert!(client.info().capabilities.fua.is_native());
        let medium = |offset, len| disk.medium_range(offset, len);
        let trial = Trial::default();
        let (fua, flushes) = acknowledgements(&client, &log, &medium, trial)
            .unwrap_or_else(|e| panic!("{connections} connection(s): {e}"));
        assert_eq!((fua, flushes), (52, 32));
    }
}
