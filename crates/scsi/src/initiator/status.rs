//! A command's status and sense as an initiator sees them, turned into our neutral
//! error through the crate's one [`Status`] enum and the one sense table
//! ([`error_kind_for_sense`]) the target answers with.

use blockwire_blockdev::{Error, ErrorKind, Op};

use crate::errors::error_kind_for_sense;
use crate::sense::{key, Code, Sense};
use crate::Status;

/// The status byte of a response (SAM-5 5.3.1), or `None` for a code SAM-5 does
/// not define (or obsoleted).
pub fn parse_status(byte: u8) -> Option<Status> {
    Some(match byte {
        0x00 => Status::Good,
        0x02 => Status::CheckCondition,
        0x04 => Status::ConditionMet,
        0x08 => Status::Busy,
        0x18 => Status::ReservationConflict,
        0x28 => Status::TaskSetFull,
        0x40 => Status::TaskAborted,
        _ => return None,
    })
}

/// The sense key, ASC and ASCQ of sense data in either format.
pub fn sense_code(sense: &[u8]) -> Option<Code> {
    Sense::parse_code(sense)
}

/// Whether a status and its sense are a unit attention: worth one retry
/// (SAM-5 5.14), since it reports an event, not a fault of this command.
pub fn is_unit_attention(status: u8, sense: &[u8]) -> bool {
    parse_status(status) == Some(Status::CheckCondition)
        && sense_code(sense).is_some_and(|code| code.key == key::UNIT_ATTENTION)
}

/// The error for a command of `op` over `offset..offset + len` that ended with
/// `status` (not GOOD) and `sense`.
pub fn status_error(status: u8, sense: &[u8], op: Op, offset: u64, len: u64) -> Error {
    let (kind, detail) = match parse_status(status) {
        Some(Status::CheckCondition) => match sense_code(sense) {
            Some(Code { key, asc, ascq }) => (
                error_kind_for_sense(key, asc, ascq),
                format!("CHECK CONDITION, sense key {key:#x}, ASC/ASCQ {asc:#04x}/{ascq:#04x}"),
            ),
            None => (
                ErrorKind::Io,
                "CHECK CONDITION without usable sense data".to_string(),
            ),
        },
        Some(Status::Busy | Status::TaskSetFull) => (
            ErrorKind::Io,
            format!("the target is busy (status {status:#04x})"),
        ),
        Some(Status::ReservationConflict) => (ErrorKind::Io, "reservation conflict".to_string()),
        Some(Status::TaskAborted) => (ErrorKind::Io, "task aborted".to_string()),
        Some(Status::Good | Status::ConditionMet) | None => {
            (ErrorKind::Io, format!("SCSI status {status:#04x}"))
        }
    };
    Error::new(kind, op, offset, len).with_detail(detail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::codes;

    #[test]
    fn every_status_byte_round_trips() {
        for status in [
            Status::Good,
            Status::CheckCondition,
            Status::ConditionMet,
            Status::Busy,
            Status::ReservationConflict,
            Status::TaskSetFull,
            Status::TaskAborted,
        ] {
            assert_eq!(parse_status(status as u8), Some(status));
        }
        assert_eq!(parse_status(0x22), None);
    }

    #[test]
    fn sense_in_either_format_maps_through_the_one_table() {
        for descriptor in [false, true] {
            let sense = Sense::new(codes::LBA_OUT_OF_RANGE).encode(descriptor);
            let error = status_error(Status::CheckCondition as u8, &sense, Op::Read, 0, 512);
            assert_eq!(error.kind(), ErrorKind::OutOfRange);
            let sense = Sense::new(codes::WRITE_PROTECTED).encode(descriptor);
            let error = status_error(Status::CheckCondition as u8, &sense, Op::Write, 0, 512);
            assert_eq!(error.kind(), ErrorKind::ReadOnly);
        }
        let garbage = status_error(Status::CheckCondition as u8, &[1, 2], Op::Read, 0, 1);
        assert_eq!(garbage.kind(), ErrorKind::Io);
        assert_eq!(
            status_error(Status::Busy as u8, &[], Op::Read, 0, 1).kind(),
            ErrorKind::Io
        );
    }

    #[test]
    fn unit_attention_needs_check_condition_and_its_key() {
        let ua = Sense::new(Code::new(key::UNIT_ATTENTION, 0x29, 0)).encode(false);
        assert!(is_unit_attention(Status::CheckCondition as u8, &ua));
        assert!(!is_unit_attention(Status::Good as u8, &ua));
        let other = Sense::new(codes::LBA_OUT_OF_RANGE).encode(false);
        assert!(!is_unit_attention(Status::CheckCondition as u8, &other));
    }
}
