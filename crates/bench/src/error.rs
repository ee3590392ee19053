//! The bench's errors. Every message is one line that names the problem, because the
//! CLI prints it as is.

use std::io;
use std::path::Path;

/// A benchmark failure.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The target cannot be measured as asked (missing, too small, read-only, holds a
    /// file system, no space, ...).
    #[error("{0}")]
    Target(String),
    /// A device operation failed during a phase.
    #[error("{phase}: {source}")]
    Device {
        phase: String,
        #[source]
        source: blockwire_blockdev::Error,
    },
    /// A file system operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A report could not be read or written.
    #[error("{0}")]
    Report(String),
}

/// Result of a bench operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn target(message: impl Into<String>) -> Error {
        Error::Target(message.into())
    }

    pub(crate) fn device(phase: impl Into<String>, source: blockwire_blockdev::Error) -> Error {
        Error::Device {
            phase: phase.into(),
            source,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn io_at(what: &str, path: &Path, source: io::Error) -> Error {
        Error::io(format!("{what} {}", path.display()), source)
    }
}
