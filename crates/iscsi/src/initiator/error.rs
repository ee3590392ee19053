//! The initiator's errors while connecting, logging in and discovering; once a
//! device is open, its I/O errors are `blockwire_blockdev::Error`s.

use std::io;

use super::login::LoginError;
use super::uri::UriError;

#[derive(Debug, thiserror::Error)]
pub enum InitiatorError {
    #[error("{address}: {source}")]
    Io {
        address: String,
        #[source]
        source: io::Error,
    },
    /// One line naming the login status, e.g. "authentication failure (0x0201)".
    #[error("{address}: login to {target} failed: {source}")]
    Login {
        address: String,
        target: String,
        #[source]
        source: LoginError,
    },
    #[error("{address}: {reason}")]
    Protocol { address: String, reason: String },
    #[error(transparent)]
    Uri(#[from] UriError),
    /// A secret that cannot be found or read.
    #[error("{0}")]
    Credentials(String),
    /// The logical unit cannot serve as a block device (or did not answer).
    #[error("{address}: {detail}")]
    Device { address: String, detail: String },
}
