//! The NBD initiator: an NBD export as a [`blockwire_blockdev::BlockDevice`].
//!
//! - [`uri`]: `nbd://host[:port]/export` and `nbd+unix:///export?socket=PATH`;
//! - `handshake`: fixed newstyle negotiation over the sans-IO codec
//!   ([`crate::wire`]): structured replies, `base:allocation`, NBD_OPT_GO with a
//!   fallback to NBD_OPT_EXPORT_NAME, and NBD_OPT_LIST;
//! - [`reply`]: reply parsing without I/O, checking every chunk against its request;
//! - `connection` and `reader`: one socket per connection, a shared writer and a
//!   read side completing requests out of order by cookie (a reader thread, or a
//!   request queue's own thread while it exists: `queue`);
//! - [`NbdClient`]: the device, spreading requests over one or more connections;
//! - `fake_server` (tests only, and with the `test-support` feature): a scripted
//!   NBD server to test the initiator against.
//!
//! ```no_run
//! use std::sync::Arc;
//! use blockwire_blockdev::Device;
//! use blockwire_nbd::initiator::{ClientOptions, NbdClient, NbdUri};
//!
//! let uri: NbdUri = "nbd://127.0.0.1/disk".parse()?;
//! let client = NbdClient::connect(&uri, ClientOptions::default())?;
//! let device = Device::new(Arc::new(client));
//! let mut block = vec![0u8; 4096];
//! device.read(&mut block, 0)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod connection;
mod details;
mod device;
mod error;
// Public only for the crate's integration tests (the `test-support` feature, which
// they turn on through a dev-dependency of the crate on itself): one scripted server
// for unit and integration tests alike, and none in a release build.
#[cfg(any(test, feature = "test-support"))]
pub mod fake_server;
mod handshake;
mod poll_budget;
mod queue;
#[cfg(test)]
mod queue_reading_tests;
mod reader;
mod reconnect;
pub mod reply;
mod slot;
mod socket;
#[cfg(test)]
mod transmission_tests;
pub mod uri;

pub use details::{ExportDetails, FLAG_WORDS};
pub use device::{allocation_type, ClientOptions, NbdClient, DEFAULT_RECONNECT};
pub use error::{error_name, reply_name, ClientError};
pub use uri::{Endpoint, NbdUri, UriError, DEFAULT_PORT};

/// The exports a server offers, as (name, description) pairs (NBD_OPT_LIST; the
/// export name in the URI is ignored).
pub fn list_exports(uri: &NbdUri) -> Result<Vec<(String, String)>, ClientError> {
    let timeout = ClientOptions::default().handshake_timeout;
    let (_, exports) = socket::connect_and(uri, timeout, |socket, address, starttls| {
        handshake::list(socket, address, starttls)
    })?;
    Ok(exports)
}
