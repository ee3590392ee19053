//! SCSI disk semantics (SPC-4 / SBC-3) on a blockwire [`Device`](blockwire_blockdev::Device).
//!
//! The crate knows nothing of any transport: an iSCSI (or other) target decodes its
//! PDUs, builds a [`Command`] for an I_T nexus ([`Nexus`]) and calls
//! [`ScsiTarget::execute`], which answers with a [`Response`] (status, sense data,
//! data-in). Everything here is blocking, `&self` and safe to call from many threads
//! for many nexuses at once; nothing panics on any CDB or data bytes.
//!
//! Layout: [`cdb`] decodes CDBs (sans-IO), [`sense`] encodes sense data, [`errors`] is
//! the one table between device errors and sense codes, [`inquiry`] and [`vpd`] build
//! INQUIRY data, [`mode`] the mode pages, [`reservation`] the reservation state
//! machine (pure), [`sbc`] the block commands, [`lun`] the per-LU state and dispatch, `spc` INQUIRY and the reservation
//! commands, and
//! [`target`] LUN addressing, REPORT LUNS and unit attentions; [`xcopy`] EXTENDED
//! COPY between logical units.

pub mod cdb;
pub mod command;
pub mod errors;
pub mod initiator;
pub mod inquiry;
pub mod lun;
pub mod mode;
pub mod nexus;
pub mod opcodes;
mod queued;
pub mod reservation;
pub mod sbc;
pub mod sense;
mod spc;
pub mod target;
mod unit_attention;
pub mod vpd;
mod write_gate;
pub mod xcopy;

pub use command::{Command, DataDirection, DecodedCdb, Response, Status, TransferInfo};
pub use errors::{error_kind_for_sense, sense_for_error};
pub use lun::{LogicalUnit, LunConfig, LunError};
pub use nexus::{Nexus, NexusKey};
pub use queued::{QueuedRead, QueuedWrite};
pub use target::{ResetKind, ScsiTarget};
