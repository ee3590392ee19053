//! PDUs a target sends (RFC 7143 §11, the "response" half).

use super::bhs::Bhs;
use super::opcode;

/// Sequence numbers every target PDU of the full feature phase carries.
fn put_sequence(bhs: &mut Bhs, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) {
    bhs.put_u32(24, stat_sn);
    bhs.put_u32(28, exp_cmd_sn);
    bhs.put_u32(32, max_cmd_sn);
}

/// NOP-In (§11.19): the answer to a NOP-Out, or a target's own ping.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NopIn {
    pub lun: u64,
    /// The NOP-Out's tag; RESERVED_TAG for a target's ping.
    pub initiator_task_tag: u32,
    /// A tag the initiator must echo (a ping that wants an answer); else RESERVED_TAG.
    pub target_transfer_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl NopIn {
    pub(super) fn decode(bhs: &Bhs) -> NopIn {
        NopIn {
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::NOP_IN;
        bhs.0[1] = 0x80;
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs
    }
}

/// Residual over- or underflow (§11.4.5): the target moved fewer (underflow) or
/// the command wanted more (overflow) bytes than the Expected Data Transfer Length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResidualKind {
    #[default]
    None,
    Underflow(u32),
    Overflow(u32),
}

impl ResidualKind {
    /// The residual of a transfer the command wanted (`wanted`) against the
    /// initiator's Expected Data Transfer Length.
    pub fn of(wanted: u64, expected: u32) -> ResidualKind {
        let expected = u64::from(expected);
        if wanted > expected {
            ResidualKind::Overflow((wanted - expected).min(u64::from(u32::MAX)) as u32)
        } else if wanted < expected {
            ResidualKind::Underflow((expected - wanted) as u32)
        } else {
            ResidualKind::None
        }
    }

    fn flags(self) -> u8 {
        match self {
            ResidualKind::None => 0,
            ResidualKind::Overflow(_) => 0x04,
            ResidualKind::Underflow(_) => 0x02,
        }
    }

    fn count(self) -> u32 {
        match self {
            ResidualKind::None => 0,
            ResidualKind::Overflow(n) | ResidualKind::Underflow(n) => n,
        }
    }

    fn from_fields(flags: u8, count: u32) -> ResidualKind {
        if flags & 0x04 != 0 {
            ResidualKind::Overflow(count)
        } else if flags & 0x02 != 0 {
            ResidualKind::Underflow(count)
        } else {
            ResidualKind::None
        }
    }
}

/// SCSI Response (§11.4). The data segment holds SenseLength (2 bytes) and the sense
/// data, or nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    /// 0: command completed at the target; 1: target failure.
    pub response: u8,
    /// SCSI status (GOOD, CHECK CONDITION, ...).
    pub status: u8,
    pub residual: ResidualKind,
    pub bidi_residual: ResidualKind,
    pub initiator_task_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
}

impl ScsiResponse {
    pub(super) fn decode(bhs: &Bhs) -> ScsiResponse {
        let flags = bhs.0[1];
        ScsiResponse {
            response: bhs.0[2],
            status: bhs.0[3],
            residual: ResidualKind::from_fields(flags, bhs.u32_at(44)),
            bidi_residual: ResidualKind::from_fields(flags >> 2, bhs.u32_at(40)),
            initiator_task_tag: bhs.u32_at(16),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
            exp_data_sn: bhs.u32_at(36),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::SCSI_RESPONSE;
        bhs.0[1] = 0x80 | (self.bidi_residual.flags() << 2) | self.residual.flags();
        bhs.0[2] = self.response;
        bhs.0[3] = self.status;
        bhs.put_u32(16, self.initiator_task_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs.put_u32(36, self.exp_data_sn);
        bhs.put_u32(40, self.bidi_residual.count());
        bhs.put_u32(44, self.residual.count());
        bhs
    }
}

/// Task Management Function Response (§11.6).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskMgmtResponse {
    /// 0 complete, 1 task does not exist, 2 LUN does not exist, 3 task still
    /// allegiant, 4 reassignment not supported, 5 function not supported,
    /// 6 authorization failed, 255 rejected.
    pub response: u8,
    pub initiator_task_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl TaskMgmtResponse {
    pub(super) fn decode(bhs: &Bhs) -> TaskMgmtResponse {
        TaskMgmtResponse {
            response: bhs.0[2],
            initiator_task_tag: bhs.u32_at(16),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::TASK_MGMT_RESPONSE;
        bhs.0[1] = 0x80;
        bhs.0[2] = self.response;
        bhs.put_u32(16, self.initiator_task_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs
    }
}

/// Login Response (§11.13).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginResponse {
    pub transit: bool,
    pub continue_bit: bool,
    pub current_stage: u8,
    pub next_stage: u8,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: u64,
    pub tsih: u16,
    pub initiator_task_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    /// 0 success, 1 redirection, 2 initiator error, 3 target error (§11.13.5).
    pub status_class: u8,
    pub status_detail: u8,
}

impl LoginResponse {
    pub(super) fn decode(bhs: &Bhs) -> LoginResponse {
        LoginResponse {
            transit: bhs.0[1] & 0x80 != 0,
            continue_bit: bhs.0[1] & 0x40 != 0,
            current_stage: (bhs.0[1] >> 2) & 3,
            next_stage: bhs.0[1] & 3,
            version_max: bhs.0[2],
            version_active: bhs.0[3],
            isid: bhs.isid(),
            tsih: bhs.u16_at(14),
            initiator_task_tag: bhs.u32_at(16),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
            status_class: bhs.0[36],
            status_detail: bhs.0[37],
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::LOGIN_RESPONSE;
        bhs.0[1] = (u8::from(self.transit) << 7)
            | (u8::from(self.continue_bit) << 6)
            | ((self.current_stage & 3) << 2)
            | (self.next_stage & 3);
        bhs.0[2] = self.version_max;
        bhs.0[3] = self.version_active;
        bhs.set_isid(self.isid);
        bhs.put_u16(14, self.tsih);
        bhs.put_u32(16, self.initiator_task_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs.0[36] = self.status_class;
        bhs.0[37] = self.status_detail;
        bhs
    }
}

/// Text Response (§11.11).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextResponse {
    pub final_bit: bool,
    pub continue_bit: bool,
    pub lun: u64,
    pub initiator_task_tag: u32,
    /// RESERVED_TAG on the last response; else a tag the initiator echoes to get
    /// the rest.
    pub target_transfer_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl TextResponse {
    pub(super) fn decode(bhs: &Bhs) -> TextResponse {
        TextResponse {
            final_bit: bhs.final_bit(),
            continue_bit: bhs.0[1] & 0x40 != 0,
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::TEXT_RESPONSE;
        bhs.0[1] = (u8::from(self.final_bit) << 7) | (u8::from(self.continue_bit) << 6);
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs
    }
}

/// SCSI Data-In (§11.7). With `status` set the last Data-In also carries the
/// command's status (phase collapse) and no SCSI Response follows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataIn {
    pub final_bit: bool,
    /// A: the initiator should acknowledge (ERL > 0 only).
    pub acknowledge: bool,
    /// S: `status` and `stat_sn` are valid.
    pub status: Option<u8>,
    pub residual: ResidualKind,
    pub lun: u64,
    pub initiator_task_tag: u32,
    pub target_transfer_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

impl DataIn {
    pub(super) fn decode(bhs: &Bhs) -> DataIn {
        let flags = bhs.0[1];
        DataIn {
            final_bit: flags & 0x80 != 0,
            acknowledge: flags & 0x40 != 0,
            status: (flags & 0x01 != 0).then_some(bhs.0[3]),
            residual: ResidualKind::from_fields(flags, bhs.u32_at(44)),
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
            data_sn: bhs.u32_at(36),
            buffer_offset: bhs.u32_at(40),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::DATA_IN;
        bhs.0[1] = (u8::from(self.final_bit) << 7)
            | (u8::from(self.acknowledge) << 6)
            | self.residual.flags()
            | u8::from(self.status.is_some());
        bhs.0[3] = self.status.unwrap_or(0);
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs.put_u32(36, self.data_sn);
        bhs.put_u32(40, self.buffer_offset);
        bhs.put_u32(44, self.residual.count());
        bhs
    }
}

/// Logout Response (§11.15).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogoutResponse {
    /// 0 closed successfully, 1 CID not found, 2 recovery not supported,
    /// 3 cleanup failed.
    pub response: u8,
    pub initiator_task_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

impl LogoutResponse {
    pub(super) fn decode(bhs: &Bhs) -> LogoutResponse {
        LogoutResponse {
            response: bhs.0[2],
            initiator_task_tag: bhs.u32_at(16),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
            time2wait: bhs.u16_at(40),
            time2retain: bhs.u16_at(42),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::LOGOUT_RESPONSE;
        bhs.0[1] = 0x80;
        bhs.0[2] = self.response;
        bhs.put_u32(16, self.initiator_task_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs.put_u16(40, self.time2wait);
        bhs.put_u16(42, self.time2retain);
        bhs
    }
}

/// Ready To Transfer (§11.8): asks for a range of a command's data-out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct R2t {
    pub lun: u64,
    pub initiator_task_tag: u32,
    pub target_transfer_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_data_transfer_length: u32,
}

impl R2t {
    pub(super) fn decode(bhs: &Bhs) -> R2t {
        R2t {
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
            r2t_sn: bhs.u32_at(36),
            buffer_offset: bhs.u32_at(40),
            desired_data_transfer_length: bhs.u32_at(44),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::R2T;
        bhs.0[1] = 0x80;
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs.put_u32(36, self.r2t_sn);
        bhs.put_u32(40, self.buffer_offset);
        bhs.put_u32(44, self.desired_data_transfer_length);
        bhs
    }
}

/// Asynchronous Message (§11.9). Event 1 asks the initiator to log out within
/// `parameter3` seconds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AsyncMessage {
    pub lun: u64,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub event: u8,
    pub vendor_code: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
}

impl AsyncMessage {
    /// AsyncEvent 1: the target requests a logout.
    pub const REQUEST_LOGOUT: u8 = 1;

    pub(super) fn decode(bhs: &Bhs) -> AsyncMessage {
        AsyncMessage {
            lun: bhs.u64_at(8),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
            event: bhs.0[36],
            vendor_code: bhs.0[37],
            parameter1: bhs.u16_at(38),
            parameter2: bhs.u16_at(40),
            parameter3: bhs.u16_at(42),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::ASYNC_MESSAGE;
        bhs.0[1] = 0x80;
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, super::RESERVED_TAG);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs.0[36] = self.event;
        bhs.0[37] = self.vendor_code;
        bhs.put_u16(38, self.parameter1);
        bhs.put_u16(40, self.parameter2);
        bhs.put_u16(42, self.parameter3);
        bhs
    }
}

/// Reject reasons (§11.17.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RejectReason {
    DataDigestError,
    SnackReject,
    #[default]
    ProtocolError,
    CommandNotSupported,
    ImmediateCommandReject,
    TaskInProgress,
    InvalidDataAck,
    InvalidPduField,
    LongOperationReject,
    WaitingForLogout,
    Other(u8),
}

impl RejectReason {
    pub fn code(self) -> u8 {
        match self {
            RejectReason::DataDigestError => 0x02,
            RejectReason::SnackReject => 0x03,
            RejectReason::ProtocolError => 0x04,
            RejectReason::CommandNotSupported => 0x05,
            RejectReason::ImmediateCommandReject => 0x06,
            RejectReason::TaskInProgress => 0x07,
            RejectReason::InvalidDataAck => 0x08,
            RejectReason::InvalidPduField => 0x09,
            RejectReason::LongOperationReject => 0x0a,
            RejectReason::WaitingForLogout => 0x0c,
            RejectReason::Other(code) => code,
        }
    }

    fn from_code(code: u8) -> RejectReason {
        match code {
            0x02 => RejectReason::DataDigestError,
            0x03 => RejectReason::SnackReject,
            0x04 => RejectReason::ProtocolError,
            0x05 => RejectReason::CommandNotSupported,
            0x06 => RejectReason::ImmediateCommandReject,
            0x07 => RejectReason::TaskInProgress,
            0x08 => RejectReason::InvalidDataAck,
            0x09 => RejectReason::InvalidPduField,
            0x0a => RejectReason::LongOperationReject,
            0x0c => RejectReason::WaitingForLogout,
            other => RejectReason::Other(other),
        }
    }
}

/// Reject (§11.17). Its data segment is the header of the rejected PDU.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reject {
    pub reason: RejectReason,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
}

impl Reject {
    pub(super) fn decode(bhs: &Bhs) -> Reject {
        Reject {
            reason: RejectReason::from_code(bhs.0[2]),
            stat_sn: bhs.u32_at(24),
            exp_cmd_sn: bhs.u32_at(28),
            max_cmd_sn: bhs.u32_at(32),
            data_sn: bhs.u32_at(36),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::REJECT;
        bhs.0[1] = 0x80;
        bhs.0[2] = self.reason.code();
        bhs.put_u32(16, super::RESERVED_TAG);
        put_sequence(&mut bhs, self.stat_sn, self.exp_cmd_sn, self.max_cmd_sn);
        bhs.put_u32(36, self.data_sn);
        bhs
    }
}
