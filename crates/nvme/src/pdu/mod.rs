//! The NVMe/TCP PDU codec, sans-IO: bytes in, [`Pdu`] out, and back.
//!
//! Every PDU is an 8-byte [`CommonHeader`], a type-specific header (HLEN bytes in
//! all), an optional header digest, padding up to the PDU data offset (PDO), data,
//! and an optional data digest; PLEN covers all of it (NVMe/TCP transport
//! specification 1.0, section 3.6). [`decode`] takes a buffer that may hold a
//! partial PDU and answers `Ok(None)` until the whole PDU is there, so a transport
//! can read the common header, ask [`pdu_len`] how much follows, and read exactly
//! that. [`Pdu::encode`] writes one PDU with the digests and data alignment of a
//! [`Framing`]. Errors say which field was wrong and map to the fatal error status
//! and information a TermReq reports ([`PduError::fes`], [`PduError::fei`]).

mod decode;
pub mod digest;
mod encode;
pub mod header;
mod types;

#[cfg(test)]
mod tests;

pub use decode::{data_header_len, decode, decode_data_header, pdu_len, DataHeader};
pub use header::{flags, CommonHeader, PduType, COMMON_HEADER_LEN, DIGEST_LEN};
pub use types::{
    fes, C2HData, CapsuleCmd, CapsuleResp, Digests, H2CData, IcReq, IcResp, Pdu, TermReq, R2T,
    TERM_REQ_MAX_DATA,
};

/// The smallest MAXH2CDATA a controller may offer (NVMe/TCP section 3.6.2.3).
pub const MIN_MAXH2CDATA: u32 = 4096;
/// Largest PDU a [`Framing`] accepts by default: 1 MiB of data and headers.
pub const DEFAULT_MAX_PDU_LEN: u32 = (1 << 20) + 256;

/// How PDUs are framed on one connection: the negotiated digests, the alignment
/// the peer asked for, and the largest PDU accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub digests: Digests,
    /// The peer's PDU data alignment (HPDA for a controller, CPDA for a host):
    /// data in PDUs this side sends starts at a multiple of `(pda + 1) * 4` bytes.
    pub send_pda: u8,
    /// PDUs longer than this are refused before their bytes are read.
    pub max_pdu_len: u32,
}

impl Default for Framing {
    /// The framing before ICReq/ICResp: no digests, no alignment.
    fn default() -> Framing {
        Framing {
            digests: Digests::default(),
            send_pda: 0,
            max_pdu_len: DEFAULT_MAX_PDU_LEN,
        }
    }
}

/// Why bytes are not a valid PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// Fewer bytes than a common header (only from [`pdu_len`]).
    #[error("PDU shorter than its common header")]
    Truncated,
    /// A header field is wrong; `offset` is its byte offset in the PDU.
    #[error("invalid PDU header field at byte {offset}: {reason}")]
    InvalidField { offset: u32, reason: &'static str },
    /// PLEN is beyond what this side accepts.
    #[error("PDU of {plen} bytes exceeds the limit of {max}")]
    TooLong { plen: u32, max: u32 },
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data digest of a command's data is wrong. The framing is intact, so the
    /// connection may go on: the command fails with a transient transport error.
    /// `len` is how many bytes the PDU took.
    #[error("data digest mismatch for command {cccid}")]
    DataDigest { cccid: u16, len: usize },
}

impl PduError {
    /// The fatal error status a TermReq reports for this error.
    pub fn fes(&self) -> u16 {
        match self {
            PduError::Truncated | PduError::InvalidField { .. } => fes::INVALID_PDU_HEADER_FIELD,
            PduError::TooLong { .. } => fes::DATA_LIMIT_EXCEEDED,
            PduError::HeaderDigest => fes::HEADER_DIGEST_ERROR,
            // Not fatal; if a transport still ends the connection, it is a header
            // field (the digest) that the data does not match.
            PduError::DataDigest { .. } => fes::INVALID_PDU_HEADER_FIELD,
        }
    }

    /// The fatal error information: the offset of the bad field.
    pub fn fei(&self) -> u32 {
        match self {
            PduError::InvalidField { offset, .. } => *offset,
            PduError::TooLong { .. } => 4,
            _ => 0,
        }
    }

    /// Whether the connection must end (every error but a data digest).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, PduError::DataDigest { .. })
    }
}

/// `value` rounded up to a multiple of `align` (a power of two or any positive).
pub(crate) fn align_up(value: usize, align: usize) -> usize {
    value.div_ceil(align) * align
}
