//! The full feature phase on a virtual clock, with no socket: PDUs in, PDUs and
//! work out, against a SCSI target with one 1 MiB memory logical unit (LUN 0,
//! 512-byte blocks).

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_scsi::{LogicalUnit, LunConfig, ResetKind, ScsiTarget, Status};

use super::*;
use crate::login::SessionType;
use crate::pdu::{
    DataOut, LogoutReason, LogoutRequest, NopOut, ScsiCommand, TaskFunction, TaskMgmtRequest,
    TextRequest,
};
use crate::target::io::Window;

const INTERVAL: Duration = Duration::from_secs(5);
const TIMEOUT: Duration = Duration::from_secs(3);

fn negotiated() -> Negotiated {
    Negotiated {
        session_type: SessionType::Normal,
        initiator_name: "iqn.2026-11.test:initiator".into(),
        initiator_alias: None,
        target_name: Some("iqn.2026-11.test:target".into()),
        isid: 1,
        tsih: 0,
        cid: 1,
        header_digest: false,
        data_digest: false,
        initiator_max_recv_data_segment_length: 8192,
        target_max_recv_data_segment_length: 8192,
        max_burst_length: 4096,
        first_burst_length: 4096,
        initial_r2t: true,
        immediate_data: true,
        max_outstanding_r2t: 2,
        data_pdu_in_order: true,
        data_sequence_in_order: true,
        default_time2wait: 2,
        default_time2retain: 20,
        error_recovery_level: 0,
        max_connections: 1,
        stat_sn: 0,
        exp_cmd_sn: 10,
    }
}

fn scsi_target() -> Arc<ScsiTarget> {
    let mut target = ScsiTarget::new();
    let device = Device::from_device(MemoryDevice::new(1 << 20));
    let unit = LogicalUnit::new(device, LunConfig::default()).expect("logical unit");
    target.add_lun(0, Arc::new(unit));
    Arc::new(target)
}

struct Harness {
    phase: FullFeature,
    tasks: Arc<Tasks>,
    now: Instant,
    start: Instant,
}

impl Harness {
    fn new() -> Harness {
        Harness::with(|_| {})
    }

    fn with(configure: impl FnOnce(&mut Negotiated)) -> Harness {
        let mut negotiated = negotiated();
        configure(&mut negotiated);
        let scsi = (negotiated.session_type == SessionType::Normal).then(scsi_target);
        let tasks = Arc::new(Tasks::new(negotiated.exp_cmd_sn, 4));
        let start = Instant::now();
        let timers = Timers {
            nop_interval: INTERVAL,
            nop_timeout: TIMEOUT,
        };
        let phase = FullFeature::new(
            negotiated,
            Arc::new(LoginConfig::default()),
            scsi,
            tasks.clone(),
            timers,
            start,
        );
        Harness {
            phase,
            tasks,
            now: start,
            start,
        }
    }

    fn feed(&mut self, pdu: Pdu, data: &[u8]) {
        let header = pdu.encode(data.len() as u32);
        self.phase
            .handle_pdu(self.now, &header.bhs, &header.ahs, data);
    }

    fn sent(&mut self) -> Vec<Transmit> {
        std::iter::from_fn(|| self.phase.poll_transmit()).collect()
    }

    fn work(&mut self) -> Vec<Work> {
        std::iter::from_fn(|| self.phase.poll_work()).collect()
    }

    /// The one command queued for the device.
    fn executed(&mut self) -> CommandJob {
        let mut work = self.work();
        assert_eq!(work.len(), 1, "one command queued");
        match work.remove(0) {
            Work::Execute(job) => job,
            Work::Quiesce { .. } => panic!("a quiesce, not a command"),
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
    }
}

fn read10(itt: u32, cmd_sn: u32, lba: u32, blocks: u16) -> Pdu {
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x28;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    Pdu::ScsiCommand(ScsiCommand {
        final_bit: true,
        read: true,
        initiator_task_tag: itt,
        expected_data_transfer_length: u32::from(blocks) * 512,
        cmd_sn,
        cdb,
        ..ScsiCommand::default()
    })
}

/// A WRITE(10); `final_bit` false announces unsolicited Data-Out.
fn write10(itt: u32, cmd_sn: u32, lba: u32, blocks: u16, final_bit: bool) -> Pdu {
    let mut cdb = vec![0u8; 16];
    cdb[0] = 0x2a;
    cdb[2..6].copy_from_slice(&lba.to_be_bytes());
    cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
    Pdu::ScsiCommand(ScsiCommand {
        final_bit,
        write: true,
        initiator_task_tag: itt,
        expected_data_transfer_length: u32::from(blocks) * 512,
        cmd_sn,
        cdb,
        ..ScsiCommand::default()
    })
}

fn data_out(itt: u32, ttt: u32, data_sn: u32, offset: u32, final_bit: bool) -> Pdu {
    Pdu::DataOut(DataOut {
        final_bit,
        initiator_task_tag: itt,
        target_transfer_tag: ttt,
        data_sn,
        buffer_offset: offset,
        ..DataOut::default()
    })
}

fn task_management(function: TaskFunction, lun: u64, referenced: u32, cmd_sn: u32) -> Pdu {
    Pdu::TaskMgmtRequest(TaskMgmtRequest {
        immediate: true,
        function,
        lun,
        initiator_task_tag: 100,
        referenced_task_tag: referenced,
        cmd_sn,
        ..TaskMgmtRequest::default()
    })
}

/// The R2Ts sent: (TTT, R2TSN, offset, length).
fn r2ts(sent: &[Transmit]) -> Vec<(u32, u32, u32, u32)> {
    sent.iter()
        .map(|t| match &t.pdu {
            Pdu::R2t(r2t) => {
                assert_eq!(t.stat_sn, StatSn::Current, "an R2T takes no StatSN");
                (
                    r2t.target_transfer_tag,
                    r2t.r2t_sn,
                    r2t.buffer_offset,
                    r2t.desired_data_transfer_length,
                )
            }
            other => panic!("not an R2T: {other:?}"),
        })
        .collect()
}

fn reject_reason(sent: &[Transmit]) -> RejectReason {
    match sent {
        [Transmit {
            pdu: Pdu::Reject(reject),
            ..
        }] => reject.reason,
        other => panic!("not one Reject: {other:?}"),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

#[test]
fn accepted_commands_advance_exp_cmd_sn_and_max_cmd_sn() {
    let mut h = Harness::new();
    assert_eq!(h.tasks.window(), (10, 13));
    h.feed(read10(1, 10, 0, 1), &[]);
    assert_eq!(h.executed().itt, 1);
    assert_eq!(h.tasks.window(), (11, 14), "MaxCmdSN moves with ExpCmdSN");
    // A gap (a command lost on the way) moves the window on.
    h.feed(read10(2, 13, 0, 1), &[]);
    assert_eq!(h.executed().itt, 2);
    assert_eq!(h.tasks.window(), (14, 17));
}

#[test]
fn commands_outside_the_window_are_dropped_silently() {
    let mut h = Harness::new();
    // Below ExpCmdSN (a duplicate) and beyond MaxCmdSN.
    h.feed(read10(1, 9, 0, 1), &[]);
    h.feed(read10(2, 14, 0, 1), &[]);
    h.feed(write10(3, 100, 0, 1, true), &pattern(512, 1));
    assert!(h.work().is_empty());
    assert!(h.sent().is_empty());
    assert_eq!(h.tasks.window(), (10, 13));
    assert_eq!(h.phase.pending(), (0, 0));
}

#[test]
fn immediate_commands_do_not_advance_the_window() {
    let mut h = Harness::new();
    let Pdu::ScsiCommand(mut command) = read10(1, 10, 0, 1) else {
        unreachable!()
    };
    command.immediate = true;
    h.feed(Pdu::ScsiCommand(command), &[]);
    assert_eq!(h.executed().itt, 1);
    assert_eq!(h.tasks.window(), (10, 13));
}

#[test]
fn a_tag_still_in_use_is_rejected() {
    let mut h = Harness::new();
    h.feed(write10(1, 10, 0, 8, true), &[]);
    assert_eq!(r2ts(&h.sent()).len(), 1);
    h.feed(read10(1, 11, 0, 1), &[]);
    assert_eq!(reject_reason(&h.sent()), RejectReason::TaskInProgress);
    h.tasks.start_executing(2);
    h.feed(read10(2, 12, 0, 1), &[]);
    assert_eq!(reject_reason(&h.sent()), RejectReason::TaskInProgress);
    assert!(h.work().is_empty());
}

#[test]
fn r2ts_respect_max_outstanding_r2t_and_max_burst_length() {
    let mut h = Harness::new();
    // 12 KiB with bursts of 4 KiB and two R2Ts outstanding at most.
    h.feed(write10(1, 10, 0, 24, true), &[]);
    let first = r2ts(&h.sent());
    assert_eq!(first.len(), 2);
    assert_eq!((first[0].1, first[0].2, first[0].3), (0, 0, 4096));
    assert_eq!((first[1].1, first[1].2, first[1].3), (1, 4096, 4096));
    let data = pattern(12288, 3);
    // The first burst in two PDUs: the third R2T goes out when it closes.
    h.feed(data_out(1, first[0].0, 0, 0, false), &data[..2048]);
    assert!(h.sent().is_empty());
    h.feed(data_out(1, first[0].0, 1, 2048, true), &data[2048..4096]);
    let third = r2ts(&h.sent());
    assert_eq!(third.len(), 1);
    assert_eq!((third[0].1, third[0].2, third[0].3), (2, 8192, 4096));
    assert!(h.work().is_empty(), "not all data is in");
    h.feed(data_out(1, third[0].0, 0, 8192, true), &data[8192..]);
    h.feed(data_out(1, first[1].0, 0, 4096, true), &data[4096..8192]);
    let job = h.executed();
    assert!(job.early.is_none());
    assert_eq!(job.r2t_count, 3);
    let (buf, received) = job.data.expect("data-out");
    assert_eq!(received, 12288);
    assert_eq!(&buf[..], &data[..]);
    assert_eq!(h.phase.pending(), (0, 0));
}

#[test]
fn immediate_and_unsolicited_data_fill_the_first_burst() {
    let mut h = Harness::with(|n| n.initial_r2t = false);
    let data = pattern(8192, 5);
    // 1 KiB immediate, 3 KiB unsolicited (FirstBurstLength 4 KiB), 4 KiB by R2T.
    h.feed(write10(1, 10, 0, 16, false), &data[..1024]);
    assert!(
        h.sent().is_empty(),
        "no R2T while unsolicited data may come"
    );
    h.feed(data_out(1, RESERVED_TAG, 0, 1024, true), &data[1024..4096]);
    let r2t = r2ts(&h.sent());
    assert_eq!(r2t.len(), 1);
    assert_eq!((r2t[0].2, r2t[0].3), (4096, 4096));
    h.feed(data_out(1, r2t[0].0, 0, 4096, true), &data[4096..]);
    let (buf, received) = h.executed().data.expect("data-out");
    assert_eq!(received, 8192);
    assert_eq!(&buf[..], &data[..]);
}

#[test]
fn unsolicited_data_beyond_the_first_burst_fails_the_command() {
    let mut h = Harness::with(|n| n.initial_r2t = false);
    h.feed(write10(1, 10, 0, 16, false), &[]);
    h.feed(data_out(1, RESERVED_TAG, 0, 0, true), &pattern(8192, 0));
    let r2ts_sent = r2ts(&h.sent());
    assert!(r2ts_sent.is_empty(), "a failed command solicits nothing");
    let job = h.executed();
    assert!(job.data.is_none());
    let early = job.early.expect("failed early");
    assert_eq!(early.sense_code(), Some(DATA_PHASE_ERROR));
}

#[test]
fn immediate_data_the_login_refused_ends_the_connection() {
    let mut h = Harness::with(|n| n.immediate_data = false);
    h.feed(write10(1, 10, 0, 1, true), &pattern(512, 0));
    assert_eq!(reject_reason(&h.sent()), RejectReason::ProtocolError);
    assert!(matches!(h.phase.ending(), Some(Ending::Violation(_))));
    assert_eq!(h.phase.next_timeout(), None);
}

#[test]
fn a_data_sn_out_of_order_fails_only_its_command() {
    let mut h = Harness::new();
    h.feed(write10(1, 10, 0, 8, true), &[]);
    let r2t = r2ts(&h.sent());
    h.feed(data_out(1, r2t[0].0, 1, 0, false), &pattern(2048, 0));
    assert!(
        h.sent().is_empty(),
        "no Reject: the task fails, not the PDU"
    );
    assert!(h.work().is_empty(), "the sequence is still open");
    assert_eq!(h.phase.pending().1, 0, "the buffer is released at once");
    h.feed(data_out(1, r2t[0].0, 2, 2048, true), &pattern(2048, 0));
    let job = h.executed();
    assert_eq!(
        job.early.expect("failed").sense_code(),
        Some(DATA_PHASE_ERROR)
    );
    assert_eq!(h.phase.ending(), None);
}

#[test]
fn a_wrong_offset_or_an_early_final_bit_fails_the_command() {
    let mut h = Harness::new();
    h.feed(write10(1, 10, 0, 8, true), &[]);
    let r2t = r2ts(&h.sent());
    h.feed(data_out(1, r2t[0].0, 0, 512, true), &pattern(512, 0));
    let early = h.executed().early.expect("failed");
    assert_eq!(early.sense_code(), Some(DATA_PHASE_ERROR));

    h.feed(write10(2, 11, 0, 8, true), &[]);
    let r2t = r2ts(&h.sent());
    // F before the R2T's whole length.
    h.feed(data_out(2, r2t[0].0, 0, 0, true), &pattern(512, 0));
    let early = h.executed().early.expect("failed");
    assert_eq!(early.sense_code(), Some(DATA_PHASE_ERROR));
}

#[test]
fn a_data_digest_error_rejects_the_pdu_and_fails_the_command() {
    let mut h = Harness::new();
    h.feed(write10(1, 10, 0, 8, true), &[]);
    let r2t = r2ts(&h.sent());
    let header = data_out(1, r2t[0].0, 0, 0, true).encode(4096);
    assert_eq!(
        h.phase.handle_header(h.now, &header.bhs, &[]),
        Segment::Buffer
    );
    assert_eq!(h.phase.segment_buffer().len(), 4096);
    h.phase.handle_segment(h.now, SegmentRead::DigestError);
    assert_eq!(reject_reason(&h.sent()), RejectReason::DataDigestError);
    let early = h.executed().early.expect("failed");
    assert_eq!(early.sense_code(), Some(CRC_ERROR));
}

#[test]
fn data_out_for_no_such_command_or_sequence_is_rejected() {
    let mut h = Harness::new();
    h.feed(data_out(9, 1, 0, 0, true), &pattern(512, 0));
    assert_eq!(reject_reason(&h.sent()), RejectReason::InvalidPduField);
    h.feed(write10(1, 10, 0, 8, true), &[]);
    h.sent();
    h.feed(data_out(1, 0x1234, 0, 0, true), &pattern(512, 0));
    assert_eq!(reject_reason(&h.sent()), RejectReason::InvalidPduField);
    // Unsolicited data for a command that announced none.
    h.feed(data_out(1, RESERVED_TAG, 0, 0, true), &pattern(512, 0));
    assert_eq!(reject_reason(&h.sent()), RejectReason::ProtocolError);
}

#[test]
fn a_command_too_large_is_answered_without_a_buffer() {
    let mut h = Harness::new();
    let Pdu::ScsiCommand(mut command) = write10(1, 10, 0, 0xffff, true) else {
        unreachable!()
    };
    // WRITE(16) of 2^20 blocks: 512 MiB.
    command.cdb = vec![0x8a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0];
    command.expected_data_transfer_length = 512 << 20;
    h.feed(Pdu::ScsiCommand(command), &[]);
    assert!(h.sent().is_empty());
    let job = h.executed();
    assert!(job.data.is_none());
    let early = job.early.expect("refused");
    assert_eq!(early.status, Status::CheckCondition);
}

#[test]
fn abort_task_drops_a_write_gathering_data() {
    let mut h = Harness::new();
    h.feed(write10(1, 10, 0, 8, true), &[]);
    let r2t = r2ts(&h.sent());
    assert!(h.phase.pending().1 > 0);
    h.feed(task_management(TaskFunction::AbortTask, 0, 1, 11), &[]);
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::TaskMgmtResponse(response),
            stat_sn: StatSn::Advance,
            ..
        }] => {
            assert_eq!(response.response, 0);
            assert_eq!(response.initiator_task_tag, 100);
        }
        other => panic!("{other:?}"),
    }
    assert!(h.work().is_empty(), "an aborted task gets no response");
    assert_eq!(h.phase.pending(), (0, 0));
    h.feed(data_out(1, r2t[0].0, 0, 0, true), &pattern(4096, 0));
    assert_eq!(reject_reason(&h.sent()), RejectReason::InvalidPduField);
}

#[test]
fn abort_task_of_a_running_command_answers_after_it() {
    let mut h = Harness::new();
    h.tasks.start_executing(7);
    h.feed(task_management(TaskFunction::AbortTask, 0, 7, 10), &[]);
    assert!(h.sent().is_empty(), "the answer waits for the command");
    match &h.work()[..] {
        [Work::Quiesce {
            task: Some(7),
            reset: None,
        }] => {}
        _ => panic!("expected a wait for task 7"),
    }
    h.tasks.finish_executing(7);
    h.phase.quiesced();
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::TaskMgmtResponse(response),
            ..
        }] => assert_eq!(response.response, 1, "no longer exists"),
        other => panic!("{other:?}"),
    }
    // A task nobody knows: answered at once.
    h.feed(task_management(TaskFunction::AbortTask, 0, 8, 10), &[]);
    assert!(h.work().is_empty());
    assert_eq!(h.sent().len(), 1);
}

#[test]
fn lun_reset_drops_pending_writes_and_resets_after_the_running_ones() {
    let mut h = Harness::new();
    h.feed(write10(1, 10, 0, 8, true), &[]);
    h.feed(write10(2, 11, 8, 8, true), &[]);
    h.sent();
    assert_eq!(h.phase.pending().0, 2);
    h.feed(
        task_management(TaskFunction::LogicalUnitReset, 0, 0, 12),
        &[],
    );
    assert_eq!(h.phase.pending(), (0, 0));
    assert!(h.sent().is_empty());
    match &h.work()[..] {
        [Work::Quiesce {
            task: None,
            reset: Some(ResetKind::LogicalUnit(0)),
        }] => {}
        _ => panic!("expected a wait and a LUN reset"),
    }
    h.phase.quiesced();
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::TaskMgmtResponse(response),
            ..
        }] => assert_eq!(response.response, 0),
        other => panic!("{other:?}"),
    }
    // No such LUN: answered at once, nothing reset.
    h.feed(
        task_management(TaskFunction::LogicalUnitReset, 5 << 48, 0, 13),
        &[],
    );
    assert!(h.work().is_empty());
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::TaskMgmtResponse(response),
            ..
        }] => assert_eq!(response.response, 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_target_cold_reset_ends_the_connection_after_its_answer() {
    let mut h = Harness::new();
    h.feed(
        task_management(TaskFunction::TargetColdReset, 0, 0, 10),
        &[],
    );
    assert!(matches!(
        &h.work()[..],
        [Work::Quiesce {
            reset: Some(ResetKind::TargetCold),
            ..
        }]
    ));
    assert_eq!(h.phase.ending(), None);
    h.phase.quiesced();
    assert_eq!(h.sent().len(), 1);
    assert_eq!(h.phase.ending(), Some(&Ending::ColdReset));
}

#[test]
fn a_silent_initiator_is_pinged_and_dropped_when_it_does_not_answer() {
    let mut h = Harness::new();
    assert_eq!(h.phase.next_timeout(), Some(h.start + INTERVAL));
    h.advance(INTERVAL - Duration::from_millis(1));
    h.phase.handle_timeout(h.now);
    assert!(h.sent().is_empty(), "not yet");
    h.advance(Duration::from_millis(1));
    h.phase.handle_timeout(h.now);
    let ping = match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::NopIn(nop),
            stat_sn: StatSn::Current,
            ..
        }] => {
            assert_eq!(nop.initiator_task_tag, RESERVED_TAG);
            nop.target_transfer_tag
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(h.phase.next_timeout(), Some(h.now + TIMEOUT));
    // The answer clears the ping; the next one comes an interval later.
    h.advance(Duration::from_secs(1));
    h.feed(
        Pdu::NopOut(NopOut {
            initiator_task_tag: RESERVED_TAG,
            target_transfer_tag: ping,
            ..NopOut::default()
        }),
        &[],
    );
    assert!(h.sent().is_empty(), "an answer is not answered");
    assert_eq!(h.phase.next_timeout(), Some(h.now + INTERVAL));
    h.advance(INTERVAL);
    h.phase.handle_timeout(h.now);
    assert_eq!(h.sent().len(), 1);
    // This one goes unanswered.
    h.advance(TIMEOUT);
    h.phase.handle_timeout(h.now);
    assert!(matches!(h.phase.ending(), Some(Ending::Violation(_))));
}

#[test]
fn traffic_keeps_a_pinged_connection_alive() {
    let mut h = Harness::new();
    h.advance(INTERVAL);
    h.phase.handle_timeout(h.now);
    assert_eq!(h.sent().len(), 1);
    h.advance(TIMEOUT - Duration::from_millis(1));
    h.feed(read10(1, 10, 0, 1), &[]);
    h.advance(Duration::from_millis(1));
    h.phase.handle_timeout(h.now);
    assert_eq!(h.phase.ending(), None);
    assert_eq!(
        h.phase.next_timeout(),
        Some(h.now - Duration::from_millis(1) + TIMEOUT)
    );
}

#[test]
fn a_nop_out_is_echoed() {
    let mut h = Harness::new();
    let ping = Pdu::NopOut(NopOut {
        initiator_task_tag: 9,
        target_transfer_tag: RESERVED_TAG,
        cmd_sn: 10,
        ..NopOut::default()
    });
    h.feed(ping, b"hello");
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::NopIn(nop),
            stat_sn: StatSn::Advance,
            data,
        }] => {
            assert_eq!(nop.initiator_task_tag, 9);
            assert_eq!(data, b"hello");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.tasks.window(), (11, 14));
}

#[test]
fn logout_answers_after_every_running_command() {
    let mut h = Harness::new();
    h.feed(write10(1, 10, 0, 8, true), &[]);
    h.sent();
    h.tasks.start_executing(3);
    let logout = |cid, cmd_sn| {
        Pdu::LogoutRequest(LogoutRequest {
            reason: LogoutReason::CloseConnection,
            initiator_task_tag: 50,
            cid,
            cmd_sn,
            ..LogoutRequest::default()
        })
    };
    // Another connection's CID: answered at once, nothing ends.
    h.feed(logout(7, 11), &[]);
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::LogoutResponse(response),
            ..
        }] => assert_eq!(response.response, 1),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.phase.ending(), None);
    h.feed(logout(1, 12), &[]);
    assert_eq!(h.phase.pending(), (0, 0));
    assert!(h.sent().is_empty());
    assert!(matches!(
        &h.work()[..],
        [Work::Quiesce {
            task: None,
            reset: None
        }]
    ));
    h.phase.quiesced();
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::LogoutResponse(response),
            ..
        }] => {
            assert_eq!(response.response, 0);
            assert_eq!(response.time2wait, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.phase.ending(), Some(&Ending::LoggedOut));
    // Nothing more is taken.
    h.feed(read10(2, 13, 0, 1), &[]);
    assert!(h.work().is_empty());
}

#[test]
fn a_login_request_in_the_full_feature_phase_ends_it() {
    let mut h = Harness::new();
    h.feed(Pdu::LoginRequest(Default::default()), &[]);
    assert_eq!(reject_reason(&h.sent()), RejectReason::ProtocolError);
    assert!(matches!(h.phase.ending(), Some(Ending::Violation(_))));
}

#[test]
fn a_discovery_session_refuses_scsi_commands() {
    let mut h = Harness::with(|n| {
        n.session_type = SessionType::Discovery;
        n.target_name = None;
    });
    h.feed(read10(1, 10, 0, 1), &[]);
    assert_eq!(reject_reason(&h.sent()), RejectReason::ProtocolError);
    h.feed(
        task_management(TaskFunction::LogicalUnitReset, 0, 0, 10),
        &[],
    );
    assert_eq!(reject_reason(&h.sent()), RejectReason::ProtocolError);
    assert!(h.work().is_empty());
    assert_eq!(h.phase.ending(), None);
}

#[test]
fn continued_text_is_acknowledged_until_its_last_part() {
    let mut h = Harness::new();
    let text = |continue_bit: bool, cmd_sn: u32| {
        Pdu::TextRequest(TextRequest {
            final_bit: !continue_bit,
            continue_bit,
            initiator_task_tag: 60,
            target_transfer_tag: RESERVED_TAG,
            cmd_sn,
            ..TextRequest::default()
        })
    };
    h.feed(text(true, 10), b"SendTarg");
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::TextResponse(response),
            data,
            ..
        }] => {
            assert!(!response.final_bit);
            assert_ne!(response.target_transfer_tag, RESERVED_TAG);
            assert!(data.is_empty());
        }
        other => panic!("{other:?}"),
    }
    h.feed(text(false, 11), b"ets=All\0");
    match &h.sent()[..] {
        [Transmit {
            pdu: Pdu::TextResponse(response),
            ..
        }] => assert!(response.final_bit),
        other => panic!("{other:?}"),
    }
}
