//! A command as the transport hands it over, and the answer it gets back.

use blockwire_blockdev::IoBuf;

use crate::cdb::{Cdb, CdbError};
use crate::nexus::Nexus;
use crate::sense::{Code, Sense};

/// One SCSI command addressed to a logical unit.
pub struct Command<'a> {
    pub nexus: &'a Nexus,
    /// 6..=16 bytes; longer CDBs are answered with INVALID COMMAND OPERATION CODE.
    pub cdb: &'a [u8],
    /// Everything the initiator sent as data-out (iSCSI's Expected Data Transfer
    /// Length bytes). It may be shorter or longer than the CDB implies: a write gets
    /// the whole blocks it received, or INVALID FIELD IN COMMAND INFORMATION UNIT when
    /// a block is cut; bytes beyond what the CDB asks for are ignored.
    pub data_out: &'a [u8],
}

/// SAM-5 status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Good = 0x00,
    CheckCondition = 0x02,
    ConditionMet = 0x04,
    Busy = 0x08,
    ReservationConflict = 0x18,
    TaskSetFull = 0x28,
    TaskAborted = 0x40,
}

/// The answer to one command.
pub struct Response {
    pub status: Status,
    /// Sense data, raw bytes (fixed format 0x70, or descriptor format 0x72 when the
    /// control mode page's D_SENSE is set); empty unless CheckCondition.
    pub sense: Vec<u8>,
    /// Data-in, already cut to the CDB's allocation length.
    pub data_in: IoBuf,
    /// The transfer length the CDB asks for in bytes (SPDTL): for reads the bytes the
    /// command would return (for commands with an allocation length, that length),
    /// for writes the bytes it expects to receive. The transport compares it with
    /// its expected data transfer length to report residual overflow or underflow.
    pub expected_len: u64,
}

impl Response {
    /// GOOD without data.
    pub fn good(expected_len: u64) -> Response {
        Response {
            status: Status::Good,
            sense: Vec::new(),
            data_in: IoBuf::new(0),
            expected_len,
        }
    }

    /// GOOD with data-in.
    pub fn with_data(data_in: IoBuf, expected_len: u64) -> Response {
        Response {
            status: Status::Good,
            sense: Vec::new(),
            data_in,
            expected_len,
        }
    }

    /// GOOD with `data` cut to the allocation length `alloc` (SPC-4 4.2.5.6: the
    /// device server returns what fits and never fails for a short allocation).
    pub fn with_allocation(data: &[u8], alloc: u32) -> Response {
        let len = data.len().min(alloc as usize);
        Response::with_data(IoBuf::from_slice(&data[..len]), u64::from(alloc))
    }

    /// CHECK CONDITION with encoded sense data.
    pub fn check_condition(sense: Vec<u8>, expected_len: u64) -> Response {
        Response {
            status: Status::CheckCondition,
            sense,
            data_in: IoBuf::new(0),
            expected_len,
        }
    }

    /// CHECK CONDITION for `sense` in fixed or descriptor format.
    pub fn sense(sense: &Sense, descriptor: bool, expected_len: u64) -> Response {
        Response::check_condition(sense.encode(descriptor), expected_len)
    }

    /// CHECK CONDITION for a bare code in fixed format.
    pub fn code(code: Code, expected_len: u64) -> Response {
        Response::sense(&Sense::new(code), false, expected_len)
    }

    /// RESERVATION CONFLICT (no sense data, SAM-5 5.3.1).
    pub fn reservation_conflict(expected_len: u64) -> Response {
        Response {
            status: Status::ReservationConflict,
            sense: Vec::new(),
            data_in: IoBuf::new(0),
            expected_len,
        }
    }

    /// The data-in bytes.
    pub fn data(&self) -> &[u8] {
        &self.data_in
    }

    /// The sense key, ASC and ASCQ of the sense data, if there is any.
    pub fn sense_code(&self) -> Option<Code> {
        Sense::parse_code(&self.sense)
    }
}

impl std::fmt::Debug for Response {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("sense", &self.sense_code())
            .field("data_in", &self.data_in.len())
            .field("expected_len", &self.expected_len)
            .finish()
    }
}

/// Which way a command moves data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    None,
    In,
    Out,
}

/// What a CDB will transfer, so the transport knows how much data-out to solicit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferInfo {
    pub direction: DataDirection,
    /// Bytes: data-out to receive, or the most data-in the command returns.
    pub len: u64,
}

impl TransferInfo {
    pub const NONE: TransferInfo = TransferInfo {
        direction: DataDirection::None,
        len: 0,
    };

    pub fn data_in(len: u64) -> TransferInfo {
        TransferInfo {
            direction: if len == 0 {
                DataDirection::None
            } else {
                DataDirection::In
            },
            len,
        }
    }

    pub fn data_out(len: u64) -> TransferInfo {
        TransferInfo {
            direction: if len == 0 {
                DataDirection::None
            } else {
                DataDirection::Out
            },
            len,
        }
    }
}

/// A CDB decoded once, for the logical unit it is addressed to
/// ([`ScsiTarget::decode`](crate::ScsiTarget::decode)). A transport keeps it with
/// the command: how much data-out to solicit, where the command may run and its
/// execution all read this one decoding instead of the CDB bytes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedCdb {
    /// The LUN the command is addressed to.
    pub lun: u64,
    /// The operation code; None for an empty CDB.
    pub opcode: Option<u8>,
    /// The fields, or why the CDB cannot be executed.
    pub cdb: Result<Cdb, CdbError>,
    /// What the command transfers on its logical unit; nothing for a command that
    /// will fail.
    pub transfer: TransferInfo,
}
