//! The submission queue entries the initiator sends, and what it reads from
//! Identify. Command IDs and data pointers are filled in by the connection.

use crate::opcodes::{admin, cns, feature, io};
use crate::sqe::Sqe;

/// Identify (controller or namespace), 4096 bytes back.
pub fn identify(cns_value: u8, nsid: u32) -> Sqe {
    let mut sqe = Sqe::new(admin::IDENTIFY, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, u32::from(cns_value));
    sqe
}

/// Identify Controller.
pub fn identify_controller() -> Sqe {
    identify(cns::CONTROLLER, 0)
}

/// Get Log Page `lid`, `len` bytes (a multiple of 4) from byte `offset`.
pub fn get_log_page(lid: u8, len: u32, offset: u64) -> Sqe {
    let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 0);
    let dwords = len / 4 - 1;
    sqe.set_cdw(10, u32::from(lid) | ((dwords & 0xffff) << 16));
    sqe.set_cdw(11, dwords >> 16);
    sqe.set_cdw(12, offset as u32);
    sqe.set_cdw(13, (offset >> 32) as u32);
    sqe
}

/// Set Features Number of Queues: `count` submission and completion queues.
pub fn set_queue_count(count: u16) -> Sqe {
    let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
    let n = u32::from(count.max(1) - 1);
    sqe.set_cdw(10, u32::from(feature::NUMBER_OF_QUEUES));
    sqe.set_cdw(11, n | (n << 16));
    sqe
}

pub fn keep_alive() -> Sqe {
    Sqe::new(admin::KEEP_ALIVE, 0)
}

/// An LBA range command's common part: namespace, starting LBA, block count.
fn ranged(opcode: u8, nsid: u32, lba: u64, blocks: u32) -> Sqe {
    let mut sqe = Sqe::new(opcode, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw10_11(lba);
    sqe.set_cdw(12, (blocks - 1) & 0xffff);
    sqe
}

/// Force Unit Access (CDW12 bit 30).
const FUA: u32 = 1 << 30;
/// Write Zeroes: deallocate the blocks (CDW12 bit 25).
const DEAC: u32 = 1 << 25;
/// Blocks one Read/Write/Write Zeroes names at most (NLB is 16 bits, 0's based).
pub const MAX_BLOCKS: u32 = 1 << 16;

pub fn read(nsid: u32, lba: u64, blocks: u32) -> Sqe {
    ranged(io::READ, nsid, lba, blocks)
}

pub fn write(nsid: u32, lba: u64, blocks: u32, fua: bool) -> Sqe {
    let mut sqe = ranged(io::WRITE, nsid, lba, blocks);
    if fua {
        sqe.set_cdw(12, sqe.cdw(12) | FUA);
    }
    sqe
}

pub fn flush(nsid: u32) -> Sqe {
    let mut sqe = Sqe::new(io::FLUSH, 0);
    sqe.set_nsid(nsid);
    sqe
}

pub fn write_zeroes(nsid: u32, lba: u64, blocks: u32, fua: bool, deallocate: bool) -> Sqe {
    let mut sqe = ranged(io::WRITE_ZEROES, nsid, lba, blocks);
    let mut cdw12 = sqe.cdw(12);
    if fua {
        cdw12 |= FUA;
    }
    if deallocate {
        cdw12 |= DEAC;
    }
    sqe.set_cdw(12, cdw12);
    sqe
}

/// Ranges one Dataset Management command carries at most.
pub const DSM_MAX_RANGES: usize = 256;
/// Blocks one Dataset Management range names at most.
pub const DSM_MAX_BLOCKS: u64 = u32::MAX as u64;

/// Dataset Management with the deallocate attribute over `ranges` (starting
/// LBA, blocks); returns the command and its data (16 bytes a range).
pub fn deallocate(nsid: u32, ranges: &[(u64, u32)]) -> (Sqe, Vec<u8>) {
    let mut sqe = Sqe::new(io::DATASET_MANAGEMENT, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, ranges.len() as u32 - 1);
    sqe.set_cdw(11, 1 << 2);
    let mut data = Vec::with_capacity(ranges.len() * 16);
    for &(lba, blocks) in ranges {
        data.extend_from_slice(&0u32.to_le_bytes()); // context attributes
        data.extend_from_slice(&blocks.to_le_bytes());
        data.extend_from_slice(&lba.to_le_bytes());
    }
    (sqe, data)
}

fn u16_at(d: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([d[at], d[at + 1]])
}

fn u32_at(d: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(d[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(d[at..at + 8].try_into().expect("8 bytes"))
}

/// An ASCII field with its padding (spaces or NULs) removed.
pub(crate) fn text(field: &[u8]) -> String {
    String::from_utf8_lossy(field)
        .trim_end_matches(['\0', ' '])
        .to_string()
}

/// What the initiator uses of Identify Controller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ControllerIdentity {
    pub cntlid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Maximum data transfer size as a power of two of the minimum page size
    /// (0: no limit).
    pub mdts: u8,
    /// Optional NVM commands: bit 2 Dataset Management, bit 3 Write Zeroes.
    pub oncs: u16,
    /// A volatile write cache is present (Flush does something).
    pub volatile_write_cache: bool,
    /// I/O command capsule size in 16-byte units (SQE included).
    pub ioccsz: u32,
    pub namespaces: u32,
}

impl ControllerIdentity {
    /// Reads the 4096 bytes of Identify Controller (None when shorter).
    pub fn parse(d: &[u8]) -> Option<ControllerIdentity> {
        if d.len() < 4096 {
            return None;
        }
        Some(ControllerIdentity {
            cntlid: u16_at(d, 78),
            serial: text(&d[4..24]),
            model: text(&d[24..64]),
            firmware: text(&d[64..72]),
            mdts: d[77],
            oncs: u16_at(d, 520),
            volatile_write_cache: d[525] & 1 != 0,
            ioccsz: u32_at(d, 1792),
            namespaces: u32_at(d, 516),
        })
    }

    pub fn supports_deallocate(&self) -> bool {
        self.oncs & (1 << 2) != 0
    }

    pub fn supports_write_zeroes(&self) -> bool {
        self.oncs & (1 << 3) != 0
    }

    /// In-capsule data an I/O command may carry.
    pub fn inline_data(&self) -> usize {
        (self.ioccsz as usize * 16).saturating_sub(64)
    }
}

/// What the initiator uses of Identify Namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NamespaceIdentity {
    /// Size in logical blocks.
    pub blocks: u64,
    pub block_size: u32,
    pub write_protected: bool,
}

impl NamespaceIdentity {
    /// Reads Identify Namespace; None for an inactive namespace (size 0), a
    /// format with metadata, a block size outside 512 B..64 KiB, or a size
    /// beyond 2^64 bytes.
    pub fn parse(d: &[u8]) -> Option<NamespaceIdentity> {
        if d.len() < 4096 {
            return None;
        }
        let blocks = u64_at(d, 0);
        let format = usize::from(d[26] & 0x0f) | (usize::from(d[26] >> 5 & 0x3) << 4);
        let lbaf = 128 + 4 * format;
        let lbads = d[lbaf + 2];
        if blocks == 0 || u16_at(d, lbaf) != 0 || !(9..=16).contains(&lbads) {
            return None;
        }
        // A size in bytes that does not fit 64 bits is not a real namespace.
        blocks.checked_mul(1 << lbads)?;
        Some(NamespaceIdentity {
            blocks,
            block_size: 1 << lbads,
            write_protected: d[99] & 1 != 0,
        })
    }

    pub fn size(&self) -> u64 {
        self.blocks * u64::from(self.block_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_fields() {
        let sqe = write(1, 0x1_0000_0002, 8, true);
        assert_eq!(sqe.opcode(), 0x01);
        assert_eq!(sqe.nsid(), 1);
        assert_eq!(sqe.cdw10_11(), 0x1_0000_0002);
        assert_eq!(sqe.cdw(12), 7 | (1 << 30));
        let sqe = read(2, 5, MAX_BLOCKS);
        assert_eq!((sqe.opcode(), sqe.cdw(12)), (0x02, 0xffff));
        let sqe = write_zeroes(1, 0, 1, false, true);
        assert_eq!(sqe.cdw(12), 1 << 25);
    }

    #[test]
    fn dsm_ranges() {
        let (sqe, data) = deallocate(1, &[(10, 4), (1 << 40, 1)]);
        assert_eq!(sqe.cdw(10), 1);
        assert_eq!(sqe.cdw(11), 4);
        assert_eq!(data.len(), 32);
        assert_eq!(&data[4..8], &4u32.to_le_bytes());
        assert_eq!(&data[8..16], &10u64.to_le_bytes());
        assert_eq!(&data[24..32], &(1u64 << 40).to_le_bytes());
    }

    #[test]
    fn log_page_length_is_zeros_based_dwords() {
        let sqe = get_log_page(0x70, 1024 * 65, 4096);
        let dwords = 1024 * 65 / 4 - 1;
        assert_eq!(sqe.cdw(10), 0x70 | ((dwords & 0xffff) << 16));
        assert_eq!(sqe.cdw(11), dwords >> 16);
        assert_eq!(sqe.cdw(12), 4096);
    }

    #[test]
    fn namespace_identity() {
        let mut d = vec![0u8; 4096];
        d[0..8].copy_from_slice(&2048u64.to_le_bytes());
        d[26] = 1;
        d[132 + 2] = 12;
        let ns = NamespaceIdentity::parse(&d).unwrap();
        assert_eq!((ns.blocks, ns.block_size, ns.size()), (2048, 4096, 8 << 20));
        d[26] = 0; // format 0 has LBADS 0: unusable
        assert!(NamespaceIdentity::parse(&d).is_none());
        assert!(NamespaceIdentity::parse(&d[..100]).is_none());
    }

    #[test]
    fn controller_identity() {
        let mut d = vec![0u8; 4096];
        d[4..8].copy_from_slice(b"SN1 ");
        d[77] = 8;
        d[78..80].copy_from_slice(&5u16.to_le_bytes());
        d[520..522].copy_from_slice(&0b1100u16.to_le_bytes());
        d[525] = 1;
        d[1792..1796].copy_from_slice(&(1028u32).to_le_bytes());
        let c = ControllerIdentity::parse(&d).unwrap();
        assert_eq!(c.serial, "SN1");
        assert_eq!((c.cntlid, c.mdts), (5, 8));
        assert!(c.supports_deallocate() && c.supports_write_zeroes());
        assert!(c.volatile_write_cache);
        assert_eq!(c.inline_data(), 16 * 1024);
    }

    proptest::proptest! {
        /// Identify data is the target's to choose: any of it parses or is
        /// refused, never a panic.
        #[test]
        fn identify_never_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 4096..4097),
        ) {
            let _ = ControllerIdentity::parse(&bytes);
            if let Some(ns) = NamespaceIdentity::parse(&bytes) {
                proptest::prop_assert!(ns.block_size.is_power_of_two() && ns.blocks > 0);
                proptest::prop_assert!(ns.size() >= ns.blocks);
            }
        }
    }
}
