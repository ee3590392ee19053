//! The PDUs, one struct each, with the fields of their specific headers.

use crate::cqe::Cqe;
use crate::sqe::Sqe;

/// Which digests a connection uses (negotiated by ICReq/ICResp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    /// The DGST byte of ICReq/ICResp: bit 0 header, bit 1 data.
    pub fn to_byte(self) -> u8 {
        u8::from(self.header) | (u8::from(self.data) << 1)
    }

    pub fn from_byte(byte: u8) -> Digests {
        Digests {
            header: byte & 1 != 0,
            data: byte & 2 != 0,
        }
    }
}

/// Initialize Connection Request (host to controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IcReq {
    /// PDU format version, 0.
    pub pfv: u16,
    /// Host PDU data alignment, 0's based dwords, for C2HData it receives.
    pub hpda: u8,
    /// The digests the host asks for.
    pub digests: Digests,
    /// Most R2Ts outstanding per command the host accepts, 0's based.
    pub maxr2t: u32,
}

/// Initialize Connection Response (controller to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment, 0's based dwords, for data it receives.
    pub cpda: u8,
    /// The digests the connection will use.
    pub digests: Digests,
    /// MAXH2CDATA: the most data one H2CData PDU may carry (at least 4096).
    pub maxh2cdata: u32,
}

/// Fatal error status (FES) values of H2CTermReq/C2HTermReq.
pub mod fes {
    pub const INVALID_PDU_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Most bytes of the offending PDU header a TermReq carries back.
pub const TERM_REQ_MAX_DATA: usize = 152;

/// H2CTermReq or C2HTermReq: a fatal transport error; the sender closes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TermReq {
    /// Fatal error status, see [`fes`].
    pub fes: u16,
    /// Fatal error information: the byte offset of the bad field, for FES 1.
    pub fei: u32,
    /// The header of the PDU in error (at most [`TERM_REQ_MAX_DATA`] bytes).
    pub data: Vec<u8>,
}

/// A command capsule: the SQE and any in-capsule data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapsuleCmd {
    pub sqe: Sqe,
    pub data: Vec<u8>,
}

/// A response capsule: the CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapsuleResp {
    pub cqe: Cqe,
}

/// Host to controller data, answering an R2T.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct H2CData {
    /// Command capsule CID.
    pub cccid: u16,
    /// The transfer tag of the R2T this answers.
    pub ttag: u16,
    /// Where this data goes in the command's data.
    pub offset: u32,
    /// The last H2CData of the R2T.
    pub last: bool,
    pub data: Vec<u8>,
}

/// Controller to host data (a read's data).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct C2HData {
    pub cccid: u16,
    pub offset: u32,
    /// The last C2HData of the command.
    pub last: bool,
    /// The command succeeded and no CapsuleResp follows (only with `last`).
    pub success: bool,
    pub data: Vec<u8>,
}

/// Ready to Transfer: the controller asks for a range of a command's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct R2T {
    pub cccid: u16,
    pub ttag: u16,
    pub offset: u32,
    pub length: u32,
}

/// Any NVMe/TCP PDU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pdu {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTermReq(TermReq),
    C2HTermReq(TermReq),
    CapsuleCmd(CapsuleCmd),
    CapsuleResp(CapsuleResp),
    H2CData(H2CData),
    C2HData(C2HData),
    R2T(R2T),
}

impl Pdu {
    /// The PDU's type.
    pub fn pdu_type(&self) -> super::PduType {
        use super::PduType;
        match self {
            Pdu::IcReq(_) => PduType::IcReq,
            Pdu::IcResp(_) => PduType::IcResp,
            Pdu::H2CTermReq(_) => PduType::H2CTermReq,
            Pdu::C2HTermReq(_) => PduType::C2HTermReq,
            Pdu::CapsuleCmd(_) => PduType::CapsuleCmd,
            Pdu::CapsuleResp(_) => PduType::CapsuleResp,
            Pdu::H2CData(_) => PduType::H2CData,
            Pdu::C2HData(_) => PduType::C2HData,
            Pdu::R2T(_) => PduType::R2T,
        }
    }

    /// The data this PDU carries (empty for those without).
    pub fn data(&self) -> &[u8] {
        match self {
            Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => &t.data,
            Pdu::CapsuleCmd(c) => &c.data,
            Pdu::H2CData(d) => &d.data,
            Pdu::C2HData(d) => &d.data,
            _ => &[],
        }
    }
}
