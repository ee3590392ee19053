//! The CDBs an initiator sends (SBC-3, SPC-4), built big-endian as the standards
//! lay them out. [`crate::cdb`] decodes every one of them on the target side.

use crate::cdb::op;

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_be_bytes());
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

/// The UNMAP parameter list for one range (SBC-3 5.28.2): an 8-byte header whose
/// two lengths count the bytes after themselves, then one 16-byte descriptor.
pub fn unmap_list(lba: u64, blocks: u32) -> Vec<u8> {
    let mut list = vec![0u8; 24];
    list[0..2].copy_from_slice(&22u16.to_be_bytes());
    list[2..4].copy_from_slice(&16u16.to_be_bytes());
    put_u64(&mut list, 8, lba);
    put_u32(&mut list, 16, blocks);
    list
}

/// READ CAPACITY (16) (SBC-3 5.16), asking for the 32-byte answer.
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

/// INQUIRY (SPC-4 6.6): standard data, or the VPD page `page` (EVPD set).
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

/// REPORT LUNS (SPC-4 6.33), select report 0: all of them.
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
/// options 001b, or 011b with a service action), answering in 64 bytes.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_cdbs_put_fields_where_sbc_says() {
        let cdb = read16(0x0102_0304_0506_0708, 0x0a0b_0c0d);
        assert_eq!(cdb[0], 0x88);
        assert_eq!(&cdb[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&cdb[10..14], &[0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(write16(0, 1, true)[..2], [0x8a, 0x08]);
        assert_eq!(write16(0, 1, false)[1], 0);
        assert_eq!(write_same16(0, 1, true)[..2], [0x93, 0x08]);
        assert_eq!(synchronize_cache16()[0], 0x91);
        assert_eq!(synchronize_cache10()[0], 0x35);
        assert_eq!(unmap(24)[..], [0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0]);
    }

    #[test]
    fn unmap_list_lengths_count_the_bytes_after_them() {
        let list = unmap_list(9, 3);
        assert_eq!(list.len(), 24);
        assert_eq!(&list[..4], &[0, 22, 0, 16]);
        assert_eq!(list[15], 9);
        assert_eq!(list[19], 3);
    }

    #[test]
    fn inquiry_and_service_action_cdbs() {
        assert_eq!(inquiry(Some(0xb0), 64)[..5], [0x12, 1, 0xb0, 0, 64]);
        assert_eq!(inquiry(None, 96)[..5], [0x12, 0, 0, 0, 96]);
        assert_eq!(read_capacity16()[..2], [0x9e, 0x10]);
        assert_eq!(read_capacity16()[13], 32);
        assert_eq!(get_lba_status(7, 4096)[..2], [0x9e, 0x12]);
        assert_eq!(report_luns(1024)[..10], [0xa0, 0, 0, 0, 0, 0, 0, 0, 4, 0]);
        assert_eq!(test_unit_ready(), [0; 6]);
        let with_action = report_supported_opcode(0x9e, Some(0x10));
        assert_eq!(with_action[..6], [0xa3, 0x0c, 3, 0x9e, 0, 0x10]);
        assert_eq!(report_supported_opcode(0x42, None)[2], 1);
    }
}
