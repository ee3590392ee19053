//! Gathered sends and answers of one connection, against a fake target that
//! watches the wire.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use super::*;
use crate::initiator::commands;
use crate::pdu::{CapsuleResp, IcResp, R2T};

/// A capsule without in-capsule data and without digests.
const CAPSULE_LEN: usize = 72;

/// A connection to a fake target that has answered ICReq, and the target's end.
fn connected(depth: u16) -> (Arc<Connection>, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let target = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut icreq = [0u8; 128];
        stream.read_exact(&mut icreq).unwrap();
        let resp = Pdu::IcResp(IcResp {
            maxh2cdata: 65536,
            ..IcResp::default()
        });
        stream
            .write_all(&resp.to_bytes(&Framing::default()))
            .unwrap();
        stream
    });
    let connection = Connection::open(
        &addr.to_string(),
        Digests::default(),
        depth,
        0,
        1 << 20,
        Duration::from_secs(5),
    )
    .unwrap();
    (connection, target.join().unwrap())
}

/// Whether the target has bytes to read within `wait`.
fn readable(stream: &TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    let ready = stream.peek(&mut byte).is_ok_and(|n| n > 0);
    stream.set_read_timeout(None).unwrap();
    ready
}

/// Reads `count` capsules; their command IDs.
fn capsule_ids(stream: &mut TcpStream, count: usize) -> Vec<u16> {
    // A capsule that never comes fails the test instead of hanging it.
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    (0..count)
        .map(|_| {
            let mut capsule = [0u8; CAPSULE_LEN];
            stream.read_exact(&mut capsule).unwrap();
            assert_eq!(capsule[0], PduType::CapsuleCmd as u8);
            u16::from_le_bytes([capsule[10], capsule[11]])
        })
        .collect()
}

fn answer(stream: &mut TcpStream, cids: &[u16]) {
    let mut bytes = Vec::new();
    for &cid in cids {
        Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::new(cid, Status::SUCCESS),
        })
        .encode(&Framing::default(), &mut bytes);
    }
    stream.write_all(&bytes).unwrap();
}

/// Gathers a one-block read at block `tag`, answered to `sink` with `tag`.
fn enqueue_read(connection: &Connection, tag: u64, sink: &Sink, capsules: &mut Vec<u8>) {
    connection.enqueue(
        commands::read(1, tag, 1),
        Payload::Owned(vec![0; 512]),
        tag,
        sink.clone(),
        capsules,
    );
}

fn sink() -> (Sink, mpsc::Receiver<Done>) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let sink: Sink = Arc::new(move |done: Done| {
        let _ = tx.lock().unwrap().send(done);
    });
    (sink, rx)
}

#[test]
fn gathered_capsules_leave_only_when_sent_and_then_together() {
    let (connection, mut target) = connected(8);
    let (sink, done) = sink();
    let mut capsules = Vec::new();
    for tag in 0..3 {
        enqueue_read(&connection, tag, &sink, &mut capsules);
    }
    assert_eq!(connection.in_flight(), 3, "registered before being sent");
    assert!(
        !readable(&target, Duration::from_millis(100)),
        "a gathered capsule left before send_capsules"
    );
    connection.send_capsules(&mut capsules);
    assert!(capsules.is_empty());
    let cids = capsule_ids(&mut target, 3);
    answer(&mut target, &cids);
    let mut tags: Vec<u64> = (0..3)
        .map(|_| done.recv_timeout(Duration::from_secs(5)).unwrap())
        .map(|d| {
            assert!(d.result.is_ok());
            d.tag
        })
        .collect();
    tags.sort();
    assert_eq!(tags, [0, 1, 2]);
}

#[test]
fn waiting_for_a_command_id_sends_what_was_gathered_first() {
    // Two IDs: the third command waits for an answer, which the target can
    // only give once it has the two gathered capsules.
    let (connection, mut target) = connected(2);
    let (sink, done) = sink();
    let submitter = {
        let connection = connection.clone();
        thread::spawn(move || {
            let mut capsules = Vec::new();
            for tag in 0..3 {
                enqueue_read(&connection, tag, &sink, &mut capsules);
            }
            connection.send_capsules(&mut capsules);
        })
    };
    let first = capsule_ids(&mut target, 2);
    answer(&mut target, &first[..1]);
    let third = capsule_ids(&mut target, 1);
    assert_eq!(third, first[..1], "the freed ID is used again");
    submitter.join().unwrap();
    answer(&mut target, &[first[1], third[0]]);
    for _ in 0..3 {
        assert!(done
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .result
            .is_ok());
    }
}

#[test]
fn answers_read_in_one_go_all_reach_their_sinks_and_a_lost_connection_fails_the_rest() {
    let (connection, mut target) = connected(8);
    let (sink, done) = sink();
    let mut capsules = Vec::new();
    for tag in 0..4 {
        enqueue_read(&connection, tag, &sink, &mut capsules);
    }
    connection.send_capsules(&mut capsules);
    let cids = capsule_ids(&mut target, 4);
    answer(&mut target, &cids[..3]);
    for _ in 0..3 {
        let d = done.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(d.result.is_ok());
    }
    drop(target);
    let last = done.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(last.result.unwrap_err(), Lost);
    assert!(connection.is_dead());
}

/// Reads a capsule; its opcode and command ID.
fn capsule(stream: &mut TcpStream) -> (u8, u16) {
    let mut capsule = [0u8; CAPSULE_LEN];
    stream.read_exact(&mut capsule).unwrap();
    assert_eq!(capsule[0], PduType::CapsuleCmd as u8);
    (capsule[8], u16::from_le_bytes([capsule[10], capsule[11]]))
}

#[test]
fn h2c_data_the_socket_cannot_take_at_once_is_finished_by_the_writer_while_the_reader_reads_on() {
    const LEN: usize = 16 << 20;
    let (connection, mut target) = connected(8);
    let (sink, done) = sink();
    let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let mut capsules = Vec::new();
    connection.enqueue(
        commands::write(1, 0, (LEN / 512) as u32, false),
        Payload::Io(IoBuf::from_slice(&data)),
        1,
        sink.clone(),
        &mut capsules,
    );
    enqueue_read(&connection, 2, &sink, &mut capsules);
    connection.send_capsules(&mut capsules);
    target
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut cids = HashMap::new();
    for _ in 0..2 {
        let (opcode, cid) = capsule(&mut target);
        cids.insert(opcode, cid);
    }
    let (write, read) = (cids[&0x01], cids[&0x02]);
    // All 16 MiB asked for while the target reads nothing: more than the
    // socket buffers hold.
    let mut r2t = Vec::new();
    Pdu::R2T(R2T {
        cccid: write,
        ttag: 9,
        offset: 0,
        length: LEN as u32,
    })
    .encode(&Framing::default(), &mut r2t);
    target.write_all(&r2t).unwrap();
    thread::sleep(Duration::from_millis(200));
    // The reader is not stuck behind the data: it takes the read's answer.
    answer(&mut target, &[read]);
    let first = done.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(first.tag, 2);
    // A capsule sent meanwhile waits for the H2CData to finish.
    connection.submit(
        commands::read(1, 8, 1),
        Payload::Owned(vec![0; 512]),
        3,
        sink.clone(),
    );
    // The H2CData arrives whole and in order (64 KiB per PDU), then the capsule.
    let mut received = 0;
    while received < LEN {
        let mut head = [0u8; 24];
        target.read_exact(&mut head).unwrap();
        assert_eq!(head[0], PduType::H2CData as u8);
        let cccid = u16::from_le_bytes([head[8], head[9]]);
        let offset = u32::from_le_bytes(head[12..16].try_into().unwrap()) as usize;
        let len = u32::from_le_bytes(head[16..20].try_into().unwrap()) as usize;
        assert_eq!((cccid, offset), (write, received));
        let mut chunk = vec![0u8; len];
        target.read_exact(&mut chunk).unwrap();
        assert!(
            chunk == data[offset..offset + len],
            "data at {offset} differs"
        );
        received += len;
    }
    assert_eq!(capsule(&mut target).0, 0x02);
    answer(&mut target, &[write]);
    let written = done.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(written.tag, 1);
    assert!(written.result.is_ok());
}
