//! The iSCSI PDU codec (RFC 7143 §11), sans-IO: a header's bytes in, a typed PDU out,
//! and back. Data segments stay with the caller (a target reads Data-Out straight
//! into the command's buffer), so PDUs here carry only their headers; the
//! DataSegmentLength is passed beside them.

mod bhs;
pub mod frame;
mod initiator;
mod target;
pub mod text;

pub use bhs::{
    crc32c, crc32c_append, data_digest, digest_bytes, digest_value, header_digest, padded, Bhs,
    BHS_LEN, DIGEST_LEN, MAX_DATA_SEGMENT, RESERVED_TAG,
};
pub use initiator::{
    DataOut, LoginRequest, LogoutReason, LogoutRequest, NopOut, ScsiCommand, Snack, TaskAttribute,
    TaskFunction, TaskMgmtRequest, TextRequest,
};
pub use target::{
    AsyncMessage, DataIn, LoginResponse, LogoutResponse, NopIn, R2t, Reject, RejectReason,
    ResidualKind, ScsiResponse, TaskMgmtResponse, TextResponse,
};

/// Opcodes (RFC 7143 §11.2.1.2).
pub mod opcode {
    pub const NOP_OUT: u8 = 0x00;
    pub const SCSI_COMMAND: u8 = 0x01;
    pub const TASK_MGMT_REQUEST: u8 = 0x02;
    pub const LOGIN_REQUEST: u8 = 0x03;
    pub const TEXT_REQUEST: u8 = 0x04;
    pub const DATA_OUT: u8 = 0x05;
    pub const LOGOUT_REQUEST: u8 = 0x06;
    pub const SNACK: u8 = 0x10;
    pub const NOP_IN: u8 = 0x20;
    pub const SCSI_RESPONSE: u8 = 0x21;
    pub const TASK_MGMT_RESPONSE: u8 = 0x22;
    pub const LOGIN_RESPONSE: u8 = 0x23;
    pub const TEXT_RESPONSE: u8 = 0x24;
    pub const DATA_IN: u8 = 0x25;
    pub const LOGOUT_RESPONSE: u8 = 0x26;
    pub const R2T: u8 = 0x31;
    pub const ASYNC_MESSAGE: u8 = 0x32;
    pub const REJECT: u8 = 0x3f;
}

/// Why a header does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    #[error("AHS is malformed: {0}")]
    BadAhs(&'static str),
    #[error("{0}")]
    BadField(&'static str),
}

/// Every PDU type, decoded from its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pdu {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    Snack(Snack),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

/// An encoded header: the BHS and any Additional Header Segments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    pub bhs: Bhs,
    pub ahs: Vec<u8>,
}

impl Header {
    /// The header as one byte run (BHS then AHS), ready to send.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(BHS_LEN + self.ahs.len());
        out.extend_from_slice(&self.bhs.0);
        out.extend_from_slice(&self.ahs);
        out
    }
}

impl Pdu {
    /// Decodes a header. `ahs` holds exactly the BHS's TotalAHSLength bytes.
    pub fn decode(bhs: &Bhs, ahs: &[u8]) -> Result<Pdu, PduError> {
        if ahs.len() != bhs.ahs_len() {
            return Err(PduError::BadAhs("length differs from TotalAHSLength"));
        }
        Ok(match bhs.opcode() {
            opcode::NOP_OUT => Pdu::NopOut(NopOut::decode(bhs)),
            opcode::SCSI_COMMAND => Pdu::ScsiCommand(ScsiCommand::decode(bhs, ahs)?),
            opcode::TASK_MGMT_REQUEST => Pdu::TaskMgmtRequest(TaskMgmtRequest::decode(bhs)),
            opcode::LOGIN_REQUEST => Pdu::LoginRequest(LoginRequest::decode(bhs)),
            opcode::TEXT_REQUEST => Pdu::TextRequest(TextRequest::decode(bhs)),
            opcode::DATA_OUT => Pdu::DataOut(DataOut::decode(bhs)),
            opcode::LOGOUT_REQUEST => Pdu::LogoutRequest(LogoutRequest::decode(bhs)),
            opcode::SNACK => Pdu::Snack(Snack::decode(bhs)),
            opcode::NOP_IN => Pdu::NopIn(NopIn::decode(bhs)),
            opcode::SCSI_RESPONSE => Pdu::ScsiResponse(ScsiResponse::decode(bhs)),
            opcode::TASK_MGMT_RESPONSE => Pdu::TaskMgmtResponse(TaskMgmtResponse::decode(bhs)),
            opcode::LOGIN_RESPONSE => Pdu::LoginResponse(LoginResponse::decode(bhs)),
            opcode::TEXT_RESPONSE => Pdu::TextResponse(TextResponse::decode(bhs)),
            opcode::DATA_IN => Pdu::DataIn(DataIn::decode(bhs)),
            opcode::LOGOUT_RESPONSE => Pdu::LogoutResponse(LogoutResponse::decode(bhs)),
            opcode::R2T => Pdu::R2t(R2t::decode(bhs)),
            opcode::ASYNC_MESSAGE => Pdu::AsyncMessage(AsyncMessage::decode(bhs)),
            opcode::REJECT => Pdu::Reject(Reject::decode(bhs)),
            other => return Err(PduError::UnknownOpcode(other)),
        })
    }

    /// Encodes the header of a PDU whose data segment is `data_len` bytes.
    pub fn encode(&self, data_len: u32) -> Header {
        let (mut bhs, ahs) = match self {
            Pdu::NopOut(p) => (p.encode(), Vec::new()),
            Pdu::ScsiCommand(p) => p.encode(),
            Pdu::TaskMgmtRequest(p) => (p.encode(), Vec::new()),
            Pdu::LoginRequest(p) => (p.encode(), Vec::new()),
            Pdu::TextRequest(p) => (p.encode(), Vec::new()),
            Pdu::DataOut(p) => (p.encode(), Vec::new()),
            Pdu::LogoutRequest(p) => (p.encode(), Vec::new()),
            Pdu::Snack(p) => (p.encode(), Vec::new()),
            Pdu::NopIn(p) => (p.encode(), Vec::new()),
            Pdu::ScsiResponse(p) => (p.encode(), Vec::new()),
            Pdu::TaskMgmtResponse(p) => (p.encode(), Vec::new()),
            Pdu::LoginResponse(p) => (p.encode(), Vec::new()),
            Pdu::TextResponse(p) => (p.encode(), Vec::new()),
            Pdu::DataIn(p) => (p.encode(), Vec::new()),
            Pdu::LogoutResponse(p) => (p.encode(), Vec::new()),
            Pdu::R2t(p) => (p.encode(), Vec::new()),
            Pdu::AsyncMessage(p) => (p.encode(), Vec::new()),
            Pdu::Reject(p) => (p.encode(), Vec::new()),
        };
        bhs.set_ahs_len(ahs.len());
        bhs.set_data_len(data_len);
        Header { bhs, ahs }
    }
}

#[cfg(test)]
mod tests;
