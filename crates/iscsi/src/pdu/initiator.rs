//! PDUs an initiator sends (RFC 7143 §11.1-§11.16, the "request" half).

use super::bhs::Bhs;
use super::{opcode, PduError};

/// The AHS type of an Extended CDB (§11.2.2.3).
const AHS_EXTENDED_CDB: u8 = 1;
/// The AHS type of the Expected Bidirectional Read Data Length (§11.2.2.4).
const AHS_BIDI_READ_LENGTH: u8 = 2;
/// Longest CDB an Extended CDB AHS can carry with the 16 bytes in the BHS.
const MAX_CDB: usize = 260;

fn first_byte(opcode: u8, immediate: bool) -> u8 {
    opcode | if immediate { 0x40 } else { 0 }
}

/// NOP-Out (§11.18): a ping, or the answer to a target's NOP-In.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    /// RESERVED_TAG when this answers a NOP-In.
    pub initiator_task_tag: u32,
    /// The NOP-In's tag when this answers one; else RESERVED_TAG.
    pub target_transfer_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl NopOut {
    pub(super) fn decode(bhs: &Bhs) -> NopOut {
        NopOut {
            immediate: bhs.immediate(),
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            cmd_sn: bhs.u32_at(24),
            exp_stat_sn: bhs.u32_at(28),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = first_byte(opcode::NOP_OUT, self.immediate);
        bhs.0[1] = 0x80;
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        bhs.put_u32(24, self.cmd_sn);
        bhs.put_u32(28, self.exp_stat_sn);
        bhs
    }
}

/// SAM task attributes (§11.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskAttribute {
    Untagged,
    #[default]
    Simple,
    Ordered,
    HeadOfQueue,
    Aca,
    Reserved(u8),
}

impl TaskAttribute {
    fn from_bits(bits: u8) -> TaskAttribute {
        match bits & 7 {
            0 => TaskAttribute::Untagged,
            1 => TaskAttribute::Simple,
            2 => TaskAttribute::Ordered,
            3 => TaskAttribute::HeadOfQueue,
            4 => TaskAttribute::Aca,
            other => TaskAttribute::Reserved(other),
        }
    }

    fn bits(self) -> u8 {
        match self {
            TaskAttribute::Untagged => 0,
            TaskAttribute::Simple => 1,
            TaskAttribute::Ordered => 2,
            TaskAttribute::HeadOfQueue => 3,
            TaskAttribute::Aca => 4,
            TaskAttribute::Reserved(bits) => bits & 7,
        }
    }
}

/// SCSI Command (§11.3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScsiCommand {
    pub immediate: bool,
    /// F: no unsolicited Data-Out follows this PDU.
    pub final_bit: bool,
    /// R: the command reads (data-in).
    pub read: bool,
    /// W: the command writes (data-out).
    pub write: bool,
    pub attribute: TaskAttribute,
    pub lun: u64,
    pub initiator_task_tag: u32,
    pub expected_data_transfer_length: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// The whole CDB: 16 bytes from the BHS (trailing zeroes included) plus any
    /// Extended CDB AHS.
    pub cdb: Vec<u8>,
    /// Expected Bidirectional Read Data Length, when the AHS carries one.
    pub bidi_read_length: Option<u32>,
}

impl ScsiCommand {
    pub(super) fn decode(bhs: &Bhs, ahs: &[u8]) -> Result<ScsiCommand, PduError> {
        let mut cdb = bhs.0[32..48].to_vec();
        let mut bidi_read_length = None;
        let mut rest = ahs;
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err(PduError::BadAhs("truncated AHS header"));
            }
            let length = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
            let kind = rest[2];
            // AHSLength counts the bytes after the reserved byte; each AHS is padded.
            let total = super::padded(3 + length);
            if length == 0 || total > rest.len() {
                return Err(PduError::BadAhs("AHSLength runs past the header"));
            }
            let body = &rest[4..3 + length];
            match kind {
                AHS_EXTENDED_CDB => {
                    if cdb.len() + body.len() > MAX_CDB {
                        return Err(PduError::BadAhs("extended CDB too long"));
                    }
                    cdb.extend_from_slice(body);
                }
                AHS_BIDI_READ_LENGTH if body.len() == 4 => {
                    bidi_read_length = Some(u32::from_be_bytes(body.try_into().expect("4")));
                }
                _ => return Err(PduError::BadAhs("unknown AHS type")),
            }
            rest = &rest[total..];
        }
        Ok(ScsiCommand {
            immediate: bhs.immediate(),
            final_bit: bhs.final_bit(),
            read: bhs.0[1] & 0x40 != 0,
            write: bhs.0[1] & 0x20 != 0,
            attribute: TaskAttribute::from_bits(bhs.0[1]),
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            expected_data_transfer_length: bhs.u32_at(20),
            cmd_sn: bhs.u32_at(24),
            exp_stat_sn: bhs.u32_at(28),
            cdb,
            bidi_read_length,
        })
    }

    pub(super) fn encode(&self) -> (Bhs, Vec<u8>) {
        let mut bhs = Bhs::default();
        bhs.0[0] = first_byte(opcode::SCSI_COMMAND, self.immediate);
        bhs.0[1] = (u8::from(self.final_bit) << 7)
            | (u8::from(self.read) << 6)
            | (u8::from(self.write) << 5)
            | self.attribute.bits();
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.expected_data_transfer_length);
        bhs.put_u32(24, self.cmd_sn);
        bhs.put_u32(28, self.exp_stat_sn);
        let head = self.cdb.len().min(16);
        bhs.0[32..32 + head].copy_from_slice(&self.cdb[..head]);
        let mut ahs = Vec::new();
        if self.cdb.len() > 16 {
            let extra = &self.cdb[16..];
            ahs.extend_from_slice(&((extra.len() + 1) as u16).to_be_bytes());
            ahs.push(AHS_EXTENDED_CDB);
            ahs.push(0);
            ahs.extend_from_slice(extra);
            ahs.resize(super::padded(ahs.len()), 0);
        }
        if let Some(length) = self.bidi_read_length {
            ahs.extend_from_slice(&[0, 5, AHS_BIDI_READ_LENGTH, 0]);
            ahs.extend_from_slice(&length.to_be_bytes());
        }
        (bhs, ahs)
    }
}

/// Task management functions (§11.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskFunction {
    #[default]
    AbortTask,
    AbortTaskSet,
    ClearAca,
    ClearTaskSet,
    LogicalUnitReset,
    TargetWarmReset,
    TargetColdReset,
    TaskReassign,
    Other(u8),
}

impl TaskFunction {
    fn from_code(code: u8) -> TaskFunction {
        match code {
            1 => TaskFunction::AbortTask,
            2 => TaskFunction::AbortTaskSet,
            3 => TaskFunction::ClearAca,
            4 => TaskFunction::ClearTaskSet,
            5 => TaskFunction::LogicalUnitReset,
            6 => TaskFunction::TargetWarmReset,
            7 => TaskFunction::TargetColdReset,
            8 => TaskFunction::TaskReassign,
            other => TaskFunction::Other(other),
        }
    }

    fn code(self) -> u8 {
        match self {
            TaskFunction::AbortTask => 1,
            TaskFunction::AbortTaskSet => 2,
            TaskFunction::ClearAca => 3,
            TaskFunction::ClearTaskSet => 4,
            TaskFunction::LogicalUnitReset => 5,
            TaskFunction::TargetWarmReset => 6,
            TaskFunction::TargetColdReset => 7,
            TaskFunction::TaskReassign => 8,
            TaskFunction::Other(code) => code & 0x7f,
        }
    }
}

/// Task Management Function Request (§11.5).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: TaskFunction,
    pub lun: u64,
    pub initiator_task_tag: u32,
    pub referenced_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

impl TaskMgmtRequest {
    pub(super) fn decode(bhs: &Bhs) -> TaskMgmtRequest {
        TaskMgmtRequest {
            immediate: bhs.immediate(),
            function: TaskFunction::from_code(bhs.0[1] & 0x7f),
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            referenced_task_tag: bhs.u32_at(20),
            cmd_sn: bhs.u32_at(24),
            exp_stat_sn: bhs.u32_at(28),
            ref_cmd_sn: bhs.u32_at(32),
            exp_data_sn: bhs.u32_at(36),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = first_byte(opcode::TASK_MGMT_REQUEST, self.immediate);
        bhs.0[1] = 0x80 | self.function.code();
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.referenced_task_tag);
        bhs.put_u32(24, self.cmd_sn);
        bhs.put_u32(28, self.exp_stat_sn);
        bhs.put_u32(32, self.ref_cmd_sn);
        bhs.put_u32(36, self.exp_data_sn);
        bhs
    }
}

/// Login Request (§11.12).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoginRequest {
    /// T: the initiator is ready to move to `next_stage`.
    pub transit: bool,
    /// C: the text is continued in the next PDU.
    pub continue_bit: bool,
    /// CSG: 0 security negotiation, 1 operational negotiation, 3 full feature.
    pub current_stage: u8,
    /// NSG (meaningful with `transit`).
    pub next_stage: u8,
    pub version_max: u8,
    pub version_min: u8,
    /// Initiator Session ID (6 bytes, big-endian in the low 48 bits).
    pub isid: u64,
    /// Target Session Identifying Handle: 0 for a new session.
    pub tsih: u16,
    pub initiator_task_tag: u32,
    /// Connection ID.
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LoginRequest {
    pub(super) fn decode(bhs: &Bhs) -> LoginRequest {
        LoginRequest {
            transit: bhs.0[1] & 0x80 != 0,
            continue_bit: bhs.0[1] & 0x40 != 0,
            current_stage: (bhs.0[1] >> 2) & 3,
            next_stage: bhs.0[1] & 3,
            version_max: bhs.0[2],
            version_min: bhs.0[3],
            isid: bhs.isid(),
            tsih: bhs.u16_at(14),
            initiator_task_tag: bhs.u32_at(16),
            cid: bhs.u16_at(20),
            cmd_sn: bhs.u32_at(24),
            exp_stat_sn: bhs.u32_at(28),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        // A login request is always immediate (§11.12).
        bhs.0[0] = first_byte(opcode::LOGIN_REQUEST, true);
        bhs.0[1] = (u8::from(self.transit) << 7)
            | (u8::from(self.continue_bit) << 6)
            | ((self.current_stage & 3) << 2)
            | (self.next_stage & 3);
        bhs.0[2] = self.version_max;
        bhs.0[3] = self.version_min;
        bhs.set_isid(self.isid);
        bhs.put_u16(14, self.tsih);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u16(20, self.cid);
        bhs.put_u32(24, self.cmd_sn);
        bhs.put_u32(28, self.exp_stat_sn);
        bhs
    }
}

/// Text Request (§11.10).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_bit: bool,
    pub continue_bit: bool,
    pub lun: u64,
    pub initiator_task_tag: u32,
    pub target_transfer_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl TextRequest {
    pub(super) fn decode(bhs: &Bhs) -> TextRequest {
        TextRequest {
            immediate: bhs.immediate(),
            final_bit: bhs.final_bit(),
            continue_bit: bhs.0[1] & 0x40 != 0,
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            cmd_sn: bhs.u32_at(24),
            exp_stat_sn: bhs.u32_at(28),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = first_byte(opcode::TEXT_REQUEST, self.immediate);
        bhs.0[1] = (u8::from(self.final_bit) << 7) | (u8::from(self.continue_bit) << 6);
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        bhs.put_u32(24, self.cmd_sn);
        bhs.put_u32(28, self.exp_stat_sn);
        bhs
    }
}

/// SCSI Data-Out (§11.7).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataOut {
    pub final_bit: bool,
    pub lun: u64,
    pub initiator_task_tag: u32,
    /// The R2T's tag, or RESERVED_TAG for unsolicited data.
    pub target_transfer_tag: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

impl DataOut {
    pub(super) fn decode(bhs: &Bhs) -> DataOut {
        DataOut {
            final_bit: bhs.final_bit(),
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            exp_stat_sn: bhs.u32_at(28),
            data_sn: bhs.u32_at(36),
            buffer_offset: bhs.u32_at(40),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::DATA_OUT;
        bhs.0[1] = u8::from(self.final_bit) << 7;
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        bhs.put_u32(28, self.exp_stat_sn);
        bhs.put_u32(36, self.data_sn);
        bhs.put_u32(40, self.buffer_offset);
        bhs
    }
}

/// Why an initiator logs out (§11.14.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogoutReason {
    #[default]
    CloseSession,
    CloseConnection,
    RemoveConnectionForRecovery,
    Other(u8),
}

/// Logout Request (§11.14).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogoutRequest {
    pub immediate: bool,
    pub reason: LogoutReason,
    pub initiator_task_tag: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LogoutRequest {
    pub(super) fn decode(bhs: &Bhs) -> LogoutRequest {
        LogoutRequest {
            immediate: bhs.immediate(),
            reason: match bhs.0[1] & 0x7f {
                0 => LogoutReason::CloseSession,
                1 => LogoutReason::CloseConnection,
                2 => LogoutReason::RemoveConnectionForRecovery,
                other => LogoutReason::Other(other),
            },
            initiator_task_tag: bhs.u32_at(16),
            cid: bhs.u16_at(20),
            cmd_sn: bhs.u32_at(24),
            exp_stat_sn: bhs.u32_at(28),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = first_byte(opcode::LOGOUT_REQUEST, self.immediate);
        bhs.0[1] = 0x80
            | match self.reason {
                LogoutReason::CloseSession => 0,
                LogoutReason::CloseConnection => 1,
                LogoutReason::RemoveConnectionForRecovery => 2,
                LogoutReason::Other(code) => code & 0x7f,
            };
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u16(20, self.cid);
        bhs.put_u32(24, self.cmd_sn);
        bhs.put_u32(28, self.exp_stat_sn);
        bhs
    }
}

/// SNACK Request (§11.16); only meaningful at ErrorRecoveryLevel > 0, which blockwire
/// does not negotiate, so a target rejects it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snack {
    pub kind: u8,
    pub lun: u64,
    pub initiator_task_tag: u32,
    pub target_transfer_tag: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

impl Snack {
    pub(super) fn decode(bhs: &Bhs) -> Snack {
        Snack {
            kind: bhs.0[1] & 0x0f,
            lun: bhs.u64_at(8),
            initiator_task_tag: bhs.u32_at(16),
            target_transfer_tag: bhs.u32_at(20),
            exp_stat_sn: bhs.u32_at(28),
            beg_run: bhs.u32_at(40),
            run_length: bhs.u32_at(44),
        }
    }

    pub(super) fn encode(&self) -> Bhs {
        let mut bhs = Bhs::default();
        bhs.0[0] = opcode::SNACK;
        bhs.0[1] = 0x80 | (self.kind & 0x0f);
        bhs.put_u64(8, self.lun);
        bhs.put_u32(16, self.initiator_task_tag);
        bhs.put_u32(20, self.target_transfer_tag);
        bhs.put_u32(28, self.exp_stat_sn);
        bhs.put_u32(40, self.beg_run);
        bhs.put_u32(44, self.run_length);
        bhs
    }
}
