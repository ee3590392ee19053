//! The SCSI target device: logical units by number, REPORT LUNS, unknown LUNs, unit
//! attentions and task management resets.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use crate::cdb::{self, op, Cdb};
use crate::command::{Command, DecodedCdb, Response, TransferInfo};
use crate::inquiry::{self, NO_LUN};
use crate::lun::{LogicalUnit, LunConfig};
use crate::nexus::{Nexus, NexusKey};
use crate::sense::{codes, Sense};

/// Task management resets (SAM-5 7.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetKind {
    LogicalUnit(u64),
    TargetWarm,
    TargetCold,
}

/// A SCSI target device: its logical units and per-nexus state.
#[derive(Debug, Default)]
pub struct ScsiTarget {
    luns: BTreeMap<u64, Arc<LogicalUnit>>,
    /// Every nexus that has sent a command since it formed, as initiator port to
    /// relative target ports (looked up by `&str`, without allocating, on every
    /// command): resets raise unit attentions for each of them.
    nexuses: RwLock<HashMap<String, Vec<u16>>>,
}

/// Standard INQUIRY identity for LUNs that do not exist.
fn absent_config() -> LunConfig {
    LunConfig::default()
}

/// A LUN number in SAM-5 single-level format (peripheral or flat addressing); larger
/// values are taken as an already encoded 8-byte LUN.
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut out = [0u8; 8];
    if lun < 256 {
        out[1] = lun as u8;
    } else if lun < 0x4000 {
        out[0] = 0x40 | (lun >> 8) as u8;
        out[1] = lun as u8;
    } else {
        out = lun.to_be_bytes();
    }
    out
}

impl ScsiTarget {
    /// A target without logical units.
    pub fn new() -> ScsiTarget {
        ScsiTarget::default()
    }

    /// Adds (or replaces) the logical unit at `lun`.
    pub fn add_lun(&mut self, lun: u64, unit: Arc<LogicalUnit>) {
        self.luns.insert(lun, unit);
    }

    /// The LUN numbers, in order.
    pub fn luns(&self) -> Vec<u64> {
        self.luns.keys().copied().collect()
    }

    /// The logical unit at `lun`.
    pub fn lun(&self, lun: u64) -> Option<&Arc<LogicalUnit>> {
        self.luns.get(&lun)
    }

    pub(crate) fn note_nexus(&self, nexus: &Nexus) {
        let known = self
            .nexuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(nexus.initiator_port.as_str())
            .is_some_and(|ports| ports.contains(&nexus.relative_target_port));
        if !known {
            let mut nexuses = self.nexuses.write().unwrap_or_else(|e| e.into_inner());
            let ports = nexuses.entry(nexus.initiator_port.clone()).or_default();
            if !ports.contains(&nexus.relative_target_port) {
                ports.push(nexus.relative_target_port);
            }
        }
    }

    fn known_nexuses(&self) -> Vec<NexusKey> {
        let nexuses = self.nexuses.read().unwrap_or_else(|e| e.into_inner());
        nexuses
            .iter()
            .flat_map(|(port, targets)| {
                targets.iter().map(|&relative_target_port| NexusKey {
                    initiator_port: port.clone(),
                    relative_target_port,
                })
            })
            .collect()
    }

    fn report_luns(&self, select: u8, alloc: u32) -> Response {
        // SELECT REPORT 00h, 01h (well-known: none), 02h (all) (SPC-4 6.33).
        let luns: Vec<u64> = match select {
            0 | 2 => self.luns(),
            1 => Vec::new(),
            _ => return Response::code(codes::INVALID_FIELD_IN_CDB, u64::from(alloc)),
        };
        let mut out = Vec::with_capacity(8 + 8 * luns.len());
        out.extend_from_slice(&((8 * luns.len()) as u32).to_be_bytes());
        out.extend_from_slice(&[0; 4]);
        for lun in luns {
            out.extend_from_slice(&encode_lun(lun));
        }
        Response::with_allocation(&out, alloc)
    }

    /// Decodes `cdb` for the logical unit `lun`, once: the transport reads what it
    /// transfers and where it may run from the result, then executes it with
    /// [`execute_decoded`](Self::execute_decoded).
    pub fn decode(&self, lun: u64, cdb: &[u8]) -> DecodedCdb {
        let decoded = cdb::decode(cdb);
        let transfer = match (self.luns.get(&lun), &decoded) {
            (Some(unit), Ok(d)) => d.transfer(unit.block_size()),
            // An absent LUN answers only these (SPC-4 6.6.2, 6.29, 6.33).
            (
                None,
                Ok(d @ (Cdb::Inquiry { .. } | Cdb::RequestSense { .. } | Cdb::ReportLuns { .. })),
            ) => d.transfer(512),
            _ => TransferInfo::NONE,
        };
        DecodedCdb {
            lun,
            opcode: cdb.first().copied(),
            cdb: decoded,
            transfer,
        }
    }

    /// Executes one command addressed to `lun`. Handles REPORT LUNS (any LUN),
    /// unknown LUNs, pending unit attentions, and passes the rest to the logical
    /// unit. Blocking; safe to call concurrently for many nexuses.
    pub fn execute(&self, lun: u64, command: &Command<'_>) -> Response {
        self.execute_decoded(&self.decode(lun, command.cdb), command)
    }

    /// [`execute`](Self::execute) for a command whose CDB (`command.cdb`) was
    /// decoded with [`decode`](Self::decode).
    pub fn execute_decoded(&self, decoded: &DecodedCdb, command: &Command<'_>) -> Response {
        let opcode = decoded.opcode;
        if opcode == Some(op::REPORT_LUNS) {
            return match decoded.cdb {
                Ok(Cdb::ReportLuns { select, alloc }) => self.report_luns(select, alloc),
                Ok(_) => Response::code(codes::INVALID_COMMAND_OPERATION_CODE, 0),
                Err(err) => Response::sense(&err.sense(), false, 0),
            };
        }
        let Some(unit) = self.luns.get(&decoded.lun) else {
            return absent_lun(decoded);
        };
        self.note_nexus(command.nexus);
        // SAM-5 5.14: INQUIRY, REPORT LUNS and REQUEST SENSE pass a pending unit
        // attention (REQUEST SENSE reports it as its data); everything else gets it.
        if !matches!(opcode, Some(op::INQUIRY) | Some(op::REQUEST_SENSE)) {
            if let Some(code) = unit.take_unit_attention(command.nexus) {
                return unit.fail(code, decoded.transfer.len);
            }
        }
        if opcode == Some(op::EXTENDED_COPY) {
            let others: Vec<&LogicalUnit> = self
                .luns
                .values()
                .filter(|other| !Arc::ptr_eq(other, unit))
                .map(|other| other.as_ref())
                .collect();
            return unit.execute_decoded(decoded.cdb, command, &others);
        }
        if matches!(opcode, Some(op::MODE_SELECT_6) | Some(op::MODE_SELECT_10)) {
            let before = unit.mode.changes();
            let response = unit.execute_decoded(decoded.cdb, command, &[]);
            if unit.mode.changes() != before {
                // SPC-4 6.9: the other nexuses learn of it by a unit attention.
                for nexus in self.known_nexuses() {
                    if !command.nexus.is(&nexus) {
                        unit.attentions.add(nexus, codes::MODE_PARAMETERS_CHANGED);
                    }
                }
            }
            return response;
        }
        unit.execute_decoded(decoded.cdb, command, &[])
    }

    /// [`execute`](Self::execute) for a READ whose data is all in the device's cache:
    /// it never waits for the device, so a transport may run it on its connection's
    /// own thread. None for any other command, or when the read would wait (or
    /// fail, or a unit attention or reservation is in the way): then `execute` it
    /// where blocking is fine.
    pub fn try_execute_cached(&self, lun: u64, command: &Command<'_>) -> Option<Response> {
        self.try_execute_cached_decoded(&self.decode(lun, command.cdb), command)
    }

    /// [`try_execute_cached`](Self::try_execute_cached) for a decoded CDB.
    pub fn try_execute_cached_decoded(
        &self,
        decoded: &DecodedCdb,
        command: &Command<'_>,
    ) -> Option<Response> {
        let Ok(cdb @ Cdb::Read(_)) = &decoded.cdb else {
            return None;
        };
        let unit = self.luns.get(&decoded.lun)?;
        self.note_nexus(command.nexus);
        unit.try_read_cached(cdb, command)
    }

    /// Whether `cdb` is a WRITE that `lun`'s device finishes without waiting for
    /// hardware (buffered, no FUA, the write cache on): a transport may then
    /// [`execute`](Self::execute) it on its connection's own thread.
    pub fn write_completes_inline(&self, lun: u64, cdb: &[u8]) -> bool {
        self.write_completes_inline_decoded(&self.decode(lun, cdb))
    }

    /// [`write_completes_inline`](Self::write_completes_inline) for a decoded CDB.
    pub fn write_completes_inline_decoded(&self, decoded: &DecodedCdb) -> bool {
        match (&decoded.cdb, self.luns.get(&decoded.lun)) {
            (Ok(cdb @ Cdb::Write(_)), Some(unit)) => unit.write_completes_inline(cdb),
            _ => false,
        }
    }

    /// What the CDB will transfer, so the transport knows how much data-out to
    /// solicit before calling [`execute`](ScsiTarget::execute). Commands that will
    /// fail (unknown operation codes, bad fields) transfer nothing.
    pub fn transfer_info(&self, lun: u64, cdb: &[u8]) -> TransferInfo {
        self.decode(lun, cdb).transfer
    }

    /// Task management: LOGICAL UNIT RESET, TARGET WARM RESET, TARGET COLD RESET.
    /// SPC-2 reservations and PREVENT MEDIUM REMOVAL are released and every known
    /// nexus gets a unit attention; persistent reservations stay (SPC-4 5.12.1).
    /// Aborting the tasks in flight is the transport's part.
    pub fn reset(&self, kind: ResetKind, by: &Nexus) {
        tracing::info!(?kind, initiator = %by.initiator_port, "reset");
        let nexuses = self.known_nexuses();
        match kind {
            ResetKind::LogicalUnit(lun) => {
                if let Some(unit) = self.luns.get(&lun) {
                    unit.reset(codes::BUS_DEVICE_RESET, &nexuses, false);
                }
            }
            ResetKind::TargetWarm | ResetKind::TargetCold => {
                let cold = kind == ResetKind::TargetCold;
                for unit in self.luns.values() {
                    unit.reset(codes::POWER_ON_OR_RESET, &nexuses, cold);
                }
            }
        }
    }

    /// The I_T nexus is gone: its RESERVE(6)/(10) reservations, PREVENT MEDIUM
    /// REMOVAL and pending unit attentions go; persistent registrations stay.
    pub fn nexus_lost(&self, nexus: &Nexus) {
        for unit in self.luns.values() {
            unit.nexus_lost(nexus);
        }
        let mut nexuses = self.nexuses.write().unwrap_or_else(|e| e.into_inner());
        if let Some(ports) = nexuses.get_mut(nexus.initiator_port.as_str()) {
            ports.retain(|&port| port != nexus.relative_target_port);
            if ports.is_empty() {
                nexuses.remove(nexus.initiator_port.as_str());
            }
        }
    }
}

/// The answer of a LUN that does not exist: INQUIRY and REQUEST SENSE say so in
/// their data, everything else fails with LOGICAL UNIT NOT SUPPORTED.
fn absent_lun(decoded: &DecodedCdb) -> Response {
    match decoded.cdb {
        Ok(Cdb::Inquiry {
            evpd: false, alloc, ..
        }) => Response::with_allocation(&inquiry::standard(&absent_config(), NO_LUN), alloc),
        Ok(Cdb::RequestSense { descriptor, alloc }) => {
            // SPC-4 6.29: REQUEST SENSE to an absent LUN reports it as data.
            let sense = Sense::new(codes::LOGICAL_UNIT_NOT_SUPPORTED).encode(descriptor);
            Response::with_allocation(&sense, alloc)
        }
        Ok(other) => Response::code(codes::LOGICAL_UNIT_NOT_SUPPORTED, other.transfer(512).len),
        Err(_) => Response::code(codes::LOGICAL_UNIT_NOT_SUPPORTED, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{DataDirection, Status};
    use blockwire_blockdev::{Device, MemoryDevice};

    fn target() -> ScsiTarget {
        let mut target = ScsiTarget::new();
        let device = Device::from_device(MemoryDevice::new(1 << 20));
        let unit = LogicalUnit::new(device, LunConfig::default()).expect("logical unit");
        target.add_lun(0, Arc::new(unit));
        target
    }

    fn nexus() -> Nexus {
        Nexus {
            initiator_port: "iqn.test:i,i,0x1".into(),
            transport_id: Vec::new(),
            relative_target_port: 1,
        }
    }

    const WRITE_8_BLOCKS: [u8; 10] = [0x2a, 0, 0, 0, 0, 0, 0, 0, 8, 0];
    const INQUIRY_36: [u8; 6] = [0x12, 0, 0, 0, 36, 0];

    #[test]
    fn one_decoding_tells_the_transfer_for_the_lun() {
        let t = target();
        let write = t.decode(0, &WRITE_8_BLOCKS);
        assert_eq!(write.opcode, Some(0x2a));
        assert!(matches!(write.cdb, Ok(Cdb::Write(_))));
        assert_eq!(write.transfer.direction, DataDirection::Out);
        assert_eq!(write.transfer.len, 4096);
        assert_eq!(t.transfer_info(0, &WRITE_8_BLOCKS), write.transfer);
        // An absent LUN moves data only for what it answers itself.
        assert_eq!(t.decode(7, &WRITE_8_BLOCKS).transfer, TransferInfo::NONE);
        assert_eq!(t.decode(7, &INQUIRY_36).transfer.len, 36);
        // A CDB that does not decode transfers nothing.
        let bad = t.decode(0, &[0xff, 0, 0, 0, 0, 0]);
        assert!(bad.cdb.is_err());
        assert_eq!(bad.transfer, TransferInfo::NONE);
    }

    #[test]
    fn a_decoded_command_executes_as_its_bytes_do() {
        let t = target();
        let nexus = nexus();
        let data = vec![0x5a; 4096];
        let command = Command {
            nexus: &nexus,
            cdb: &WRITE_8_BLOCKS,
            data_out: &data,
        };
        let decoded = t.decode(0, command.cdb);
        assert_eq!(t.execute_decoded(&decoded, &command).status, Status::Good);
        let read = [0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0];
        let command = Command {
            nexus: &nexus,
            cdb: &read,
            data_out: &[],
        };
        let response = t.execute_decoded(&t.decode(0, &read), &command);
        assert_eq!(response.data(), &data[..]);
        // To an absent LUN: INQUIRY answers, a READ fails.
        let absent = t.execute_decoded(&t.decode(7, &read), &command);
        assert_eq!(absent.sense_code(), Some(codes::LOGICAL_UNIT_NOT_SUPPORTED));
        let inquiry = Command {
            cdb: &INQUIRY_36,
            ..command
        };
        let answer = t.execute_decoded(&t.decode(7, &INQUIRY_36), &inquiry);
        assert_eq!(answer.status, Status::Good);
        assert_eq!(answer.data()[0], NO_LUN);
    }
}
