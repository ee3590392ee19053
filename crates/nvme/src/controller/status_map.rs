//! The one table from blockwire's neutral error kinds to NVMe status codes.

use blockwire_blockdev::{Error, ErrorKind, Op};

use crate::cqe::Status;

/// The status a command fails with when its device operation fails.
pub fn status_for(error: &Error) -> Status {
    match error.kind() {
        ErrorKind::OutOfRange => Status::LBA_OUT_OF_RANGE,
        ErrorKind::Misaligned | ErrorKind::TooLarge | ErrorKind::InvalidArgument => {
            Status::INVALID_FIELD
        }
        ErrorKind::ReadOnly => Status::NAMESPACE_WRITE_PROTECTED,
        ErrorKind::Unsupported => Status::INVALID_OPCODE,
        ErrorKind::NoSpace => Status::CAPACITY_EXCEEDED,
        ErrorKind::Io => match error.op() {
            Op::Read => Status::UNRECOVERED_READ_ERROR,
            Op::Write | Op::WriteZeroes | Op::Trim | Op::Flush => Status::WRITE_FAULT,
            _ => Status::INTERNAL_ERROR,
        },
        ErrorKind::NoMemory => Status::INTERNAL_ERROR,
        // The device behind is a remote one that may come back: the host retries
        // (no DNR), which is what rides out a gateway's upstream restart.
        ErrorKind::TimedOut | ErrorKind::Disconnected => Status::NAMESPACE_NOT_READY,
        ErrorKind::ShuttingDown => Status::ABORTED_SQ_DELETION,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let e = |kind, op| Error::new(kind, op, 0, 512);
        assert_eq!(
            status_for(&e(ErrorKind::OutOfRange, Op::Read)),
            Status::LBA_OUT_OF_RANGE
        );
        assert_eq!(
            status_for(&e(ErrorKind::ReadOnly, Op::Write)),
            Status::NAMESPACE_WRITE_PROTECTED
        );
        assert_eq!(
            status_for(&e(ErrorKind::Io, Op::Read)),
            Status::UNRECOVERED_READ_ERROR
        );
        assert_eq!(
            status_for(&e(ErrorKind::Io, Op::Write)),
            Status::WRITE_FAULT
        );
        assert_eq!(
            status_for(&e(ErrorKind::NoSpace, Op::Write)),
            Status::CAPACITY_EXCEEDED
        );
        let retry = status_for(&e(ErrorKind::Disconnected, Op::Read));
        assert!(!retry.dnr());
    }
}
