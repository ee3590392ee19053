//! The AoE initiator: an AoE target as a [`blockwire_blockdev::BlockDevice`].
//!
//! - [`uri`]: `aoe://IFACE/eSHELF.SLOT` and `aoe://eth0,eth1/e1.2`;
//! - [`discovery`]: the config query broadcast and the answers collected;
//! - [`session`]: the protocol state without I/O — tags, the window, the
//!   retransmission timer ([`rtt`]), the checks every answer must pass, the fences
//!   that keep stale write copies from landing on newer data (`fence`);
//! - `engine`: the sockets and threads around the session: callers send their own
//!   frames, one receiver thread per interface completes them;
//! - [`errors`]: ATA and AoE errors to our neutral error kinds;
//! - [`AoeClient`]: the device.
//!
//! ```no_run
//! use std::sync::Arc;
//! use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
//! use blockwire_blockdev::Device;
//!
//! let uri: AoeUri = "aoe://eth0/e1.2".parse()?;
//! let client = AoeClient::open(&uri, AoeOptions::default())?;
//! let device = Device::new(Arc::new(client));
//! let mut block = vec![0u8; 4096];
//! device.read(&mut block, 0)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod device;
pub mod discovery;
mod engine;
pub mod errors;
mod fence;
mod queue;
pub mod rtt;
pub mod session;
pub mod uri;

pub use device::{AoeClient, AoeOptions, AoePath, OpenError, DEFAULT_MAX_WINDOW, MAX_TRANSFER};
pub use discovery::{discover, discover_by_name, format_mac, Found};
pub use session::Stats;
pub use uri::{AoeUri, UriError};
