//! Transmission against a scripted server (fake_server.rs): replies that come back
//! in another order than their requests, requests spread over several connections,
//! and a connection that drops with queued requests in flight.

use std::io;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::conformance::pattern;
use blockwire_blockdev::{BlockDevice, Completion, ErrorKind, IoBuf, QueuedOp, Submission};

use super::fake_server::{self, FakeExport, Peer};
use super::{ClientOptions, NbdClient};
use crate::wire::*;

const SIZE: u64 = 16 << 20;
pub(super) const LEN: usize = 4096;
/// Bounds every wait of the initiator: a broken one fails a test, never hangs it.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// What read buffers hold before a read, so that bytes a read misses show.
pub(super) const GARBAGE: u8 = 0xa5;
/// How long one test may take: the request timeout cannot help when a broken
/// initiator loses requests altogether.
const TEST_LIMIT: Duration = Duration::from_secs(30);

/// Runs a test's body in its own thread and fails the test if it hangs (the
/// thread is then left behind; the test binary ends anyway).
pub(super) fn bounded(body: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    let test = thread::spawn(move || {
        body();
        let _ = done.send(());
    });
    match finished.recv_timeout(TEST_LIMIT) {
        Ok(()) => test.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: fail with its message.
            std::panic::resume_unwind(test.join().unwrap_err())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test hung for {TEST_LIMIT:?}"),
    }
}

pub(super) fn export(flags: u16) -> FakeExport {
    FakeExport { size: SIZE, flags }
}

pub(super) fn connect(uri: &super::NbdUri, connections: usize, structured: bool) -> NbdClient {
    let options = ClientOptions {
        connections,
        structured,
        extended_headers: false,
        base_allocation: false,
        handshake_timeout: REQUEST_TIMEOUT,
        request_timeout: Some(REQUEST_TIMEOUT),
        // These tests check what a dropped connection does to its requests.
        reconnect: None,
    };
    NbdClient::connect(uri, options).unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

/// What the fake export holds at `offset`: different bytes at every offset.
pub(super) fn data_at(offset: u64, len: usize) -> Vec<u8> {
    pattern(0x0b5e, offset, len)
}

/// The whole reply to a read of the export, simple or as one data chunk.
pub(super) fn read_reply(out: &mut Vec<u8>, request: &Request, structured: bool) {
    assert_eq!(request.command, NBD_CMD_READ, "{request:?}");
    if structured {
        encode_offset_data_header(
            out,
            request.cookie,
            request.offset,
            request.len as u32,
            true,
        );
    } else {
        encode_simple_reply(out, 0, request.cookie);
    }
    out.extend_from_slice(&data_at(request.offset, request.len as usize));
}

/// Answers `requests` in the reverse of the order they arrived in, in one write.
fn answer_in_reverse(peer: &mut Peer, requests: &[Request]) {
    let mut out = Vec::new();
    for request in requests.iter().rev() {
        read_reply(&mut out, request, peer.structured);
    }
    peer.send(&out);
}

/// Answers `requests` (reads of LEN bytes) in three rounds of chunks, so that every
/// reply is spread over the stream between the others': the tail half as data, last
/// request first; a hole in the second quarter, first request first; the head
/// quarter as data with DONE, last request first.
fn answer_interleaved(peer: &mut Peer, requests: &[Request]) {
    assert!(peer.structured);
    let (quarter, half) = (LEN as u32 / 4, LEN as u32 / 2);
    let mut out = Vec::new();
    for r in requests.iter().rev() {
        let at = r.offset + u64::from(half);
        encode_offset_data_header(&mut out, r.cookie, at, half, false);
        out.extend_from_slice(&data_at(at, half as usize));
    }
    for r in requests {
        encode_offset_hole(
            &mut out,
            r.cookie,
            r.offset + u64::from(quarter),
            quarter,
            false,
        );
    }
    for r in requests.iter().rev() {
        encode_offset_data_header(&mut out, r.cookie, r.offset, quarter, true);
        out.extend_from_slice(&data_at(r.offset, quarter as usize));
    }
    peer.send(&out);
}

/// What a read at `offset` returns when answered by [`answer_interleaved`].
fn interleaved_data(offset: u64) -> Vec<u8> {
    let mut data = data_at(offset, LEN);
    data[LEN / 4..LEN / 2].fill(0);
    data
}

/// Queued reads on one connection: the server takes all `count` of them before it
/// answers any, with `answer`. Checks that every completion carries its own tag's
/// data and that they complete in the order they were answered.
fn queued_reads_answered_out_of_order(
    structured: bool,
    answer: fn(&mut Peer, &[Request]),
    expected: fn(u64) -> Vec<u8>,
) {
    const COUNT: usize = 8;
    let server = fake_server::start(export(0), 1, move |mut peers, _| {
        let mut peer = peers.remove(0);
        assert_eq!(peer.structured, structured);
        let requests = peer.requests(COUNT);
        answer(&mut peer, &requests);
        peer.until_disconnect();
        requests
    });
    let client = connect(&server.uri, 1, structured);
    assert_eq!(client.details().structured, structured);
    // Offsets that differ in their low bits too, and tags that are not indexes.
    let offset_of = |tag: u64| (tag - 100) * 3 * LEN as u64 + 512;
    let mut queue = client.queue().expect("the initiator has a request queue");
    for tag in 100..100 + COUNT as u64 {
        queue.submit(Submission {
            tag,
            op: QueuedOp::Read,
            buf: IoBuf::from_slice(&[GARBAGE; LEN]),
            offset: offset_of(tag),
        });
    }
    let mut done: Vec<Completion> = Vec::new();
    queue.complete(COUNT, &mut done);
    assert_eq!(done.len(), COUNT);
    assert_eq!(queue.in_flight(), 0);
    for completion in &done {
        let offset = offset_of(completion.tag);
        if let Err(e) = &completion.result {
            panic!("read tagged {} failed: {e}", completion.tag);
        }
        assert!(
            completion.buf[..] == expected(offset)[..],
            "read tagged {} (offset {offset}) holds another read's data",
            completion.tag
        );
    }
    drop(queue);
    drop(client);
    let requests = server.join();
    // The server saw each offset once, and the initiator completed the last request
    // it sent first: it did not wait for the replies before it.
    let mut offsets: Vec<u64> = requests.iter().map(|r| r.offset).collect();
    offsets.sort_unstable();
    let mut submitted: Vec<u64> = (100..100 + COUNT as u64).map(offset_of).collect();
    submitted.sort_unstable();
    assert_eq!(offsets, submitted);
    // Both scripts end replies last request first (interleaved ones in their last
    // round).
    let answered: Vec<u64> = requests.iter().rev().map(|r| r.offset).collect();
    let completed: Vec<u64> = done.iter().map(|c| offset_of(c.tag)).collect();
    assert_eq!(completed, answered, "completion order");
}

#[test]
fn queued_reads_complete_by_cookie_when_simple_replies_come_in_reverse() {
    bounded(|| {
        queued_reads_answered_out_of_order(false, answer_in_reverse, |offset| data_at(offset, LEN));
    });
}

#[test]
fn queued_reads_complete_by_cookie_when_data_chunks_come_in_reverse() {
    bounded(|| {
        queued_reads_answered_out_of_order(true, answer_in_reverse, |offset| data_at(offset, LEN));
    });
}

#[test]
fn queued_reads_complete_by_cookie_when_chunks_of_replies_interleave() {
    bounded(|| {
        queued_reads_answered_out_of_order(true, answer_interleaved, interleaved_data);
    });
}

/// Blocking reads from several threads (one request each, on one connection): the
/// server takes them all, then answers the last one first.
fn concurrent_reads_answered_in_reverse(structured: bool) {
    const THREADS: u64 = 6;
    let server = fake_server::start(export(0), 1, |mut peers, _| {
        let mut peer = peers.remove(0);
        let requests = peer.requests(THREADS as usize);
        answer_in_reverse(&mut peer, &requests);
        peer.until_disconnect();
        requests
    });
    let client = connect(&server.uri, 1, structured);
    thread::scope(|scope| {
        let readers: Vec<_> = (0..THREADS)
            .map(|i| {
                let client = &client;
                scope.spawn(move || {
                    let offset = i * 5 * LEN as u64 + 1024;
                    let mut buf = vec![GARBAGE; LEN];
                    client
                        .read_at(&mut buf, offset)
                        .unwrap_or_else(|e| panic!("reader {i}: {e}"));
                    assert!(
                        buf == data_at(offset, LEN),
                        "reader {i} (offset {offset}) got another read's data"
                    );
                })
            })
            .collect();
        for reader in readers {
            reader.join().unwrap();
        }
    });
    drop(client);
    let requests = server.join();
    let mut cookies: Vec<u64> = requests.iter().map(|r| r.cookie).collect();
    cookies.sort_unstable();
    cookies.dedup();
    assert_eq!(cookies.len(), THREADS as usize, "cookies are unique");
}

#[test]
fn concurrent_blocking_reads_complete_by_cookie_with_simple_replies() {
    bounded(|| {
        concurrent_reads_answered_in_reverse(false);
    });
}

#[test]
fn concurrent_blocking_reads_complete_by_cookie_with_structured_replies() {
    bounded(|| {
        concurrent_reads_answered_in_reverse(true);
    });
}

/// Serves reads on every connection, each in its own thread, until the initiator
/// disconnects; returns the offsets each connection was asked for.
fn serve_reads(peers: Vec<Peer>) -> Vec<Vec<u64>> {
    let servers: Vec<_> = peers
        .into_iter()
        .map(|mut peer| {
            thread::spawn(move || {
                let mut offsets = Vec::new();
                while let Some(request) = peer.next_request() {
                    let mut out = Vec::new();
                    read_reply(&mut out, &request, peer.structured);
                    peer.send(&out);
                    offsets.push(request.offset);
                }
                offsets
            })
        })
        .collect();
    servers
        .into_iter()
        .map(|server| {
            server
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
        .collect()
}

/// Whether another connection is waiting on the (non-blocking) listener.
fn connection_waiting(listener: &std::net::TcpListener) -> bool {
    match listener.accept() {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("accept: {e}"),
    }
}

/// `count` queued reads of LEN bytes from `base` on, checked.
fn queued_reads(client: &NbdClient, base: u64, count: usize) {
    let mut queue = client.queue().unwrap();
    for i in 0..count as u64 {
        queue.submit(Submission {
            tag: i,
            op: QueuedOp::Read,
            buf: IoBuf::from_slice(&[GARBAGE; LEN]),
            offset: base + i * LEN as u64,
        });
    }
    let mut done = Vec::new();
    queue.complete(count, &mut done);
    assert_eq!(done.len(), count);
    for completion in done {
        let offset = base + completion.tag * LEN as u64;
        completion
            .result
            .unwrap_or_else(|e| panic!("queued read at {offset}: {e}"));
        assert!(
            completion.buf[..] == data_at(offset, LEN)[..],
            "at {offset}"
        );
    }
}

/// `count` blocking reads of LEN bytes from `base` on, one after another, checked.
fn blocking_reads(client: &NbdClient, base: u64, count: usize) {
    for i in 0..count as u64 {
        let offset = base + i * LEN as u64;
        let mut buf = vec![GARBAGE; LEN];
        client.read_at(&mut buf, offset).unwrap();
        assert!(buf == data_at(offset, LEN), "at {offset}");
    }
}

const QUEUED_BASE: u64 = 0;
const BLOCKING_BASE: u64 = 8 << 20;
const REQUESTS: usize = 30;

#[test]
fn requests_spread_over_multi_conn_connections() {
    bounded(|| {
        const CONNECTIONS: usize = 3;
        for structured in [false, true] {
            let server = fake_server::start(
                export(NBD_FLAG_CAN_MULTI_CONN),
                CONNECTIONS,
                |peers, listener| {
                    let offsets = serve_reads(peers);
                    (offsets, connection_waiting(&listener))
                },
            );
            let client = connect(&server.uri, CONNECTIONS, structured);
            assert_eq!(client.connections(), CONNECTIONS);
            queued_reads(&client, QUEUED_BASE, REQUESTS);
            blocking_reads(&client, BLOCKING_BASE, REQUESTS);
            drop(client);
            let (per_connection, extra) = server.join();
            assert!(!extra, "the initiator opened more connections than asked");
            assert_eq!(per_connection.len(), CONNECTIONS);
            // Every connection carries a fair share of each kind of request.
            let fair = REQUESTS / CONNECTIONS / 2;
            for (what, range) in [
                ("queued", QUEUED_BASE..BLOCKING_BASE),
                ("blocking", BLOCKING_BASE..SIZE),
            ] {
                let counts: Vec<usize> = per_connection
                    .iter()
                    .map(|offsets| offsets.iter().filter(|o| range.contains(o)).count())
                    .collect();
                assert_eq!(counts.iter().sum::<usize>(), REQUESTS, "{what}: {counts:?}");
                assert!(
                    counts.iter().all(|&n| n >= fair),
                    "{what} requests per connection {counts:?}: each should carry at least {fair}"
                );
            }
        }
    });
}

#[test]
fn without_multi_conn_only_one_connection_is_opened() {
    bounded(|| {
        // Flush is advertised, CAN_MULTI_CONN is not.
        let server = fake_server::start(export(NBD_FLAG_SEND_FLUSH), 1, |peers, listener| {
            let offsets = serve_reads(peers);
            (offsets, connection_waiting(&listener))
        });
        let client = connect(&server.uri, 3, true);
        assert_eq!(client.connections(), 1);
        queued_reads(&client, QUEUED_BASE, REQUESTS);
        blocking_reads(&client, BLOCKING_BASE, REQUESTS);
        drop(client);
        let (per_connection, extra) = server.join();
        assert_eq!(per_connection[0].len(), 2 * REQUESTS);
        // Not even a second socket was opened (and left unused).
        assert!(!extra, "the initiator opened a second connection");
    });
}

#[test]
fn dropped_connection_fails_its_queued_requests_and_spares_the_others() {
    bounded(|| {
        const COUNT: u64 = 10;
        let server = fake_server::start(export(NBD_FLAG_CAN_MULTI_CONN), 2, |mut peers, _| {
            let mut dropping = peers.pop().unwrap();
            let serving = thread::spawn(move || serve_reads(peers));
            // Least-loaded spreading puts half of the burst on this connection: take
            // those requests and hang up without answering any.
            let taken: Vec<u64> = dropping
                .requests(COUNT as usize / 2)
                .iter()
                .map(|r| r.offset)
                .collect();
            dropping.hang_up();
            let served = serving
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            (served.into_iter().next().unwrap(), taken)
        });
        let client = connect(&server.uri, 2, true);
        assert_eq!(client.connections(), 2);
        let started = Instant::now();
        let mut queue = client.queue().unwrap();
        for tag in 0..COUNT {
            queue.submit(Submission {
                tag,
                op: QueuedOp::Read,
                buf: IoBuf::from_slice(&[GARBAGE; LEN]),
                offset: tag * LEN as u64,
            });
        }
        let mut done = Vec::new();
        queue.complete(COUNT as usize, &mut done);
        assert!(started.elapsed() < REQUEST_TIMEOUT, "waited for a timeout");
        let mut failed = Vec::new();
        for completion in &done {
            let offset = completion.tag * LEN as u64;
            match &completion.result {
                Ok(()) => assert!(completion.buf[..] == data_at(offset, LEN)[..]),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Disconnected, "{e}");
                    assert!(e.to_string().contains("closed the connection"), "{e}");
                    failed.push(offset);
                }
            }
        }
        assert_eq!(failed.len(), COUNT as usize / 2, "failed: {failed:?}");
        // Later requests go to the connection that is left, and succeed.
        queue.submit(Submission {
            tag: 1000,
            op: QueuedOp::Read,
            buf: IoBuf::from_slice(&[GARBAGE; LEN]),
            offset: 1 << 20,
        });
        done.clear();
        queue.complete(1, &mut done);
        assert!(done[0].result.is_ok() && done[0].buf[..] == data_at(1 << 20, LEN)[..]);
        drop(queue);
        blocking_reads(&client, BLOCKING_BASE, 4);
        drop(client);
        let (served, taken) = server.join();
        failed.sort_unstable();
        let mut taken = taken;
        taken.sort_unstable();
        assert_eq!(
            failed, taken,
            "exactly the dropped connection's requests fail"
        );
        assert_eq!(served.len(), COUNT as usize / 2 + 1 + 4);
    });
}
