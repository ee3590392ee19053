//! The 8-byte common header every NVMe/TCP PDU starts with (NVMe/TCP transport
//! specification, section 3.6.1), the PDU types and the flag bits.

use super::PduError;

/// Length of the common header.
pub const COMMON_HEADER_LEN: usize = 8;
/// Length of a header or data digest (CRC32C).
pub const DIGEST_LEN: usize = 4;

/// PDU types (the first byte of every PDU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl PduType {
    /// The type a first byte names, if any.
    pub fn from_u8(value: u8) -> Option<PduType> {
        Some(match value {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The fixed header length (HLEN) of this type, digest excluded.
    pub fn header_len(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => 128,
            PduType::CapsuleCmd => 72,
            PduType::H2CTermReq
            | PduType::C2HTermReq
            | PduType::CapsuleResp
            | PduType::H2CData
            | PduType::C2HData
            | PduType::R2T => 24,
        }
    }

    /// Whether a header digest follows this type's header when digests are on.
    /// Connection setup and termination PDUs never carry digests.
    pub fn may_have_header_digest(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }

    /// Whether this type may carry data protected by a data digest.
    pub fn may_have_data_digest(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData
        )
    }
}

/// Flag bits of the common header.
pub mod flags {
    /// A header digest follows the PDU header.
    pub const HDGSTF: u8 = 0x01;
    /// A data digest follows the PDU data.
    pub const DDGSTF: u8 = 0x02;
    /// H2CData/C2HData: the last data PDU of the command (or of the R2T).
    pub const DATA_LAST: u8 = 0x04;
    /// C2HData: the command succeeded; no CapsuleResp follows.
    pub const DATA_SUCCESS: u8 = 0x08;
}

/// The common header: type, flags, header length, PDU data offset, PDU length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    /// HLEN: the PDU header's length, common header included, digest excluded.
    pub hlen: u8,
    /// PDO: where the data starts, from the start of the PDU (0: no data).
    pub pdo: u8,
    /// PLEN: the whole PDU's length, digests and padding included.
    pub plen: u32,
}

impl CommonHeader {
    /// Reads the first 8 bytes of `bytes` (which must hold at least 8).
    pub fn parse(bytes: &[u8]) -> Result<CommonHeader, PduError> {
        if bytes.len() < COMMON_HEADER_LEN {
            return Err(PduError::Truncated);
        }
        Ok(CommonHeader {
            pdu_type: bytes[0],
            flags: bytes[1],
            hlen: bytes[2],
            pdo: bytes[3],
            plen: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        })
    }

    /// Writes the header into the first 8 bytes of `out`.
    pub fn write(&self, out: &mut [u8]) {
        out[0] = self.pdu_type;
        out[1] = self.flags;
        out[2] = self.hlen;
        out[3] = self.pdo;
        out[4..8].copy_from_slice(&self.plen.to_le_bytes());
    }

    pub fn has_header_digest(&self) -> bool {
        self.flags & flags::HDGSTF != 0
    }

    pub fn has_data_digest(&self) -> bool {
        self.flags & flags::DDGSTF != 0
    }
}
