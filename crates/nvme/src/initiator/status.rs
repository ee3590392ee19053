//! A failed completion's status as a block device error.

use blockwire_blockdev::{Error, ErrorKind, Op};

use crate::cqe::{sct, Status};

/// What Linux's nvmet answers a command its backing store cannot do (a Write
/// Zeroes on a file system without zero-range fallocate): SCT 1, SC 83h.
const ONCS_NOT_SUPPORTED: Status = Status::new(sct::COMMAND_SPECIFIC, 0x83, true);

/// The error kind a status stands for (the reverse of the target's table).
pub(crate) fn kind_for(status: Status) -> ErrorKind {
    match status {
        Status::LBA_OUT_OF_RANGE => ErrorKind::OutOfRange,
        Status::NAMESPACE_WRITE_PROTECTED => ErrorKind::ReadOnly,
        Status::CAPACITY_EXCEEDED => ErrorKind::NoSpace,
        Status::INVALID_OPCODE | ONCS_NOT_SUPPORTED => ErrorKind::Unsupported,
        Status::INVALID_FIELD | Status::INVALID_NAMESPACE => ErrorKind::InvalidArgument,
        Status::DATA_SGL_LENGTH_INVALID => ErrorKind::TooLarge,
        // The controller lost the command, not the medium: try it elsewhere.
        Status::TRANSIENT_TRANSPORT_ERROR | Status::ABORTED_SQ_DELETION => ErrorKind::Disconnected,
        s if s.sct() == sct::PATH => ErrorKind::Disconnected,
        _ => ErrorKind::Io,
    }
}

/// The error for a command that failed with `status`.
pub(crate) fn error_for(status: Status, op: Op, offset: u64, len: u64) -> Error {
    // Compare the status without DNR and More bits, as the table names them.
    let plain = Status::new(status.sct(), status.sc(), false);
    let with_dnr = Status::new(status.sct(), status.sc(), true);
    let kind = match kind_for(plain) {
        ErrorKind::Io => kind_for(with_dnr),
        kind => kind,
    };
    Error::new(kind, op, offset, len).with_detail(format!("NVMe status {status}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_kinds() {
        let kind = |s| error_for(s, Op::Read, 0, 512).kind();
        assert_eq!(kind(Status::LBA_OUT_OF_RANGE), ErrorKind::OutOfRange);
        assert_eq!(kind(Status::NAMESPACE_WRITE_PROTECTED), ErrorKind::ReadOnly);
        assert_eq!(
            kind(Status::TRANSIENT_TRANSPORT_ERROR),
            ErrorKind::Disconnected
        );
        assert_eq!(kind(Status::UNRECOVERED_READ_ERROR), ErrorKind::Io);
        assert_eq!(kind(ONCS_NOT_SUPPORTED), ErrorKind::Unsupported);
        // The DNR bit does not change the meaning.
        assert_eq!(kind(Status::new(0, 0x80, false)), ErrorKind::OutOfRange);
        assert_eq!(kind(Status::new(3, 0x02, false)), ErrorKind::Disconnected);
    }
}
