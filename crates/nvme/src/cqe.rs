//! The 16-byte completion queue entry and the status field it carries.

use std::fmt;

/// Length of a completion queue entry.
pub const CQE_LEN: usize = 16;

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// Dwords 0 and 1: the command-specific result.
    pub result: u64,
    pub sq_head: u16,
    pub sq_id: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    /// A completion for command `cid` with `status` and no result.
    pub fn new(cid: u16, status: Status) -> Cqe {
        Cqe {
            cid,
            status,
            ..Cqe::default()
        }
    }

    /// Reads 16 bytes (None when shorter).
    pub fn parse(bytes: &[u8]) -> Option<Cqe> {
        let b = bytes.get(..CQE_LEN)?;
        Some(Cqe {
            result: u64::from_le_bytes(b[0..8].try_into().ok()?),
            sq_head: u16::from_le_bytes([b[8], b[9]]),
            sq_id: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            // Bit 0 is the phase tag, meaningless on fabrics.
            status: Status(u16::from_le_bytes([b[14], b[15]]) >> 1),
        })
    }

    /// The 16 bytes on the wire.
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut out = [0; CQE_LEN];
        out[0..8].copy_from_slice(&self.result.to_le_bytes());
        out[8..10].copy_from_slice(&self.sq_head.to_le_bytes());
        out[10..12].copy_from_slice(&self.sq_id.to_le_bytes());
        out[12..14].copy_from_slice(&self.cid.to_le_bytes());
        out[14..16].copy_from_slice(&(self.status.0 << 1).to_le_bytes());
        out
    }
}

/// The status field without its phase bit: SC (bits 7:0), SCT (10:8), CRD
/// (12:11), More (13), DNR (14).
#[derive(Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Status(pub u16);

/// Status code types.
pub mod sct {
    pub const GENERIC: u8 = 0;
    pub const COMMAND_SPECIFIC: u8 = 1;
    pub const MEDIA: u8 = 2;
    pub const PATH: u8 = 3;
}

impl Status {
    pub const SUCCESS: Status = Status(0);

    /// A status of type `sct`, code `sc`; `dnr` tells the host not to retry.
    pub const fn new(sct: u8, sc: u8, dnr: bool) -> Status {
        Status(((dnr as u16) << 14) | (((sct & 0x7) as u16) << 8) | sc as u16)
    }

    // Generic command status (NVMe base 2.0, figure "Generic Command Status").
    pub const INVALID_OPCODE: Status = Status::new(sct::GENERIC, 0x01, true);
    pub const INVALID_FIELD: Status = Status::new(sct::GENERIC, 0x02, true);
    pub const CID_CONFLICT: Status = Status::new(sct::GENERIC, 0x03, true);
    pub const DATA_TRANSFER_ERROR: Status = Status::new(sct::GENERIC, 0x04, false);
    pub const INTERNAL_ERROR: Status = Status::new(sct::GENERIC, 0x06, false);
    pub const ABORTED_SQ_DELETION: Status = Status::new(sct::GENERIC, 0x08, false);
    pub const INVALID_NAMESPACE: Status = Status::new(sct::GENERIC, 0x0b, true);
    pub const COMMAND_SEQUENCE_ERROR: Status = Status::new(sct::GENERIC, 0x0c, true);
    pub const SGL_INVALID_DESCRIPTOR: Status = Status::new(sct::GENERIC, 0x0d, true);
    pub const DATA_SGL_LENGTH_INVALID: Status = Status::new(sct::GENERIC, 0x0f, true);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Status = Status::new(sct::GENERIC, 0x11, true);
    pub const SGL_OFFSET_INVALID: Status = Status::new(sct::GENERIC, 0x16, true);
    pub const NAMESPACE_WRITE_PROTECTED: Status = Status::new(sct::GENERIC, 0x20, true);
    pub const TRANSIENT_TRANSPORT_ERROR: Status = Status::new(sct::GENERIC, 0x22, false);
    pub const LBA_OUT_OF_RANGE: Status = Status::new(sct::GENERIC, 0x80, true);
    pub const CAPACITY_EXCEEDED: Status = Status::new(sct::GENERIC, 0x81, true);
    pub const NAMESPACE_NOT_READY: Status = Status::new(sct::GENERIC, 0x82, false);

    // Command specific status.
    pub const INVALID_QUEUE_IDENTIFIER: Status = Status::new(sct::COMMAND_SPECIFIC, 0x01, true);
    pub const ASYNC_EVENT_LIMIT_EXCEEDED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x05, true);
    pub const INVALID_LOG_PAGE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x09, true);
    pub const FEATURE_NOT_SAVEABLE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0d, true);
    pub const FEATURE_NOT_CHANGEABLE: Status = Status::new(sct::COMMAND_SPECIFIC, 0x0e, true);
    /// Fabrics: Connect refused, its parameters are invalid.
    pub const CONNECT_INVALID_PARAMETERS: Status = Status::new(sct::COMMAND_SPECIFIC, 0x82, true);
    /// Fabrics: Connect refused, the host is not allowed.
    pub const CONNECT_INVALID_HOST: Status = Status::new(sct::COMMAND_SPECIFIC, 0x84, true);
    /// Fabrics: Connect refused, the controller is busy.
    pub const CONTROLLER_BUSY: Status = Status::new(sct::COMMAND_SPECIFIC, 0x81, false);

    // Media and data integrity errors.
    pub const WRITE_FAULT: Status = Status::new(sct::MEDIA, 0x80, false);
    pub const UNRECOVERED_READ_ERROR: Status = Status::new(sct::MEDIA, 0x81, false);
    pub const COMPARE_FAILURE: Status = Status::new(sct::MEDIA, 0x85, true);

    pub fn sc(self) -> u8 {
        self.0 as u8
    }

    pub fn sct(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    pub fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    pub fn is_success(self) -> bool {
        self.0 & 0x07ff == 0
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Status(sct {:#x}, sc {:#04x}{})",
            self.sct(),
            self.sc(),
            if self.dnr() { ", dnr" } else { "" }
        )
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_vector() {
        let cqe = Cqe {
            result: 0x0102_0304_0506_0708,
            sq_head: 0x0a0b,
            sq_id: 1,
            cid: 0x1234,
            status: Status::INVALID_FIELD,
        };
        let bytes = cqe.to_bytes();
        assert_eq!(
            bytes,
            [
                0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, 0x0b, 0x0a, 0x01, 0x00, 0x34, 0x12,
                0x04, 0x80
            ]
        );
        assert_eq!(Cqe::parse(&bytes), Some(cqe));
    }

    #[test]
    fn status_fields() {
        let s = Status::CONNECT_INVALID_HOST;
        assert_eq!((s.sct(), s.sc(), s.dnr()), (1, 0x84, true));
        assert!(!s.is_success());
        assert!(Status::SUCCESS.is_success());
    }
}
