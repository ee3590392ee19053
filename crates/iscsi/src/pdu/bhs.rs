//! The Basic Header Segment: 48 bytes at the start of every PDU (RFC 7143 §11.2.1),
//! with big-endian field accessors shared by every PDU type.

/// Length of the Basic Header Segment.
pub const BHS_LEN: usize = 48;
/// Length of a CRC32C digest.
pub const DIGEST_LEN: usize = 4;
/// The value of a tag field that names no task (§11.2.1.4, "reserved tag").
pub const RESERVED_TAG: u32 = 0xffff_ffff;
/// Largest DataSegmentLength the 24-bit field can express.
pub const MAX_DATA_SEGMENT: u32 = 0x00ff_ffff;

/// Rounds a segment length up to the 4-byte boundary PDUs are padded to.
pub fn padded(len: usize) -> usize {
    (len + 3) & !3
}

/// A Basic Header Segment as it travels on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Bhs(pub [u8; BHS_LEN]);

impl std::fmt::Debug for Bhs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bhs(opcode {:#04x}, ", self.opcode())?;
        for byte in &self.0 {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(")")
    }
}

impl Default for Bhs {
    fn default() -> Self {
        Bhs([0; BHS_LEN])
    }
}

impl Bhs {
    /// The opcode (6 bits).
    pub fn opcode(&self) -> u8 {
        self.0[0] & 0x3f
    }

    /// The immediate-delivery bit (initiator PDUs only).
    pub fn immediate(&self) -> bool {
        self.0[0] & 0x40 != 0
    }

    /// The final bit, where the PDU type has one.
    pub fn final_bit(&self) -> bool {
        self.0[1] & 0x80 != 0
    }

    /// TotalAHSLength in bytes (the field counts 4-byte words).
    pub fn ahs_len(&self) -> usize {
        usize::from(self.0[4]) * 4
    }

    /// DataSegmentLength in bytes, without padding.
    pub fn data_len(&self) -> u32 {
        self.u32_at(4) & MAX_DATA_SEGMENT
    }

    pub fn set_data_len(&mut self, len: u32) {
        debug_assert!(len <= MAX_DATA_SEGMENT);
        self.0[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
    }

    pub fn set_ahs_len(&mut self, bytes: usize) {
        debug_assert!(bytes.is_multiple_of(4) && bytes / 4 <= 255);
        self.0[4] = (bytes / 4) as u8;
    }

    pub fn initiator_task_tag(&self) -> u32 {
        self.u32_at(16)
    }

    /// The Initiator Session ID of a login PDU: 6 bytes at offset 8, in the low 48
    /// bits.
    pub fn isid(&self) -> u64 {
        self.0[8..14]
            .iter()
            .fold(0u64, |acc, &byte| (acc << 8) | u64::from(byte))
    }

    pub fn set_isid(&mut self, isid: u64) {
        self.0[8..14].copy_from_slice(&isid.to_be_bytes()[2..]);
    }

    pub fn u16_at(&self, at: usize) -> u16 {
        u16::from_be_bytes([self.0[at], self.0[at + 1]])
    }

    pub fn u32_at(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.0[at..at + 4].try_into().expect("4 bytes"))
    }

    pub fn u64_at(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.0[at..at + 8].try_into().expect("8 bytes"))
    }

    pub fn put_u16(&mut self, at: usize, value: u16) {
        self.0[at..at + 2].copy_from_slice(&value.to_be_bytes());
    }

    pub fn put_u32(&mut self, at: usize, value: u32) {
        self.0[at..at + 4].copy_from_slice(&value.to_be_bytes());
    }

    pub fn put_u64(&mut self, at: usize, value: u64) {
        self.0[at..at + 8].copy_from_slice(&value.to_be_bytes());
    }
}

/// CRC32C (Castagnoli) as iSCSI digests use it (RFC 7143 §13.1 and Appendix B).
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// Continues a CRC32C over more bytes (a digest over a segment and its padding).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// A digest as it travels: the CRC's least significant byte first, as libiscsi and
/// the Linux initiator put it on the wire.
pub fn digest_bytes(crc: u32) -> [u8; DIGEST_LEN] {
    crc.to_le_bytes()
}

/// The digest value of four received bytes.
pub fn digest_value(bytes: [u8; DIGEST_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// The header digest of a BHS and its AHS.
pub fn header_digest(bhs: &Bhs, ahs: &[u8]) -> u32 {
    crc32c_append(crc32c(&bhs.0), ahs)
}

/// The data digest of a segment, including its padding.
pub fn data_digest(data: &[u8]) -> u32 {
    let pad = padded(data.len()) - data.len();
    crc32c_append(crc32c(data), &[0u8; 3][..pad])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_rfc_3720_appendix_vectors() {
        // RFC 3720 B.4: 32 bytes of zeroes, of 0xff, and an ascending sequence.
        assert_eq!(digest_bytes(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(
            digest_bytes(crc32c(&[0xffu8; 32])),
            [0x43, 0xab, 0xa8, 0x62]
        );
        let ascending: Vec<u8> = (0u8..32).collect();
        assert_eq!(digest_bytes(crc32c(&ascending)), [0x4e, 0x79, 0xdd, 0x46]);
        let descending: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(digest_bytes(crc32c(&descending)), [0x5c, 0xdb, 0x3f, 0x11]);
    }

    #[test]
    fn data_digest_covers_padding() {
        let data = [1u8, 2, 3, 4, 5];
        let mut with_pad = data.to_vec();
        with_pad.extend_from_slice(&[0, 0, 0]);
        assert_eq!(data_digest(&data), crc32c(&with_pad));
    }

    #[test]
    fn lengths_are_24_bit_and_words() {
        let mut bhs = Bhs::default();
        bhs.set_data_len(0x12_3456);
        bhs.set_ahs_len(8);
        assert_eq!(bhs.data_len(), 0x12_3456);
        assert_eq!(bhs.ahs_len(), 8);
        assert_eq!(&bhs.0[4..8], &[2, 0x12, 0x34, 0x56]);
        assert_eq!(padded(5), 8);
        assert_eq!(padded(8), 8);
    }
}
