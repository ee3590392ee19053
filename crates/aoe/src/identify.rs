//! The 512-byte ATA IDENTIFY DEVICE block: built by the target, read by the initiator.
//!
//! Word numbers follow ATA/ATAPI-8 (ACS); words are little-endian, strings are ASCII
//! with the two characters of each word swapped, padded with spaces.

use crate::wire::SECTOR_SIZE;

/// Largest sector count addressable with 28-bit LBAs.
pub const LBA28_MAX_SECTORS: u64 = 0x0fff_ffff;

/// What a target says about itself in IDENTIFY DEVICE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Capacity in 512-byte sectors.
    pub sectors: u64,
    /// Whether 48-bit addressing (READ/WRITE SECTORS EXT, FLUSH CACHE EXT) is supported.
    pub lba48: bool,
    /// Model number (up to 40 characters).
    pub model: String,
    /// Serial number (up to 20 characters).
    pub serial: String,
    /// Firmware revision (up to 8 characters).
    pub firmware: String,
}

const MODEL_WORDS: (usize, usize) = (27, 20);
const SERIAL_WORDS: (usize, usize) = (10, 10);
const FIRMWARE_WORDS: (usize, usize) = (23, 4);

fn put_word(block: &mut [u8; SECTOR_SIZE], word: usize, value: u16) {
    block[word * 2..word * 2 + 2].copy_from_slice(&value.to_le_bytes());
}

fn word(block: &[u8], word: usize) -> u16 {
    u16::from_le_bytes([block[word * 2], block[word * 2 + 1]])
}

fn put_string(block: &mut [u8; SECTOR_SIZE], (first, words): (usize, usize), text: &str) {
    let mut chars: Vec<u8> = text
        .bytes()
        .map(|b| if b.is_ascii_graphic() { b } else { b' ' })
        .take(words * 2)
        .collect();
    chars.resize(words * 2, b' ');
    for (i, pair) in chars.chunks_exact(2).enumerate() {
        put_word(block, first + i, u16::from_be_bytes([pair[0], pair[1]]));
    }
}

fn string(block: &[u8], (first, words): (usize, usize)) -> String {
    let bytes: Vec<u8> = (first..first + words)
        .flat_map(|w| word(block, w).to_be_bytes())
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}

impl Identity {
    /// Encodes the IDENTIFY DEVICE block, with its integrity word.
    pub fn encode(&self) -> [u8; SECTOR_SIZE] {
        let mut block = [0u8; SECTOR_SIZE];
        let lba28 = self.sectors.min(LBA28_MAX_SECTORS) as u32;
        // Word 0: fixed, non-removable ATA device.
        put_word(&mut block, 0, 0x0040);
        // Words 1, 3, 6: legacy geometry, the values ATA gives for devices > 8 GB.
        put_word(&mut block, 1, 16383);
        put_word(&mut block, 3, 16);
        put_word(&mut block, 6, 63);
        put_string(&mut block, SERIAL_WORDS, &self.serial);
        put_string(&mut block, FIRMWARE_WORDS, &self.firmware);
        put_string(&mut block, MODEL_WORDS, &self.model);
        // Word 47: READ/WRITE MULTIPLE up to 1 sector per DRQ block (0x80 is fixed).
        put_word(&mut block, 47, 0x8001);
        // Word 49: LBA and DMA supported. Word 53: words 64-70 and 88 valid.
        put_word(&mut block, 49, 0x0300);
        put_word(&mut block, 53, 0x0006);
        // Words 60-61: sectors addressable with LBA28.
        put_word(&mut block, 60, lba28 as u16);
        put_word(&mut block, 61, (lba28 >> 16) as u16);
        // Word 80: ATA/ATAPI-5 through ATA8-ACS.
        put_word(&mut block, 80, 0x01f0);
        // Words 82-87: command sets supported and enabled. 82: write cache;
        // 83: bit 14 set, FLUSH CACHE (12), FLUSH CACHE EXT (13), 48-bit (10).
        let ext = if self.lba48 { 0x2400 } else { 0 };
        put_word(&mut block, 82, 0x4020);
        put_word(&mut block, 83, 0x5000 | ext);
        put_word(&mut block, 84, 0x4000);
        put_word(&mut block, 85, 0x4020);
        put_word(&mut block, 86, 0x1000 | ext);
        put_word(&mut block, 87, 0x4000);
        // Words 100-103: sectors addressable with LBA48.
        if self.lba48 {
            for i in 0..4 {
                put_word(&mut block, 100 + i, (self.sectors >> (16 * i)) as u16);
            }
        }
        // Word 106: valid, one 512-byte logical sector per physical sector.
        put_word(&mut block, 106, 0x4000);
        // Word 255: signature 0xA5 and a checksum making all bytes sum to zero.
        block[510] = 0xa5;
        let sum = block[..511].iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
        block[511] = sum.wrapping_neg();
        block
    }

    /// Decodes an IDENTIFY DEVICE block; `None` when it is shorter than 512 bytes.
    pub fn parse(block: &[u8]) -> Option<Identity> {
        if block.len() < SECTOR_SIZE {
            return None;
        }
        let lba48 = word(block, 83) & 0x0400 != 0 && word(block, 86) & 0x0400 != 0;
        let sectors = if lba48 {
            (0..4).fold(0u64, |acc, i| {
                acc | (word(block, 100 + i) as u64) << (16 * i)
            })
        } else {
            word(block, 60) as u64 | (word(block, 61) as u64) << 16
        };
        Some(Identity {
            sectors,
            lba48,
            model: string(block, MODEL_WORDS),
            serial: string(block, SERIAL_WORDS),
            firmware: string(block, FIRMWARE_WORDS),
        })
    }

    /// Whether the integrity word is absent (signature not 0xA5) or checks out.
    pub fn checksum_ok(block: &[u8]) -> bool {
        block.len() >= SECTOR_SIZE
            && (block[510] != 0xa5
                || block[..512].iter().fold(0u8, |acc, b| acc.wrapping_add(*b)) == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(sectors: u64, lba48: bool) -> Identity {
        Identity {
            sectors,
            lba48,
            model: "blockwire AoE".into(),
            serial: "e1.2".into(),
            firmware: "0.1.0".into(),
        }
    }

    #[test]
    fn strings_are_byte_swapped_per_word() {
        let block = identity(2048, true).encode();
        // "bl" is stored as word 27 = 0x626c, little-endian: 'l' first.
        assert_eq!(&block[54..58], b"lbco");
        assert_eq!(&block[20..24], b"1e2.");
    }

    #[test]
    fn round_trips_and_checksums() {
        for (sectors, lba48) in [(2048, true), (1 << 40, true), (12345, false)] {
            let id = identity(sectors, lba48);
            let block = id.encode();
            assert!(Identity::checksum_ok(&block));
            assert_eq!(Identity::parse(&block), Some(id));
        }
    }

    #[test]
    fn large_devices_cap_the_lba28_count() {
        let block = identity(1 << 40, true).encode();
        assert_eq!(word(&block, 60), 0xffff);
        assert_eq!(word(&block, 61), 0x0fff);
        assert_eq!(word(&block, 103), 0);
        assert_eq!(word(&block, 102), 0x0100);
    }

    #[test]
    fn a_corrupted_block_fails_the_checksum() {
        let mut block = identity(2048, true).encode();
        block[100] ^= 1;
        assert!(!Identity::checksum_ok(&block));
        assert_eq!(Identity::parse(&block[..100]), None);
    }
}
