//! librbd's negative errno values as our neutral error kinds, with the image and
//! the librbd call named; and the one-line errors of opening an image.

use std::fmt;

use blockwire_blockdev::{Error, Op};

use crate::ffi::CallError;

/// A failed request: the kind comes from the errno (ETIMEDOUT is a timeout, EROFS
/// read-only, ...); the detail names the image and the librbd function.
pub fn request_error(call: CallError, image: &str, op: Op, offset: u64, len: u64) -> Error {
    let detail = format!("rbd image {image}, {}", call.function);
    Error::from_io(call.io(), op, offset, len).with_detail(detail)
}

/// Why an image could not be opened, in one line naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenError {
    /// `rbd:POOL/IMAGE[@SNAP]`.
    pub spec: String,
    pub message: String,
    /// The errno behind it, if any.
    pub errno: Option<i32>,
}

impl OpenError {
    pub fn new(spec: impl Into<String>, message: impl Into<String>) -> OpenError {
        OpenError {
            spec: spec.into(),
            message: message.into(),
            errno: None,
        }
    }

    /// An error from a librados/librbd call, explained for the common errnos of
    /// `what` ("connect", "pool", "image", "lock").
    pub fn from_call(spec: &str, what: Stage, call: CallError, subject: &str) -> OpenError {
        let reason = match (what, call.errno) {
            (Stage::Connect, libc::EACCES) | (Stage::Connect, libc::EPERM) => {
                "the cluster refused the key (check id= and keyring=)".to_string()
            }
            (Stage::Connect, libc::ENOENT) => {
                "no key for this user (check id= and keyring=)".to_string()
            }
            (Stage::Connect, libc::ETIMEDOUT) => {
                "no monitor answered in time (check conf= and mon_host)".to_string()
            }
            (Stage::Config, libc::ENOENT) => format!("cannot read configuration {subject}"),
            (Stage::Pool, libc::ENOENT) => format!("pool '{subject}' does not exist"),
            (Stage::Image, libc::ENOENT) => format!("image or snapshot '{subject}' does not exist"),
            (Stage::Lock, _) => {
                format!("cannot take the exclusive lock of '{subject}' (another client holds it?)")
            }
            _ => subject.to_string(),
        };
        OpenError {
            spec: spec.to_string(),
            message: format!("{reason} ({call})"),
            errno: Some(call.errno),
        }
    }
}

/// Which step of opening failed, for [`OpenError::from_call`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Config,
    Connect,
    Pool,
    Image,
    Lock,
    Query,
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.spec, self.message)
    }
}

impl std::error::Error for OpenError {}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::ErrorKind;

    #[test]
    fn errnos_map_to_kinds_and_name_the_image() {
        let call = |errno| CallError {
            function: "rbd_aio_write",
            errno,
        };
        let cases = [
            (libc::ETIMEDOUT, ErrorKind::TimedOut),
            (libc::EROFS, ErrorKind::ReadOnly),
            (libc::EIO, ErrorKind::Io),
            (libc::ENOSPC, ErrorKind::NoSpace),
            (EBLOCKLISTED_OR_ESHUTDOWN, ErrorKind::Io),
        ];
        for (errno, kind) in cases {
            let error = request_error(call(errno), "rbd/disk", Op::Write, 4096, 512);
            assert_eq!(error.kind(), kind, "errno {errno}");
            assert!(error
                .to_string()
                .contains("rbd image rbd/disk, rbd_aio_write"));
        }
    }

    /// ESHUTDOWN: what librados answers once the client was blocklisted.
    const EBLOCKLISTED_OR_ESHUTDOWN: i32 = libc::ESHUTDOWN;

    #[test]
    fn open_errors_are_one_line_naming_the_subject() {
        let call = CallError {
            function: "rbd_open",
            errno: libc::ENOENT,
        };
        let error = OpenError::from_call("rbd:rbd/nope", Stage::Image, call, "nope");
        let text = error.to_string();
        assert!(text.starts_with("rbd:rbd/nope: image or snapshot 'nope' does not exist"));
        assert!(!text.contains('\n'));
    }
}
