//! The answers an initiator parses: READ CAPACITY (16), the VPD pages that shape a
//! device (supported pages, block limits, provisioning), standard INQUIRY, REPORT
//! LUNS, GET LBA STATUS and REPORT SUPPORTED OPERATION CODES. Every field is read
//! with checked indexing: a short or hostile answer yields `None` or fewer entries,
//! never a panic.

use crate::vpd;

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn be64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// READ CAPACITY (16) data (SBC-3 5.16.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Logical blocks on the medium (the last LBA plus one).
    pub blocks: u64,
    pub block_size: u32,
    /// LBPME: logical block provisioning (UNMAP, GET LBA STATUS) is enabled.
    pub provisioning: bool,
    /// LBPRZ: unmapped blocks read as zeroes.
    pub reads_zero: bool,
    /// Logical blocks per physical block, as a power of two.
    pub physical_exponent: u8,
}

/// READ CAPACITY (16) data, or `None` when it is short or its block size is not a
/// power of two (a size we could not address by).
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

/// The Block Limits page, or `None` when `page` is another page; fields a short
/// page leaves out read as 0 (not reported).
pub fn parse_block_limits(page: &[u8]) -> Option<BlockLimits> {
    if page.get(1) != Some(&vpd::BLOCK_LIMITS) {
        return None;
    }
    Some(BlockLimits {
        optimal_granularity_blocks: be16(page, 6).unwrap_or(0),
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

/// The Logical Block Provisioning page, or `None` when `page` is another page or
/// too short to hold its flags.
pub fn parse_provisioning(page: &[u8]) -> Option<Provisioning> {
    if page.get(1) != Some(&vpd::LOGICAL_BLOCK_PROVISIONING) {
        return None;
    }
    let flags = *page.get(5)?;
    Some(Provisioning {
        unmap: flags & 0x80 != 0,
        write_same_unmap: flags & 0x40 != 0,
    })
}

/// The page codes a Supported VPD Pages page (00h) lists, cut to the bytes present.
pub fn parse_supported_pages(page: &[u8]) -> Vec<u8> {
    let len = usize::from(be16(page, 2).unwrap_or(0));
    page.get(4..)
        .map_or_else(Vec::new, |rest| rest.iter().take(len).copied().collect())
}

/// Standard INQUIRY data (SPC-4 6.6.2), the fields people read.
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

/// Standard INQUIRY data, or `None` when it is empty; text fields a short answer
/// leaves out read as empty.
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

/// A LUN number from an 8-byte single-level LUN (SAM-5 4.7: peripheral addressing
/// below 256, flat space up to 16383); other forms are not ours to address.
fn decode_lun(entry: [u8; 8]) -> Option<u64> {
    if entry[2..].iter().any(|&b| b != 0) {
        return None;
    }
    match entry[0] >> 6 {
        0 if entry[0] == 0 => Some(u64::from(entry[1])),
        1 => Some((u64::from(entry[0] & 0x3f) << 8) | u64::from(entry[1])),
        _ => None,
    }
}

/// The LUNs of a REPORT LUNS answer (SPC-4 6.33.2) that are in a single-level form;
/// entries beyond the LUN LIST LENGTH or the bytes present are ignored.
pub fn parse_report_luns(data: &[u8]) -> Vec<u64> {
    let len = be32(data, 0).unwrap_or(0) as usize;
    data.get(8..)
        .unwrap_or(&[])
        .chunks_exact(8)
        .take(len / 8)
        .filter_map(|entry| decode_lun(entry.try_into().ok()?))
        .collect()
}

/// One LBA status descriptor (SBC-3 5.6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaStatus {
    pub lba: u64,
    pub blocks: u32,
    /// Provisioning status: 0 mapped, 1 deallocated, 2 anchored.
    pub provisioning: u8,
}

/// The descriptors of a GET LBA STATUS answer, cut to its PARAMETER DATA LENGTH
/// and to the bytes present.
pub fn parse_lba_status(data: &[u8]) -> Vec<LbaStatus> {
    let len = be32(data, 0).unwrap_or(0) as usize;
    // PARAMETER DATA LENGTH counts the bytes after itself.
    let end = len.saturating_add(4).min(data.len());
    data.get(8..end)
        .unwrap_or(&[])
        .chunks_exact(16)
        .filter_map(|d| {
            Some(LbaStatus {
                lba: be64(d, 0)?,
                blocks: be32(d, 8)?,
                provisioning: d[12] & 0x0f,
            })
        })
        .collect()
}

/// Whether a one-command REPORT SUPPORTED OPERATION CODES answer (SPC-4 6.35.2)
/// says the command is supported (SUPPORT field 011b or 101b).
pub fn opcode_supported(answer: &[u8]) -> bool {
    answer.get(1).is_some_and(|b| matches!(b & 7, 3 | 5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The answers we parse come from the network: any bytes are fine.
        #[test]
        fn parsers_take_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = parse_capacity(&data);
            let _ = parse_block_limits(&data);
            let _ = parse_provisioning(&data);
            let _ = parse_supported_pages(&data);
            let _ = parse_inquiry(&data);
            let _ = parse_report_luns(&data);
            let _ = parse_lba_status(&data);
            let _ = crate::initiator::sense_code(&data);
            let _ = opcode_supported(&data);
        }
    }

    #[test]
    fn capacity_parses_and_rejects_short_or_odd_block_sizes() {
        let mut cap = vec![0u8; 32];
        cap[7] = 99;
        cap[10] = 2; // 512
        cap[13] = 3;
        cap[14] = 0xc0;
        let c = parse_capacity(&cap).unwrap();
        assert_eq!((c.blocks, c.block_size, c.physical_exponent), (100, 512, 3));
        assert!(c.provisioning && c.reads_zero);
        assert!(parse_capacity(&cap[..8]).is_none());
        cap[10] = 3; // 768
        assert!(parse_capacity(&cap).is_none());
        let mut wraps = vec![0xffu8; 8];
        wraps.extend_from_slice(&[0, 0, 2, 0]);
        assert!(parse_capacity(&wraps).is_none(), "last LBA + 1 overflows");
    }

    #[test]
    fn vpd_pages_are_checked_by_code() {
        assert_eq!(parse_block_limits(&[0, 0xb0]), Some(BlockLimits::default()));
        assert!(parse_block_limits(&[0, 0xb1]).is_none());
        assert_eq!(
            parse_provisioning(&[0, 0xb2, 0, 4, 0, 0xc0]),
            Some(Provisioning {
                unmap: true,
                write_same_unmap: true
            })
        );
        assert!(parse_provisioning(&[0, 0xb2, 0, 4]).is_none());
        assert_eq!(
            parse_supported_pages(&[0, 0, 0, 3, 0, 0xb0, 0xb2]),
            vec![0, 0xb0, 0xb2]
        );
        assert_eq!(parse_supported_pages(&[0, 0, 0, 9, 0]), vec![0]);
        assert!(parse_supported_pages(&[0]).is_empty());
    }

    #[test]
    fn report_luns_keeps_single_level_forms_within_the_length() {
        let mut luns = vec![0, 0, 0, 24, 0, 0, 0, 0];
        luns.extend_from_slice(&[0; 8]);
        luns.extend_from_slice(&[0, 3, 0, 0, 0, 0, 0, 0]);
        luns.extend_from_slice(&[0x41, 0x02, 0, 0, 0, 0, 0, 0]);
        luns.extend_from_slice(&[0, 9, 0, 0, 0, 0, 0, 0]); // beyond the list length
        assert_eq!(parse_report_luns(&luns), vec![0, 3, 0x102]);
        luns[19] = 1; // a second-level address: not ours
        assert_eq!(parse_report_luns(&luns), vec![0, 0x102]);
        assert!(parse_report_luns(&[0, 0]).is_empty());
    }

    #[test]
    fn lba_status_stops_at_its_length() {
        let mut status = vec![0, 0, 0, 20, 0, 0, 0, 0];
        status.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 16, 1, 0, 0, 0]);
        status.extend_from_slice(&[0; 16]); // beyond PARAMETER DATA LENGTH
        let expected = LbaStatus {
            lba: 8,
            blocks: 16,
            provisioning: 1,
        };
        assert_eq!(parse_lba_status(&status), vec![expected]);
        status[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_lba_status(&status).len(), 2);
        assert!(parse_lba_status(&[0, 0, 0]).is_empty());
    }

    #[test]
    fn inquiry_and_opcode_answers() {
        assert!(parse_inquiry(&[]).is_none());
        let absent = parse_inquiry(&[0x7f]).unwrap();
        assert!(absent.not_present);
        assert_eq!(absent.vendor, "");
        assert_eq!(device_type_name(0x0c), "STORAGE_ARRAY_CONTROLLER");
        assert_eq!(device_type_name(0x1e), "OTHER");
        assert!(opcode_supported(&[0, 3]));
        assert!(opcode_supported(&[0, 5]));
        assert!(!opcode_supported(&[0, 1]));
        assert!(!opcode_supported(&[0]));
    }
}
