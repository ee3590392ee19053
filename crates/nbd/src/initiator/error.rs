//! Errors of connecting and negotiating. Once a connection is in transmission, its
//! failures are device errors ([`blockwire_blockdev::Error`]) like any other device's.

use std::io;

use super::uri::UriError;
use crate::wire::*;

/// Why an initiator could not connect to an export (or list exports).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Uri(#[from] UriError),
    #[error("cannot connect to {address}: {source}")]
    Connect { address: String, source: io::Error },
    #[error("connection to {address} failed during the handshake: {source}")]
    Io { address: String, source: io::Error },
    #[error("{address} closed the connection during the handshake{context}")]
    Closed { address: String, context: String },
    #[error("{address} speaks the oldstyle NBD handshake, which is not supported (only newstyle servers: nbd-server 3.10 or later, nbdkit, qemu-nbd)")]
    Oldstyle { address: String },
    #[error("{address} is not an NBD server: {reason}")]
    NotNbd { address: String, reason: String },
    #[error("{address} broke the NBD handshake: {reason}")]
    Protocol { address: String, reason: String },
    #[error("{address} refused {what}: {reply}{message}")]
    Refused {
        address: String,
        what: String,
        reply: &'static str,
        message: String,
    },
    #[error("TLS with {address}: {reason}")]
    Tls { address: String, reason: String },
    #[error("{address} does not support {what} (it only speaks plain newstyle)")]
    Unsupported { address: String, what: String },
    #[error("connection {index} to {address} disagrees with the first: {reason}")]
    Mismatch {
        address: String,
        index: usize,
        reason: String,
    },
}

impl ClientError {
    /// A refusal with the server's message, if it sent one.
    pub(crate) fn refused(address: &str, what: String, reply: u32, message: &str) -> ClientError {
        ClientError::Refused {
            address: address.to_string(),
            what,
            reply: reply_name(reply),
            message: if message.is_empty() {
                String::new()
            } else {
                format!(" ({message})")
            },
        }
    }
}

/// The protocol's name of an option reply type, for messages.
pub fn reply_name(reply: u32) -> &'static str {
    match reply {
        NBD_REP_ACK => "NBD_REP_ACK",
        NBD_REP_SERVER => "NBD_REP_SERVER",
        NBD_REP_INFO => "NBD_REP_INFO",
        NBD_REP_META_CONTEXT => "NBD_REP_META_CONTEXT",
        NBD_REP_ERR_UNSUP => "NBD_REP_ERR_UNSUP (not supported)",
        NBD_REP_ERR_POLICY => "NBD_REP_ERR_POLICY (forbidden by policy)",
        NBD_REP_ERR_INVALID => "NBD_REP_ERR_INVALID (invalid)",
        NBD_REP_ERR_PLATFORM => "NBD_REP_ERR_PLATFORM (not on this platform)",
        NBD_REP_ERR_TLS_REQD => "NBD_REP_ERR_TLS_REQD (TLS required: use an nbds:// URI)",
        NBD_REP_ERR_UNKNOWN => "NBD_REP_ERR_UNKNOWN (no such export)",
        NBD_REP_ERR_SHUTDOWN => "NBD_REP_ERR_SHUTDOWN (server shutting down)",
        NBD_REP_ERR_BLOCK_SIZE_REQD => "NBD_REP_ERR_BLOCK_SIZE_REQD (block sizes required)",
        NBD_REP_ERR_TOO_BIG => "NBD_REP_ERR_TOO_BIG (too big)",
        other if other & NBD_REP_FLAG_ERROR != 0 => "an unknown error",
        _ => "an unknown reply",
    }
}

/// The protocol's name of a transmission error value, for messages.
pub fn error_name(error: u32) -> &'static str {
    match error {
        NBD_EPERM => "NBD_EPERM",
        NBD_EIO => "NBD_EIO",
        NBD_ENOMEM => "NBD_ENOMEM",
        NBD_EINVAL => "NBD_EINVAL",
        NBD_ENOSPC => "NBD_ENOSPC",
        NBD_EOVERFLOW => "NBD_EOVERFLOW",
        NBD_ENOTSUP => "NBD_ENOTSUP",
        NBD_ESHUTDOWN => "NBD_ESHUTDOWN",
        _ => "an unknown NBD error",
    }
}
