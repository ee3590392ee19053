//! The initiator against targets that misbehave on the wire: each answer is a
//! clean error (never a panic, never a hang), and a namespace already open
//! rides out a target that garbles one connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use blockwire_nvme::initiator::{NvmeClient, NvmeOptions};
use blockwire_nvme::pdu::{C2HData, CapsuleResp, Framing, IcResp, Pdu, R2T};
use blockwire_nvme::{decode, Cqe, Status};

/// Reads one PDU (framing without digests).
fn read_pdu(stream: &mut TcpStream) -> Option<Pdu> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some((pdu, _))) = decode(&buf, &Framing::default()) {
            return Some(pdu);
        }
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A one-connection fake: answers ICReq properly, then sends `after` to the
/// first command capsule.
fn fake(after: impl FnOnce(&mut TcpStream, Cqe) + Send + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let Some(Pdu::IcReq(_)) = read_pdu(&mut stream) else {
            return;
        };
        let resp = Pdu::IcResp(IcResp {
            maxh2cdata: 65536,
            ..IcResp::default()
        });
        stream
            .write_all(&resp.to_bytes(&Framing::default()))
            .unwrap();
        let Some(Pdu::CapsuleCmd(cmd)) = read_pdu(&mut stream) else {
            return;
        };
        after(&mut stream, Cqe::new(cmd.sqe.cid(), Status::SUCCESS));
        // Hold the connection open: the initiator must notice the fault itself.
        thread::sleep(Duration::from_secs(3));
    });
    addr
}

fn open_fails(addr: SocketAddr) -> String {
    let mut options = NvmeOptions::parse(&format!("nvme+tcp://{addr}/nqn.x:y")).unwrap();
    options.setup_timeout = Duration::from_secs(2);
    let start = Instant::now();
    let error = NvmeClient::open(options).unwrap_err().to_string();
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    error
}

#[test]
fn garbage_instead_of_a_completion() {
    let addr = fake(|s, _| s.write_all(&[0xee; 64]).unwrap());
    let error = open_fails(addr);
    assert!(error.contains("lost"), "{error}");
}

#[test]
fn completion_for_a_command_never_sent() {
    let addr = fake(|s, mut cqe| {
        cqe.cid = cqe.cid.wrapping_add(100);
        let pdu = Pdu::CapsuleResp(CapsuleResp { cqe });
        s.write_all(&pdu.to_bytes(&Framing::default())).unwrap();
    });
    open_fails(addr);
}

#[test]
fn data_for_a_command_that_reads_nothing() {
    let addr = fake(|s, cqe| {
        let pdu = Pdu::C2HData(C2HData {
            cccid: cqe.cid,
            offset: 0,
            last: true,
            success: false,
            data: vec![1; 512],
        });
        s.write_all(&pdu.to_bytes(&Framing::default())).unwrap();
    });
    open_fails(addr);
}

#[test]
fn r2t_beyond_the_data() {
    let addr = fake(|s, cqe| {
        let pdu = Pdu::R2T(R2T {
            cccid: cqe.cid,
            ttag: 1,
            offset: 512,
            length: 1 << 20,
        });
        s.write_all(&pdu.to_bytes(&Framing::default())).unwrap();
    });
    open_fails(addr);
}

#[test]
fn a_silent_target_times_out() {
    let addr = fake(|_, _| {});
    let error = open_fails(addr);
    assert!(error.contains("Connect"), "{error}");
}

#[test]
fn a_refused_connect_says_so_and_hangs_up() {
    let (closed_tx, closed) = std::sync::mpsc::channel();
    let addr = fake(move |s, mut cqe| {
        cqe.status = Status::CONNECT_INVALID_HOST;
        let pdu = Pdu::CapsuleResp(CapsuleResp { cqe });
        s.write_all(&pdu.to_bytes(&Framing::default())).unwrap();
        // The initiator closes the connection it gave up on.
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let _ = closed_tx.send(matches!(s.read(&mut [0u8; 16]), Ok(0)));
    });
    let error = open_fails(addr);
    assert!(error.contains("Connect (admin queue) failed"), "{error}");
    assert!(closed.recv().unwrap(), "the connection was left open");
}

#[test]
fn nobody_listening() {
    let addr = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    open_fails(addr);
}
