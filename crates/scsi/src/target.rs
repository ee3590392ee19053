//! The SCSI target device: logical units by number, REPORT LUNS, unknown LUNs, unit
//! attentions and task management resets.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use crate::cdb::{self, op, Cdb};
use crate::command::{Command, Response, TransferInfo};
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

    /// Executes one command addressed to `lun`. Handles REPORT LUNS (any LUN),
    /// unknown LUNs, pending unit attentions, and passes the rest to the logical
    /// unit. Blocking; safe to call concurrently for many nexuses.
    pub fn execute(&self, lun: u64, command: &Command<'_>) -> Response {
        let opcode = command.cdb.first().copied();
        if opcode == Some(op::REPORT_LUNS) {
            return match cdb::decode(command.cdb) {
                Ok(Cdb::ReportLuns { select, alloc }) => self.report_luns(select, alloc),
                Ok(_) => Response::code(codes::INVALID_COMMAND_OPERATION_CODE, 0),
                Err(err) => Response::sense(&err.sense(), false, 0),
            };
        }
        let Some(unit) = self.luns.get(&lun) else {
            return self.absent_lun(command);
        };
        self.note_nexus(command.nexus);
        // SAM-5 5.14: INQUIRY, REPORT LUNS and REQUEST SENSE pass a pending unit
        // attention (REQUEST SENSE reports it as its data); everything else gets it.
        if !matches!(opcode, Some(op::INQUIRY) | Some(op::REQUEST_SENSE)) {
            if let Some(code) = unit.take_unit_attention(command.nexus) {
                let expected = unit.transfer_info(command.cdb).len;
                return unit.fail(code, expected);
            }
        }
        if opcode == Some(op::EXTENDED_COPY) {
            let others: Vec<&LogicalUnit> = self
                .luns
                .values()
                .filter(|other| !Arc::ptr_eq(other, unit))
                .map(|other| other.as_ref())
                .collect();
            return unit.execute_among(command, &others);
        }
        if matches!(opcode, Some(op::MODE_SELECT_6) | Some(op::MODE_SELECT_10)) {
            let before = unit.mode.changes();
            let response = unit.execute(command);
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
        unit.execute(command)
    }

    /// [`execute`](Self::execute) for a READ whose data is all in the device's cache:
    /// it never waits for the device, so a transport may run it on its connection's
    /// own thread. None for any other command, or when the read would wait (or
    /// fail, or a unit attention or reservation is in the way): then `execute` it
    /// where blocking is fine.
    pub fn try_execute_cached(&self, lun: u64, command: &Command<'_>) -> Option<Response> {
        let opcode = *command.cdb.first()?;
        if !matches!(opcode, op::READ_6 | op::READ_10 | op::READ_12 | op::READ_16) {
            return None;
        }
        let unit = self.luns.get(&lun)?;
        self.note_nexus(command.nexus);
        unit.try_read_cached(command)
    }

    /// Whether `cdb` is a WRITE that `lun`'s device finishes without waiting for
    /// hardware (buffered, no FUA, the write cache on): a transport may then
    /// [`execute`](Self::execute) it on its connection's own thread.
    pub fn write_completes_inline(&self, lun: u64, cdb: &[u8]) -> bool {
        self.luns
            .get(&lun)
            .is_some_and(|unit| unit.write_completes_inline(cdb))
    }

    fn absent_lun(&self, command: &Command<'_>) -> Response {
        match cdb::decode(command.cdb) {
            Ok(Cdb::Inquiry {
                evpd: false, alloc, ..
            }) => Response::with_allocation(&inquiry::standard(&absent_config(), NO_LUN), alloc),
            Ok(Cdb::RequestSense { descriptor, alloc }) => {
                // SPC-4 6.29: REQUEST SENSE to an absent LUN reports it as data.
                let sense = Sense::new(codes::LOGICAL_UNIT_NOT_SUPPORTED).encode(descriptor);
                Response::with_allocation(&sense, alloc)
            }
            Ok(decoded) => {
                Response::code(codes::LOGICAL_UNIT_NOT_SUPPORTED, decoded.transfer(512).len)
            }
            Err(_) => Response::code(codes::LOGICAL_UNIT_NOT_SUPPORTED, 0),
        }
    }

    /// What the CDB will transfer, so the transport knows how much data-out to
    /// solicit before calling [`execute`](ScsiTarget::execute). Commands that will
    /// fail (unknown operation codes, bad fields) transfer nothing.
    pub fn transfer_info(&self, lun: u64, cdb: &[u8]) -> TransferInfo {
        match self.luns.get(&lun) {
            Some(unit) => unit.transfer_info(cdb),
            None => match cdb::decode(cdb) {
                Ok(
                    decoded @ (Cdb::Inquiry { .. }
                    | Cdb::RequestSense { .. }
                    | Cdb::ReportLuns { .. }),
                ) => decoded.transfer(512),
                _ => TransferInfo::NONE,
            },
        }
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
