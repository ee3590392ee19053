//! The target against a hand-driven initiator over loopback: login, the data paths
//! (immediate data, R2T), and what RFC 7143 prescribes for bad input. Each case
//! checks that a bad PDU gets its Reject or a closed connection, and that the target
//! keeps serving.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_iscsi::pdu::{
    data_digest, digest_bytes, header_digest, padded, text, Bhs, DataOut, LoginRequest, NopOut,
    Pdu, RejectReason, ScsiCommand, TextRequest, BHS_LEN, RESERVED_TAG,
};
use blockwire_iscsi::{IscsiConfig, IscsiTarget, ReloadHandle, ShutdownHandle, TargetDefinition};
use blockwire_scsi::{LogicalUnit, LunConfig, ScsiTarget};

const IQN: &str = "iqn.2026-11.dev.blockwire:test";
const INITIATOR: &str = "iqn.2026-11.dev.blockwire:initiator";
const SIZE: u64 = 16 << 20;

struct Running {
    addr: SocketAddr,
    stop: ShutdownHandle,
    reload: ReloadHandle,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.shutdown();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn start() -> Running {
    start_with(|_| {})
}

/// A target `name` with a memory device as LUN 0.
fn definition(name: &str) -> TargetDefinition {
    let device = Device::from_device(MemoryDevice::new(SIZE));
    let unit = LogicalUnit::new(
        device,
        LunConfig {
            block_size: 512,
            vendor: "BLKWIRE".into(),
            product: "test".into(),
            revision: "0.1".into(),
            serial: "1".into(),
            unique_id: 1,
            target_name: name.into(),
        },
    )
    .expect("logical unit");
    let mut scsi = ScsiTarget::new();
    scsi.add_lun(0, Arc::new(unit));
    TargetDefinition {
        name: name.into(),
        alias: None,
        scsi: Arc::new(scsi),
        allowed_initiators: Vec::new(),
        chap: None,
    }
}

fn start_with(adjust: impl FnOnce(&mut IscsiConfig)) -> Running {
    let mut config = IscsiConfig::new(vec!["127.0.0.1:0".parse().unwrap()], vec![definition(IQN)]);
    config.workers = 4;
    config.shutdown_grace = Duration::from_secs(2);
    adjust(&mut config);
    let target = IscsiTarget::bind(config).expect("bind");
    let addr = target.local_addrs()[0];
    let stop = target.shutdown_handle();
    let reload = target.reload_handle();
    let thread = thread::spawn(move || target.run().expect("run"));
    Running {
        addr,
        stop,
        reload,
        thread: Some(thread),
    }
}

/// A minimal initiator: sends PDUs and reads whole PDUs back.
struct Initiator {
    stream: TcpStream,
    cmd_sn: u32,
    exp_stat_sn: u32,
    header_digest: bool,
    data_digest: bool,
}

struct Received {
    pdu: Pdu,
    data: Vec<u8>,
}

impl Initiator {
    fn connect(addr: SocketAddr) -> Initiator {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Initiator {
            stream,
            cmd_sn: 1,
            exp_stat_sn: 0,
            header_digest: false,
            data_digest: false,
        }
    }

    fn send(&mut self, pdu: Pdu, data: &[u8]) {
        let header = pdu.encode(data.len() as u32);
        self.send_raw(&header.bhs, data);
    }

    fn send_raw(&mut self, bhs: &Bhs, data: &[u8]) {
        let mut out = bhs.0.to_vec();
        if self.header_digest {
            out.extend_from_slice(&digest_bytes(header_digest(bhs, &[])));
        }
        out.extend_from_slice(data);
        out.resize(
            BHS_LEN + padded(data.len()) + if self.header_digest { 4 } else { 0 },
            0,
        );
        if self.data_digest && !data.is_empty() {
            out.extend_from_slice(&digest_bytes(data_digest(data)));
        }
        self.stream.write_all(&out).expect("send");
    }

    /// The next PDU, or None when the target closed the connection.
    fn receive(&mut self) -> Option<Received> {
        let mut bhs = Bhs::default();
        if self.stream.read_exact(&mut bhs.0).is_err() {
            return None;
        }
        if self.header_digest {
            let mut digest = [0u8; 4];
            self.stream.read_exact(&mut digest).ok()?;
        }
        let mut data = vec![0u8; padded(bhs.data_len() as usize)];
        self.stream.read_exact(&mut data).ok()?;
        if self.data_digest && bhs.data_len() > 0 {
            let mut digest = [0u8; 4];
            self.stream.read_exact(&mut digest).ok()?;
        }
        data.truncate(bhs.data_len() as usize);
        let pdu = Pdu::decode(&bhs, &[]).expect("target PDUs decode");
        if bhs.opcode() != 0x25 || bhs.0[1] & 1 != 0 {
            self.exp_stat_sn = bhs.u32_at(24).wrapping_add(1);
        }
        Some(Received { pdu, data })
    }

    /// Whether the target closes the connection (reading it to the end).
    fn closed(&mut self) -> bool {
        loop {
            match self.receive() {
                None => return true,
                Some(_) => continue,
            }
        }
    }

    fn login(&mut self, keys: &[(&str, &str)]) -> Received {
        let request = LoginRequest {
            transit: true,
            current_stage: 1,
            next_stage: 3,
            isid: 0x8000_0000_0001,
            cmd_sn: self.cmd_sn,
            cid: 1,
            ..LoginRequest::default()
        };
        self.send(Pdu::LoginRequest(request), &text::encode(keys));
        let response = self.receive().expect("login response");
        if let Pdu::LoginResponse(r) = &response.pdu {
            if r.status_class == 0 {
                self.exp_stat_sn = r.stat_sn.wrapping_add(1);
            }
        }
        response
    }

    fn login_normal(&mut self) {
        let (class, detail) = self.login_to(IQN);
        assert_eq!((class, detail), (0, 0));
    }

    /// Logs in to `target`; returns the status class and detail.
    fn login_to(&mut self, target: &str) -> (u8, u8) {
        let response = self.login(&[
            ("InitiatorName", INITIATOR),
            ("TargetName", target),
            ("SessionType", "Normal"),
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("ImmediateData", "No"),
            ("InitialR2T", "Yes"),
            ("MaxBurstLength", "65536"),
        ]);
        match response.pdu {
            Pdu::LoginResponse(r) => (r.status_class, r.status_detail),
            other => panic!("expected a login response, got {other:?}"),
        }
    }

    fn command(&mut self, itt: u32, cdb: &[u8], read: u32, write: u32) -> ScsiCommand {
        let command = ScsiCommand {
            final_bit: true,
            read: read > 0,
            write: write > 0,
            initiator_task_tag: itt,
            expected_data_transfer_length: read.max(write),
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            cdb: cdb.to_vec(),
            ..ScsiCommand::default()
        };
        self.cmd_sn += 1;
        command
    }

    fn test_unit_ready(&mut self, itt: u32) -> u8 {
        let command = self.command(itt, &[0; 6], 0, 0);
        self.send(Pdu::ScsiCommand(command), &[]);
        match self.receive().expect("response").pdu {
            Pdu::ScsiResponse(r) => {
                assert_eq!(r.initiator_task_tag, itt);
                r.status
            }
            other => panic!("expected a SCSI response, got {other:?}"),
        }
    }
}

fn read10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut cdb = vec![0x28, 0];
    cdb.extend_from_slice(&lba.to_be_bytes());
    cdb.push(0);
    cdb.extend_from_slice(&blocks.to_be_bytes());
    cdb.push(0);
    cdb
}

fn write10(lba: u32, blocks: u16) -> Vec<u8> {
    let mut cdb = read10(lba, blocks);
    cdb[0] = 0x2a;
    cdb
}

#[test]
fn writes_through_r2ts_and_reads_back() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    let len = 256 * 1024u32;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let command = initiator.command(7, &write10(8, (len / 512) as u16), 0, len);
    initiator.send(Pdu::ScsiCommand(command), &[]);
    // InitialR2T=Yes and MaxBurstLength 64 KiB: the target asks for 4 bursts.
    let mut asked = 0;
    loop {
        let received = initiator.receive().expect("target answers");
        match received.pdu {
            Pdu::R2t(r2t) => {
                assert!(r2t.desired_data_transfer_length <= 65536);
                let (offset, want) = (r2t.buffer_offset, r2t.desired_data_transfer_length);
                let mut sent = 0;
                let mut data_sn = 0;
                while sent < want {
                    let piece = (want - sent).min(8192);
                    let out = DataOut {
                        final_bit: sent + piece == want,
                        initiator_task_tag: 7,
                        target_transfer_tag: r2t.target_transfer_tag,
                        exp_stat_sn: initiator.exp_stat_sn,
                        data_sn,
                        buffer_offset: offset + sent,
                        ..DataOut::default()
                    };
                    let at = (offset + sent) as usize;
                    initiator.send(Pdu::DataOut(out), &data[at..at + piece as usize]);
                    sent += piece;
                    data_sn += 1;
                }
                asked += want;
            }
            Pdu::ScsiResponse(response) => {
                assert_eq!(response.status, 0);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(asked, len);
    let command = initiator.command(8, &read10(8, (len / 512) as u16), len, 0);
    initiator.send(Pdu::ScsiCommand(command), &[]);
    let mut back = Vec::new();
    loop {
        let received = initiator.receive().expect("data");
        match received.pdu {
            Pdu::DataIn(data_in) => {
                assert_eq!(data_in.buffer_offset as usize, back.len());
                back.extend_from_slice(&received.data);
                if data_in.status.is_some() {
                    assert_eq!(data_in.status, Some(0));
                    break;
                }
            }
            Pdu::ScsiResponse(response) => {
                assert_eq!(response.status, 0);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(back, data);
}

#[test]
fn unknown_opcodes_are_rejected_and_the_session_carries_on() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    let mut bhs = Bhs::default();
    bhs.0[0] = 0x1e;
    bhs.0[1] = 0x80;
    initiator.send_raw(&bhs, &[]);
    let reject = initiator.receive().expect("a Reject");
    match reject.pdu {
        Pdu::Reject(r) => assert_eq!(r.reason, RejectReason::CommandNotSupported),
        other => panic!("expected a Reject, got {other:?}"),
    }
    assert_eq!(&reject.data[..BHS_LEN], &bhs.0);
    assert_eq!(initiator.test_unit_ready(3), 0);
}

#[test]
fn a_data_segment_beyond_the_negotiated_length_closes_the_connection() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    // The target declared a MaxRecvDataSegmentLength of 256 KiB; send more.
    let command = initiator.command(1, &[0; 6], 0, 0);
    let mut header = Pdu::ScsiCommand(command).encode(0).bhs;
    header.set_data_len(1 << 20);
    initiator.send_raw(&header, &[]);
    assert!(initiator.closed());
    // Other initiators are served as before.
    let mut other = Initiator::connect(target.addr);
    other.login_normal();
    assert_eq!(other.test_unit_ready(1), 0);
}

#[test]
fn commands_outside_the_cmdsn_window_are_ignored() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    let mut command = initiator.command(5, &[0; 6], 0, 0);
    command.cmd_sn = command.cmd_sn.wrapping_add(100_000);
    initiator.cmd_sn -= 1;
    initiator.send(Pdu::ScsiCommand(command), &[]);
    // The next answer is for the next command, not the ignored one.
    assert_eq!(initiator.test_unit_ready(6), 0);
}

#[test]
fn commands_before_login_close_the_connection() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    let command = initiator.command(1, &[0; 6], 0, 0);
    initiator.send(Pdu::ScsiCommand(command), &[]);
    assert!(initiator.closed());
}

#[test]
fn a_bad_header_digest_closes_the_connection() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    let response = initiator.login(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", IQN),
        ("HeaderDigest", "CRC32C"),
        ("DataDigest", "None"),
    ]);
    assert!(matches!(response.pdu, Pdu::LoginResponse(r) if r.status_class == 0));
    initiator.header_digest = true;
    assert_eq!(initiator.test_unit_ready(1), 0);
    let command = initiator.command(2, &[0; 6], 0, 0);
    let bhs = Pdu::ScsiCommand(command).encode(0).bhs;
    let mut out = bhs.0.to_vec();
    out.extend_from_slice(&digest_bytes(header_digest(&bhs, &[]) ^ 1));
    initiator.stream.write_all(&out).unwrap();
    assert!(initiator.closed());
}

#[test]
fn a_bad_data_digest_is_rejected_and_the_session_carries_on() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    let response = initiator.login(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", IQN),
        ("HeaderDigest", "None"),
        ("DataDigest", "CRC32C"),
    ]);
    assert!(matches!(response.pdu, Pdu::LoginResponse(r) if r.status_class == 0));
    initiator.data_digest = true;
    // A NOP-Out whose ping data fails its digest.
    let nop = NopOut {
        immediate: true,
        initiator_task_tag: 4,
        target_transfer_tag: RESERVED_TAG,
        cmd_sn: initiator.cmd_sn,
        exp_stat_sn: initiator.exp_stat_sn,
        ..NopOut::default()
    };
    let bhs = Pdu::NopOut(nop.clone()).encode(8).bhs;
    let mut out = bhs.0.to_vec();
    out.extend_from_slice(b"pingping");
    out.extend_from_slice(&digest_bytes(data_digest(b"pingping") ^ 1));
    initiator.stream.write_all(&out).unwrap();
    match initiator.receive().expect("a Reject").pdu {
        Pdu::Reject(r) => assert_eq!(r.reason, RejectReason::DataDigestError),
        other => panic!("expected a Reject, got {other:?}"),
    }
    // The same ping with a good digest is echoed.
    initiator.send(Pdu::NopOut(nop), b"pingping");
    let echo = initiator.receive().expect("a NOP-In");
    assert!(matches!(echo.pdu, Pdu::NopIn(n) if n.initiator_task_tag == 4));
    assert_eq!(echo.data, b"pingping");
    assert_eq!(initiator.test_unit_ready(5), 0);
}

#[test]
fn data_out_for_an_unknown_task_is_rejected() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    let out = DataOut {
        final_bit: true,
        initiator_task_tag: 99,
        target_transfer_tag: 1234,
        ..DataOut::default()
    };
    initiator.send(Pdu::DataOut(out), &[0u8; 512]);
    match initiator.receive().expect("a Reject").pdu {
        Pdu::Reject(r) => assert_eq!(r.reason, RejectReason::InvalidPduField),
        other => panic!("expected a Reject, got {other:?}"),
    }
    assert_eq!(initiator.test_unit_ready(2), 0);
}

#[test]
fn discovery_sessions_list_targets_and_refuse_commands() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    let response = initiator.login(&[("InitiatorName", INITIATOR), ("SessionType", "Discovery")]);
    assert!(matches!(response.pdu, Pdu::LoginResponse(r) if r.status_class == 0));
    let request = TextRequest {
        immediate: true,
        final_bit: true,
        initiator_task_tag: 1,
        target_transfer_tag: RESERVED_TAG,
        cmd_sn: initiator.cmd_sn,
        exp_stat_sn: initiator.exp_stat_sn,
        ..TextRequest::default()
    };
    initiator.send(
        Pdu::TextRequest(request),
        &text::encode(&[("SendTargets", "All")]),
    );
    let answer = initiator.receive().expect("text response");
    assert!(matches!(answer.pdu, Pdu::TextResponse(_)));
    let pairs = text::parse(&answer.data).unwrap();
    assert!(pairs.contains(&("TargetName".to_string(), IQN.to_string())));
    assert!(pairs
        .iter()
        .any(|(k, v)| k == "TargetAddress" && v == &format!("{},1", target.addr)));
    let command = initiator.command(2, &[0; 6], 0, 0);
    initiator.send(Pdu::ScsiCommand(command), &[]);
    match initiator.receive().expect("a Reject").pdu {
        Pdu::Reject(r) => assert_eq!(r.reason, RejectReason::ProtocolError),
        other => panic!("expected a Reject, got {other:?}"),
    }
}

#[test]
fn bad_login_text_fails_the_login() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    let request = LoginRequest {
        transit: true,
        current_stage: 1,
        next_stage: 3,
        isid: 1,
        ..LoginRequest::default()
    };
    initiator.send(Pdu::LoginRequest(request), b"InitiatorName=\xff\xfe\0");
    match initiator.receive().expect("login response").pdu {
        Pdu::LoginResponse(r) => assert_eq!(r.status_class, 2),
        other => panic!("expected a login response, got {other:?}"),
    }
    assert!(initiator.closed());
}

#[test]
fn shutdown_asks_initiators_to_log_out() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    assert_eq!(initiator.test_unit_ready(1), 0);
    target.stop.shutdown();
    match initiator.receive().expect("an async message").pdu {
        Pdu::AsyncMessage(message) => assert_eq!(message.event, 1),
        other => panic!("expected an Asynchronous Message, got {other:?}"),
    }
    // Ignoring the request, the initiator is cut off after the grace period.
    assert!(initiator.closed());
}

#[test]
fn a_reload_asks_sessions_on_a_removed_target_to_log_out_and_keeps_the_others() {
    const OTHER: &str = "iqn.2026-11.dev.blockwire:other";
    let target = start();
    let mut kept = Initiator::connect(target.addr);
    kept.login_normal();
    // Added: the target served now keeps its SCSI target, so it is unchanged.
    let mut both = target.reload.targets();
    both.push(definition(OTHER));
    let (removed, drain) = target.reload.replace(both);
    assert!(removed.is_empty());
    drain.join().unwrap();
    let mut on_other = Initiator::connect(target.addr);
    assert_eq!(on_other.login_to(OTHER), (0, 0));
    assert_eq!(on_other.test_unit_ready(1), 0);

    let only_first: Vec<_> = target
        .reload
        .targets()
        .into_iter()
        .filter(|t| t.name == IQN)
        .collect();
    let (removed, drain) = target.reload.replace(only_first);
    assert_eq!(removed, vec![OTHER.to_string()]);
    // RFC 7143 §11.9.1: AsyncEvent 1, Parameter3 the seconds left to log out.
    match on_other.receive().expect("an async message").pdu {
        Pdu::AsyncMessage(message) => {
            assert_eq!(message.event, 1);
            assert_eq!(message.parameter3, 2);
        }
        other => panic!("expected an Asynchronous Message, got {other:?}"),
    }
    // New logins to it: Target not found (0x0203).
    let mut late = Initiator::connect(target.addr);
    assert_eq!(late.login_to(OTHER), (2, 3));
    // The session on the unchanged target goes on as before.
    assert_eq!(kept.test_unit_ready(2), 0);
    // Ignoring the request, the initiator is cut off after the grace period.
    assert!(on_other.closed());
    drain.join().unwrap();
    assert_eq!(kept.test_unit_ready(3), 0);
}

#[test]
fn a_login_with_a_live_sessions_isid_reinstates_it() {
    let target = start();
    let mut first = Initiator::connect(target.addr);
    first.login_normal();
    assert_eq!(first.test_unit_ready(1), 0);
    // The same initiator name and ISID, TSIH 0: the old session must go.
    let mut second = Initiator::connect(target.addr);
    second.login_normal();
    assert!(first.closed());
    assert_eq!(second.test_unit_ready(1), 0);
}

#[test]
fn silent_connections_are_pinged_and_closed_when_the_ping_goes_unanswered() {
    let target = start_with(|config| {
        config.nop_interval = Duration::from_millis(500);
        config.nop_timeout = Duration::from_millis(200);
    });
    let mut answering = Initiator::connect(target.addr);
    answering.login_normal();
    // A ping asks for an answer: its target transfer tag is not the reserved one.
    let ping = match answering.receive().expect("a NOP-In").pdu {
        Pdu::NopIn(ping) => ping,
        other => panic!("expected a NOP-In, got {other:?}"),
    };
    assert_eq!(ping.initiator_task_tag, RESERVED_TAG);
    assert_ne!(ping.target_transfer_tag, RESERVED_TAG);
    let answer = NopOut {
        immediate: true,
        initiator_task_tag: RESERVED_TAG,
        target_transfer_tag: ping.target_transfer_tag,
        cmd_sn: answering.cmd_sn,
        exp_stat_sn: answering.exp_stat_sn,
        ..NopOut::default()
    };
    answering.send(Pdu::NopOut(answer), &[]);
    assert_eq!(answering.test_unit_ready(2), 0);

    let mut silent = Initiator::connect(target.addr);
    silent.login_normal();
    assert!(matches!(
        silent.receive().map(|r| r.pdu),
        Some(Pdu::NopIn(_))
    ));
    // Not answering: the target closes the connection.
    assert!(silent.closed());
}

/// A TCP connection from `source` (another loopback address) to `target`.
fn connect_from(source: &str, target: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    let source: SocketAddr = format!("{source}:0").parse().unwrap();
    socket.bind(&source.into())?;
    socket.connect(&target.into())?;
    Ok(socket.into())
}

#[test]
fn connections_that_never_log_in_do_not_lock_other_hosts_out() {
    let target = start();
    // One host opens hundreds of connections and never logs in.
    let mut idle = Vec::new();
    for _ in 0..300 {
        match connect_from("127.0.0.2", target.addr) {
            Ok(stream) => idle.push(stream),
            Err(e) => panic!("connect from 127.0.0.2: {e}"),
        }
    }
    // Another host still gets in and is served.
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    assert_eq!(initiator.test_unit_ready(1), 0);
    // All but a few of the idle host's connections were closed at once.
    thread::sleep(Duration::from_millis(200));
    let mut open = 0;
    for stream in &mut idle {
        stream.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => open += 1,
            _ => {}
        }
    }
    assert!(
        open <= 16,
        "{open} unfinished logins from one host kept open"
    );
}

/// Sends WRITE(10) of 8 blocks at LBA 16 (InitialR2T=Yes, so nothing unsolicited)
/// and returns the R2T the target answers with.
fn write_asking_for_r2t(initiator: &mut Initiator, itt: u32) -> blockwire_iscsi::pdu::R2t {
    let command = initiator.command(itt, &write10(16, 8), 0, 4096);
    initiator.send(Pdu::ScsiCommand(command), &[]);
    match initiator.receive().expect("an R2T").pdu {
        Pdu::R2t(r2t) => r2t,
        other => panic!("expected an R2T, got {other:?}"),
    }
}

/// The status of the next SCSI Response and its sense key / ASC / ASCQ.
fn status_and_sense(initiator: &mut Initiator, itt: u32) -> (u8, (u8, u8, u8)) {
    let received = initiator.receive().expect("a SCSI Response");
    let Pdu::ScsiResponse(response) = received.pdu else {
        panic!("expected a SCSI Response, got {:?}", received.pdu);
    };
    assert_eq!(response.initiator_task_tag, itt);
    // SenseLength (2 bytes), then fixed-format sense: key at 2, ASC/ASCQ at 12/13.
    let sense = &received.data[2..];
    (response.status, (sense[2] & 0x0f, sense[12], sense[13]))
}

/// Reads 8 blocks at LBA 16: whether they are all zero (nothing was written).
fn still_zero(initiator: &mut Initiator, itt: u32) -> bool {
    let command = initiator.command(itt, &read10(16, 8), 4096, 0);
    initiator.send(Pdu::ScsiCommand(command), &[]);
    let received = initiator.receive().expect("Data-In");
    assert!(matches!(received.pdu, Pdu::DataIn(ref d) if d.status == Some(0)));
    received.data.iter().all(|&b| b == 0)
}

#[test]
fn a_data_out_failing_its_digest_fails_only_its_command() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    let response = initiator.login(&[
        ("InitiatorName", INITIATOR),
        ("TargetName", IQN),
        ("DataDigest", "CRC32C"),
        ("ImmediateData", "No"),
        ("InitialR2T", "Yes"),
    ]);
    assert!(matches!(response.pdu, Pdu::LoginResponse(r) if r.status_class == 0));
    initiator.data_digest = true;
    let r2t = write_asking_for_r2t(&mut initiator, 9);
    let out = DataOut {
        final_bit: true,
        initiator_task_tag: 9,
        target_transfer_tag: r2t.target_transfer_tag,
        exp_stat_sn: initiator.exp_stat_sn,
        buffer_offset: 0,
        ..DataOut::default()
    };
    let data = vec![0x5au8; 4096];
    let mut wire = Pdu::DataOut(out).encode(4096).bhs.0.to_vec();
    wire.extend_from_slice(&data);
    wire.extend_from_slice(&digest_bytes(data_digest(&data) ^ 1));
    initiator.stream.write_all(&wire).unwrap();
    match initiator.receive().expect("a Reject").pdu {
        Pdu::Reject(r) => assert_eq!(r.reason, RejectReason::DataDigestError),
        other => panic!("expected a Reject, got {other:?}"),
    }
    // ABORTED COMMAND / PROTOCOL SERVICE CRC ERROR, and nothing was written.
    assert_eq!(status_and_sense(&mut initiator, 9), (2, (0x0b, 0x47, 0x05)));
    assert!(still_zero(&mut initiator, 10));
    assert_eq!(initiator.test_unit_ready(11), 0);
}

#[test]
fn a_data_out_out_of_sequence_fails_only_its_command() {
    let target = start();
    let mut initiator = Initiator::connect(target.addr);
    initiator.login_normal();
    let r2t = write_asking_for_r2t(&mut initiator, 9);
    // DataSN 27 where 0 is due.
    let out = DataOut {
        final_bit: true,
        initiator_task_tag: 9,
        target_transfer_tag: r2t.target_transfer_tag,
        exp_stat_sn: initiator.exp_stat_sn,
        data_sn: 27,
        ..DataOut::default()
    };
    initiator.send(Pdu::DataOut(out), &[0x5au8; 4096]);
    // ABORTED COMMAND / DATA PHASE ERROR, and nothing was written.
    assert_eq!(status_and_sense(&mut initiator, 9), (2, (0x0b, 0x4b, 0x00)));
    assert!(still_zero(&mut initiator, 10));
    assert_eq!(initiator.test_unit_ready(11), 0);
}
