//! A logical unit: SCSI disk semantics over one checked device handle. This file
//! holds the state and the dispatch plus the SPC (non-block) commands; the block
//! commands are in [`crate::sbc`].

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use blockwire_blockdev::Device;

use crate::cdb::{self, Access, Cdb, CdbError, Rw};
use crate::command::{Command, Response};
use crate::mode::{Geometry, ModeState};
use crate::nexus::{Nexus, NexusKey};
use crate::opcodes;
use crate::reservation::Reservations;
use crate::sense::{codes, Code, Sense};
use crate::unit_attention::UnitAttentions;
use crate::vpd::BlockFacts;
use crate::write_gate::WriteGate;

/// How a logical unit presents itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunConfig {
    /// Logical block size: 512 (default) or 4096 (any power of two from 512 to
    /// 65536 that the device's minimum block size divides).
    pub block_size: u32,
    /// T10 vendor identification, 8 characters (space-padded in INQUIRY).
    pub vendor: String,
    /// Product identification, 16 characters.
    pub product: String,
    /// Product revision level, 4 characters.
    pub revision: String,
    /// Unit serial number (VPD page 80h).
    pub serial: String,
    /// A stable 64-bit value the NAA designator of VPD page 83h is built from.
    pub unique_id: u64,
    /// SCSI name string for the target device designator in VPD page 83h (the
    /// iSCSI target name).
    pub target_name: String,
}

impl Default for LunConfig {
    fn default() -> LunConfig {
        LunConfig {
            block_size: 512,
            vendor: "BLKWIRE".into(),
            product: "blockwire disk".into(),
            revision: "0001".into(),
            serial: "0".into(),
            unique_id: 0,
            target_name: "iqn.2026-11.dev.blockwire:disk0".into(),
        }
    }
}

/// Why a logical unit cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LunError {
    #[error("block size {0} is not a power of two from 512 to 65536")]
    BlockSize(u32),
    #[error("block size {block_size} is not a multiple of the device's minimum block size {device_minimum}")]
    DeviceBlockSize {
        block_size: u32,
        device_minimum: u32,
    },
    #[error("the device ({size} bytes) is smaller than one {block_size}-byte block")]
    TooSmall { size: u64, block_size: u32 },
}

/// How UNMAP and WRITE SAME with UNMAP deallocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deallocate {
    /// Not supported (LBPME = 0).
    None,
    /// Native write-zeroes that may punch holes: deallocated blocks read as zeroes
    /// (LBPRZ = 1).
    Zeroes,
    /// Native trim: deallocated blocks read as anything (LBPRZ = 0).
    Trim,
}

/// One logical unit.
pub struct LogicalUnit {
    pub(crate) device: Device,
    pub(crate) config: LunConfig,
    pub(crate) block_size: u32,
    pub(crate) num_blocks: u64,
    pub(crate) facts: BlockFacts,
    pub(crate) deallocate: Deallocate,
    /// The device has FUA (native or emulated); without it writes are durable anyway.
    pub(crate) fua: bool,
    pub(crate) flush: bool,
    pub(crate) read_only: bool,
    /// log2(physical block / logical block), for READ CAPACITY(16).
    pub(crate) lbppbe: u8,
    pub(crate) mode: ModeState,
    reservations: RwLock<Reservations>,
    /// Mirrors `reservations.any_reservation()`: when clear, no command can meet a
    /// conflict and the data path takes no lock.
    reserved: AtomicBool,
    pub(crate) attentions: UnitAttentions,
    /// Writes take it shared, COMPARE AND WRITE exclusively: the compare and the
    /// write are atomic against every other write (SBC-3 5.2). Queued writes hold
    /// a ticket of it while in flight.
    pub(crate) write_gate: Arc<WriteGate>,
    /// Nexuses with PREVENT MEDIUM REMOVAL in effect (SPC-4 6.13).
    prevent: Mutex<HashSet<NexusKey>>,
    /// Outcomes of EXTENDED COPY commands for RECEIVE COPY RESULTS.
    pub(crate) copy_results: crate::xcopy::HeldResults,
}

impl std::fmt::Debug for LogicalUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogicalUnit")
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Most blocks one UNMAP descriptor or WRITE SAME may cover when the device sets no
/// lower limit.
const MAX_UNMAP_DESCRIPTORS: u32 = 4095;
const MAX_COMPARE_AND_WRITE_BLOCKS: u32 = 255;
/// Largest WRITE SAME in bytes: long enough for any zeroing pass, short enough that
/// a replicated pattern finishes well inside an initiator's command timeout.
const MAX_WRITE_SAME_BYTES: u64 = 1 << 30;

impl LogicalUnit {
    /// A logical unit over `device`.
    pub fn new(device: Device, config: LunConfig) -> Result<LogicalUnit, LunError> {
        let block_size = config.block_size;
        if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
            return Err(LunError::BlockSize(block_size));
        }
        let info = *device.info();
        let minimum = info.block_sizes.minimum.max(1);
        if !block_size.is_multiple_of(minimum) {
            return Err(LunError::DeviceBlockSize {
                block_size,
                device_minimum: minimum,
            });
        }
        let num_blocks = info.size / u64::from(block_size);
        if num_blocks == 0 {
            return Err(LunError::TooSmall {
                size: info.size,
                block_size,
            });
        }
        let caps = info.capabilities;
        let read_only = info.read_only;
        let deallocate = if read_only {
            Deallocate::None
        } else if caps.write_zeroes.is_native() {
            Deallocate::Zeroes
        } else if caps.trim.is_native() {
            Deallocate::Trim
        } else {
            Deallocate::None
        };
        let bs = u64::from(block_size);
        let max_transfer_blocks = (u64::from(info.block_sizes.maximum) / bs).max(1) as u32;
        // The device's preferred size (an RBD object, 4 MiB by default) goes into the
        // block limits page as the optimal transfer granularity and length, however
        // large: initiators size and align their requests by it (Linux: io_opt). The
        // logical block is reported as the physical one (exponent 0), as file-backed
        // targets usually do: libiscsi's GET LBA STATUS checks assume it.
        let physical = info.block_sizes.preferred.max(block_size);
        let preferred_blocks = if physical.is_power_of_two() {
            (physical / block_size).min(max_transfer_blocks)
        } else {
            1
        };
        // Unmap granularity stays at most 16 blocks: a coarser one makes initiators
        // drop smaller discards, and trim is only a hint here anyway.
        let unmap_granularity = if preferred_blocks <= 1 << 4 {
            preferred_blocks
        } else {
            1
        };
        let lbppbe = 0;
        let limit = match deallocate {
            Deallocate::Zeroes => info.limits.max_write_zeroes,
            _ => info.limits.max_trim,
        };
        let facts = BlockFacts {
            max_transfer_blocks,
            optimal_transfer_blocks: preferred_blocks,
            max_compare_and_write_blocks: MAX_COMPARE_AND_WRITE_BLOCKS.min(max_transfer_blocks)
                as u8,
            max_unmap_blocks: (limit / bs).clamp(1, u64::from(u32::MAX)) as u32,
            max_unmap_descriptors: MAX_UNMAP_DESCRIPTORS,
            unmap_granularity,
            max_write_same_blocks: MAX_WRITE_SAME_BYTES / bs,
            unmap: deallocate != Deallocate::None,
            lbprz: deallocate == Deallocate::Zeroes,
            rotational: info.rotational,
        };
        Ok(LogicalUnit {
            fua: caps.fua.available(),
            flush: caps.flush.available(),
            mode: ModeState::new(caps.flush.available()),
            device,
            config,
            block_size,
            num_blocks,
            facts,
            deallocate,
            read_only,
            lbppbe,
            reservations: RwLock::new(Reservations::new()),
            reserved: AtomicBool::new(false),
            attentions: UnitAttentions::default(),
            write_gate: Arc::new(WriteGate::default()),
            prevent: Mutex::new(HashSet::new()),
            copy_results: Default::default(),
        })
    }

    /// The checked device handle the unit serves.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// How the unit presents itself.
    pub fn config(&self) -> &LunConfig {
        &self.config
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Capacity in logical blocks.
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks
    }

    /// CHECK CONDITION in the format the control mode page asks for.
    pub(crate) fn fail(&self, sense: impl Into<Sense>, expected_len: u64) -> Response {
        Response::sense(&sense.into(), self.mode.descriptor_sense(), expected_len)
    }

    pub(crate) fn reservations(&self) -> RwLockReadGuard<'_, Reservations> {
        self.reservations.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn reservations_mut(&self) -> RwLockWriteGuard<'_, Reservations> {
        self.reservations.write().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn publish(&self, state: &Reservations) {
        self.reserved
            .store(state.any_reservation(), Ordering::Release);
    }

    pub(crate) fn queue_attentions(&self, attentions: Vec<(NexusKey, Code)>) {
        for (nexus, code) in attentions {
            self.attentions.add(nexus, code);
        }
    }

    /// The pending unit attention for `nexus`, removed (SAM-5 5.14).
    pub(crate) fn take_unit_attention(&self, nexus: &Nexus) -> Option<Code> {
        self.attentions.take(nexus)
    }

    /// A reset: the SPC-2 reservation and PREVENT MEDIUM REMOVAL go, and every nexus
    /// in `nexuses` gets a unit attention with `code`. Persistent reservations stay.
    pub(crate) fn reset(&self, code: Code, nexuses: &[NexusKey], cold: bool) {
        {
            let mut state = self.reservations_mut();
            state.reset_legacy();
            self.publish(&state);
        }
        self.prevent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if cold {
            self.mode.reset();
        }
        for nexus in nexuses {
            self.attentions.add(nexus.clone(), code);
        }
    }

    /// The nexus is gone: its SPC-2 reservation, PREVENT and unit attentions go.
    pub(crate) fn nexus_lost(&self, nexus: &Nexus) {
        {
            let mut state = self.reservations_mut();
            state.nexus_lost(nexus);
            self.publish(&state);
        }
        self.prevent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k| !nexus.is(k));
        self.attentions.clear(nexus);
    }

    /// Whether a command of class `access` from `nexus` meets a reservation conflict;
    /// free when no reservation exists.
    pub(crate) fn conflicts(&self, nexus: &Nexus, access: Access) -> bool {
        self.reserved.load(Ordering::Acquire) && self.reservations().conflicts(nexus, access)
    }

    /// The sense for a write refused because the unit is write-protected.
    pub(crate) fn write_protection(&self) -> Option<Code> {
        if self.read_only {
            Some(codes::WRITE_PROTECTED)
        } else if self.mode.software_write_protect() {
            Some(codes::SOFTWARE_WRITE_PROTECTED)
        } else {
            None
        }
    }

    /// Whether `cdb` is a plain WRITE that the device finishes without waiting for
    /// hardware: a buffered write into a cache, neither FUA nor write-through (see
    /// [`ScsiTarget::write_completes_inline`](crate::ScsiTarget::write_completes_inline)).
    pub(crate) fn write_completes_inline(&self, cdb: &Cdb) -> bool {
        if !self.device.info().completes_inline {
            return false;
        }
        match cdb {
            Cdb::Write(rw) => !self.write_flags(rw.fua).fua,
            _ => false,
        }
    }

    /// A READ served from the device's cache without waiting (see
    /// [`ScsiTarget::try_execute_cached`](crate::ScsiTarget::try_execute_cached)).
    pub(crate) fn try_read_cached(&self, cdb: &Cdb, command: &Command<'_>) -> Option<Response> {
        if self.attentions.any() {
            return None;
        }
        let expected = cdb.transfer(self.block_size).len;
        match *cdb {
            Cdb::Read(rw) if !self.conflicts(command.nexus, cdb.access()) => {
                self.try_read(rw, expected)
            }
            _ => None,
        }
    }

    /// Executes one command (unit attentions are the caller's, [`crate::ScsiTarget`]).
    /// EXTENDED COPY may only name this logical unit; through the target it may name
    /// any of the target's.
    pub fn execute(&self, command: &Command<'_>) -> Response {
        self.execute_decoded(cdb::decode(command.cdb), command, &[])
    }

    /// [`execute`](LogicalUnit::execute) with the CDB already decoded, and `others`
    /// the logical units EXTENDED COPY may also name.
    pub(crate) fn execute_decoded(
        &self,
        decoded: Result<Cdb, CdbError>,
        command: &Command<'_>,
        others: &[&LogicalUnit],
    ) -> Response {
        let decoded = match decoded {
            Ok(decoded) => decoded,
            Err(err) => return self.fail(err.sense(), 0),
        };
        let expected = decoded.transfer(self.block_size).len;
        if self.conflicts(command.nexus, decoded.access()) {
            return Response::reservation_conflict(expected);
        }
        if decoded.writes_medium() {
            if let Some(code) = self.write_protection() {
                return self.fail(code, expected);
            }
        }
        if let Cdb::ExtendedCopy { param_len } = decoded {
            return crate::xcopy::extended_copy(self, others, command, param_len);
        }
        self.dispatch(decoded, command, expected)
    }

    fn dispatch(&self, decoded: Cdb, command: &Command<'_>, expected: u64) -> Response {
        let nexus = command.nexus;
        let data = command.data_out;
        match decoded {
            Cdb::TestUnitReady => Response::good(0),
            Cdb::RequestSense { descriptor, alloc } => {
                let sense = match self.take_unit_attention(nexus) {
                    Some(code) => Sense::new(code),
                    None => Sense::new(codes::NO_SENSE),
                };
                Response::with_allocation(&sense.encode(descriptor), alloc)
            }
            Cdb::Inquiry { evpd, page, alloc } => self.inquiry(evpd, page, alloc, nexus),
            Cdb::ReportLuns { .. } => {
                // Answered by the target, which knows every LUN.
                self.fail(codes::INVALID_COMMAND_OPERATION_CODE, expected)
            }
            Cdb::ReadCapacity10 => {
                let last = u32::try_from(self.num_blocks - 1).unwrap_or(u32::MAX);
                let mut out = [0u8; 8];
                out[0..4].copy_from_slice(&last.to_be_bytes());
                out[4..8].copy_from_slice(&self.block_size.to_be_bytes());
                Response::with_allocation(&out, 8)
            }
            Cdb::ReadCapacity16 { alloc } => {
                Response::with_allocation(&self.read_capacity16(), alloc)
            }
            Cdb::Read(rw) => self.read(rw, expected),
            Cdb::Write(rw) => self.write(rw, data, expected),
            Cdb::OrWrite(rw) => self.or_write(rw, data, expected),
            // Verification reads the medium, so the data must be on it first.
            Cdb::WriteAndVerify { rw, .. } => self.write(Rw { fua: true, ..rw }, data, expected),
            Cdb::Verify {
                lba,
                blocks,
                bytchk,
            } => self.verify(lba, blocks, bytchk, data, expected),
            Cdb::SynchronizeCache { lba, blocks } => self.synchronize_cache(lba, blocks),
            Cdb::PreFetch { lba, blocks } => self.pre_fetch(lba, blocks),
            Cdb::WriteSame {
                lba,
                blocks,
                unmap,
                ndob,
            } => self.write_same(lba, blocks, unmap, ndob, data, expected),
            Cdb::Unmap { param_len } => self.unmap(param_len, data),
            Cdb::CompareAndWrite { lba, blocks, fua } => {
                self.compare_and_write(lba, blocks, fua, data, expected)
            }
            Cdb::GetLbaStatus { lba, alloc } => self.get_lba_status(lba, alloc),
            Cdb::ModeSense {
                ten,
                dbd,
                llbaa,
                pc,
                page,
                subpage,
                alloc,
            } => match self
                .mode
                .sense(ten, dbd, llbaa, pc, page, subpage, self.geometry())
            {
                Ok(out) => Response::with_allocation(&out, alloc),
                Err(sense) => self.fail(sense, expected),
            },
            Cdb::ModeSelect { ten, sp, param_len } => {
                let params = &data[..data.len().min(param_len as usize)];
                if params.len() < param_len as usize {
                    return self.fail(codes::PARAMETER_LIST_LENGTH_ERROR, expected);
                }
                match self.mode.select(ten, sp, params, self.geometry()) {
                    Ok(_) => Response::good(expected),
                    Err(sense) => self.fail(sense, expected),
                }
            }
            Cdb::StartStopUnit { loej, .. } => {
                // A disk: nothing spins down. Ejecting is refused while any nexus
                // prevents removal (SPC-4 6.13).
                if loej
                    && !self
                        .prevent
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty()
                {
                    return self.fail(codes::MEDIUM_REMOVAL_PREVENTED, 0);
                }
                Response::good(0)
            }
            Cdb::PreventAllow { prevent } => {
                let mut set = self.prevent.lock().unwrap_or_else(|e| e.into_inner());
                if prevent {
                    set.insert(nexus.key());
                } else {
                    set.retain(|k| !nexus.is(k));
                }
                Response::good(0)
            }
            Cdb::Reserve => self.legacy(|state| state.reserve_legacy(nexus)),
            Cdb::Release => self.legacy(|state| state.release_legacy(nexus)),
            Cdb::PersistentReserveIn { action, alloc } => self.persistent_reserve_in(action, alloc),
            Cdb::PersistentReserveOut {
                action,
                scope,
                kind,
                param_len,
            } => self.persistent_reserve_out(nexus, action, scope, kind, param_len, data),
            Cdb::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                action,
                alloc,
            } => match opcodes::report(options, rctd, opcode, action) {
                Some(out) => Response::with_allocation(&out, alloc),
                None => self.fail(
                    CdbError::InvalidField { byte: 2, bit: None }.sense(),
                    expected,
                ),
            },
            Cdb::ExtendedCopy { param_len } => {
                crate::xcopy::extended_copy(self, &[], command, param_len)
            }
            Cdb::ReceiveCopyParameters { alloc } => {
                Response::with_allocation(&crate::xcopy::operating_parameters(), alloc)
            }
            Cdb::ReceiveCopyStatus { list_id, alloc } => {
                match self.copy_results.copy_status(nexus, list_id) {
                    Some(out) => Response::with_allocation(&out, alloc),
                    // No such copy (SPC-4 6.18.1).
                    None => self.fail(
                        CdbError::InvalidField { byte: 2, bit: None }.sense(),
                        expected,
                    ),
                }
            }
            Cdb::ReadDefectData { ten, alloc } => {
                // No defects: an empty list in the format asked for (SBC-3 5.18).
                let out = if ten {
                    vec![0, 0, 0, 0]
                } else {
                    vec![0, 0, 0, 0, 0, 0, 0, 0]
                };
                Response::with_allocation(&out, alloc)
            }
        }
    }

    pub(crate) fn geometry(&self) -> Geometry {
        Geometry {
            num_blocks: self.num_blocks,
            block_size: self.block_size,
            write_protected: self.read_only,
        }
    }

    /// A device error as sense data, with the failing LBA in INFORMATION.
    pub(crate) fn device_error(&self, err: &blockwire_blockdev::Error, expected: u64) -> Response {
        tracing::debug!(%err, "device error");
        let code = crate::errors::code_for_error(err.kind(), err.op());
        let lba = err.offset() / u64::from(self.block_size);
        self.fail(Sense::new(code).with_information(lba), expected)
    }
}
