//! The one table from a device error to the errno a FUSE request answers with.

use blockwire_blockdev::{Error, ErrorKind, Op};

/// The errno for a failed device request. A block device answers EIO for anything
/// the medium or the link did; the few kinds a caller can act on keep their own
/// code (a write past the end is ENOSPC, as on a block device).
pub fn errno_for(error: &Error) -> i32 {
    errno_for_kind(error.kind(), error.op())
}

/// [`errno_for`] from the kind and operation alone.
pub fn errno_for_kind(kind: ErrorKind, op: Op) -> i32 {
    match kind {
        ErrorKind::ReadOnly => libc::EROFS,
        ErrorKind::NoSpace => libc::ENOSPC,
        ErrorKind::OutOfRange if writes(op) => libc::ENOSPC,
        ErrorKind::OutOfRange
        | ErrorKind::Misaligned
        | ErrorKind::TooLarge
        | ErrorKind::InvalidArgument => libc::EINVAL,
        ErrorKind::Unsupported => libc::EOPNOTSUPP,
        ErrorKind::NoMemory => libc::ENOMEM,
        // Timeouts and lost connections reach us only once the initiator has given
        // up reconnecting (it waits through a target restart); to the file system on
        // top that is a failed medium.
        ErrorKind::Io | ErrorKind::TimedOut | ErrorKind::Disconnected | ErrorKind::ShuttingDown => {
            libc::EIO
        }
    }
}

fn writes(op: Op) -> bool {
    matches!(op, Op::Write | Op::Trim | Op::WriteZeroes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_errno() {
        let table = [
            (ErrorKind::ReadOnly, Op::Write, libc::EROFS),
            (ErrorKind::NoSpace, Op::Write, libc::ENOSPC),
            (ErrorKind::OutOfRange, Op::Write, libc::ENOSPC),
            (ErrorKind::OutOfRange, Op::WriteZeroes, libc::ENOSPC),
            (ErrorKind::OutOfRange, Op::Read, libc::EINVAL),
            (ErrorKind::Misaligned, Op::Read, libc::EINVAL),
            (ErrorKind::TooLarge, Op::Write, libc::EINVAL),
            (ErrorKind::InvalidArgument, Op::Read, libc::EINVAL),
            (ErrorKind::Unsupported, Op::Trim, libc::EOPNOTSUPP),
            (ErrorKind::NoMemory, Op::Read, libc::ENOMEM),
            (ErrorKind::Io, Op::Read, libc::EIO),
            (ErrorKind::TimedOut, Op::Write, libc::EIO),
            (ErrorKind::Disconnected, Op::Flush, libc::EIO),
            (ErrorKind::ShuttingDown, Op::Read, libc::EIO),
        ];
        for (kind, op, errno) in table {
            assert_eq!(errno_for_kind(kind, op), errno, "{kind:?} on {op}");
        }
    }

    #[test]
    fn a_device_error_maps_through_its_kind() {
        let error = Error::new(ErrorKind::Disconnected, Op::Read, 4096, 512);
        assert_eq!(errno_for(&error), libc::EIO);
        let error = Error::new(ErrorKind::OutOfRange, Op::Write, 1 << 20, 512);
        assert_eq!(errno_for(&error), libc::ENOSPC);
    }
}
