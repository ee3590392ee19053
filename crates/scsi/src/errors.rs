//! The one table between blockwire's neutral device errors and SCSI sense codes,
//! both ways: the target answers device errors with [`sense_for_error`], an
//! initiator turns a CHECK CONDITION back into an error kind with
//! [`error_kind_for_sense`].

use blockwire_blockdev::{ErrorKind, Op};

use crate::sense::{codes, key, Code};

fn writes(op: Op) -> bool {
    matches!(op, Op::Write | Op::Trim | Op::WriteZeroes | Op::Flush)
}

/// The sense key, ASC and ASCQ for a device error during `op`.
pub fn sense_for_error(kind: ErrorKind, op: Op) -> (u8, u8, u8) {
    let code = code_for_error(kind, op);
    (code.key, code.asc, code.ascq)
}

/// [`sense_for_error`] as a [`Code`].
pub fn code_for_error(kind: ErrorKind, op: Op) -> Code {
    match kind {
        ErrorKind::OutOfRange => codes::LBA_OUT_OF_RANGE,
        ErrorKind::Misaligned | ErrorKind::TooLarge | ErrorKind::InvalidArgument => {
            codes::INVALID_FIELD_IN_CDB
        }
        ErrorKind::ReadOnly => codes::WRITE_PROTECTED,
        ErrorKind::Unsupported => codes::INVALID_COMMAND_OPERATION_CODE,
        // SBC-3 4.7.3.6: a thin device out of space fails writes with this code.
        ErrorKind::NoSpace if writes(op) => codes::SPACE_ALLOCATION_FAILED_WRITE_PROTECT,
        ErrorKind::NoSpace => codes::UNRECOVERED_READ_ERROR,
        ErrorKind::Io if writes(op) => codes::WRITE_ERROR,
        ErrorKind::Io => codes::UNRECOVERED_READ_ERROR,
        // ABORTED COMMAND makes initiators retry, which is right for resources and a
        // remote device that may come back.
        ErrorKind::NoMemory => codes::INSUFFICIENT_RESOURCES,
        ErrorKind::TimedOut => codes::COMMUNICATION_TIMEOUT,
        ErrorKind::Disconnected => codes::COMMUNICATION_FAILURE,
        ErrorKind::ShuttingDown => codes::LOGICAL_UNIT_NOT_READY_OFFLINE,
    }
}

/// The error kind a CHECK CONDITION with this sense stands for: the reverse of
/// [`sense_for_error`], with whole sense keys as the fallback.
pub fn error_kind_for_sense(sense_key: u8, asc: u8, ascq: u8) -> ErrorKind {
    match (sense_key, asc, ascq) {
        (key::ILLEGAL_REQUEST, 0x21, _) => ErrorKind::OutOfRange,
        (key::ILLEGAL_REQUEST, 0x20, _) => ErrorKind::Unsupported,
        (key::ILLEGAL_REQUEST, _, _) => ErrorKind::InvalidArgument,
        (key::DATA_PROTECT, 0x27, 0x07) => ErrorKind::NoSpace,
        (key::DATA_PROTECT, _, _) => ErrorKind::ReadOnly,
        (key::NOT_READY, 0x04, 0x12) => ErrorKind::ShuttingDown,
        (key::NOT_READY, _, _) => ErrorKind::Disconnected,
        (key::ABORTED_COMMAND, 0x08, 0x01) => ErrorKind::TimedOut,
        (key::ABORTED_COMMAND, 0x08, _) => ErrorKind::Disconnected,
        (key::ABORTED_COMMAND, 0x55, _) => ErrorKind::NoMemory,
        (key::MEDIUM_ERROR, _, _) | (key::HARDWARE_ERROR, _, _) => ErrorKind::Io,
        _ => ErrorKind::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ErrorKind; 12] = [
        ErrorKind::OutOfRange,
        ErrorKind::Misaligned,
        ErrorKind::TooLarge,
        ErrorKind::ReadOnly,
        ErrorKind::Unsupported,
        ErrorKind::NoSpace,
        ErrorKind::InvalidArgument,
        ErrorKind::Io,
        ErrorKind::NoMemory,
        ErrorKind::TimedOut,
        ErrorKind::Disconnected,
        ErrorKind::ShuttingDown,
    ];

    #[test]
    fn table_vectors() {
        assert_eq!(
            sense_for_error(ErrorKind::OutOfRange, Op::Read),
            (5, 0x21, 0)
        );
        assert_eq!(
            sense_for_error(ErrorKind::ReadOnly, Op::Write),
            (7, 0x27, 0)
        );
        assert_eq!(sense_for_error(ErrorKind::NoSpace, Op::Write), (7, 0x27, 7));
        assert_eq!(sense_for_error(ErrorKind::Io, Op::Read), (3, 0x11, 0));
        assert_eq!(sense_for_error(ErrorKind::Io, Op::Write), (3, 0x0c, 0));
    }

    #[test]
    fn round_trip_keeps_the_kinds_that_matter() {
        for kind in KINDS {
            for op in [Op::Read, Op::Write] {
                let (k, asc, ascq) = sense_for_error(kind, op);
                let back = error_kind_for_sense(k, asc, ascq);
                let expected = match kind {
                    ErrorKind::Misaligned | ErrorKind::TooLarge => ErrorKind::InvalidArgument,
                    ErrorKind::NoSpace if op == Op::Read => ErrorKind::Io,
                    other => other,
                };
                assert_eq!(back, expected, "{kind:?} during {op:?}");
            }
        }
    }
}
