//! The full feature phase against a scripted target over loopback: the login runs
//! through the real target's [`LoginMachine`], then each test plays the target's
//! part PDU by PDU — reordered Data-In, R2T sequences, a Reject, an asynchronous
//! logout request with a NOP-In ping, a connection dropped in the middle of Data-In.

use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use blockwire_blockdev::{ErrorKind, Op};

use super::connect;
use super::connection::{Command, Connection, Timing};
use super::login::LoginOptions;
use super::scsi;
use super::wire::{send_pdu, Digests, PduReader};
use crate::login::{LoginConfig, LoginMachine, LoginStep, TargetEntry, TargetLimits};
use crate::pdu::{
    AsyncMessage, DataIn, LogoutResponse, NopIn, Pdu, R2t, Reject, RejectReason, ResidualKind,
    ScsiCommand, ScsiResponse, RESERVED_TAG,
};

const IQN: &str = "iqn.2026-11.dev.blockwire:fake";

/// The target's side of the scripted connection.
struct Fake {
    reader: PduReader,
    writer: TcpStream,
    stat_sn: u32,
    exp_cmd_sn: u32,
}

impl Fake {
    fn recv(&mut self) -> (Pdu, Vec<u8>) {
        let (bhs, ahs) = self.reader.read_header().expect("a PDU from the initiator");
        let data = self.reader.read_data_vec(bhs.data_len()).expect("its data");
        let pdu = Pdu::decode(&bhs, &ahs).expect("it decodes");
        if let Pdu::ScsiCommand(command) = &pdu {
            if !command.immediate {
                self.exp_cmd_sn = command.cmd_sn.wrapping_add(1);
            }
        }
        (pdu, data)
    }

    fn command(&mut self) -> (ScsiCommand, Vec<u8>) {
        match self.recv() {
            (Pdu::ScsiCommand(command), data) => (command, data),
            (other, _) => panic!("expected a SCSI command, got {other:?}"),
        }
    }

    fn send(&mut self, pdu: Pdu, data: &[u8]) {
        let header = pdu.encode(data.len() as u32);
        send_pdu(&mut self.writer, &header, data, Digests::default()).expect("send");
    }

    fn window(&self) -> (u32, u32) {
        (self.exp_cmd_sn, self.exp_cmd_sn.wrapping_add(31))
    }

    fn next_stat_sn(&mut self) -> u32 {
        let sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        sn
    }

    fn data_in(&mut self, itt: u32, offset: u32, data: &[u8], status: Option<u8>) {
        let (exp_cmd_sn, max_cmd_sn) = self.window();
        let stat_sn = if status.is_some() {
            self.next_stat_sn()
        } else {
            0
        };
        let pdu = DataIn {
            final_bit: status.is_some(),
            status,
            initiator_task_tag: itt,
            target_transfer_tag: RESERVED_TAG,
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            buffer_offset: offset,
            ..DataIn::default()
        };
        self.send(Pdu::DataIn(pdu), data);
    }

    fn good(&mut self, itt: u32) {
        let (exp_cmd_sn, max_cmd_sn) = self.window();
        let response = ScsiResponse {
            initiator_task_tag: itt,
            stat_sn: self.next_stat_sn(),
            exp_cmd_sn,
            max_cmd_sn,
            residual: ResidualKind::None,
            ..ScsiResponse::default()
        };
        self.send(Pdu::ScsiResponse(response), &[]);
    }
}

/// A logged-in connection to a fake target that runs `script` after the login.
fn session(
    limits: TargetLimits,
    script: impl FnOnce(Fake) + Send + 'static,
) -> (Connection, JoinHandle<()>) {
    session_timed(limits, Duration::from_secs(10), None, script)
}

/// [`session`] with NOP-Out pings after `nop_interval` of silence and a request
/// timeout.
fn session_timed(
    limits: TargetLimits,
    nop_interval: Duration,
    request_timeout: Option<Duration>,
    script: impl FnOnce(Fake) + Send + 'static,
) -> (Connection, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let target = thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = PduReader::new(stream.try_clone().unwrap(), 256 * 1024);
        let mut writer = stream;
        let config = Arc::new(LoginConfig {
            targets: vec![TargetEntry {
                name: IQN.into(),
                portal_group_tag: 1,
                ..TargetEntry::default()
            }],
            limits,
            ..LoginConfig::default()
        });
        let mut machine = LoginMachine::new(config);
        let negotiated = loop {
            let (bhs, ahs) = reader.read_header().unwrap();
            let data = reader.read_data_vec(bhs.data_len()).unwrap();
            let Ok(Pdu::LoginRequest(request)) = Pdu::decode(&bhs, &ahs) else {
                panic!("login requests first");
            };
            match machine.handle(&request, &data) {
                LoginStep::Continue { response, data } => {
                    let header = Pdu::LoginResponse(response).encode(data.len() as u32);
                    send_pdu(&mut writer, &header, &data, Digests::default()).unwrap();
                }
                LoginStep::Complete {
                    mut response,
                    data,
                    negotiated,
                } => {
                    response.tsih = 1;
                    let header = Pdu::LoginResponse(response).encode(data.len() as u32);
                    send_pdu(&mut writer, &header, &data, Digests::default()).unwrap();
                    break negotiated;
                }
                LoginStep::Fail { reason, .. } => panic!("login failed: {reason}"),
            }
        };
        script(Fake {
            reader,
            writer,
            stat_sn: negotiated.stat_sn,
            exp_cmd_sn: negotiated.exp_cmd_sn,
        });
    });
    let stream = connect::dial(&address, Duration::from_secs(5)).unwrap();
    let options = LoginOptions {
        initiator_name: "iqn.2026-11.dev.blockwire:tester".into(),
        target_name: Some(IQN.into()),
        isid: 0x8000_0000_0001,
        tsih: 0,
        cid: 0,
        cmd_sn: 1,
        chap: None,
        digests: false,
    };
    let params = connect::login(&stream, &address, options, Duration::from_secs(5)).unwrap();
    let connection = Connection::start(
        stream,
        params,
        0,
        "fake session".into(),
        None,
        Timing {
            nop_interval,
            request_timeout,
        },
    )
    .unwrap();
    (connection, target)
}

fn read(
    connection: &Connection,
    lba: u64,
    len: usize,
) -> Result<Vec<u8>, blockwire_blockdev::Error> {
    let cdb = scsi::read16(lba, (len / 512) as u32);
    let command = Command {
        cdb: &cdb,
        op: Op::Read,
        offset: lba * 512,
        len: len as u64,
    };
    let mut buf = vec![0u8; len];
    let outcome = connection.execute(&command, Some(&mut buf), None)?;
    scsi::check_io(&outcome, Op::Read, lba * 512, len as u64)?;
    Ok(buf)
}

fn lba_of(command: &ScsiCommand) -> u64 {
    u64::from_be_bytes(command.cdb[2..10].try_into().unwrap())
}

#[test]
fn data_in_in_any_order_lands_in_the_right_buffers() {
    let (connection, target) = session(TargetLimits::default(), |mut fake| {
        let (first, _) = fake.command();
        let (second, _) = fake.command();
        let (a, b) = if lba_of(&first) == 0 {
            (first, second)
        } else {
            (second, first)
        };
        let (a, b) = (a.initiator_task_tag, b.initiator_task_tag);
        fake.data_in(b, 4096, &[0xb2; 4096], None);
        fake.data_in(a, 0, &[0xa1; 4096], None);
        fake.data_in(b, 0, &[0xb1; 4096], None);
        // Phase collapse: the last Data-In carries the status.
        fake.data_in(a, 4096, &[0xa2; 4096], Some(0));
        fake.good(b);
    });
    let connection = Arc::new(connection);
    let other = {
        let connection = connection.clone();
        thread::spawn(move || read(&connection, 100, 8192))
    };
    let a = read(&connection, 0, 8192).unwrap();
    let b = other.join().unwrap().unwrap();
    assert!(a[..4096].iter().all(|&x| x == 0xa1) && a[4096..].iter().all(|&x| x == 0xa2));
    assert!(b[..4096].iter().all(|&x| x == 0xb1) && b[4096..].iter().all(|&x| x == 0xb2));
    target.join().unwrap();
}

#[test]
fn r2ts_are_served_from_the_callers_buffer() {
    let limits = TargetLimits {
        immediate_data: false,
        initial_r2t: true,
        max_outstanding_r2t: 2,
        max_recv_data_segment_length: 4096,
        ..TargetLimits::default()
    };
    let (connection, target) = session(limits, |mut fake| {
        let (command, data) = fake.command();
        // No immediate or unsolicited data was allowed.
        assert!(data.is_empty() && command.final_bit && command.write);
        assert_eq!(command.expected_data_transfer_length, 16384);
        let itt = command.initiator_task_tag;
        let (exp_cmd_sn, max_cmd_sn) = fake.window();
        // Two R2Ts, the second half first.
        for (r2t_sn, (ttt, offset)) in [(0xa, 8192u32), (0xb, 0)].into_iter().enumerate() {
            let r2t = R2t {
                initiator_task_tag: itt,
                target_transfer_tag: ttt,
                stat_sn: fake.stat_sn,
                exp_cmd_sn,
                max_cmd_sn,
                r2t_sn: r2t_sn as u32,
                buffer_offset: offset,
                desired_data_transfer_length: 8192,
                ..R2t::default()
            };
            fake.send(Pdu::R2t(r2t), &[]);
        }
        let mut got = vec![0u8; 16384];
        let mut sequences = Vec::new();
        while sequences.len() < 4 {
            let (Pdu::DataOut(out), data) = fake.recv() else {
                panic!("Data-Out expected");
            };
            // Within the target's MaxRecvDataSegmentLength.
            assert!(data.len() <= 4096);
            let at = out.buffer_offset as usize;
            got[at..at + data.len()].copy_from_slice(&data);
            sequences.push((out.target_transfer_tag, out.data_sn, out.final_bit, at));
        }
        sequences.sort();
        assert_eq!(
            sequences,
            vec![
                (0xa, 0, false, 8192),
                (0xa, 1, true, 12288),
                (0xb, 0, false, 0),
                (0xb, 1, true, 4096)
            ]
        );
        let expected: Vec<u8> = (0..16384).map(|i| (i % 251) as u8).collect();
        assert_eq!(got, expected);
        fake.good(itt);
    });
    let data: Vec<u8> = (0..16384).map(|i| (i % 251) as u8).collect();
    let cdb = scsi::write16(0, 32, false);
    let command = Command {
        cdb: &cdb,
        op: Op::Write,
        offset: 0,
        len: 16384,
    };
    let outcome = connection.execute(&command, None, Some(&data)).unwrap();
    scsi::check_io(&outcome, Op::Write, 0, 16384).unwrap();
    target.join().unwrap();
}

#[test]
fn immediate_and_unsolicited_data_fill_the_first_burst() {
    let limits = TargetLimits {
        max_recv_data_segment_length: 8192,
        first_burst_length: 65536,
        ..TargetLimits::default()
    };
    let (connection, target) = session(limits, |mut fake| {
        let (command, immediate) = fake.command();
        assert_eq!(immediate.len(), 8192);
        assert!(!command.final_bit);
        let mut offset = 8192;
        loop {
            let (Pdu::DataOut(out), data) = fake.recv() else {
                panic!("Data-Out expected");
            };
            assert_eq!(out.target_transfer_tag, RESERVED_TAG);
            assert_eq!(out.buffer_offset, offset);
            assert_eq!(out.data_sn, offset / 8192 - 1);
            offset += data.len() as u32;
            if out.final_bit {
                break;
            }
        }
        // FirstBurstLength bounds the unsolicited part.
        assert_eq!(offset, 65536);
        let (exp_cmd_sn, max_cmd_sn) = fake.window();
        let r2t = R2t {
            initiator_task_tag: command.initiator_task_tag,
            target_transfer_tag: 7,
            exp_cmd_sn,
            max_cmd_sn,
            buffer_offset: 65536,
            desired_data_transfer_length: 65536,
            ..R2t::default()
        };
        fake.send(Pdu::R2t(r2t), &[]);
        let mut rest = 0;
        while rest < 65536 {
            let (Pdu::DataOut(out), data) = fake.recv() else {
                panic!("Data-Out expected");
            };
            assert_eq!(out.target_transfer_tag, 7);
            rest += data.len();
        }
        fake.good(command.initiator_task_tag);
    });
    let data = vec![3u8; 131072];
    let cdb = scsi::write16(0, 256, true);
    let command = Command {
        cdb: &cdb,
        op: Op::Write,
        offset: 0,
        len: 131072,
    };
    let outcome = connection.execute(&command, None, Some(&data)).unwrap();
    assert_eq!(outcome.status, 0);
    target.join().unwrap();
}

#[test]
fn a_rejected_command_fails_and_the_session_goes_on() {
    let (connection, target) = session(TargetLimits::default(), |mut fake| {
        let (command, _) = fake.command();
        let header = Pdu::ScsiCommand(command).encode(0);
        let (exp_cmd_sn, max_cmd_sn) = fake.window();
        let reject = Reject {
            reason: RejectReason::CommandNotSupported,
            stat_sn: fake.next_stat_sn(),
            exp_cmd_sn,
            max_cmd_sn,
            data_sn: 0,
        };
        fake.send(Pdu::Reject(reject), &header.bhs.0);
        let (command, _) = fake.command();
        fake.data_in(command.initiator_task_tag, 0, &[9; 512], Some(0));
    });
    let error = read(&connection, 0, 512).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Io);
    assert!(error.to_string().contains("rejected"), "{error}");
    assert_eq!(read(&connection, 0, 512).unwrap(), vec![9; 512]);
    target.join().unwrap();
}

#[test]
fn an_async_logout_request_drains_then_logs_out() {
    let (processed_tx, processed_rx) = mpsc::channel();
    let (finish_tx, finish_rx) = mpsc::channel::<()>();
    let (connection, target) = session(TargetLimits::default(), move |mut fake| {
        let (command, _) = fake.command();
        let (exp_cmd_sn, max_cmd_sn) = fake.window();
        let message = AsyncMessage {
            stat_sn: fake.stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
            event: AsyncMessage::REQUEST_LOGOUT,
            parameter3: 5,
            ..AsyncMessage::default()
        };
        fake.send(Pdu::AsyncMessage(message), &[]);
        // A ping after it: its answer shows the message was read.
        let ping = NopIn {
            lun: 0,
            initiator_task_tag: RESERVED_TAG,
            target_transfer_tag: 0x1234,
            stat_sn: fake.stat_sn,
            exp_cmd_sn,
            max_cmd_sn,
        };
        fake.send(Pdu::NopIn(ping), b"ping");
        match fake.recv() {
            (Pdu::NopOut(answer), data) => {
                assert_eq!(answer.target_transfer_tag, 0x1234);
                assert_eq!(answer.initiator_task_tag, RESERVED_TAG);
                assert!(answer.immediate);
                assert_eq!(data, b"ping");
            }
            (other, _) => panic!("expected a NOP-Out, got {other:?}"),
        }
        processed_tx.send(()).unwrap();
        finish_rx.recv().unwrap();
        fake.data_in(command.initiator_task_tag, 0, &[1; 512], Some(0));
        // The last command done, the initiator logs out.
        let (Pdu::LogoutRequest(logout), _) = fake.recv() else {
            panic!("expected a logout request");
        };
        let (exp_cmd_sn, max_cmd_sn) = fake.window();
        let response = LogoutResponse {
            initiator_task_tag: logout.initiator_task_tag,
            stat_sn: fake.next_stat_sn(),
            exp_cmd_sn,
            max_cmd_sn,
            ..LogoutResponse::default()
        };
        fake.send(Pdu::LogoutResponse(response), &[]);
    });
    let connection = Arc::new(connection);
    let in_flight = {
        let connection = connection.clone();
        thread::spawn(move || read(&connection, 0, 512))
    };
    processed_rx.recv().unwrap();
    // No new commands once the target asked for a logout.
    let error = read(&connection, 8, 512).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::ShuttingDown, "{error}");
    finish_tx.send(()).unwrap();
    // The command in flight still completes.
    assert_eq!(in_flight.join().unwrap().unwrap(), vec![1; 512]);
    target.join().unwrap();
}

#[test]
fn a_connection_dropped_mid_data_in_fails_what_is_in_flight() {
    let (connection, target) = session(TargetLimits::default(), |mut fake| {
        let (command, _) = fake.command();
        let (exp_cmd_sn, max_cmd_sn) = fake.window();
        let pdu = DataIn {
            initiator_task_tag: command.initiator_task_tag,
            target_transfer_tag: RESERVED_TAG,
            exp_cmd_sn,
            max_cmd_sn,
            ..DataIn::default()
        };
        // A header for 8 KiB, then 1000 bytes of it, then the end.
        let header = Pdu::DataIn(pdu).encode(8192);
        use std::io::Write;
        fake.writer.write_all(&header.bhs.0).unwrap();
        fake.writer.write_all(&[0u8; 1000]).unwrap();
        fake.writer.shutdown(std::net::Shutdown::Both).unwrap();
    });
    let error = read(&connection, 0, 8192).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Disconnected, "{error}");
    // Later commands fail at once.
    let error = read(&connection, 0, 512).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Disconnected);
    target.join().unwrap();
}

#[test]
fn data_in_beyond_the_buffer_ends_the_connection() {
    let (connection, target) = session(TargetLimits::default(), |mut fake| {
        let (command, _) = fake.command();
        fake.data_in(command.initiator_task_tag, 512, &[0; 512], Some(0));
        // The initiator closes on the protocol error.
        assert!(fake.reader.read_header().is_err());
    });
    let error = read(&connection, 0, 512).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Disconnected);
    assert!(error.to_string().contains("protocol error"), "{error}");
    target.join().unwrap();
}

#[test]
fn check_condition_maps_sense_to_an_error_kind() {
    let (connection, target) = session(TargetLimits::default(), |mut fake| {
        let (command, _) = fake.command();
        let (exp_cmd_sn, max_cmd_sn) = fake.window();
        // LOGICAL BLOCK ADDRESS OUT OF RANGE, fixed format.
        let mut sense = vec![0u8; 18];
        sense[0] = 0x70;
        sense[2] = 0x05;
        sense[7] = 10;
        sense[12] = 0x21;
        let mut data = (sense.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&sense);
        let response = ScsiResponse {
            status: 2,
            initiator_task_tag: command.initiator_task_tag,
            stat_sn: fake.next_stat_sn(),
            exp_cmd_sn,
            max_cmd_sn,
            ..ScsiResponse::default()
        };
        fake.send(Pdu::ScsiResponse(response), &data);
    });
    let error = read(&connection, 1 << 30, 512).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::OutOfRange);
    target.join().unwrap();
}

#[test]
fn an_idle_connection_is_pinged_and_a_silent_one_ends() {
    let interval = Duration::from_millis(100);
    let (connection, target) =
        session_timed(TargetLimits::default(), interval, None, |mut fake| {
            // The first ping is answered...
            let ping = match fake.recv() {
                (Pdu::NopOut(ping), _) => ping,
                (other, _) => panic!("expected a NOP-Out ping, got {other:?}"),
            };
            assert_ne!(ping.initiator_task_tag, RESERVED_TAG);
            assert_eq!(ping.target_transfer_tag, RESERVED_TAG);
            assert!(ping.immediate);
            let (exp_cmd_sn, max_cmd_sn) = fake.window();
            let answer = NopIn {
                lun: 0,
                initiator_task_tag: ping.initiator_task_tag,
                target_transfer_tag: RESERVED_TAG,
                stat_sn: fake.next_stat_sn(),
                exp_cmd_sn,
                max_cmd_sn,
            };
            fake.send(Pdu::NopIn(answer), &[]);
            // ...the next is not: the initiator gives up on the connection.
            let (Pdu::NopOut(_), _) = fake.recv() else {
                panic!("expected a second ping");
            };
            assert!(fake.reader.read_header().is_err());
        });
    thread::sleep(Duration::from_millis(600));
    let error = read(&connection, 0, 512).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Disconnected);
    assert!(error.to_string().contains("NOP-Out"), "{error}");
    target.join().unwrap();
}

#[test]
fn a_command_past_the_request_timeout_fails_with_a_timeout() {
    let limit = Duration::from_millis(200);
    let (connection, target) = session_timed(
        TargetLimits::default(),
        Duration::from_secs(10),
        Some(limit),
        |mut fake| {
            // Take the command, never answer it; pings are answered by nobody
            // either, but the timeout comes first.
            let _ = fake.command();
            assert!(fake.reader.read_header().is_err());
        },
    );
    let started = std::time::Instant::now();
    let error = read(&connection, 0, 512).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
    assert!(started.elapsed() < Duration::from_secs(5));
    target.join().unwrap();
}

#[test]
fn garbage_from_the_target_ends_requests_without_hanging_or_panicking() {
    // A small xorshift: reproducible cases without a dependency.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    const OPCODES: [u8; 10] = [0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3f];
    for case in 0..40 {
        let mut pdus = Vec::new();
        for _ in 0..(1 + next() % 4) {
            let mut bhs = crate::pdu::Bhs::default();
            for chunk in bhs.0.chunks_mut(8) {
                chunk.copy_from_slice(&next().to_be_bytes()[..chunk.len()]);
            }
            bhs.0[0] = OPCODES[(next() % OPCODES.len() as u64) as usize];
            bhs.0[4] = 0; // no AHS
            let len = (next() % 600) as u32;
            bhs.set_data_len(len);
            // Half the cases aim at the command in flight.
            if next() % 2 == 0 {
                bhs.put_u32(16, 1);
            }
            let mut bytes = bhs.0.to_vec();
            bytes.resize(48 + crate::pdu::padded(len as usize), (next() & 0xff) as u8);
            pdus.push(bytes);
        }
        let (connection, target) = session(TargetLimits::default(), move |mut fake| {
            let _ = fake.command();
            use std::io::Write;
            for bytes in pdus {
                if fake.writer.write_all(&bytes).is_err() {
                    break;
                }
            }
            let _ = fake.writer.shutdown(std::net::Shutdown::Both);
        });
        let (done_tx, done_rx) = mpsc::channel();
        let reader = thread::spawn(move || {
            let result = read(&connection, 0, 4096);
            done_tx.send(result.is_ok()).unwrap();
            connection
        });
        done_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("case {case}: the read hung"));
        drop(reader.join().expect("no panic"));
        target.join().unwrap();
    }
}
