//! Sense data (SPC-4 4.5): the codes we answer with and their two encodings, fixed
//! format (response code 70h) and descriptor format (72h, when the control mode
//! page's D_SENSE bit is set).

/// Sense keys (SPC-4 table 27).
pub mod key {
    pub const NO_SENSE: u8 = 0x00;
    pub const RECOVERED_ERROR: u8 = 0x01;
    pub const NOT_READY: u8 = 0x02;
    pub const MEDIUM_ERROR: u8 = 0x03;
    pub const HARDWARE_ERROR: u8 = 0x04;
    pub const ILLEGAL_REQUEST: u8 = 0x05;
    pub const UNIT_ATTENTION: u8 = 0x06;
    pub const DATA_PROTECT: u8 = 0x07;
    pub const COPY_ABORTED: u8 = 0x0a;
    pub const ABORTED_COMMAND: u8 = 0x0b;
    pub const MISCOMPARE: u8 = 0x0e;
}

/// A sense key with its additional sense code and qualifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Code {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
}

impl Code {
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Code {
        Code { key, asc, ascq }
    }
}

/// The additional sense codes this crate answers with (SPC-4 table D.1).
pub mod codes {
    use super::{key, Code};

    pub const NO_SENSE: Code = Code::new(key::NO_SENSE, 0x00, 0x00);
    pub const INVALID_FIELD_IN_INFORMATION_UNIT: Code = Code::new(key::ILLEGAL_REQUEST, 0x0e, 0x03);
    pub const PARAMETER_LIST_LENGTH_ERROR: Code = Code::new(key::ILLEGAL_REQUEST, 0x1a, 0x00);
    pub const INVALID_COMMAND_OPERATION_CODE: Code = Code::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
    pub const LBA_OUT_OF_RANGE: Code = Code::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
    pub const INVALID_FIELD_IN_CDB: Code = Code::new(key::ILLEGAL_REQUEST, 0x24, 0x00);
    pub const LOGICAL_UNIT_NOT_SUPPORTED: Code = Code::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
    pub const INVALID_FIELD_IN_PARAMETER_LIST: Code = Code::new(key::ILLEGAL_REQUEST, 0x26, 0x00);
    pub const INVALID_RELEASE_OF_PERSISTENT_RESERVATION: Code =
        Code::new(key::ILLEGAL_REQUEST, 0x26, 0x04);
    pub const TOO_MANY_TARGET_DESCRIPTORS: Code = Code::new(key::ILLEGAL_REQUEST, 0x26, 0x06);
    pub const UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE: Code =
        Code::new(key::ILLEGAL_REQUEST, 0x26, 0x07);
    pub const TOO_MANY_SEGMENT_DESCRIPTORS: Code = Code::new(key::ILLEGAL_REQUEST, 0x26, 0x08);
    pub const UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE: Code =
        Code::new(key::ILLEGAL_REQUEST, 0x26, 0x09);
    pub const COPY_ABORTED: Code = Code::new(key::COPY_ABORTED, 0x00, 0x00);
    pub const COPY_TARGET_DEVICE_NOT_REACHABLE: Code = Code::new(key::COPY_ABORTED, 0x0d, 0x02);
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: Code = Code::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
    pub const MEDIUM_REMOVAL_PREVENTED: Code = Code::new(key::ILLEGAL_REQUEST, 0x53, 0x02);
    pub const WRITE_PROTECTED: Code = Code::new(key::DATA_PROTECT, 0x27, 0x00);
    pub const SOFTWARE_WRITE_PROTECTED: Code = Code::new(key::DATA_PROTECT, 0x27, 0x02);
    pub const SPACE_ALLOCATION_FAILED_WRITE_PROTECT: Code =
        Code::new(key::DATA_PROTECT, 0x27, 0x07);
    pub const UNRECOVERED_READ_ERROR: Code = Code::new(key::MEDIUM_ERROR, 0x11, 0x00);
    pub const WRITE_ERROR: Code = Code::new(key::MEDIUM_ERROR, 0x0c, 0x00);
    pub const MISCOMPARE_DURING_VERIFY: Code = Code::new(key::MISCOMPARE, 0x1d, 0x00);
    pub const POWER_ON_OR_RESET: Code = Code::new(key::UNIT_ATTENTION, 0x29, 0x00);
    pub const BUS_DEVICE_RESET: Code = Code::new(key::UNIT_ATTENTION, 0x29, 0x03);
    pub const MODE_PARAMETERS_CHANGED: Code = Code::new(key::UNIT_ATTENTION, 0x2a, 0x01);
    pub const RESERVATIONS_PREEMPTED: Code = Code::new(key::UNIT_ATTENTION, 0x2a, 0x03);
    pub const RESERVATIONS_RELEASED: Code = Code::new(key::UNIT_ATTENTION, 0x2a, 0x04);
    pub const REGISTRATIONS_PREEMPTED: Code = Code::new(key::UNIT_ATTENTION, 0x2a, 0x05);
    pub const LOGICAL_UNIT_NOT_READY_OFFLINE: Code = Code::new(key::NOT_READY, 0x04, 0x12);
    pub const COMMUNICATION_FAILURE: Code = Code::new(key::ABORTED_COMMAND, 0x08, 0x00);
    pub const COMMUNICATION_TIMEOUT: Code = Code::new(key::ABORTED_COMMAND, 0x08, 0x01);
    pub const INSUFFICIENT_RESOURCES: Code = Code::new(key::ABORTED_COMMAND, 0x55, 0x03);
}

/// Where in the CDB or parameter list a bad field is (SPC-4 4.5.2.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    /// In the CDB (C/D = 1) rather than the parameter list.
    pub in_cdb: bool,
    pub byte: u16,
    pub bit: Option<u8>,
}

/// Sense data to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub code: Code,
    /// The INFORMATION field (an LBA, or a miscompare offset).
    pub information: Option<u64>,
    pub field: Option<FieldPointer>,
}

impl Sense {
    pub fn new(code: Code) -> Sense {
        Sense {
            code,
            information: None,
            field: None,
        }
    }

    pub fn with_information(mut self, information: u64) -> Sense {
        self.information = Some(information);
        self
    }

    pub fn with_field(mut self, field: FieldPointer) -> Sense {
        self.field = Some(field);
        self
    }

    fn sense_key_specific(&self) -> Option<[u8; 3]> {
        let field = self.field?;
        let mut first = 0x80; // SKSV
        if field.in_cdb {
            first |= 0x40;
        }
        if let Some(bit) = field.bit {
            first |= 0x08 | (bit & 0x07);
        }
        let [hi, lo] = field.byte.to_be_bytes();
        Some([first, hi, lo])
    }

    /// The encoded bytes: fixed format (18 bytes) or descriptor format.
    pub fn encode(&self, descriptor: bool) -> Vec<u8> {
        if descriptor {
            self.encode_descriptor()
        } else {
            self.encode_fixed()
        }
    }

    fn encode_fixed(&self) -> Vec<u8> {
        let mut out = vec![0u8; 18];
        out[0] = 0x70;
        out[2] = self.code.key & 0x0f;
        out[7] = 10; // additional sense length
        out[12] = self.code.asc;
        out[13] = self.code.ascq;
        if let Some(info) = self.information {
            // The fixed format only has four bytes; larger values leave VALID clear.
            if let Ok(info) = u32::try_from(info) {
                out[0] |= 0x80;
                out[3..7].copy_from_slice(&info.to_be_bytes());
            }
        }
        if let Some(sks) = self.sense_key_specific() {
            out[15..18].copy_from_slice(&sks);
        }
        out
    }

    fn encode_descriptor(&self) -> Vec<u8> {
        let mut out = vec![
            0x72,
            self.code.key & 0x0f,
            self.code.asc,
            self.code.ascq,
            0,
            0,
            0,
            0,
        ];
        if let Some(info) = self.information {
            // Information descriptor (SPC-4 4.5.2.2).
            out.extend_from_slice(&[0x00, 0x0a, 0x80, 0x00]);
            out.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(sks) = self.sense_key_specific() {
            // Sense key specific descriptor (SPC-4 4.5.2.4).
            out.extend_from_slice(&[0x02, 0x06, 0x00, 0x00, sks[0], sks[1], sks[2], 0x00]);
        }
        out[7] = (out.len() - 8) as u8;
        out
    }

    /// The key, ASC and ASCQ of encoded sense data in either format.
    pub fn parse_code(bytes: &[u8]) -> Option<Code> {
        match bytes.first()? & 0x7f {
            0x70 | 0x71 => Some(Code::new(
                bytes.get(2)? & 0x0f,
                *bytes.get(12).unwrap_or(&0),
                *bytes.get(13).unwrap_or(&0),
            )),
            0x72 | 0x73 => Some(Code::new(
                bytes.get(1)? & 0x0f,
                *bytes.get(2).unwrap_or(&0),
                *bytes.get(3).unwrap_or(&0),
            )),
            _ => None,
        }
    }

    /// The INFORMATION field of encoded sense data, when VALID.
    pub fn parse_information(bytes: &[u8]) -> Option<u64> {
        match bytes.first()? {
            0xf0 | 0xf1 => {
                let raw: [u8; 4] = bytes.get(3..7)?.try_into().ok()?;
                Some(u64::from(u32::from_be_bytes(raw)))
            }
            0x72 | 0x73 => {
                let mut at = 8;
                while let (Some(&kind), Some(&len)) = (bytes.get(at), bytes.get(at + 1)) {
                    if kind == 0 {
                        let raw: [u8; 8] = bytes.get(at + 4..at + 12)?.try_into().ok()?;
                        return Some(u64::from_be_bytes(raw));
                    }
                    at += 2 + usize::from(len);
                }
                None
            }
            _ => None,
        }
    }
}

impl From<Code> for Sense {
    fn from(code: Code) -> Sense {
        Sense::new(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_vector() {
        let sense = Sense::new(codes::INVALID_FIELD_IN_CDB).with_field(FieldPointer {
            in_cdb: true,
            byte: 1,
            bit: Some(5),
        });
        assert_eq!(
            sense.encode(false),
            [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0x00, 0, 0xcd, 0x00, 0x01]
        );
    }

    #[test]
    fn fixed_format_information() {
        let bytes = Sense::new(codes::MISCOMPARE_DURING_VERIFY)
            .with_information(0x1234)
            .encode(false);
        assert_eq!(bytes[0], 0xf0);
        assert_eq!(&bytes[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!(Sense::parse_information(&bytes), Some(0x1234));
        assert_eq!(
            Sense::parse_code(&bytes),
            Some(codes::MISCOMPARE_DURING_VERIFY)
        );
    }

    #[test]
    fn descriptor_format_vector() {
        let bytes = Sense::new(codes::LBA_OUT_OF_RANGE)
            .with_information(0x0102_0304_0506_0708)
            .encode(true);
        assert_eq!(
            bytes,
            [0x72, 0x05, 0x21, 0x00, 0, 0, 0, 12, 0x00, 0x0a, 0x80, 0x00, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(Sense::parse_code(&bytes), Some(codes::LBA_OUT_OF_RANGE));
        assert_eq!(
            Sense::parse_information(&bytes),
            Some(0x0102_0304_0506_0708)
        );
    }

    #[test]
    fn parse_rejects_garbage() {
        assert_eq!(Sense::parse_code(&[]), None);
        assert_eq!(Sense::parse_code(&[0x12, 0, 0]), None);
        assert_eq!(
            Sense::parse_information(&[0x72, 0, 0, 0, 0, 0, 0, 4, 0, 9]),
            None
        );
    }
}
