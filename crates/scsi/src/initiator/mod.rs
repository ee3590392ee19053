//! The initiator's side of SCSI, sans-IO: the CDBs an initiator sends
//! ([`cdbs`]), the answers it parses with checked indexing ([`answers`]), and a
//! command's status and sense turned into our neutral error kind ([`status`]) through
//! the same [`Status`](crate::Status) and sense tables the target answers with.
//!
//! It lives beside the target's encoders so each builder meets its decoder
//! ([`crate::cdb`]) and each parser its encoder ([`crate::vpd`], [`crate::inquiry`])
//! in one crate's tests. Any transport (iSCSI today) wraps these.

pub mod answers;
pub mod cdbs;
#[cfg(test)]
mod round_trip_tests;
pub mod status;

pub use answers::{
    device_type_name, opcode_supported, parse_block_limits, parse_capacity, parse_inquiry,
    parse_lba_status, parse_provisioning, parse_report_luns, parse_supported_pages, BlockLimits,
    Capacity, Inquiry, LbaStatus, Provisioning,
};
pub use status::{is_unit_attention, parse_status, sense_code, status_error};
