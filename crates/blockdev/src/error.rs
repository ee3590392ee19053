//! One neutral error type for every device. Each protocol maps [`ErrorKind`] to its
//! own codes in a single table at its edge (NBD errno values, SCSI sense, AoE errors).

use std::fmt;
use std::io;

/// The operation that failed; carried as context and used by protocol error tables
/// (NBD, for instance, wants ENOSPC for a write past the end but EINVAL for a read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Open,
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Extents,
    Cache,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Open => "open",
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write-zeroes",
            Op::Extents => "extents",
            Op::Cache => "cache",
        })
    }
}

/// What went wrong, independent of any protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The range ends beyond the device (or overflows).
    OutOfRange,
    /// Offset or length is not a multiple of the device's minimum block size.
    Misaligned,
    /// The request is larger than the device or protocol accepts in one piece.
    TooLarge,
    /// The device (or export) is read-only.
    ReadOnly,
    /// The device cannot do this operation (or cannot do it fast, for fast zeroing).
    Unsupported,
    /// The backing store ran out of space (or quota, or file size limit).
    NoSpace,
    /// A malformed request that is none of the above.
    InvalidArgument,
    /// The medium failed (EIO and friends).
    Io,
    /// Out of memory.
    NoMemory,
    /// A remote device did not answer in time.
    TimedOut,
    /// A remote device went away.
    Disconnected,
    /// The server is shutting down.
    ShuttingDown,
}

impl ErrorKind {
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::OutOfRange => "range beyond the end of the device",
            ErrorKind::Misaligned => "not aligned to the device's block size",
            ErrorKind::TooLarge => "request too large",
            ErrorKind::ReadOnly => "device is read-only",
            ErrorKind::Unsupported => "operation not supported",
            ErrorKind::NoSpace => "no space left",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Io => "I/O error",
            ErrorKind::NoMemory => "out of memory",
            ErrorKind::TimedOut => "timed out",
            ErrorKind::Disconnected => "disconnected",
            ErrorKind::ShuttingDown => "shutting down",
        }
    }

    /// The kind an OS error belongs to.
    pub fn from_io(err: &io::Error) -> ErrorKind {
        match err.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => ErrorKind::NoSpace,
            Some(libc::EROFS) | Some(libc::EPERM) | Some(libc::EACCES) => ErrorKind::ReadOnly,
            Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::ENOTTY) => {
                ErrorKind::Unsupported
            }
            Some(libc::EINVAL) => ErrorKind::InvalidArgument,
            Some(libc::ENOMEM) => ErrorKind::NoMemory,
            Some(libc::ETIMEDOUT) => ErrorKind::TimedOut,
            Some(libc::ECONNRESET) | Some(libc::EPIPE) | Some(libc::ENOTCONN) => {
                ErrorKind::Disconnected
            }
            _ => ErrorKind::Io,
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A device error: a stable kind, the operation and range it concerned, and the
/// underlying OS error if there was one.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    op: Op,
    offset: u64,
    len: u64,
    detail: Option<String>,
    source: Option<io::Error>,
}

/// Result of a device operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` for `op` on the byte range `offset..offset+len`.
    pub fn new(kind: ErrorKind, op: Op, offset: u64, len: u64) -> Error {
        Error {
            kind,
            op,
            offset,
            len,
            detail: None,
            source: None,
        }
    }

    /// An error from the OS, its kind derived from the errno.
    pub fn from_io(source: io::Error, op: Op, offset: u64, len: u64) -> Error {
        Error {
            kind: ErrorKind::from_io(&source),
            op,
            offset,
            len,
            detail: None,
            source: Some(source),
        }
    }

    /// Adds a human-readable explanation.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Error {
        self.detail = Some(detail.into());
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn op(&self) -> Op {
        self.op
    }

    pub fn offset(&self) -> u64 {
        self.offset
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Op::Flush | Op::Open => write!(f, "{}: {}", self.op, self.kind)?,
            _ => write!(
                f,
                "{} of {} bytes at offset {}: {}",
                self.op, self.len, self.offset, self.kind
            )?,
        }
        if let Some(detail) = &self.detail {
            write!(f, " ({detail})")?;
        }
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_map_to_kinds() {
        let cases = [
            (libc::ENOSPC, ErrorKind::NoSpace),
            (libc::EDQUOT, ErrorKind::NoSpace),
            (libc::EFBIG, ErrorKind::NoSpace),
            (libc::EROFS, ErrorKind::ReadOnly),
            (libc::EOPNOTSUPP, ErrorKind::Unsupported),
            (libc::EIO, ErrorKind::Io),
            (libc::EINVAL, ErrorKind::InvalidArgument),
        ];
        for (errno, kind) in cases {
            assert_eq!(
                ErrorKind::from_io(&io::Error::from_raw_os_error(errno)),
                kind
            );
        }
    }

    #[test]
    fn display_names_operation_range_and_cause() {
        let err = Error::from_io(
            io::Error::from_raw_os_error(libc::EIO),
            Op::Write,
            4096,
            512,
        )
        .with_detail("disk 0");
        let text = err.to_string();
        assert!(text.starts_with("write of 512 bytes at offset 4096: I/O error (disk 0)"));
    }
}
