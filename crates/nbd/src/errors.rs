//! The one table from our neutral error kinds to NBD error values (proto.md, "Error
//! values"), and back for the initiator.

use blockwire_blockdev::{ErrorKind, Op};

use crate::wire::*;

/// The NBD error value for a device error of `kind` during `op`.
///
/// The protocol asks for ENOSPC on writes past the end but EINVAL on reads and trims
/// past the end, so the operation matters.
pub fn nbd_error(kind: ErrorKind, op: Op) -> u32 {
    match kind {
        ErrorKind::OutOfRange => match op {
            Op::Write | Op::WriteZeroes => NBD_ENOSPC,
            _ => NBD_EINVAL,
        },
        ErrorKind::Misaligned | ErrorKind::InvalidArgument => NBD_EINVAL,
        ErrorKind::TooLarge => NBD_EOVERFLOW,
        ErrorKind::ReadOnly => NBD_EPERM,
        ErrorKind::Unsupported => match op {
            // ENOTSUP is reserved for refused fast zeroes; anything else unsupported
            // is an invalid request.
            Op::WriteZeroes => NBD_ENOTSUP,
            _ => NBD_EINVAL,
        },
        ErrorKind::NoSpace => NBD_ENOSPC,
        ErrorKind::NoMemory => NBD_ENOMEM,
        ErrorKind::ShuttingDown => NBD_ESHUTDOWN,
        ErrorKind::Io | ErrorKind::TimedOut | ErrorKind::Disconnected => NBD_EIO,
    }
}

/// The neutral kind for an NBD error value received from a server. Unknown values are
/// treated as EINVAL, as the protocol asks.
pub fn error_kind(nbd_error: u32) -> ErrorKind {
    match nbd_error {
        NBD_EPERM => ErrorKind::ReadOnly,
        NBD_EIO => ErrorKind::Io,
        NBD_ENOMEM => ErrorKind::NoMemory,
        NBD_ENOSPC => ErrorKind::NoSpace,
        NBD_EOVERFLOW => ErrorKind::TooLarge,
        NBD_ENOTSUP => ErrorKind::Unsupported,
        NBD_ESHUTDOWN => ErrorKind::ShuttingDown,
        _ => ErrorKind::InvalidArgument,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_depends_on_the_operation() {
        assert_eq!(nbd_error(ErrorKind::OutOfRange, Op::Write), NBD_ENOSPC);
        assert_eq!(
            nbd_error(ErrorKind::OutOfRange, Op::WriteZeroes),
            NBD_ENOSPC
        );
        assert_eq!(nbd_error(ErrorKind::OutOfRange, Op::Read), NBD_EINVAL);
        assert_eq!(nbd_error(ErrorKind::OutOfRange, Op::Trim), NBD_EINVAL);
    }

    #[test]
    fn read_only_is_eperm_and_fast_zero_refusal_is_enotsup() {
        assert_eq!(nbd_error(ErrorKind::ReadOnly, Op::Write), NBD_EPERM);
        assert_eq!(
            nbd_error(ErrorKind::Unsupported, Op::WriteZeroes),
            NBD_ENOTSUP
        );
        assert_eq!(nbd_error(ErrorKind::Unsupported, Op::Trim), NBD_EINVAL);
    }

    #[test]
    fn every_value_maps_back() {
        for value in [
            NBD_EPERM,
            NBD_EIO,
            NBD_ENOMEM,
            NBD_EINVAL,
            NBD_ENOSPC,
            NBD_EOVERFLOW,
            NBD_ENOTSUP,
            NBD_ESHUTDOWN,
        ] {
            let kind = error_kind(value);
            assert_ne!(kind, ErrorKind::Disconnected);
        }
        assert_eq!(error_kind(9999), ErrorKind::InvalidArgument);
    }
}
