//! The initiator riding out a dropped connection: it reconnects, checks the export
//! is the same, and sends again exactly the requests that had no reply — from
//! blocking callers and from a request queue — against the scripted server, and
//! against our own target stopped and started again. And where it must not: an
//! export that changed, a server that stays away, a server that broke the protocol.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::conformance::pattern;
use blockwire_blockdev::{
    Device, ErrorKind, IoBuf, MemoryDevice, QueuedOp, Submission, WriteFlags,
};
use blockwire_nbd::initiator::fake_server::{self, FakeExport, Peer};
use blockwire_nbd::initiator::{ClientOptions, NbdClient, NbdUri};
use blockwire_nbd::wire::*;
use blockwire_nbd::{Export, ExportSet, NbdConfig, NbdTarget};

const SIZE: u64 = 16 << 20;
const BLOCK: usize = 4096;
/// The fake export's contents.
const SEED: u64 = 0x5eed;

fn export() -> FakeExport {
    FakeExport {
        size: SIZE,
        flags: 0,
    }
}

fn connect(uri: &NbdUri, reconnect: Duration) -> Device {
    let options = ClientOptions {
        reconnect: Some(reconnect),
        ..ClientOptions::default()
    };
    let client = NbdClient::connect(uri, options).unwrap_or_else(|e| panic!("connect {uri}: {e}"));
    Device::new(Arc::new(client))
}

/// Answers a read with the export's contents.
fn answer(peer: &mut Peer, request: &Request) {
    assert_eq!(request.command, NBD_CMD_READ, "{request:?}");
    let mut out = Vec::new();
    if peer.structured {
        encode_offset_data_header(
            &mut out,
            request.cookie,
            request.offset,
            request.len as u32,
            true,
        );
    } else {
        encode_simple_reply(&mut out, 0, request.cookie);
    }
    out.extend_from_slice(&pattern(SEED, request.offset, request.len as usize));
    peer.send(&out);
}

/// Takes four reads, answers one and hangs up; answers the three others on the
/// connection the initiator opens next. Returns the offsets left unanswered at the
/// hang-up and those sent again.
fn drop_after_one_of_four(
    mut peers: Vec<Peer>,
    listener: TcpListener,
) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let mut first = peers.pop().expect("one connection");
    let requests = first.requests(4);
    answer(&mut first, &requests[0]);
    first.hang_up();
    let unanswered = requests[1..].iter().map(|r| r.offset).collect();
    let mut second = fake_server::accept_another(&listener, export());
    let replayed = second.requests(3);
    for request in &replayed {
        answer(&mut second, request);
    }
    second.until_disconnect();
    (unanswered, replayed.iter().map(|r| r.offset).collect())
}

#[test]
fn blocking_callers_get_their_reads_answered_on_the_new_connection() {
    let server = fake_server::start(export(), 1, drop_after_one_of_four);
    let device = connect(&server.uri, Duration::from_secs(10));
    let readers: Vec<_> = (0..4u64)
        .map(|i| {
            let device = device.clone();
            thread::spawn(move || {
                let offset = i * 1024 * 1024;
                let mut buf = vec![0u8; BLOCK];
                device
                    .read(&mut buf, offset)
                    .unwrap_or_else(|e| panic!("read at {offset}: {e}"));
                assert!(buf == pattern(SEED, offset, BLOCK), "data at {offset}");
            })
        })
        .collect();
    for reader in readers {
        reader.join().unwrap();
    }
    drop(device);
    let (unanswered, replayed) = server.join();
    assert_eq!(unanswered, replayed);
}

#[test]
fn a_request_queue_resubmits_what_the_dropped_connection_left() {
    let server = fake_server::start(export(), 1, drop_after_one_of_four);
    let device = connect(&server.uri, Duration::from_secs(10));
    {
        let mut queue = device.queue().expect("the initiator has a queue");
        for tag in 0..4u64 {
            queue.submit(Submission {
                tag,
                op: QueuedOp::Read,
                buf: IoBuf::zeroed(BLOCK),
                offset: tag * 1024 * 1024,
            });
        }
        let mut done = Vec::new();
        while done.len() < 4 {
            queue.complete(1, &mut done);
        }
        assert_eq!(queue.in_flight(), 0);
        for completion in done {
            let offset = completion.tag * 1024 * 1024;
            completion
                .result
                .unwrap_or_else(|e| panic!("read at {offset}: {e}"));
            assert!(
                completion.buf[..] == pattern(SEED, offset, BLOCK),
                "data at {offset}"
            );
        }
    }
    drop(device);
    let (unanswered, replayed) = server.join();
    assert_eq!(unanswered, replayed);
}

#[test]
fn an_export_that_changed_size_is_not_replayed_onto() {
    let server = fake_server::start(export(), 1, |mut peers, listener| {
        let mut first = peers.pop().expect("one connection");
        first.request();
        first.hang_up();
        let bigger = FakeExport {
            size: SIZE * 2,
            flags: 0,
        };
        // The initiator negotiates, sees the size and goes away without a request.
        fake_server::accept_another(&listener, bigger).until_closed();
    });
    let device = connect(&server.uri, Duration::from_secs(10));
    let mut buf = vec![0u8; BLOCK];
    let err = device.read(&mut buf, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    let message = err.to_string();
    assert!(message.contains("export changed"), "{message}");
    assert!(message.contains(&format!("size {}", SIZE * 2)), "{message}");
    server.join();
    // For good, and at once.
    let started = Instant::now();
    let again = device.read(&mut buf, 0).unwrap_err();
    assert!(again.to_string().contains("export changed"), "{again}");
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_server_that_stays_away_fails_requests_after_the_limit() {
    let server = fake_server::start(export(), 1, |mut peers, listener| {
        let mut first = peers.pop().expect("one connection");
        first.request();
        // Nobody listens any more: every reconnect is refused.
        drop(listener);
        first.hang_up();
    });
    let device = connect(&server.uri, Duration::from_millis(800));
    let started = Instant::now();
    let mut buf = vec![0u8; BLOCK];
    let err = device.read(&mut buf, 0).unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    assert!(
        err.to_string().contains("could not reconnect within"),
        "{err}"
    );
    assert!(
        waited >= Duration::from_millis(300),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "gave up after {waited:?}");
    server.join();
    let started = Instant::now();
    device.read(&mut buf, 0).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_protocol_violation_is_not_reconnected() {
    let server = fake_server::start(export(), 1, |mut peers, listener| {
        let mut first = peers.pop().expect("one connection");
        first.request();
        first.send(&[0x12; 32]);
        first.until_closed();
        // No second connection comes.
        thread::sleep(Duration::from_millis(300));
        assert!(listener.accept().is_err(), "the initiator reconnected");
    });
    let device = connect(&server.uri, Duration::from_secs(10));
    let mut buf = vec![0u8; BLOCK];
    let err = device.read(&mut buf, 0).unwrap_err();
    assert!(err.to_string().contains("protocol violation"), "{err}");
    server.join();
}

/// Our own target on a Unix socket, in a thread.
fn serve(
    memory: &Device,
    socket: &std::path::Path,
) -> (
    blockwire_nbd::target::ShutdownHandle,
    thread::JoinHandle<std::io::Result<()>>,
) {
    let mut exports = ExportSet::new();
    exports
        .add(Export::new("disk", "memory", memory.clone()))
        .unwrap();
    let config = NbdConfig {
        unix: vec![socket.to_path_buf()],
        ..NbdConfig::default()
    };
    let server = NbdTarget::bind(exports, config).expect("bind");
    let shutdown = server.shutdown_handle();
    (shutdown, thread::spawn(move || server.run()))
}

#[test]
fn writes_carry_on_across_our_target_stopped_and_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    let memory = Device::from_device(MemoryDevice::new(SIZE));
    let (shutdown, running) = serve(&memory, &socket);
    let uri: NbdUri = format!("nbd+unix:///disk?socket={}", socket.display())
        .parse()
        .unwrap();
    let device = connect(&uri, Duration::from_secs(10));
    device
        .write(&pattern(1, 0, BLOCK), 0, WriteFlags::NONE)
        .unwrap();
    // A graceful stop: the target tells the initiator it is shutting down.
    shutdown.shutdown();
    running.join().unwrap().unwrap();
    let restart = {
        let memory = memory.clone();
        let socket = socket.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            serve(&memory, &socket)
        })
    };
    // Issued while nothing listens: it waits for the restart instead of failing.
    device
        .write(&pattern(2, 4096, BLOCK), 4096, WriteFlags::FUA)
        .unwrap();
    device.flush().unwrap();
    let mut back = vec![0u8; 2 * BLOCK];
    device.read(&mut back, 0).unwrap();
    assert!(back[..BLOCK] == pattern(1, 0, BLOCK));
    assert!(back[BLOCK..] == pattern(2, 4096, BLOCK));
    drop(device);
    let (shutdown, running) = restart.join().unwrap();
    shutdown.shutdown();
    running.join().unwrap().unwrap();
}
