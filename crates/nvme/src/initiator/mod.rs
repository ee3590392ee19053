//! The NVMe/TCP initiator: `nvme+tcp://HOST[:PORT]/SUBNQN[/NSID]` as a block
//! device, on the crate's sans-IO codec.
//!
//! [`NvmeClient::open`] connects the admin queue and several I/O queues (each
//! its own TCP connection), enables the controller and identifies the
//! namespace; reads, writes (FUA), flush, trim (Dataset Management deallocate)
//! and write zeroes are NVM commands spread over the I/O queues, and
//! [`NvmeQueue`] keeps many in flight from one thread. Small writes travel in
//! the command capsule, larger ones answer the controller's R2Ts with H2CData;
//! reads come back as C2HData. A target restart is ridden out: requests in
//! flight go again on a new association (recovery.rs). [`discover`] reads a
//! discovery controller's log.

mod commands;
mod connection;
mod device;
mod discovery;
mod error;
mod frame;
mod options;
mod queue;
mod recovery;
mod send;
mod session;
mod status;

pub use commands::{ControllerIdentity, NamespaceIdentity};
pub use device::NvmeClient;
pub use discovery::{discover, DiscoveryEntry};
pub use error::InitiatorError;
pub use options::{
    host_identity, nqn_for, NvmeOptions, DEFAULT_DISCOVERY_PORT, DEFAULT_PORT, SCHEME,
};
pub use queue::NvmeQueue;
