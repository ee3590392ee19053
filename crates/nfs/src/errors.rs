//! libnfs' negative errno values as our neutral error kinds, with the file and the
//! call named; and the one-line errors of opening a file.

use std::fmt;

use blockwire_blockdev::{Error, ErrorKind, Op};

use crate::ffi::CallError;

/// The kind of a failed request: the blockdev mapping (ENOSPC no space, EROFS and
/// EACCES read-only, ETIMEDOUT timed out, ...), with a lost or refused connection
/// counted as a disconnect.
pub fn kind_of(errno: i32) -> ErrorKind {
    match errno {
        libc::ECONNREFUSED
        | libc::ECONNABORTED
        | libc::EHOSTUNREACH
        | libc::ENETUNREACH
        | libc::ESHUTDOWN => ErrorKind::Disconnected,
        errno => ErrorKind::from_io(&std::io::Error::from_raw_os_error(errno)),
    }
}

/// A failed request, naming the file and the libnfs call.
pub fn request_error(call: &CallError, url: &str, op: Op, offset: u64, len: u64) -> Error {
    Error::new(kind_of(call.errno), op, offset, len).with_detail(format!("{url}, {call}"))
}

/// Why a file could not be opened, in one line naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenError {
    /// The URL as given (without its options).
    pub url: String,
    pub message: String,
    /// What kind of failure, for callers that tell them apart.
    pub stage: Stage,
}

/// Which step of opening failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The URL does not parse.
    Url,
    /// libnfs is not installed.
    Library,
    /// No TCP connection to the server.
    Unreachable,
    /// The server refused the export or has no such export.
    Export,
    /// The file is missing, a directory, or cannot be opened or created.
    File,
}

impl OpenError {
    pub fn new(url: impl Into<String>, stage: Stage, message: impl Into<String>) -> OpenError {
        OpenError {
            url: url.into(),
            message: message.into(),
            stage,
        }
    }

    /// `nfs_mount` failed: the export is refused or does not exist (the server
    /// answered: reachability is checked before).
    pub fn export(url: &str, export: &str, server: &str, call: &CallError) -> OpenError {
        OpenError::new(
            url,
            Stage::Export,
            format!("{server} refused export {export} or has no such export ({call})"),
        )
    }

    /// Opening or creating the file failed.
    pub fn file(url: &str, file: &str, export: &str, call: &CallError) -> OpenError {
        let reason = match call.errno {
            libc::ENOENT => format!("{file} does not exist in export {export}"),
            libc::EACCES | libc::EPERM => format!("{file} in export {export}: permission denied"),
            libc::EISDIR => format!("{file} in export {export} is a directory"),
            _ => format!("cannot open {file} in export {export}"),
        };
        OpenError::new(url, Stage::File, format!("{reason} ({call})"))
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.url, self.message)
    }
}

impl std::error::Error for OpenError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(errno: i32) -> CallError {
        CallError {
            function: "nfs_pwrite",
            errno,
            message: "NFS3ERR_SOMETHING".into(),
        }
    }

    #[test]
    fn errnos_map_to_kinds_and_name_the_file_and_call() {
        for (errno, kind) in [
            (libc::ENOSPC, ErrorKind::NoSpace),
            (libc::EDQUOT, ErrorKind::NoSpace),
            (libc::EROFS, ErrorKind::ReadOnly),
            (libc::EACCES, ErrorKind::ReadOnly),
            (libc::ETIMEDOUT, ErrorKind::TimedOut),
            (libc::ECONNRESET, ErrorKind::Disconnected),
            (libc::ECONNREFUSED, ErrorKind::Disconnected),
            (libc::EHOSTUNREACH, ErrorKind::Disconnected),
            (libc::EIO, ErrorKind::Io),
        ] {
            let error = request_error(&call(errno), "nfs://h/e/f", Op::Write, 4096, 512);
            assert_eq!(error.kind(), kind, "errno {errno}");
            let text = error.to_string();
            assert!(text.contains("nfs://h/e/f, nfs_pwrite"), "{text}");
            assert!(text.contains("NFS3ERR_SOMETHING"), "{text}");
        }
    }

    #[test]
    fn open_errors_are_one_line_naming_the_url_and_the_reason() {
        let missing = OpenError::file("nfs://h/e/f", "/f", "/e", &call(libc::ENOENT));
        let text = missing.to_string();
        assert!(
            text.starts_with("nfs://h/e/f: /f does not exist in export /e"),
            "{text}"
        );
        assert!(!text.contains('\n'));
        let refused = OpenError::export("nfs://h/e/f", "/e", "h", &call(libc::EACCES));
        assert!(refused
            .to_string()
            .contains("h refused export /e or has no such export"));
        assert_eq!(refused.stage, Stage::Export);
    }
}
