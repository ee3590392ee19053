//! The iSCSI initiator: a logical unit of an iSCSI target as a
//! [`blockwire_blockdev::BlockDevice`], and SendTargets discovery.
//!
//! - [`uri`]: `iscsi://[user[%password]@]host[:port]/IQN/LUN`, libiscsi's form;
//! - [`login`]: the initiator's side of the login phase, sans-IO (CHAP one-way and
//!   mutual, the operational keys), which tests drive against the target's
//!   [`crate::login::LoginMachine`] without sockets;
//! - [`session`]: command window and data sequencing rules, sans-IO;
//! - `wire`, `connect`: PDUs on a socket, the login driver, SendTargets;
//! - `connection`, `reader`, `task`: the full feature phase — many commands in
//!   flight, Data-In straight into the caller's buffer, R2Ts served from it, pings,
//!   the request timeout;
//! - `recovery`: riding out a dropped connection (reinstatement, identity check,
//!   replay);
//! - [`scsi`]: the CDBs we send and the answers we parse (from
//!   [`blockwire_scsi::initiator`]), and what iSCSI adds to a command's outcome;
//! - [`IscsiClient`]: the device, and its request queue.
//!
//! ```no_run
//! use std::sync::Arc;
//! use blockwire_blockdev::Device;
//! use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
//!
//! let uri: IscsiUri = "iscsi://127.0.0.1/iqn.2026-11.dev.blockwire:disk/0".parse()?;
//! let client = IscsiClient::connect(&uri, IscsiOptions::default())?;
//! let device = Device::new(Arc::new(client));
//! let mut block = vec![0u8; 4096];
//! device.read(&mut block, 0)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod connect;
mod connection;
#[cfg(test)]
mod connection_tests;
mod device;
mod error;
mod inventory;
pub mod login;
#[cfg(test)]
mod login_tests;
mod queue;
mod reader;
mod recovery;
pub mod scsi;
pub mod session;
mod task;
pub mod uri;
mod wire;

pub use connect::{parse_send_targets, DiscoveredTarget};
pub use connection::DEFAULT_NOP_INTERVAL;
pub use device::{
    credentials, IscsiClient, IscsiOptions, LunDetails, DEFAULT_INITIATOR_NAME, DEFAULT_RECONNECT,
};
pub use error::InitiatorError;
pub use inventory::{inventory, LunSummary};
pub use login::{status_name, Credentials, LoginError, SessionParams};
pub use scsi::{device_type_name, Capacity, Inquiry};
pub use uri::{IscsiUri, UriError, DEFAULT_PORT, SECRET_ENV, TARGET_SECRET_ENV};

/// Lists the targets a portal offers (SendTargets=All on a discovery session).
pub fn discover(
    uri: &IscsiUri,
    options: &IscsiOptions,
) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let address = uri.address();
    let stream = connect::dial(&address, options.login_timeout)?;
    let login_options = login::LoginOptions {
        initiator_name: uri
            .initiator
            .clone()
            .unwrap_or_else(|| DEFAULT_INITIATOR_NAME.to_string()),
        target_name: None,
        isid: 0x80 << 40 | u64::from(std::process::id() & 0xff_ffff) << 16,
        tsih: 0,
        cid: 0,
        cmd_sn: 1,
        chap: credentials(uri)?,
        digests: uri.digest,
    };
    let params = connect::login(&stream, &address, login_options, options.login_timeout)?;
    connect::send_targets(&stream, &address, &params)
}
