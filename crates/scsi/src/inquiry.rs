//! Standard INQUIRY data (SPC-4 6.6.2).

use crate::lun::LunConfig;

/// Peripheral device type of a direct-access block device.
pub const DISK: u8 = 0x00;
/// Peripheral qualifier 011b, device type 1Fh: no logical unit at this LUN.
pub const NO_LUN: u8 = 0x7f;

/// Version descriptors (SPC-4 table 148): SAM-5, SPC-4, SBC-3, iSCSI.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00a0, 0x0460, 0x04c0, 0x0960];

/// `text` space-padded (or cut) to `len` printable ASCII bytes.
pub fn ascii_field(text: &str, len: usize) -> Vec<u8> {
    let mut out: Vec<u8> = text
        .bytes()
        .map(|b| if (0x20..0x7f).contains(&b) { b } else { b'?' })
        .take(len)
        .collect();
    out.resize(len, b' ');
    out
}

/// Standard INQUIRY data for a disk, or for an absent LUN when `peripheral` is
/// [`NO_LUN`].
pub fn standard(config: &LunConfig, peripheral: u8) -> Vec<u8> {
    let mut out = vec![0u8; 96];
    out[0] = peripheral;
    out[2] = 0x06; // SPC-4
    out[3] = 0x12; // HISUP, response data format 2
    out[4] = (out.len() - 5) as u8;
    out[5] = 0x08; // 3PC: EXTENDED COPY
    out[7] = 0x02; // CMDQUE
    out[8..16].copy_from_slice(&ascii_field(&config.vendor, 8));
    out[16..32].copy_from_slice(&ascii_field(&config.product, 16));
    out[32..36].copy_from_slice(&ascii_field(&config.revision, 4));
    for (i, version) in VERSION_DESCRIPTORS.iter().enumerate() {
        out[58 + 2 * i..60 + 2 * i].copy_from_slice(&version.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_data_is_consistent() {
        let config = LunConfig::default();
        let data = standard(&config, DISK);
        assert_eq!(usize::from(data[4]) + 5, data.len());
        assert_eq!(&data[8..16], b"BLKWIRE ");
        assert_eq!(&data[58..60], &[0x00, 0xa0]);
        assert_eq!(standard(&config, NO_LUN)[0], 0x7f);
    }

    #[test]
    fn ascii_fields_are_padded_and_cleaned() {
        assert_eq!(ascii_field("ab\u{e9}", 6), b"ab??  ");
        assert_eq!(ascii_field("abcdef", 4), b"abcd");
    }
}
