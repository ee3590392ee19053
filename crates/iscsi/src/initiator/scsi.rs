//! The SCSI the initiator speaks (SBC-3, SPC-4), sans-IO: CDBs for the block
//! commands and the few inquiries a device needs, their answers parsed with checked
//! indexing, and a command's status turned into our neutral error kind through the
//! one sense table shared with the target (`blockwire_scsi::error_kind_for_sense`).

use blockwire_blockdev::{Error, ErrorKind, Op};
use blockwire_scsi::cdb::op;
use blockwire_scsi::error_kind_for_sense;
use blockwire_scsi::sense::Sense;

use super::session::Outcome;
use crate::pdu::ResidualKind;

/// SCSI status codes (SAM-5 table 34).
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const TASK_ABORTED: u8 = 0x40;
}

fn put_u32(cdb: &mut [u8], at: usize, value: u32) {
    cdb[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

fn put_u64(cdb: &mut [u8], at: usize, value: u64) {
    cdb[at..at + 8].copy_from_slice(&value.to_be_bytes());
}

/// READ (16) (SBC-3 5.8).
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op::READ_16;
    put_u64(&mut cdb, 2, lba);
    put_u32(&mut cdb, 10, blocks);
    cdb
}

/// WRITE (16) (SBC-3 5.40); FUA is bit 3 of byte 1.
pub fn write16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op::WRITE_16;
    cdb[1] = if fua { 0x08 } else { 0 };
    put_u64(&mut cdb, 2, lba);
    put_u32(&mut cdb, 10, blocks);
    cdb
}

/// SYNCHRONIZE CACHE (16) over the whole medium (SBC-3 5.23: 0 blocks = to the end).
pub fn synchronize_cache16() -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op::SYNCHRONIZE_CACHE_16;
    cdb
}

/// SYNCHRONIZE CACHE (10), for targets without the 16-byte form.
pub fn synchronize_cache10() -> [u8; 10] {
    let mut cdb = [0u8; 10];
    cdb[0] = op::SYNCHRONIZE_CACHE_10;
    cdb
}

/// WRITE SAME (16) (SBC-3 5.42) of one data-out block; UNMAP is bit 3 of byte 1.
pub fn write_same16(lba: u64, blocks: u32, unmap: bool) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op::WRITE_SAME_16;
    cdb[1] = if unmap { 0x08 } else { 0 };
    put_u64(&mut cdb, 2, lba);
    put_u32(&mut cdb, 10, blocks);
    cdb
}

/// UNMAP (SBC-3 5.28) with a parameter list of `len` bytes.
pub fn unmap(len: u16) -> [u8; 10] {
    let mut cdb = [0u8; 10];
    cdb[0] = op::UNMAP;
    cdb[7..9].copy_from_slice(&len.to_be_bytes());
    cdb
}

/// The UNMAP parameter list for one range (SBC-3 5.28.2).
pub fn unmap_list(lba: u64, blocks: u32) -> Vec<u8> {
    let mut list = vec![0u8; 24];
    list[0..2].copy_from_slice(&22u16.to_be_bytes());
    list[2..4].copy_from_slice(&16u16.to_be_bytes());
    put_u64(&mut list, 8, lba);
    put_u32(&mut list, 16, blocks);
    list
}

/// READ CAPACITY (16) (SBC-3 5.16).
pub fn read_capacity16() -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op::SERVICE_ACTION_IN_16;
    cdb[1] = op::SA_READ_CAPACITY_16 as u8;
    put_u32(&mut cdb, 10, 32);
    cdb
}

/// GET LBA STATUS (SBC-3 5.6) from `lba`, answering in `len` bytes.
pub fn get_lba_status(lba: u64, len: u32) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = op::SERVICE_ACTION_IN_16;
    cdb[1] = op::SA_GET_LBA_STATUS as u8;
    put_u64(&mut cdb, 2, lba);
    put_u32(&mut cdb, 10, len);
    cdb
}

/// INQUIRY (SPC-4 6.6): standard data, or the VPD page `page`.
pub fn inquiry(page: Option<u8>, len: u16) -> [u8; 6] {
    let mut cdb = [0u8; 6];
    cdb[0] = op::INQUIRY;
    if let Some(page) = page {
        cdb[1] = 1;
        cdb[2] = page;
    }
    cdb[3..5].copy_from_slice(&len.to_be_bytes());
    cdb
}

/// REPORT LUNS (SPC-4 6.33), all of them.
pub fn report_luns(len: u32) -> [u8; 12] {
    let mut cdb = [0u8; 12];
    cdb[0] = op::REPORT_LUNS;
    put_u32(&mut cdb, 6, len);
    cdb
}

/// TEST UNIT READY (SPC-4 6.37).
pub fn test_unit_ready() -> [u8; 6] {
    [op::TEST_UNIT_READY, 0, 0, 0, 0, 0]
}

/// REPORT SUPPORTED OPERATION CODES for one command (SPC-4 6.35, reporting
/// options 001b, or 011b with a service action).
pub fn report_supported_opcode(opcode: u8, service_action: Option<u16>) -> [u8; 12] {
    let mut cdb = [0u8; 12];
    cdb[0] = op::MAINTENANCE_IN;
    cdb[1] = op::SA_REPORT_SUPPORTED_OPCODES as u8;
    cdb[2] = if service_action.is_some() { 3 } else { 1 };
    cdb[3] = opcode;
    cdb[4..6].copy_from_slice(&service_action.unwrap_or(0).to_be_bytes());
    put_u32(&mut cdb, 6, 64);
    cdb
}

/// Whether a one-command REPORT SUPPORTED OPERATION CODES answer says the command
/// is supported (SUPPORT field 011b or 101b).
pub fn opcode_supported(answer: &[u8]) -> bool {
    answer.get(1).is_some_and(|b| matches!(b & 7, 3 | 5))
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn be64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// READ CAPACITY (16) data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub blocks: u64,
    pub block_size: u32,
    /// LBPME: logical block provisioning (UNMAP, GET LBA STATUS) is enabled.
    pub provisioning: bool,
    /// LBPRZ: unmapped blocks read as zeroes.
    pub reads_zero: bool,
    /// Logical blocks per physical block, as a power of two.
    pub physical_exponent: u8,
}

pub fn parse_capacity(data: &[u8]) -> Option<Capacity> {
    let last = be64(data, 0)?;
    let block_size = be32(data, 8)?;
    if block_size == 0 || !block_size.is_power_of_two() {
        return None;
    }
    let flags = data.get(14).copied().unwrap_or(0);
    Some(Capacity {
        blocks: last.checked_add(1)?,
        block_size,
        provisioning: flags & 0x80 != 0,
        reads_zero: flags & 0x40 != 0,
        physical_exponent: data.get(13).copied().unwrap_or(0) & 0x0f,
    })
}

/// What the Block Limits VPD page (B0h, SBC-3 6.6.4) says; 0 means "no limit
/// reported".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockLimits {
    pub max_transfer_blocks: u32,
    pub optimal_transfer_blocks: u32,
    pub optimal_granularity_blocks: u16,
    pub max_unmap_blocks: u32,
    pub max_unmap_descriptors: u32,
    pub max_write_same_blocks: u64,
}

pub fn parse_block_limits(page: &[u8]) -> Option<BlockLimits> {
    if page.get(1) != Some(&0xb0) {
        return None;
    }
    Some(BlockLimits {
        optimal_granularity_blocks: page
            .get(6..8)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]])),
        max_transfer_blocks: be32(page, 8).unwrap_or(0),
        optimal_transfer_blocks: be32(page, 12).unwrap_or(0),
        max_unmap_blocks: be32(page, 20).unwrap_or(0),
        max_unmap_descriptors: be32(page, 24).unwrap_or(0),
        max_write_same_blocks: be64(page, 36).unwrap_or(0),
    })
}

/// What the Logical Block Provisioning VPD page (B2h, SBC-3 6.6.5) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Provisioning {
    /// LBPU: UNMAP is supported.
    pub unmap: bool,
    /// LBPWS: WRITE SAME (16) with UNMAP is supported.
    pub write_same_unmap: bool,
}

pub fn parse_provisioning(page: &[u8]) -> Option<Provisioning> {
    if page.get(1) != Some(&0xb2) {
        return None;
    }
    let flags = *page.get(5)?;
    Some(Provisioning {
        unmap: flags & 0x80 != 0,
        write_same_unmap: flags & 0x40 != 0,
    })
}

/// The page codes a Supported VPD Pages page (00h) lists.
pub fn parse_supported_pages(page: &[u8]) -> Vec<u8> {
    let len = page
        .get(2..4)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    page.get(4..)
        .map_or_else(Vec::new, |rest| rest.iter().take(len).copied().collect())
}

/// Standard INQUIRY data, the fields people read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inquiry {
    /// Peripheral device type (0 disk, 5 CD/DVD, 0x0c controller, ...).
    pub device_type: u8,
    /// Peripheral qualifier 3: no logical unit here.
    pub not_present: bool,
    pub removable: bool,
    pub vendor: String,
    pub product: String,
    pub revision: String,
}

pub fn parse_inquiry(data: &[u8]) -> Option<Inquiry> {
    let first = *data.first()?;
    let text = |range: std::ops::Range<usize>| {
        data.get(range)
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .unwrap_or_default()
    };
    Some(Inquiry {
        device_type: first & 0x1f,
        not_present: first >> 5 == 3,
        removable: data.get(1).is_some_and(|b| b & 0x80 != 0),
        vendor: text(8..16),
        product: text(16..32),
        revision: text(32..36),
    })
}

/// A device type's name, as `sg_inq` and `iscsi-ls` print them.
pub fn device_type_name(device_type: u8) -> &'static str {
    match device_type {
        0x00 => "DISK",
        0x01 => "TAPE",
        0x05 => "CDROM",
        0x07 => "OPTICAL",
        0x08 => "CHANGER",
        0x0c => "STORAGE_ARRAY_CONTROLLER",
        0x0d => "ENCLOSURE",
        _ => "OTHER",
    }
}

/// The LUNs of a REPORT LUNS answer (SAM-5 4.7: the 8-byte single-level forms).
pub fn parse_report_luns(data: &[u8]) -> Vec<u64> {
    let len = be32(data, 0).unwrap_or(0) as usize;
    data.get(8..)
        .unwrap_or(&[])
        .chunks_exact(8)
        .take(len / 8)
        .filter_map(|entry| {
            let lun = u64::from_be_bytes(entry.try_into().ok()?);
            crate::target::decode_lun(lun)
        })
        .collect()
}

/// One LBA status descriptor (SBC-3 5.6.2): (lba, blocks, provisioning status
/// 0 mapped, 1 deallocated, 2 anchored).
pub fn parse_lba_status(data: &[u8]) -> Vec<(u64, u32, u8)> {
    let len = be32(data, 0).unwrap_or(0) as usize;
    // PARAMETER DATA LENGTH counts the bytes after itself.
    let end = (4 + len).min(data.len());
    data.get(8..end)
        .unwrap_or(&[])
        .chunks_exact(16)
        .filter_map(|d| Some((be64(d, 0)?, be32(d, 8)?, d[12] & 0x0f)))
        .collect()
}

/// A sense's (key, asc, ascq), for messages.
pub fn sense_code(sense: &[u8]) -> Option<(u8, u8, u8)> {
    Sense::parse_code(sense).map(|c| (c.key, c.asc, c.ascq))
}

/// Whether an outcome is a unit attention (worth one retry: SAM-5 5.14).
pub fn is_unit_attention(outcome: &Outcome) -> bool {
    outcome.status == status::CHECK_CONDITION
        && sense_code(&outcome.sense).is_some_and(|(key, _, _)| key == 0x06)
}

/// The error for a command that did not end GOOD.
pub fn status_error(outcome: &Outcome, op: Op, offset: u64, len: u64) -> Error {
    let (kind, detail) = match outcome.status {
        status::CHECK_CONDITION => match sense_code(&outcome.sense) {
            Some((key, asc, ascq)) => (
                error_kind_for_sense(key, asc, ascq),
                format!("CHECK CONDITION, sense key {key:#x}, ASC/ASCQ {asc:#04x}/{ascq:#04x}"),
            ),
            None => (
                ErrorKind::Io,
                "CHECK CONDITION without usable sense data".to_string(),
            ),
        },
        status::BUSY | status::TASK_SET_FULL => (
            ErrorKind::Io,
            format!("the target is busy (status {:#04x})", outcome.status),
        ),
        status::RESERVATION_CONFLICT => (ErrorKind::Io, "reservation conflict".to_string()),
        status::TASK_ABORTED => (ErrorKind::Io, "task aborted".to_string()),
        other => (ErrorKind::Io, format!("SCSI status {other:#04x}")),
    };
    Error::new(kind, op, offset, len).with_detail(detail)
}

/// The result of a block read or write: GOOD and every byte moved.
pub fn check_io(outcome: &Outcome, op: Op, offset: u64, len: u64) -> Result<(), Error> {
    if outcome.status != status::GOOD {
        return Err(status_error(outcome, op, offset, len));
    }
    if let ResidualKind::Underflow(n) | ResidualKind::Overflow(n) = outcome.residual {
        if n != 0 {
            return Err(
                Error::new(ErrorKind::Io, op, offset, len).with_detail(format!(
                    "the target moved {n} bytes less or more than asked"
                )),
            );
        }
    }
    if op == Op::Read && u64::from(outcome.received) != len {
        return Err(
            Error::new(ErrorKind::Io, op, offset, len).with_detail(format!(
                "the target sent {} of {len} bytes",
                outcome.received
            )),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdbs_put_fields_where_sbc_says() {
        let cdb = read16(0x0102_0304_0506_0708, 0x0a0b_0c0d);
        assert_eq!(cdb[0], 0x88);
        assert_eq!(&cdb[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&cdb[10..14], &[0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(write16(0, 1, true)[1], 0x08);
        assert_eq!(write_same16(0, 1, true)[1], 0x08);
        assert_eq!(unmap(24)[7..9], [0, 24]);
        let list = unmap_list(9, 3);
        assert_eq!(&list[..4], &[0, 22, 0, 16]);
        assert_eq!(list[15], 9);
        assert_eq!(list[19], 3);
        assert_eq!(inquiry(Some(0xb0), 64)[..5], [0x12, 1, 0xb0, 0, 64]);
    }

    #[test]
    fn answers_parse_and_short_ones_do_not_panic() {
        let mut cap = vec![0u8; 32];
        cap[7] = 99;
        cap[10] = 2; // 512
        cap[14] = 0xc0;
        let c = parse_capacity(&cap).unwrap();
        assert_eq!((c.blocks, c.block_size), (100, 512));
        assert!(c.provisioning && c.reads_zero);
        assert!(parse_capacity(&cap[..8]).is_none());
        assert!(parse_block_limits(&[0, 0xb0]).is_some());
        assert!(parse_block_limits(&[0, 0xb1]).is_none());
        assert_eq!(
            parse_provisioning(&[0, 0xb2, 0, 4, 0, 0xc0]),
            Some(Provisioning {
                unmap: true,
                write_same_unmap: true
            })
        );
        assert_eq!(
            parse_supported_pages(&[0, 0, 0, 3, 0, 0xb0, 0xb2]),
            vec![0, 0xb0, 0xb2]
        );
        assert_eq!(parse_supported_pages(&[0, 0, 0, 9, 0]), vec![0]);
        let mut luns = vec![0, 0, 0, 16, 0, 0, 0, 0];
        luns.extend_from_slice(&[0; 8]);
        luns.extend_from_slice(&[0, 3, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_report_luns(&luns), vec![0, 3]);
        assert!(parse_report_luns(&[0, 0]).is_empty());
        let mut status = vec![0, 0, 0, 20, 0, 0, 0, 0];
        status.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 16, 1, 0, 0, 0]);
        assert_eq!(parse_lba_status(&status), vec![(8, 16, 1)]);
        assert!(parse_inquiry(&[]).is_none());
        assert_eq!(parse_inquiry(&[0x7f]).map(|i| i.not_present), Some(true));
    }

    #[test]
    fn statuses_become_error_kinds() {
        // LBA out of range: ILLEGAL REQUEST, 21h/00h (fixed format sense).
        let mut sense = vec![0u8; 18];
        sense[0] = 0x70;
        sense[2] = 0x05;
        sense[12] = 0x21;
        let outcome = Outcome {
            status: status::CHECK_CONDITION,
            sense,
            ..Outcome::default()
        };
        let error = check_io(&outcome, Op::Read, 0, 512).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::OutOfRange);
        let short = Outcome {
            received: 100,
            ..Outcome::default()
        };
        assert_eq!(
            check_io(&short, Op::Read, 0, 512).unwrap_err().kind(),
            ErrorKind::Io
        );
        assert!(check_io(&Outcome::default(), Op::Write, 0, 512).is_ok());
    }
}
