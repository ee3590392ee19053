//! The NVMe/TCP target over loopback, driven by a small host built from the
//! crate's own codec: connect, identify, write/read/compare with and without
//! digests, many commands in flight, discovery, keep-alive, reload, and a
//! malformed PDU that ends only its own connection.

mod host;

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_nvme::controller::Subsystem;
use blockwire_nvme::fabrics::{DISCOVERY_NQN, DYNAMIC_CNTLID};
use blockwire_nvme::opcodes::{admin, cns, feature, io, log};
use blockwire_nvme::pdu::{fes, Digests, Pdu};
use blockwire_nvme::{
    default_nqn, NvmeConfig, NvmeTarget, ReloadHandle, ShutdownHandle, Sqe, Status,
};
use host::Host;

const SIZE: u64 = 8 << 20;

struct Running {
    addr: SocketAddr,
    discovery: SocketAddr,
    shutdown: ShutdownHandle,
    reload: ReloadHandle,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn subsystem(name: &str) -> Arc<Subsystem> {
    Arc::new(Subsystem::new(
        name,
        Device::from_device(MemoryDevice::new(SIZE)),
    ))
}

fn start(subsystems: Vec<Arc<Subsystem>>) -> Running {
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = NvmeConfig::new(vec![loopback]);
    config.connect_timeout = Duration::from_millis(500);
    config.discovery_listen = vec![loopback];
    config.workers = 4;
    config.removal_grace = Duration::from_millis(100);
    let target = NvmeTarget::bind(config, subsystems).expect("bind");
    let addr = target.local_addrs()[0];
    let discovery = target.discovery_addrs()[0];
    let shutdown = target.shutdown_handle();
    let reload = target.reload_handle();
    let thread = thread::spawn(move || target.run().expect("run"));
    Running {
        addr,
        discovery,
        shutdown,
        reload,
        thread: Some(thread),
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

const ALL_DIGESTS: Digests = Digests {
    header: true,
    data: true,
};

fn write_read_compare(digests: Digests) {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let (mut admin, cntlid) = Host::admin(target.addr, &nqn, digests);
    let ctrl = admin.identify_controller();
    assert_eq!(u16::from_le_bytes([ctrl[78], ctrl[79]]), cntlid);
    assert_eq!(&ctrl[768..768 + nqn.len()], nqn.as_bytes());
    let ns = admin.identify(cns::NAMESPACE, 1);
    assert!(ns.cqe.status.is_success());
    assert_eq!(
        u64::from_le_bytes(ns.data[0..8].try_into().unwrap()),
        SIZE / 512
    );

    let mut q = Host::io_queue(target.addr, &nqn, cntlid, 1, digests);
    // In-capsule (4 KiB), and by R2T (256 KiB).
    for (slba, len) in [(0u64, 4096usize), (64, 256 * 1024)] {
        let data = pattern(slba as u8, len);
        assert!(q.write(slba, &data, false).status.is_success());
        let read = q.read(slba, (len / 512) as u32);
        assert!(read.cqe.status.is_success());
        assert_eq!(read.data, data);
        assert!(q.compare(slba, &data).status.is_success());
        let mut other = data.clone();
        other[len / 2] ^= 0x10;
        assert_eq!(q.compare(slba, &other).status, Status::COMPARE_FAILURE);
    }
    assert!(q.write(8, &pattern(9, 512), true).status.is_success());
    assert!(q.flush().status.is_success());
    let beyond = q.read(SIZE / 512, 1);
    assert_eq!(beyond.cqe.status, Status::LBA_OUT_OF_RANGE);
}

#[test]
fn write_read_compare_without_digests() {
    write_read_compare(Digests::default());
}

#[test]
fn write_read_compare_with_digests() {
    write_read_compare(ALL_DIGESTS);
}

#[test]
fn header_digest_only() {
    write_read_compare(Digests {
        header: true,
        data: false,
    });
}

#[test]
fn many_commands_in_flight_on_one_queue() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let (_admin, cntlid) = Host::admin(target.addr, &nqn, Digests::default());
    let mut q = Host::io_queue(target.addr, &nqn, cntlid, 1, Digests::default());
    let blocks = 128u32; // 64 KiB each
    let mut expected = std::collections::HashMap::new();
    for i in 0..32u64 {
        let data = pattern(i as u8, blocks as usize * 512);
        assert!(q
            .write(i * u64::from(blocks), &data, false)
            .status
            .is_success());
        expected.insert(i, data);
    }
    // Thirty-two reads sent before any answer is read.
    let mut cids = std::collections::HashMap::new();
    for i in 0..32u64 {
        let sqe = q.rw_sqe(io::READ, i * u64::from(blocks), blocks, false);
        cids.insert(sqe.cid(), i);
        q.submit(sqe, &[], blocks * 512);
    }
    let mut data: std::collections::HashMap<u16, Vec<u8>> = Default::default();
    let mut done = 0;
    while done < 32 {
        match q.recv().expect("open") {
            Pdu::C2HData(d) => data.entry(d.cccid).or_default().extend_from_slice(&d.data),
            Pdu::CapsuleResp(r) => {
                assert!(r.cqe.status.is_success());
                let i = cids[&r.cqe.cid];
                assert_eq!(data[&r.cqe.cid], expected[&i]);
                done += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn two_io_queues_share_the_namespace() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let (mut admin, cntlid) = Host::admin(target.addr, &nqn, Digests::default());
    let cid = admin.cid();
    let mut sqe = Sqe::new(admin::SET_FEATURES, cid);
    sqe.set_cdw(10, u32::from(feature::NUMBER_OF_QUEUES));
    sqe.set_cdw(11, 0x0001_0001);
    let granted = admin.run(sqe, &[], 0).cqe;
    assert_eq!(granted.result, 0x0001_0001);
    let mut q1 = Host::io_queue(target.addr, &nqn, cntlid, 1, Digests::default());
    let mut q2 = Host::io_queue(target.addr, &nqn, cntlid, 2, ALL_DIGESTS);
    let data = pattern(3, 8192);
    assert!(q1.write(100, &data, true).status.is_success());
    assert_eq!(q2.read(100, 16).data, data);
}

#[test]
fn malformed_pdu_closes_only_its_connection() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let (_admin, cntlid) = Host::admin(target.addr, &nqn, Digests::default());
    let mut good = Host::io_queue(target.addr, &nqn, cntlid, 1, Digests::default());
    let mut bad = Host::connect(target.addr, Digests::default());
    // A capsule whose header length is wrong.
    bad.send_raw(&[0x04, 0x00, 99, 0, 72, 0, 0, 0]);
    match bad.recv() {
        Some(Pdu::C2HTermReq(term)) => {
            assert_eq!(term.fes, fes::INVALID_PDU_HEADER_FIELD);
            assert_eq!(term.fei, 2);
            assert_eq!(&term.data[..3], &[0x04, 0x00, 99]);
        }
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
    assert!(bad.recv().is_none(), "the target closes after a TermReq");
    // An unknown PDU type before ICReq too.
    let mut worse = std::net::TcpStream::connect(target.addr).unwrap();
    use std::io::{Read, Write};
    worse.write_all(&[0x42, 0, 8, 0, 8, 0, 0, 0]).unwrap();
    let mut reply = Vec::new();
    worse
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = worse.read_to_end(&mut reply);
    assert_eq!(reply[0], 0x03, "C2HTermReq");
    // The other queue carries on.
    let data = pattern(1, 4096);
    assert!(good.write(0, &data, false).status.is_success());
    assert_eq!(good.read(0, 8).data, data);
}

#[test]
fn h2c_data_out_of_range_is_fatal() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let (_admin, cntlid) = Host::admin(target.addr, &nqn, Digests::default());
    let mut q = Host::io_queue(target.addr, &nqn, cntlid, 1, Digests::default());
    let data = pattern(5, 64 * 1024);
    let sqe = q.rw_sqe(io::WRITE, 0, 128, false);
    q.submit(sqe, &data, 0);
    let r2t = match q.recv() {
        Some(Pdu::R2T(r2t)) => r2t,
        other => panic!("expected R2T, got {other:?}"),
    };
    q.send(&Pdu::H2CData(blockwire_nvme::pdu::H2CData {
        cccid: r2t.cccid,
        ttag: r2t.ttag,
        offset: 4096,
        last: false,
        data: vec![0; 512],
    }));
    match q.recv() {
        Some(Pdu::C2HTermReq(term)) => assert_eq!(term.fes, fes::DATA_OUT_OF_RANGE),
        other => panic!("expected C2HTermReq, got {other:?}"),
    }
}

#[test]
fn discovery_on_its_own_listener() {
    let target = start(vec![subsystem("a"), subsystem("b")]);
    let (mut d, _) = Host::admin(target.discovery, DISCOVERY_NQN, Digests::default());
    let ctrl = d.identify_controller();
    assert_eq!(ctrl[111], 2, "a discovery controller");
    let page = d.get_log_page(log::DISCOVERY, 3 * 1024);
    assert!(page.cqe.status.is_success());
    assert_eq!(u64::from_le_bytes(page.data[8..16].try_into().unwrap()), 2);
    let entry = &page.data[1024..2048];
    let port = target.addr.port().to_string();
    assert_eq!(&entry[32..32 + port.len()], port.as_bytes());
    assert_eq!(&entry[512..521], b"127.0.0.1");
    let a = default_nqn("a");
    assert_eq!(&entry[256..256 + a.len()], a.as_bytes());
    // The discovery listener serves no NVM subsystem.
    let mut wrong = Host::connect(target.discovery, Digests::default());
    let cqe = wrong.fabrics_connect(&a, 0, DYNAMIC_CNTLID, 0);
    assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAMETERS);
    // The I/O listener serves discovery too.
    let (mut also, _) = Host::admin(target.addr, DISCOVERY_NQN, Digests::default());
    assert_eq!(also.identify_controller()[111], 2);
}

#[test]
fn keep_alive_timeout_closes_the_controller() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let mut admin = Host::connect(target.addr, Digests::default());
    let cqe = admin.fabrics_connect(&nqn, 0, DYNAMIC_CNTLID, 500);
    assert!(cqe.status.is_success());
    let started = Instant::now();
    assert!(admin.recv().is_none(), "closed by the watchdog");
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

#[test]
fn reload_adds_and_removes_subsystems_with_events() {
    let a = subsystem("a");
    let target = start(vec![a.clone()]);
    let nqn_a = default_nqn("a");
    let (mut admin, _) = Host::admin(target.addr, &nqn_a, Digests::default());
    // Ask for namespace attribute notices, then leave an event request waiting.
    let cid = admin.cid();
    let mut sqe = Sqe::new(admin::SET_FEATURES, cid);
    sqe.set_cdw(10, u32::from(feature::ASYNC_EVENT_CONFIG));
    sqe.set_cdw(11, 1 << 8);
    assert!(admin.run(sqe, &[], 0).cqe.status.is_success());
    let aer_cid = admin.cid();
    admin.submit(Sqe::new(admin::ASYNC_EVENT_REQUEST, aer_cid), &[], 0);

    // Adding b: a new subsystem to connect to; a's controllers see no change.
    let b = subsystem("b");
    let (removed, drain) = target.reload.replace(vec![a.clone(), b.clone()]);
    drain.join().unwrap();
    assert!(removed.is_empty());
    let (_admin_b, _) = Host::admin(target.addr, &default_nqn("b"), Digests::default());

    // Removing a: the waiting request completes with "namespace changed".
    let (removed, drain) = target.reload.replace(vec![b]);
    assert_eq!(removed, vec![nqn_a.clone()]);
    match admin.recv() {
        Some(Pdu::CapsuleResp(resp)) => {
            assert_eq!(resp.cqe.cid, aer_cid);
            assert_eq!(resp.cqe.result & 0xff_00ff, 0x04_0002);
        }
        other => panic!("expected the event, got {other:?}"),
    }
    drain.join().unwrap();
    // Then its controller is closed, and a new connect is refused.
    let started = Instant::now();
    assert!(admin.recv().is_none());
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut late = Host::connect(target.addr, Digests::default());
    let cqe = late.fabrics_connect(&nqn_a, 0, DYNAMIC_CNTLID, 0);
    assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAMETERS);
}

#[test]
fn shutdown_closes_connections() {
    let mut target = start(vec![subsystem("disk")]);
    let (mut admin, _) = Host::admin(target.addr, &default_nqn("disk"), Digests::default());
    target.shutdown.shutdown();
    target.thread.take().unwrap().join().unwrap();
    assert!(admin.recv().is_none());
    assert_eq!(target.shutdown.open_connections(), 0);
}

/// Throughput of 1 MiB reads and writes at queue depth 16 on one I/O queue, over
/// loopback against a memory namespace (a measurement, not a check: run with
/// `cargo test --release -p blockwire-nvme --test target -- --ignored --nocapture`).
#[test]
#[ignore]
fn throughput_1mib_qd16() {
    let size = 256u64 << 20;
    let sub = Arc::new(Subsystem::new(
        "bench",
        Device::from_device(MemoryDevice::new(size)),
    ));
    let target = start(vec![sub]);
    let nqn = default_nqn("bench");
    let (_admin, cntlid) = Host::admin(target.addr, &nqn, Digests::default());
    let mut q = Host::io_queue(target.addr, &nqn, cntlid, 1, Digests::default());
    let chunk = 1u32 << 20;
    let blocks = chunk / 512;
    let data = pattern(7, chunk as usize);
    let total = 1024u64; // 1 GiB each way
    for (name, opcode) in [("write", io::WRITE), ("read", io::READ)] {
        let started = Instant::now();
        let mut sent = 0u64;
        let mut done = 0u64;
        let mut inflight = 0;
        while done < total {
            while inflight < 16 && sent < total {
                let slba = (sent % (size / u64::from(chunk))) * u64::from(blocks);
                let sqe = q.rw_sqe(opcode, slba, blocks, false);
                if opcode == io::WRITE {
                    q.submit(sqe, &data, 0);
                } else {
                    q.submit(sqe, &[], chunk);
                }
                sent += 1;
                inflight += 1;
            }
            match q.recv().expect("open") {
                Pdu::R2T(r2t) => q.answer_r2t(&r2t, &data),
                Pdu::C2HData(_) => {}
                Pdu::CapsuleResp(r) => {
                    assert!(r.cqe.status.is_success());
                    done += 1;
                    inflight -= 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{name}: {total} MiB in {secs:.2} s = {:.0} MiB/s",
            total as f64 / secs
        );
    }
}

#[test]
fn h2c_data_digest_mismatch_closes_the_connection() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let (_admin, cntlid) = Host::admin(target.addr, &nqn, ALL_DIGESTS);
    let mut q = Host::io_queue(target.addr, &nqn, cntlid, 1, ALL_DIGESTS);
    let data = pattern(6, 32 * 1024);
    let sqe = q.rw_sqe(io::WRITE, 0, 64, false);
    q.submit(sqe, &data, 0);
    let r2t = match q.recv() {
        Some(Pdu::R2T(r2t)) => r2t,
        other => panic!("expected R2T, got {other:?}"),
    };
    let mut bytes = Pdu::H2CData(blockwire_nvme::pdu::H2CData {
        cccid: r2t.cccid,
        ttag: r2t.ttag,
        offset: 0,
        last: true,
        data: data.clone(),
    })
    .to_bytes(&q.framing);
    let n = bytes.len();
    bytes[n - 1] ^= 0xff;
    q.send_raw(&bytes);
    assert!(q.recv().is_none(), "closed on a data digest mismatch");
    // Nothing was written.
    let mut other = Host::io_queue(target.addr, &nqn, cntlid, 2, ALL_DIGESTS);
    assert!(other.read(0, 64).data.iter().all(|&b| b == 0));
}

#[test]
fn reads_complete_in_their_data_when_sq_flow_control_is_off() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    let (_admin, cntlid) = Host::admin(target.addr, &nqn, Digests::default());
    let mut q = Host::connect(target.addr, Digests::default());
    let cqe = q.fabrics_connect_with(&nqn, 1, cntlid, 0, 1 << 2);
    assert!(cqe.status.is_success());
    let data = pattern(8, 4096);
    assert!(q.write(0, &data, false).status.is_success());
    let sqe = q.rw_sqe(io::READ, 0, 8, false);
    q.submit(sqe, &[], 4096);
    match q.recv() {
        Some(Pdu::C2HData(d)) => {
            assert!(d.last && d.success, "SUCCESS stands for the completion");
            assert_eq!(d.data, data);
        }
        other => panic!("expected C2HData, got {other:?}"),
    }
    // No CapsuleResp follows: the next PDU answers the next command.
    assert!(q.flush().status.is_success());
}

/// Counts sessions by export, as the metrics do.
#[derive(Debug, Default)]
struct Sessions {
    open: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

impl blockwire_blockdev::SessionMeter for Sessions {
    fn opened(&self, export: &str) {
        *self.open.lock().unwrap().entry(export.into()).or_default() += 1;
    }
    fn closed(&self, export: &str) {
        *self.open.lock().unwrap().entry(export.into()).or_default() -= 1;
    }
    fn refused(&self, _limit: &str) {}
}

#[test]
fn each_io_queue_is_a_session_of_its_export() {
    let sessions = Arc::new(Sessions::default());
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = NvmeConfig::new(vec![loopback]);
    config.sessions = Some(sessions.clone());
    let target = NvmeTarget::bind(config, vec![subsystem("disk")]).unwrap();
    let addr = target.local_addrs()[0];
    let stop = target.shutdown_handle();
    let running = thread::spawn(move || target.run().unwrap());
    let nqn = default_nqn("disk");
    let (_admin, cntlid) = Host::admin(addr, &nqn, Digests::default());
    let q1 = Host::io_queue(addr, &nqn, cntlid, 1, Digests::default());
    let mut q2 = Host::io_queue(addr, &nqn, cntlid, 2, Digests::default());
    assert!(q2.flush().status.is_success());
    assert_eq!(sessions.open.lock().unwrap()["disk"], 2);
    drop(q1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while sessions.open.lock().unwrap()["disk"] != 1 {
        assert!(
            Instant::now() < deadline,
            "the closed queue's session ended"
        );
        thread::sleep(Duration::from_millis(10));
    }
    stop.shutdown();
    running.join().unwrap();
    assert_eq!(sessions.open.lock().unwrap()["disk"], 0);
}

#[test]
fn silent_connections_are_closed_but_connected_ones_may_idle() {
    let target = start(vec![subsystem("disk")]);
    let nqn = default_nqn("disk");
    // Nothing sent: closed after the connect timeout (500 ms here).
    let mut silent = std::net::TcpStream::connect(target.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut byte = [0u8; 1];
    use std::io::Read;
    assert_eq!(silent.read(&mut byte).unwrap_or(0), 0);
    assert!(started.elapsed() < Duration::from_secs(5));
    // ICReq but no Connect: closed too.
    let mut half = Host::connect(target.addr, Digests::default());
    assert!(half.recv().is_none());
    // A connected queue may stay quiet longer than that.
    let (mut admin, _) = Host::admin(target.addr, &nqn, Digests::default());
    thread::sleep(Duration::from_millis(1200));
    assert_eq!(admin.identify_controller()[111], 1);
}
