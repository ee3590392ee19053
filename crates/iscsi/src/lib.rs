//! iSCSI (RFC 7143) for blockwire: a sans-IO PDU codec and login negotiation, and
//! the target that serves `blockwire_scsi` logical units over TCP.

pub mod login;
pub mod pdu;
pub mod target;

pub use target::{IscsiConfig, IscsiTarget, ShutdownHandle, TargetDefinition};
