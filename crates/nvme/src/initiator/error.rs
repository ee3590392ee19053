//! Why connecting to an NVMe/TCP controller failed.

use crate::cqe::Status;

/// An error while connecting or setting a controller up. I/O errors once
/// connected are [`blockwire_blockdev::Error`]s.
#[derive(Debug, thiserror::Error)]
pub enum InitiatorError {
    #[error("bad NVMe/TCP URI {uri}: {reason}")]
    Uri { uri: String, reason: String },
    #[error("NVMe/TCP {address}: {source}")]
    Io {
        address: String,
        source: std::io::Error,
    },
    #[error("NVMe/TCP {address}: {what} failed with {status}")]
    Command {
        address: String,
        what: &'static str,
        status: Status,
    },
    #[error("NVMe/TCP {address}: {reason}")]
    Protocol { address: String, reason: String },
}
