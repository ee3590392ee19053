//! A request queue reads its connections' replies on its own thread (reader.rs):
//! a caller that waits for its own reply meanwhile must read for itself, and the
//! queue's sends must read replies while the socket is full, or a server that
//! answers before it reads on would deadlock with it.

use std::time::{Duration, Instant};

use blockwire_blockdev::{BlockDevice, ErrorKind, IoBuf, QueuedOp, Submission};

use super::fake_server::{self, Peer};
use super::transmission_tests::{
    bounded, connect, data_at, export, read_reply, GARBAGE, LEN, REQUEST_TIMEOUT,
};
use super::{ClientOptions, NbdClient};
use crate::wire::*;

/// Answers every request in arrival order until the initiator disconnects: reads
/// with their data, writes with success. Returns how many it answered.
fn answer_in_order(mut peer: Peer) -> usize {
    let mut answered = 0;
    while let Some(request) = peer.next_request() {
        let mut out = Vec::new();
        match request.command {
            NBD_CMD_READ => read_reply(&mut out, &request, peer.structured),
            _ => encode_simple_reply(&mut out, 0, request.cookie),
        }
        // One request at a time, written whole before the next is read: a server
        // whose replies back up stops reading requests.
        peer.send(&out);
        answered += 1;
    }
    answered
}

fn read_at(tag: u64, offset: u64, len: usize) -> Submission {
    Submission {
        tag,
        op: QueuedOp::Read,
        buf: IoBuf::from_slice(&vec![GARBAGE; len]),
        offset,
    }
}

#[test]
fn a_caller_waiting_beside_a_queue_reads_its_own_reply_and_the_queues() {
    bounded(|| {
        const QUEUED: usize = 4;
        let server = fake_server::start(export(0), 1, |mut peers, _| {
            let mut peer = peers.pop().unwrap();
            // The queue's burst, then the blocking read; answered blocking read
            // first, then the queued ones in reverse.
            let requests = peer.requests(QUEUED + 1);
            let mut out = Vec::new();
            for request in requests.iter().rev() {
                read_reply(&mut out, request, peer.structured);
            }
            peer.send(&out);
            answer_in_order(peer)
        });
        let client = connect(&server.uri, 1, true);
        let mut queue = client.queue().unwrap();
        // A burst of this size leaves at once, without waiting for `complete`.
        for tag in 0..QUEUED as u64 {
            queue.submit(read_at(tag, tag * LEN as u64, LEN));
        }
        // The queue's thread is not reading now (it is this thread): the reader
        // thread is parked, so this read must read the socket itself.
        let offset = 1 << 20;
        let mut buf = vec![GARBAGE; LEN];
        client.read_at(&mut buf, offset).unwrap();
        assert!(buf == data_at(offset, LEN));
        // The queue's replies came before ours in the stream: they are delivered.
        let mut done = Vec::new();
        queue.complete(QUEUED, &mut done);
        assert_eq!(done.len(), QUEUED);
        for completion in done {
            let offset = completion.tag * LEN as u64;
            assert!(completion.result.is_ok(), "{:?}", completion.result);
            assert!(
                completion.buf[..] == data_at(offset, LEN)[..],
                "at {offset}"
            );
        }
        drop(queue);
        // With the queue gone the reader thread reads again.
        client.read_at(&mut buf, 0).unwrap();
        assert!(buf == data_at(0, LEN));
        drop(client);
        assert_eq!(server.join(), 1);
    });
}

#[test]
fn a_queue_reads_replies_while_its_writes_wait_for_room() {
    bounded(|| {
        // More read data than the socket buffers on both ends hold (a few MiB
        // each), then writes: the server blocks sending read data until the
        // initiator reads it, and reads no further request meanwhile. An
        // initiator that only read after sending everything would wait forever.
        const READS: usize = 24;
        const WRITES: usize = 24;
        const BIG: usize = 1 << 20;
        let server = fake_server::start(export(0), 1, |mut peers, _| {
            answer_in_order(peers.pop().unwrap())
        });
        let client = connect(&server.uri, 1, false);
        let mut queue = client.queue().unwrap();
        for tag in 0..READS as u64 {
            queue.submit(read_at(tag, tag * BIG as u64, BIG));
        }
        for i in 0..WRITES as u64 {
            queue.submit(Submission {
                tag: 1000 + i,
                op: QueuedOp::Write(Default::default()),
                buf: IoBuf::from_slice(&vec![0x5a; BIG]),
                offset: i * BIG as u64,
            });
        }
        let mut done = Vec::new();
        let started = std::time::Instant::now();
        while done.len() < READS + WRITES {
            queue.complete(1, &mut done);
        }
        assert!(started.elapsed() < REQUEST_TIMEOUT, "waited for a timeout");
        for completion in &done {
            assert!(
                completion.result.is_ok(),
                "tag {}: {:?}",
                completion.tag,
                completion.result
            );
            if completion.tag < 1000 {
                let offset = completion.tag * BIG as u64;
                assert!(
                    completion.buf[..] == data_at(offset, BIG)[..],
                    "at {offset}"
                );
            }
        }
        drop(queue);
        drop(client);
        assert_eq!(server.join(), READS + WRITES);
    });
}

#[test]
fn a_reply_that_stops_halfway_fails_the_queued_read_after_the_request_timeout() {
    bounded(|| {
        let server = fake_server::start(export(0), 1, |mut peers, _| {
            let mut peer = peers.pop().unwrap();
            let request = peer.requests(1).remove(0);
            let mut out = Vec::new();
            read_reply(&mut out, &request, peer.structured);
            out.truncate(out.len() - LEN / 2);
            peer.send(&out);
            // Sit on the rest until the initiator gives up and hangs up.
            peer.until_disconnect();
        });
        let limit = Duration::from_millis(300);
        let options = ClientOptions {
            request_timeout: Some(limit),
            ..ClientOptions::default()
        };
        let client = NbdClient::connect(&server.uri, options).unwrap();
        let mut queue = client.queue().unwrap();
        queue.submit(read_at(7, 0, LEN));
        let started = Instant::now();
        let mut done = Vec::new();
        // This thread reads the reply itself: a wait in the middle of it must not
        // outlast the request timeout.
        queue.complete(1, &mut done);
        assert!(
            started.elapsed() < REQUEST_TIMEOUT,
            "waited {:?}",
            started.elapsed()
        );
        let error = done.remove(0).result.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
        assert!(error.to_string().contains("middle of a reply"), "{error}");
        drop(queue);
        drop(client);
        server.join();
    });
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    // SAFETY: an all-zero rusage is valid, and getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a live, exclusively borrowed rusage.
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) },
        0
    );
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

#[test]
fn a_queue_waiting_for_more_completions_than_it_has_sleeps() {
    bounded(|| {
        const PAUSE: Duration = Duration::from_millis(400);
        let server = fake_server::start(export(0), 1, |mut peers, _| {
            let mut peer = peers.pop().unwrap();
            let requests = peer.requests(2);
            let mut out = Vec::new();
            read_reply(&mut out, &requests[0], peer.structured);
            peer.send(&out);
            std::thread::sleep(PAUSE);
            out.clear();
            read_reply(&mut out, &requests[1], peer.structured);
            peer.send(&out);
            answer_in_order(peer)
        });
        let client = connect(&server.uri, 1, true);
        let mut queue = client.queue().unwrap();
        queue.submit(read_at(0, 0, LEN));
        queue.submit(read_at(1, LEN as u64, LEN));
        let (wall, cpu) = (Instant::now(), thread_cpu());
        let mut done = Vec::new();
        queue.complete(2, &mut done);
        let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
        assert_eq!(done.len(), 2);
        assert!(wall >= PAUSE / 2, "completed after {wall:?}");
        // The first completion in hand must not turn the wait for the second into
        // a busy loop: a sleeping thread uses next to no CPU.
        assert!(cpu < wall / 4, "{cpu:?} of CPU in {wall:?} of waiting");
        drop(queue);
        drop(client);
        assert_eq!(server.join(), 0);
    });
}
