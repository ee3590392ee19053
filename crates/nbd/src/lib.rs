//! The NBD protocol (NetworkBlockDevice/nbd `doc/proto.md`).
//!
//! - [`wire`]: the sans-IO codec shared by target and initiator: handshake, options,
//!   requests and replies as bytes in, typed messages out, and back;
//! - [`errors`]: the one table mapping our neutral error kinds to NBD error values;
//! - [`server`]: the NBD target, serving any [`blockwire_blockdev::Device`];
//! - [`client`]: the NBD initiator, an export as a [`blockwire_blockdev::BlockDevice`];
//! - [`tls`]: NBD_OPT_STARTTLS's TLS for both, on OpenSSL.

pub mod errors;
pub mod initiator;
pub mod target;
pub mod tls;
pub mod wire;

pub use target::{Export, ExportSet, NbdConfig, NbdTarget, ReloadHandle};
