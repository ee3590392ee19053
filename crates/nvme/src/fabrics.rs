//! Fabrics commands: Connect (and its 1024-byte data), Property Get and Set.

use crate::opcodes::{admin, fctype};
use crate::sqe::{SglDescriptor, Sqe};

/// Length of the data a Connect command carries.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Controller ID a host sends to ask for any controller (the dynamic model).
pub const DYNAMIC_CNTLID: u16 = 0xffff;
/// The well-known NQN of a discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// A Connect command's fields (SQE CDW10..12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    pub cid: u16,
    /// Record format, 0.
    pub recfmt: u16,
    /// Queue: 0 for the admin queue.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes (priority, sq flow control disable).
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue only; 0 disables).
    pub kato: u32,
}

impl Connect {
    /// Reads a Connect SQE (None unless it is one).
    pub fn from_sqe(sqe: &Sqe) -> Option<Connect> {
        if sqe.opcode() != admin::FABRICS || sqe.fctype() != fctype::CONNECT {
            return None;
        }
        Some(Connect {
            cid: sqe.cid(),
            recfmt: sqe.u16_at(40),
            qid: sqe.u16_at(42),
            sqsize: sqe.u16_at(44),
            cattr: sqe.0[46],
            kato: sqe.u32_at(48),
        })
    }

    /// The SQE for this Connect, its data in the capsule.
    pub fn to_sqe(&self) -> Sqe {
        let mut sqe = Sqe::new(admin::FABRICS, self.cid);
        sqe.set_fctype(fctype::CONNECT);
        sqe.set_sgl(SglDescriptor::in_capsule(CONNECT_DATA_LEN as u32));
        sqe.0[40..42].copy_from_slice(&self.recfmt.to_le_bytes());
        sqe.0[42..44].copy_from_slice(&self.qid.to_le_bytes());
        sqe.0[44..46].copy_from_slice(&self.sqsize.to_le_bytes());
        sqe.0[46] = self.cattr;
        sqe.0[48..52].copy_from_slice(&self.kato.to_le_bytes());
        sqe
    }
}

/// The data of a Connect command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConnectData {
    pub host_id: [u8; 16],
    /// [`DYNAMIC_CNTLID`] on the admin queue; the admin queue's controller on I/O
    /// queues.
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

/// Why a Connect's data was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectDataError {
    #[error("connect data is {0} bytes, not 1024")]
    Length(usize),
    #[error("the {0} NQN is not NUL-terminated UTF-8")]
    BadNqn(&'static str),
}

impl ConnectData {
    /// Byte offset in the data where the subsystem NQN starts (host NQN at 512).
    const SUBNQN_AT: usize = 256;
    const HOSTNQN_AT: usize = 512;
    const NQN_LEN: usize = 256;

    pub fn parse(bytes: &[u8]) -> Result<ConnectData, ConnectDataError> {
        if bytes.len() < CONNECT_DATA_LEN {
            return Err(ConnectDataError::Length(bytes.len()));
        }
        let nqn = |at: usize, which: &'static str| {
            let field = &bytes[at..at + Self::NQN_LEN];
            let end = field
                .iter()
                .position(|&b| b == 0)
                .ok_or(ConnectDataError::BadNqn(which))?;
            std::str::from_utf8(&field[..end])
                .map(str::to_owned)
                .map_err(|_| ConnectDataError::BadNqn(which))
        };
        Ok(ConnectData {
            host_id: bytes[0..16].try_into().expect("16 bytes"),
            cntlid: u16::from_le_bytes([bytes[16], bytes[17]]),
            subnqn: nqn(Self::SUBNQN_AT, "subsystem")?,
            hostnqn: nqn(Self::HOSTNQN_AT, "host")?,
        })
    }

    /// The 1024 bytes; NQNs longer than 255 bytes are cut.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0; CONNECT_DATA_LEN];
        out[0..16].copy_from_slice(&self.host_id);
        out[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        let put = |out: &mut [u8], at: usize, nqn: &str| {
            let n = nqn.len().min(Self::NQN_LEN - 1);
            out[at..at + n].copy_from_slice(&nqn.as_bytes()[..n]);
        };
        put(&mut out, Self::SUBNQN_AT, &self.subnqn);
        put(&mut out, Self::HOSTNQN_AT, &self.hostnqn);
        out
    }
}

/// A Property Get or Set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertyCommand {
    Get {
        offset: u32,
        eight_bytes: bool,
    },
    Set {
        offset: u32,
        eight_bytes: bool,
        value: u64,
    },
}

impl PropertyCommand {
    /// Reads a Property Get/Set SQE (None unless it is one).
    pub fn from_sqe(sqe: &Sqe) -> Option<PropertyCommand> {
        if sqe.opcode() != admin::FABRICS {
            return None;
        }
        let eight_bytes = sqe.0[40] & 0x7 == 1;
        let offset = sqe.u32_at(44);
        match sqe.fctype() {
            fctype::PROPERTY_GET => Some(PropertyCommand::Get {
                offset,
                eight_bytes,
            }),
            fctype::PROPERTY_SET => Some(PropertyCommand::Set {
                offset,
                eight_bytes,
                value: sqe.u64_at(48),
            }),
            _ => None,
        }
    }

    /// The SQE for this command.
    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = Sqe::new(admin::FABRICS, cid);
        let (fctype, offset, eight_bytes, value) = match *self {
            PropertyCommand::Get {
                offset,
                eight_bytes,
            } => (fctype::PROPERTY_GET, offset, eight_bytes, 0),
            PropertyCommand::Set {
                offset,
                eight_bytes,
                value,
            } => (fctype::PROPERTY_SET, offset, eight_bytes, value),
        };
        sqe.set_fctype(fctype);
        sqe.0[40] = u8::from(eight_bytes);
        sqe.0[44..48].copy_from_slice(&offset.to_le_bytes());
        sqe.0[48..56].copy_from_slice(&value.to_le_bytes());
        sqe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_sqe_vector() {
        let connect = Connect {
            cid: 7,
            recfmt: 0,
            qid: 1,
            sqsize: 127,
            cattr: 0,
            kato: 0,
        };
        let sqe = connect.to_sqe();
        let b = sqe.0;
        assert_eq!(b[0], 0x7f);
        assert_eq!(b[1], 0x40);
        assert_eq!(&b[2..4], &[7, 0]);
        assert_eq!(b[4], 0x01);
        assert_eq!(&b[32..36], &[0x00, 0x04, 0, 0]);
        assert_eq!(b[39], 0x01);
        assert_eq!(&b[42..46], &[1, 0, 127, 0]);
        assert_eq!(Connect::from_sqe(&sqe), Some(connect));
    }

    #[test]
    fn connect_data_round_trip() {
        let data = ConnectData {
            host_id: [9; 16],
            cntlid: DYNAMIC_CNTLID,
            subnqn: "nqn.2026-11.dev.blockwire:disk".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        };
        let bytes = data.to_bytes();
        assert_eq!(bytes.len(), 1024);
        assert_eq!(&bytes[16..18], &[0xff, 0xff]);
        assert_eq!(&bytes[256..260], b"nqn.");
        assert_eq!(ConnectData::parse(&bytes), Ok(data));
        assert_eq!(
            ConnectData::parse(&bytes[..100]),
            Err(ConnectDataError::Length(100))
        );
        let mut unterminated = bytes.clone();
        unterminated[512..768].fill(b'a');
        assert_eq!(
            ConnectData::parse(&unterminated),
            Err(ConnectDataError::BadNqn("host"))
        );
    }

    #[test]
    fn property_round_trip() {
        for cmd in [
            PropertyCommand::Get {
                offset: 0,
                eight_bytes: true,
            },
            PropertyCommand::Set {
                offset: 0x14,
                eight_bytes: false,
                value: 0x460001,
            },
        ] {
            let sqe = cmd.to_sqe(3);
            assert_eq!(PropertyCommand::from_sqe(&sqe), Some(cmd));
        }
    }
}
