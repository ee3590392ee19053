//! CDB decoding (sans-IO): bytes from the network in, a typed command out. Every
//! field is read with checked indexing; a CDB shorter than its operation code needs
//! is an invalid field, never a panic.

use crate::sense::{codes, Code, FieldPointer, Sense};

/// Operation codes (SPC-4 / SBC-3).
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1a;
    pub const START_STOP_UNIT: u8 = 0x1b;
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1e;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5a;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const ORWRITE_16: u8 = 0x8b;
    pub const WRITE_16: u8 = 0x8a;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub const REPORT_LUNS: u8 = 0xa0;
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;
    pub const READ_DEFECT_DATA_12: u8 = 0xb7;

    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u16 = 0x10;
    pub const SA_GET_LBA_STATUS: u16 = 0x12;
    /// RECEIVE COPY RESULTS service actions.
    pub const SA_COPY_STATUS: u16 = 0x00;
    pub const SA_OPERATING_PARAMETERS: u16 = 0x03;
    /// MAINTENANCE IN service action.
    pub const SA_REPORT_SUPPORTED_OPCODES: u16 = 0x0c;
}

/// Why a CDB cannot be executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CdbError {
    /// An operation code (or service action) we do not implement.
    UnsupportedOpcode,
    /// A field we do not support or that is out of range.
    InvalidField { byte: u16, bit: Option<u8> },
}

impl CdbError {
    fn field(byte: usize, bit: Option<u8>) -> CdbError {
        CdbError::InvalidField {
            byte: byte as u16,
            bit,
        }
    }

    /// The sense data this error is answered with.
    pub fn sense(self) -> Sense {
        match self {
            CdbError::UnsupportedOpcode => Sense::new(codes::INVALID_COMMAND_OPERATION_CODE),
            CdbError::InvalidField { byte, bit } => Sense::new(codes::INVALID_FIELD_IN_CDB)
                .with_field(FieldPointer {
                    in_cdb: true,
                    byte,
                    bit,
                }),
        }
    }

    pub fn code(self) -> Code {
        self.sense().code
    }
}

/// A block read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rw {
    pub lba: u64,
    pub blocks: u32,
    pub fua: bool,
    pub dpo: bool,
}

/// A decoded CDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cdb {
    TestUnitReady,
    RequestSense {
        descriptor: bool,
        alloc: u32,
    },
    Inquiry {
        evpd: bool,
        page: u8,
        alloc: u32,
    },
    ReportLuns {
        select: u8,
        alloc: u32,
    },
    ReadCapacity10,
    ReadCapacity16 {
        alloc: u32,
    },
    Read(Rw),
    Write(Rw),
    /// ORWRITE(16): each block becomes itself OR the data-out (SBC-3 5.12).
    OrWrite(Rw),
    WriteAndVerify {
        rw: Rw,
        bytchk: bool,
    },
    Verify {
        lba: u64,
        blocks: u32,
        bytchk: u8,
    },
    SynchronizeCache {
        lba: u64,
        blocks: u32,
    },
    PreFetch {
        lba: u64,
        blocks: u32,
    },
    WriteSame {
        lba: u64,
        blocks: u32,
        unmap: bool,
        ndob: bool,
    },
    Unmap {
        param_len: u32,
    },
    CompareAndWrite {
        lba: u64,
        blocks: u32,
        fua: bool,
    },
    GetLbaStatus {
        lba: u64,
        alloc: u32,
    },
    ModeSense {
        ten: bool,
        dbd: bool,
        llbaa: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc: u32,
    },
    ModeSelect {
        ten: bool,
        sp: bool,
        param_len: u32,
    },
    StartStopUnit {
        loej: bool,
        start: bool,
    },
    PreventAllow {
        prevent: bool,
    },
    Reserve,
    Release,
    PersistentReserveIn {
        action: u8,
        alloc: u32,
    },
    PersistentReserveOut {
        action: u8,
        scope: u8,
        kind: u8,
        param_len: u32,
    },
    ReportSupportedOpcodes {
        rctd: bool,
        options: u8,
        opcode: u8,
        action: u16,
        alloc: u32,
    },
    ReadDefectData {
        ten: bool,
        alloc: u32,
    },
    /// EXTENDED COPY(LID1) (SPC-4 6.4).
    ExtendedCopy {
        param_len: u32,
    },
    /// RECEIVE COPY RESULTS OPERATING PARAMETERS (SPC-4 6.18.4).
    ReceiveCopyParameters {
        alloc: u32,
    },
    /// RECEIVE COPY RESULTS COPY STATUS(LID1) (SPC-4 6.18.2).
    ReceiveCopyStatus {
        list_id: u8,
        alloc: u32,
    },
}

fn byte(cdb: &[u8], at: usize) -> Result<u8, CdbError> {
    cdb.get(at).copied().ok_or(CdbError::field(at, None))
}

fn be(cdb: &[u8], at: usize, len: usize) -> Result<u64, CdbError> {
    let bytes = cdb.get(at..at + len).ok_or(CdbError::field(at, None))?;
    Ok(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

fn be32(cdb: &[u8], at: usize, len: usize) -> Result<u32, CdbError> {
    be(cdb, at, len).map(|v| v as u32)
}

fn bit(value: u8, bit: u8) -> bool {
    value & (1 << bit) != 0
}

/// The CDB length SAM-5 5.2 gives an operation code's group.
pub fn cdb_len(opcode: u8) -> usize {
    match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 16,
    }
}

/// Protection fields (RDPROTECT, WRPROTECT, VRPROTECT) must be zero: we have no
/// protection information (SBC-3 4.22.4).
fn no_protection(cdb: &[u8]) -> Result<u8, CdbError> {
    let flags = byte(cdb, 1)?;
    if flags & 0xe0 != 0 {
        return Err(CdbError::field(1, Some(7)));
    }
    Ok(flags)
}

/// The control byte: NACA and LINK are not supported (SAM-5 5.2).
fn check_control(cdb: &[u8], len: usize) -> Result<(), CdbError> {
    let control = byte(cdb, len - 1)?;
    if control & 0x05 != 0 {
        return Err(CdbError::field(
            len - 1,
            Some(if control & 0x04 != 0 { 2 } else { 0 }),
        ));
    }
    Ok(())
}

fn rw(cdb: &[u8], lba: u64, blocks: u32) -> Result<Rw, CdbError> {
    let flags = no_protection(cdb)?;
    Ok(Rw {
        lba,
        blocks,
        fua: bit(flags, 3),
        dpo: bit(flags, 4),
    })
}

/// LBA and transfer length of the 10-, 12- and 16-byte block commands.
fn lba_len(cdb: &[u8]) -> Result<(u64, u32), CdbError> {
    match cdb_len(byte(cdb, 0)?) {
        10 => Ok((be(cdb, 2, 4)?, be32(cdb, 7, 2)?)),
        12 => Ok((be(cdb, 2, 4)?, be32(cdb, 6, 4)?)),
        _ => Ok((be(cdb, 2, 8)?, be32(cdb, 10, 4)?)),
    }
}

/// Decodes a CDB.
pub fn decode(cdb: &[u8]) -> Result<Cdb, CdbError> {
    let opcode = *cdb.first().ok_or(CdbError::UnsupportedOpcode)?;
    if cdb.len() > 16 || !crate::opcodes::SUPPORTED.iter().any(|s| s.opcode == opcode) {
        return Err(CdbError::UnsupportedOpcode);
    }
    let len = cdb_len(opcode);
    if cdb.len() < len {
        return Err(CdbError::field(cdb.len(), None));
    }
    let decoded = decode_fields(opcode, cdb)?;
    check_control(cdb, len)?;
    Ok(decoded)
}

fn decode_fields(opcode: u8, cdb: &[u8]) -> Result<Cdb, CdbError> {
    use op::*;
    Ok(match opcode {
        TEST_UNIT_READY => Cdb::TestUnitReady,
        REQUEST_SENSE => Cdb::RequestSense {
            descriptor: bit(byte(cdb, 1)?, 0),
            alloc: u32::from(byte(cdb, 4)?),
        },
        INQUIRY => {
            let evpd = bit(byte(cdb, 1)?, 0);
            if byte(cdb, 1)? & 0xfe != 0 {
                return Err(CdbError::field(1, Some(1)));
            }
            let page = byte(cdb, 2)?;
            // SPC-4 6.6.1: a page code without EVPD is an invalid field.
            if !evpd && page != 0 {
                return Err(CdbError::field(2, None));
            }
            Cdb::Inquiry {
                evpd,
                page,
                alloc: be32(cdb, 3, 2)?,
            }
        }
        REPORT_LUNS => Cdb::ReportLuns {
            select: byte(cdb, 2)?,
            alloc: be32(cdb, 6, 4)?,
        },
        READ_CAPACITY_10 => {
            // PMI is obsolete; an LBA without it is an invalid field (SBC-3 5.15).
            if byte(cdb, 8)? & 1 == 0 && be(cdb, 2, 4)? != 0 {
                return Err(CdbError::field(2, None));
            }
            Cdb::ReadCapacity10
        }
        SERVICE_ACTION_IN_16 => match u16::from(byte(cdb, 1)? & 0x1f) {
            SA_READ_CAPACITY_16 => Cdb::ReadCapacity16 {
                alloc: be32(cdb, 10, 4)?,
            },
            SA_GET_LBA_STATUS => Cdb::GetLbaStatus {
                lba: be(cdb, 2, 8)?,
                alloc: be32(cdb, 10, 4)?,
            },
            _ => return Err(CdbError::field(1, Some(4))),
        },
        READ_6 | WRITE_6 => {
            let lba = be(cdb, 1, 3)? & 0x1f_ffff;
            // SBC-3 5.13: a transfer length of 0 means 256 blocks.
            let blocks = match byte(cdb, 4)? {
                0 => 256,
                n => u32::from(n),
            };
            let rw = Rw {
                lba,
                blocks,
                fua: false,
                dpo: false,
            };
            if opcode == READ_6 {
                Cdb::Read(rw)
            } else {
                Cdb::Write(rw)
            }
        }
        READ_10 | READ_12 | READ_16 => {
            let (lba, blocks) = lba_len(cdb)?;
            Cdb::Read(rw(cdb, lba, blocks)?)
        }
        WRITE_10 | WRITE_12 | WRITE_16 => {
            let (lba, blocks) = lba_len(cdb)?;
            Cdb::Write(rw(cdb, lba, blocks)?)
        }
        ORWRITE_16 => {
            let (lba, blocks) = lba_len(cdb)?;
            Cdb::OrWrite(rw(cdb, lba, blocks)?)
        }
        WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12 | WRITE_AND_VERIFY_16 => {
            let (lba, blocks) = lba_len(cdb)?;
            let mut rw = rw(cdb, lba, blocks)?;
            // WRITE AND VERIFY has no FUA bit; bit 3 is reserved there.
            rw.fua = false;
            Cdb::WriteAndVerify {
                rw,
                bytchk: bit(byte(cdb, 1)?, 1),
            }
        }
        VERIFY_10 | VERIFY_12 | VERIFY_16 => {
            let flags = no_protection(cdb)?;
            let bytchk = (flags >> 1) & 0x03;
            // BYTCHK 10b is reserved (SBC-3 5.29).
            if bytchk == 2 {
                return Err(CdbError::field(1, Some(2)));
            }
            let (lba, blocks) = lba_len(cdb)?;
            Cdb::Verify {
                lba,
                blocks,
                bytchk,
            }
        }
        SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => {
            let (lba, blocks) = lba_len(cdb)?;
            Cdb::SynchronizeCache { lba, blocks }
        }
        PRE_FETCH_10 | PRE_FETCH_16 => {
            let (lba, blocks) = lba_len(cdb)?;
            Cdb::PreFetch { lba, blocks }
        }
        WRITE_SAME_10 | WRITE_SAME_16 => {
            let flags = no_protection(cdb)?;
            // ANCHOR needs ANC_SUP, which we do not claim (SBC-3 5.44).
            if bit(flags, 4) {
                return Err(CdbError::field(1, Some(4)));
            }
            let (lba, blocks) = if opcode == WRITE_SAME_10 {
                (be(cdb, 2, 4)?, be32(cdb, 7, 2)?)
            } else {
                (be(cdb, 2, 8)?, be32(cdb, 10, 4)?)
            };
            Cdb::WriteSame {
                lba,
                blocks,
                unmap: bit(flags, 3),
                ndob: opcode == WRITE_SAME_16 && bit(flags, 0),
            }
        }
        UNMAP => {
            if bit(byte(cdb, 1)?, 0) {
                return Err(CdbError::field(1, Some(0)));
            }
            Cdb::Unmap {
                param_len: be32(cdb, 7, 2)?,
            }
        }
        COMPARE_AND_WRITE => {
            let flags = no_protection(cdb)?;
            Cdb::CompareAndWrite {
                lba: be(cdb, 2, 8)?,
                blocks: u32::from(byte(cdb, 13)?),
                fua: bit(flags, 3),
            }
        }
        MODE_SENSE_6 | MODE_SENSE_10 => {
            let ten = opcode == MODE_SENSE_10;
            let flags = byte(cdb, 1)?;
            let page = byte(cdb, 2)?;
            Cdb::ModeSense {
                ten,
                dbd: bit(flags, 3),
                llbaa: ten && bit(flags, 4),
                pc: page >> 6,
                page: page & 0x3f,
                subpage: byte(cdb, 3)?,
                alloc: if ten {
                    be32(cdb, 7, 2)?
                } else {
                    u32::from(byte(cdb, 4)?)
                },
            }
        }
        MODE_SELECT_6 | MODE_SELECT_10 => {
            let ten = opcode == MODE_SELECT_10;
            Cdb::ModeSelect {
                ten,
                sp: bit(byte(cdb, 1)?, 0),
                param_len: if ten {
                    be32(cdb, 7, 2)?
                } else {
                    u32::from(byte(cdb, 4)?)
                },
            }
        }
        START_STOP_UNIT => {
            let flags = byte(cdb, 4)?;
            Cdb::StartStopUnit {
                loej: bit(flags, 1),
                start: bit(flags, 0),
            }
        }
        PREVENT_ALLOW_MEDIUM_REMOVAL => Cdb::PreventAllow {
            prevent: byte(cdb, 4)? & 0x03 != 0,
        },
        RESERVE_6 | RESERVE_10 | RELEASE_6 | RELEASE_10 => {
            // Third-party reservations (SPC-2 7.21.2) are not supported.
            if matches!(opcode, RESERVE_10 | RELEASE_10) && bit(byte(cdb, 1)?, 4) {
                return Err(CdbError::field(1, Some(4)));
            }
            if matches!(opcode, RESERVE_6 | RESERVE_10) {
                Cdb::Reserve
            } else {
                Cdb::Release
            }
        }
        PERSISTENT_RESERVE_IN => Cdb::PersistentReserveIn {
            action: byte(cdb, 1)? & 0x1f,
            alloc: be32(cdb, 7, 2)?,
        },
        PERSISTENT_RESERVE_OUT => {
            let scope_type = byte(cdb, 2)?;
            Cdb::PersistentReserveOut {
                action: byte(cdb, 1)? & 0x1f,
                scope: scope_type >> 4,
                kind: scope_type & 0x0f,
                param_len: be32(cdb, 5, 4)?,
            }
        }
        MAINTENANCE_IN => match u16::from(byte(cdb, 1)? & 0x1f) {
            SA_REPORT_SUPPORTED_OPCODES => {
                let flags = byte(cdb, 2)?;
                Cdb::ReportSupportedOpcodes {
                    rctd: bit(flags, 7),
                    options: flags & 0x07,
                    opcode: byte(cdb, 3)?,
                    action: be(cdb, 4, 2)? as u16,
                    alloc: be32(cdb, 6, 4)?,
                }
            }
            _ => return Err(CdbError::field(1, Some(4))),
        },
        EXTENDED_COPY => {
            // Service action 00h: EXTENDED COPY(LID1); LID4 is not supported.
            if byte(cdb, 1)? & 0x1f != 0 {
                return Err(CdbError::field(1, Some(4)));
            }
            Cdb::ExtendedCopy {
                param_len: be32(cdb, 10, 4)?,
            }
        }
        RECEIVE_COPY_RESULTS => match u16::from(byte(cdb, 1)? & 0x1f) {
            SA_OPERATING_PARAMETERS => Cdb::ReceiveCopyParameters {
                alloc: be32(cdb, 10, 4)?,
            },
            SA_COPY_STATUS => Cdb::ReceiveCopyStatus {
                list_id: byte(cdb, 2)?,
                alloc: be32(cdb, 10, 4)?,
            },
            // RECEIVE DATA and FAILED SEGMENT DETAILS: nothing is ever held for them.
            _ => return Err(CdbError::field(1, Some(4))),
        },
        READ_DEFECT_DATA_10 => Cdb::ReadDefectData {
            ten: true,
            alloc: be32(cdb, 7, 2)?,
        },
        READ_DEFECT_DATA_12 => Cdb::ReadDefectData {
            ten: false,
            alloc: be32(cdb, 6, 4)?,
        },
        _ => return Err(CdbError::UnsupportedOpcode),
    })
}

/// How a command relates to reservations (SPC-4 5.12.1 table 47, SBC-3 table 13, and
/// SPC-2 7.21 for RESERVE/RELEASE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Never blocked, not even by an SPC-2 reservation: INQUIRY, REPORT LUNS,
    /// REQUEST SENSE, REPORT SUPPORTED OPERATION CODES, RELEASE.
    Exempt,
    /// Allowed under every persistent reservation, blocked by another nexus's SPC-2
    /// reservation (TEST UNIT READY, READ CAPACITY, PR IN/OUT, ...).
    Allowed,
    /// Reads the medium: conflicts under the exclusive access types.
    Read,
    /// Changes the medium or the logical unit: conflicts under every type.
    Write,
}

impl Cdb {
    /// The command's class in the reservation conflict tables.
    pub fn access(&self) -> Access {
        match self {
            Cdb::Inquiry { .. }
            | Cdb::ReportLuns { .. }
            | Cdb::RequestSense { .. }
            | Cdb::ReportSupportedOpcodes { .. }
            | Cdb::Release => Access::Exempt,
            Cdb::TestUnitReady
            | Cdb::ReadCapacity10
            | Cdb::ReadCapacity16 { .. }
            | Cdb::PersistentReserveIn { .. }
            | Cdb::PersistentReserveOut { .. }
            | Cdb::PreventAllow { .. }
            | Cdb::ReceiveCopyParameters { .. }
            | Cdb::ReceiveCopyStatus { .. }
            | Cdb::Reserve => Access::Allowed,
            Cdb::Read(_)
            | Cdb::Verify { .. }
            | Cdb::PreFetch { .. }
            | Cdb::GetLbaStatus { .. }
            | Cdb::ReadDefectData { .. } => Access::Read,
            Cdb::Write(_)
            | Cdb::OrWrite(_)
            | Cdb::WriteAndVerify { .. }
            | Cdb::WriteSame { .. }
            | Cdb::Unmap { .. }
            | Cdb::CompareAndWrite { .. }
            | Cdb::SynchronizeCache { .. }
            | Cdb::ModeSense { .. }
            | Cdb::ModeSelect { .. }
            | Cdb::ExtendedCopy { .. }
            | Cdb::StartStopUnit { .. } => Access::Write,
        }
    }

    /// Whether the command changes the medium (refused on a write-protected LU).
    pub fn writes_medium(&self) -> bool {
        matches!(
            self,
            Cdb::Write(_)
                | Cdb::OrWrite(_)
                | Cdb::WriteAndVerify { .. }
                | Cdb::WriteSame { .. }
                | Cdb::Unmap { .. }
                | Cdb::CompareAndWrite { .. }
        )
    }

    /// The data the command moves, in bytes, for a logical block size.
    pub fn transfer(&self, block_size: u32) -> crate::TransferInfo {
        use crate::TransferInfo as T;
        let blocks = |n: u32| u64::from(n) * u64::from(block_size);
        match *self {
            Cdb::Read(rw) => T::data_in(blocks(rw.blocks)),
            Cdb::Write(rw) | Cdb::OrWrite(rw) | Cdb::WriteAndVerify { rw, .. } => {
                T::data_out(blocks(rw.blocks))
            }
            Cdb::Verify {
                blocks: n, bytchk, ..
            } => match bytchk {
                1 => T::data_out(blocks(n)),
                3 => T::data_out(u64::from(block_size)),
                _ => T::NONE,
            },
            Cdb::WriteSame { ndob, .. } => {
                if ndob {
                    T::NONE
                } else {
                    T::data_out(u64::from(block_size))
                }
            }
            Cdb::CompareAndWrite { blocks: n, .. } => T::data_out(2 * blocks(n)),
            Cdb::Unmap { param_len }
            | Cdb::ModeSelect { param_len, .. }
            | Cdb::ExtendedCopy { param_len }
            | Cdb::PersistentReserveOut { param_len, .. } => T::data_out(u64::from(param_len)),
            Cdb::RequestSense { alloc, .. }
            | Cdb::Inquiry { alloc, .. }
            | Cdb::ReportLuns { alloc, .. }
            | Cdb::ReadCapacity16 { alloc }
            | Cdb::GetLbaStatus { alloc, .. }
            | Cdb::ModeSense { alloc, .. }
            | Cdb::PersistentReserveIn { alloc, .. }
            | Cdb::ReportSupportedOpcodes { alloc, .. }
            | Cdb::ReceiveCopyParameters { alloc }
            | Cdb::ReceiveCopyStatus { alloc, .. }
            | Cdb::ReadDefectData { alloc, .. } => T::data_in(u64::from(alloc)),
            Cdb::ReadCapacity10 => T::data_in(8),
            Cdb::TestUnitReady
            | Cdb::SynchronizeCache { .. }
            | Cdb::PreFetch { .. }
            | Cdb::StartStopUnit { .. }
            | Cdb::PreventAllow { .. }
            | Cdb::Reserve
            | Cdb::Release => T::NONE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cdb16(bytes: &[u8]) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..bytes.len()].copy_from_slice(bytes);
        out
    }

    #[test]
    fn read10_vector() {
        let cdb = cdb16(&[0x28, 0x18, 0, 0, 0x12, 0x34, 0, 0, 0x08, 0]);
        assert_eq!(
            decode(&cdb),
            Ok(Cdb::Read(Rw {
                lba: 0x1234,
                blocks: 8,
                fua: true,
                dpo: true
            }))
        );
    }

    #[test]
    fn read6_zero_means_256() {
        let cdb = [0x08, 0x1f, 0xff, 0xff, 0, 0];
        assert_eq!(
            decode(&cdb),
            Ok(Cdb::Read(Rw {
                lba: 0x1f_ffff,
                blocks: 256,
                fua: false,
                dpo: false
            }))
        );
    }

    #[test]
    fn write16_vector() {
        let cdb = [0x8a, 0x08, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0];
        assert_eq!(
            decode(&cdb),
            Ok(Cdb::Write(Rw {
                lba: 0x1_0000_0002,
                blocks: 256,
                fua: true,
                dpo: false
            }))
        );
    }

    #[test]
    fn protection_fields_are_invalid() {
        let cdb = cdb16(&[0x2a, 0x20, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert_eq!(
            decode(&cdb),
            Err(CdbError::InvalidField {
                byte: 1,
                bit: Some(7)
            })
        );
    }

    #[test]
    fn short_and_long_cdbs() {
        assert_eq!(decode(&[]), Err(CdbError::UnsupportedOpcode));
        assert!(matches!(
            decode(&[0x28, 0, 0]),
            Err(CdbError::InvalidField { byte: 3, .. })
        ));
        assert_eq!(decode(&[0x28; 17]), Err(CdbError::UnsupportedOpcode));
        assert_eq!(decode(&cdb16(&[0xff])), Err(CdbError::UnsupportedOpcode));
    }

    #[test]
    fn inquiry_page_without_evpd_is_invalid() {
        assert!(decode(&[0x12, 0, 0x80, 0, 0xff, 0]).is_err());
        assert_eq!(
            decode(&[0x12, 1, 0x80, 0, 0xff, 0]),
            Ok(Cdb::Inquiry {
                evpd: true,
                page: 0x80,
                alloc: 255
            })
        );
    }

    #[test]
    fn naca_is_refused() {
        assert_eq!(
            decode(&[0, 0, 0, 0, 0, 0x04]),
            Err(CdbError::InvalidField {
                byte: 5,
                bit: Some(2)
            })
        );
    }

    #[test]
    fn service_actions() {
        let rc16 = cdb16(&[0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32]);
        assert_eq!(decode(&rc16), Ok(Cdb::ReadCapacity16 { alloc: 32 }));
        let bad = cdb16(&[0x9e, 0x11]);
        assert!(matches!(
            decode(&bad),
            Err(CdbError::InvalidField { byte: 1, .. })
        ));
    }

    #[test]
    fn transfer_lengths() {
        let write = decode(&cdb16(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 4, 0])).unwrap();
        assert_eq!(write.transfer(512), crate::TransferInfo::data_out(2048));
        let caw = decode(&cdb16(&[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])).unwrap();
        assert_eq!(caw.transfer(4096), crate::TransferInfo::data_out(8192));
        let ws = decode(&cdb16(&[0x93, 0x01])).unwrap();
        assert_eq!(ws.transfer(512), crate::TransferInfo::NONE);
    }
}
