//! READs and WRITEs for a device's request queue: checked here as
//! [`ScsiTarget::execute`] would check them, run by the transport on the queue
//! without a blocked thread, and answered here from the completion.

use blockwire_blockdev::{IoBuf, Result, WriteFlags};

use crate::cdb::Cdb;
use crate::command::{Command, DecodedCdb, Response};
use crate::sense::codes;
use crate::target::ScsiTarget;
use crate::write_gate::QueuedWriteTicket;

/// A READ (6, 10, 12 or 16) ready for the device's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedRead {
    /// Byte offset and length on the device.
    pub offset: u64,
    pub len: usize,
    /// What the CDB transfers, for the response's residual.
    expected: u64,
}

/// A WRITE ready for the device's queue. It holds its share of the logical
/// unit's write lock until dropped, so keep it until the write has finished.
#[derive(Debug)]
pub struct QueuedWrite {
    /// Byte offset and length on the device; the data-out is exactly `len` long.
    pub offset: u64,
    pub len: usize,
    /// FUA as the unit applies it (asked for, or a disabled write cache).
    pub flags: WriteFlags,
    expected: u64,
    _ticket: QueuedWriteTicket,
}

impl ScsiTarget {
    /// The READ `command` to `lun` as a device request, when it may skip
    /// [`execute`](Self::execute): a READ with no unit attention pending, no
    /// reservation in the way and a valid range. `None` for everything else, which
    /// then goes to `execute` as usual (and is answered there, errors included).
    pub fn plan_read(&self, lun: u64, command: &Command<'_>) -> Option<QueuedRead> {
        self.plan_read_decoded(&self.decode(lun, command.cdb), command)
    }

    /// [`plan_read`](Self::plan_read) for a command whose CDB was decoded with
    /// [`decode`](Self::decode).
    pub fn plan_read_decoded(&self, cdb: &DecodedCdb, command: &Command<'_>) -> Option<QueuedRead> {
        let Ok(decoded @ Cdb::Read(rw)) = cdb.cdb else {
            return None;
        };
        let unit = self.lun(cdb.lun)?;
        if unit.attentions.any() {
            return None;
        }
        let expected = cdb.transfer.len;
        if unit.conflicts(command.nexus, decoded.access()) {
            return None;
        }
        let (offset, len) = unit.transfer_range(rw.lba, rw.blocks).ok()?;
        if len == 0 {
            return None;
        }
        self.note_nexus(command.nexus);
        Some(QueuedRead {
            offset,
            len: len as usize,
            expected,
        })
    }

    /// The response to a READ planned with [`plan_read`](Self::plan_read), from its
    /// completion: the data, or the device's error as sense.
    pub fn finish_read(
        &self,
        lun: u64,
        read: &QueuedRead,
        buf: IoBuf,
        result: Result<()>,
    ) -> Response {
        match (self.lun(lun), result) {
            (_, Ok(())) => Response::with_data(buf, read.expected),
            (Some(unit), Err(e)) => unit.device_error(&e, read.expected),
            (None, Err(_)) => Response::code(codes::LOGICAL_UNIT_NOT_SUPPORTED, read.expected),
        }
    }

    /// The WRITE `command` to `lun` as a device request, when it may skip
    /// [`execute`](Self::execute): a WRITE (6, 10, 12 or 16) of whole blocks, all of
    /// whose data-out has arrived, with no unit attention pending, no reservation
    /// or write protection in the way, a valid range, and nobody holding the
    /// write lock alone (COMPARE AND WRITE, ORWRITE, a cut last block). FUA needs
    /// the device's native FUA, as its queue does. `None` for everything else,
    /// which goes to `execute` as usual.
    pub fn plan_write(&self, lun: u64, command: &Command<'_>) -> Option<QueuedWrite> {
        self.plan_write_decoded(&self.decode(lun, command.cdb), command)
    }

    /// [`plan_write`](Self::plan_write) for a command whose CDB was decoded with
    /// [`decode`](Self::decode).
    pub fn plan_write_decoded(
        &self,
        cdb: &DecodedCdb,
        command: &Command<'_>,
    ) -> Option<QueuedWrite> {
        let Ok(decoded @ Cdb::Write(rw)) = cdb.cdb else {
            return None;
        };
        let unit = self.lun(cdb.lun)?;
        if unit.attentions.any() || unit.write_protection().is_some() {
            return None;
        }
        let expected = cdb.transfer.len;
        if unit.conflicts(command.nexus, decoded.access()) {
            return None;
        }
        let (offset, len) = unit.transfer_range(rw.lba, rw.blocks).ok()?;
        if len == 0 || command.data_out.len() as u64 != len {
            return None;
        }
        let flags = unit.write_flags(rw.fua);
        if flags.fua && !unit.device().info().capabilities.fua.is_native() {
            return None;
        }
        let ticket = unit.write_gate.try_queued()?;
        self.note_nexus(command.nexus);
        Some(QueuedWrite {
            offset,
            len: len as usize,
            flags,
            expected,
            _ticket: ticket,
        })
    }

    /// The response to a WRITE planned with [`plan_write`](Self::plan_write), from
    /// its completion; gives back its share of the write lock.
    pub fn finish_write(&self, lun: u64, write: QueuedWrite, result: Result<()>) -> Response {
        let expected = write.expected;
        drop(write);
        match (self.lun(lun), result) {
            (_, Ok(())) => Response::good(expected),
            (Some(unit), Err(e)) => unit.device_error(&e, expected),
            (None, Err(_)) => Response::code(codes::LOGICAL_UNIT_NOT_SUPPORTED, expected),
        }
    }
}
