//! Header and data digests: CRC32C over the header (or the data), stored
//! little-endian right after it (NVMe/TCP section 3.6.2.3).

use super::header::DIGEST_LEN;

/// The digest of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    ::crc32c::crc32c(bytes)
}

/// Appends the digest of `bytes` (already in `out` at `start..`) to `out`.
pub fn append_digest(out: &mut Vec<u8>, start: usize) {
    let digest = crc32c(&out[start..]);
    out.extend_from_slice(&digest.to_le_bytes());
}

/// Whether the 4 bytes in `stored` are the digest of `bytes`.
pub fn digest_matches(bytes: &[u8], stored: &[u8]) -> bool {
    stored.len() == DIGEST_LEN && crc32c(bytes).to_le_bytes() == stored[..DIGEST_LEN]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        // The CRC-32C check value from the catalogue of CRC algorithms.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn digest_round_trip() {
        let mut out = b"hello".to_vec();
        append_digest(&mut out, 0);
        assert_eq!(out.len(), 9);
        assert!(digest_matches(&out[..5], &out[5..]));
        out[0] ^= 1;
        assert!(!digest_matches(&out[..5], &out[5..]));
    }
}
