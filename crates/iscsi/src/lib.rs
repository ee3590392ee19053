//! iSCSI (RFC 7143) for blockwire: a sans-IO PDU codec and login negotiation, and
//! the target that serves `blockwire_scsi` logical units over TCP, and the initiator
//! that reaches a target's logical unit as a block device.

pub mod initiator;
pub mod login;
pub mod pdu;
pub mod target;

pub use target::{IscsiConfig, IscsiTarget, ReloadHandle, ShutdownHandle, TargetDefinition};
