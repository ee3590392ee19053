//! Vital product data pages (SPC-4 7.8, SBC-3 6.6): supported pages, unit serial
//! number, device identification, block limits, block device characteristics and
//! logical block provisioning.

use crate::inquiry::{ascii_field, DISK};
use crate::lun::LunConfig;
use crate::nexus::Nexus;

pub const SUPPORTED_PAGES: u8 = 0x00;
pub const UNIT_SERIAL_NUMBER: u8 = 0x80;
pub const DEVICE_IDENTIFICATION: u8 = 0x83;
pub const BLOCK_LIMITS: u8 = 0xb0;
pub const BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xb1;
pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;

const PAGES: [u8; 6] = [
    SUPPORTED_PAGES,
    UNIT_SERIAL_NUMBER,
    DEVICE_IDENTIFICATION,
    BLOCK_LIMITS,
    BLOCK_DEVICE_CHARACTERISTICS,
    LOGICAL_BLOCK_PROVISIONING,
];

/// What the block pages report, in logical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFacts {
    pub max_transfer_blocks: u32,
    pub optimal_transfer_blocks: u32,
    pub max_compare_and_write_blocks: u8,
    /// UNMAP limits; zero when UNMAP is not supported.
    pub max_unmap_blocks: u32,
    pub max_unmap_descriptors: u32,
    pub unmap_granularity: u32,
    pub max_write_same_blocks: u64,
    /// Thin provisioning: UNMAP and WRITE SAME with UNMAP deallocate.
    pub unmap: bool,
    /// Unmapped blocks read as zeroes.
    pub lbprz: bool,
    pub rotational: bool,
}

fn page(code: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&[DISK, code]);
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// One designation descriptor (SPC-4 7.8.6.1).
fn designator(code_set: u8, association: u8, kind: u8, id: &[u8]) -> Vec<u8> {
    // PIV is set for target port and target device associations with the iSCSI
    // protocol identifier (5h).
    let (protocol, piv) = if association == 0 {
        (0, 0)
    } else {
        (0x50, 0x80)
    };
    let mut out = vec![
        protocol | code_set,
        piv | (association << 4) | kind,
        0,
        id.len() as u8,
    ];
    out.extend_from_slice(id);
    out
}

/// A SCSI name string: null-terminated, padded to a multiple of four (SPC-4 7.8.6.11).
fn name_string(name: &str) -> Vec<u8> {
    let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(250).collect();
    bytes.push(0);
    while !bytes.len().is_multiple_of(4) {
        bytes.push(0);
    }
    bytes
}

/// The NAA designator: NAA 3h "locally assigned" (SPC-4 7.8.6.6.3), the form for
/// identifiers not under an IEEE company ID, from the stable 64-bit unique id.
pub fn naa(unique_id: u64) -> [u8; 8] {
    ((3u64 << 60) | (unique_id & 0x0fff_ffff_ffff_ffff)).to_be_bytes()
}

/// The VPD page `code`, or `None` when we do not have it.
pub fn vpd_page(
    code: u8,
    config: &LunConfig,
    facts: &BlockFacts,
    nexus: &Nexus,
) -> Option<Vec<u8>> {
    Some(match code {
        SUPPORTED_PAGES => page(code, &PAGES),
        UNIT_SERIAL_NUMBER => {
            let serial = config.serial.trim();
            page(code, &ascii_field(serial, serial.len().min(252)))
        }
        DEVICE_IDENTIFICATION => {
            let mut body = Vec::new();
            body.extend(designator(1, 0, 3, &naa(config.unique_id)));
            // T10 vendor ID based: vendor then serial (SPC-4 7.8.6.4).
            let mut t10 = ascii_field(&config.vendor, 8);
            t10.extend(ascii_field(
                config.serial.trim(),
                config.serial.trim().len().min(64),
            ));
            body.extend(designator(2, 0, 1, &t10));
            let port = u32::from(nexus.relative_target_port).to_be_bytes();
            body.extend(designator(1, 1, 4, &port));
            body.extend(designator(3, 2, 8, &name_string(&config.target_name)));
            page(code, &body)
        }
        BLOCK_LIMITS => {
            let mut body = vec![0u8; 0x3c];
            body[1] = facts.max_compare_and_write_blocks;
            // A 16-bit field: a larger optimal size keeps the largest power of two
            // that fits, which still divides it.
            let granularity = if facts.optimal_transfer_blocks <= u32::from(u16::MAX) {
                facts.optimal_transfer_blocks as u16
            } else {
                1 << 15
            };
            body[2..4].copy_from_slice(&granularity.to_be_bytes());
            body[4..8].copy_from_slice(&facts.max_transfer_blocks.to_be_bytes());
            body[8..12].copy_from_slice(&facts.optimal_transfer_blocks.to_be_bytes());
            body[12..16].copy_from_slice(&facts.max_transfer_blocks.to_be_bytes());
            if facts.unmap {
                body[16..20].copy_from_slice(&facts.max_unmap_blocks.to_be_bytes());
                body[20..24].copy_from_slice(&facts.max_unmap_descriptors.to_be_bytes());
                body[24..28].copy_from_slice(&facts.unmap_granularity.to_be_bytes());
                body[28] = 0x80; // UGAVALID, alignment 0
            }
            body[32..40].copy_from_slice(&facts.max_write_same_blocks.to_be_bytes());
            page(code, &body)
        }
        BLOCK_DEVICE_CHARACTERISTICS => {
            let mut body = vec![0u8; 0x3c];
            // Medium rotation rate: 1 = non-rotating; 0 = not reported.
            body[1] = u8::from(!facts.rotational);
            page(code, &body)
        }
        LOGICAL_BLOCK_PROVISIONING => {
            let mut body = vec![0u8; 4];
            if facts.unmap {
                // LBPU, LBPWS, LBPWS10 (SBC-3 6.6.4).
                body[1] = 0xe0;
                body[2] = 0x02; // thin provisioned
            }
            if facts.lbprz {
                body[1] |= 0x04;
            }
            page(code, &body)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> BlockFacts {
        BlockFacts {
            max_transfer_blocks: 65536,
            optimal_transfer_blocks: 8,
            max_compare_and_write_blocks: 255,
            max_unmap_blocks: 0xffff_ffff,
            max_unmap_descriptors: 4095,
            unmap_granularity: 8,
            max_write_same_blocks: 1 << 21,
            unmap: true,
            lbprz: true,
            rotational: false,
        }
    }

    fn nexus() -> Nexus {
        Nexus {
            initiator_port: "iqn.i,i,0x1".into(),
            transport_id: vec![],
            relative_target_port: 1,
        }
    }

    #[test]
    fn pages_have_consistent_lengths() {
        let config = LunConfig::default();
        for code in PAGES {
            let data = vpd_page(code, &config, &facts(), &nexus()).unwrap();
            assert_eq!(data[1], code);
            let len = usize::from(u16::from_be_bytes([data[2], data[3]]));
            assert_eq!(len + 4, data.len(), "page {code:#x}");
        }
        assert!(vpd_page(0x81, &config, &facts(), &nexus()).is_none());
    }

    #[test]
    fn device_identification_starts_with_naa() {
        let config = LunConfig {
            unique_id: 0x1234_5678_9abc_def0,
            ..LunConfig::default()
        };
        let data = vpd_page(DEVICE_IDENTIFICATION, &config, &facts(), &nexus()).unwrap();
        assert_eq!(&data[4..8], &[0x01, 0x03, 0x00, 0x08]);
        assert_eq!(data[8] >> 4, 3);
    }

    #[test]
    fn provisioning_bits() {
        let data = vpd_page(
            LOGICAL_BLOCK_PROVISIONING,
            &LunConfig::default(),
            &facts(),
            &nexus(),
        )
        .unwrap();
        assert_eq!(data[5], 0xe4);
    }
}
