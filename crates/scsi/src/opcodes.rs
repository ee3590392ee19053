//! The commands we implement, with their CDB usage data, for REPORT SUPPORTED
//! OPERATION CODES (SPC-4 6.35).

use crate::cdb::op;

/// One supported command: its operation code, service action (for commands that
/// have them) and CDB usage data (the bits of each CDB byte we look at; byte 0 is
/// the operation code).
#[derive(Debug, Clone, Copy)]
pub struct Supported {
    pub opcode: u8,
    pub action: Option<u16>,
    pub usage: &'static [u8],
}

const fn cmd(opcode: u8, usage: &'static [u8]) -> Supported {
    Supported {
        opcode,
        action: None,
        usage,
    }
}

const fn sa(opcode: u8, action: u16, usage: &'static [u8]) -> Supported {
    Supported {
        opcode,
        action: Some(action),
        usage,
    }
}

const LBA8: u8 = 0xff;

/// Every command, in operation code order.
pub const SUPPORTED: &[Supported] = &[
    cmd(op::TEST_UNIT_READY, &[0x00, 0, 0, 0, 0, 0]),
    cmd(op::REQUEST_SENSE, &[0x03, 0x01, 0, 0, 0xff, 0]),
    cmd(op::READ_6, &[0x08, 0x1f, 0xff, 0xff, 0xff, 0]),
    cmd(op::WRITE_6, &[0x0a, 0x1f, 0xff, 0xff, 0xff, 0]),
    cmd(op::INQUIRY, &[0x12, 0x01, 0xff, 0xff, 0xff, 0]),
    cmd(op::MODE_SELECT_6, &[0x15, 0x11, 0, 0, 0xff, 0]),
    cmd(op::RESERVE_6, &[0x16, 0, 0, 0, 0, 0]),
    cmd(op::RELEASE_6, &[0x17, 0, 0, 0, 0, 0]),
    cmd(op::MODE_SENSE_6, &[0x1a, 0x08, 0xff, 0xff, 0xff, 0]),
    cmd(op::START_STOP_UNIT, &[0x1b, 0x01, 0, 0x0f, 0xf7, 0]),
    cmd(op::PREVENT_ALLOW_MEDIUM_REMOVAL, &[0x1e, 0, 0, 0, 0x03, 0]),
    cmd(
        op::READ_CAPACITY_10,
        &[0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, 0],
    ),
    cmd(
        op::READ_10,
        &[0x28, 0x18, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0],
    ),
    cmd(
        op::WRITE_10,
        &[0x2a, 0x18, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0],
    ),
    cmd(
        op::WRITE_AND_VERIFY_10,
        &[0x2e, 0x12, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0],
    ),
    cmd(
        op::VERIFY_10,
        &[0x2f, 0x16, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0],
    ),
    cmd(
        op::PRE_FETCH_10,
        &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0],
    ),
    cmd(
        op::SYNCHRONIZE_CACHE_10,
        &[0x35, 0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0],
    ),
    cmd(
        op::READ_DEFECT_DATA_10,
        &[0x37, 0, 0x1f, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    cmd(
        op::WRITE_SAME_10,
        &[0x41, 0x08, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, 0],
    ),
    cmd(op::UNMAP, &[0x42, 0, 0, 0, 0, 0, 0x1f, 0xff, 0xff, 0]),
    cmd(
        op::MODE_SELECT_10,
        &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    cmd(op::RESERVE_10, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    cmd(op::RELEASE_10, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    cmd(
        op::MODE_SENSE_10,
        &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_IN,
        0,
        &[0x5e, 0x00, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_IN,
        1,
        &[0x5e, 0x01, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_IN,
        2,
        &[0x5e, 0x02, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_IN,
        3,
        &[0x5e, 0x03, 0, 0, 0, 0, 0, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_OUT,
        0,
        &[0x5f, 0x00, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_OUT,
        1,
        &[0x5f, 0x01, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_OUT,
        2,
        &[0x5f, 0x02, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_OUT,
        3,
        &[0x5f, 0x03, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_OUT,
        4,
        &[0x5f, 0x04, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_OUT,
        5,
        &[0x5f, 0x05, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    ),
    sa(
        op::PERSISTENT_RESERVE_OUT,
        6,
        &[0x5f, 0x06, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0],
    ),
    sa(
        op::EXTENDED_COPY,
        0,
        &[
            0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    sa(
        op::RECEIVE_COPY_RESULTS,
        op::SA_COPY_STATUS,
        &[
            0x84, 0x00, 0xff, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    sa(
        op::RECEIVE_COPY_RESULTS,
        op::SA_OPERATING_PARAMETERS,
        &[
            0x84, 0x03, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    cmd(
        op::READ_16,
        &[
            0x88, 0x18, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    cmd(
        op::COMPARE_AND_WRITE,
        &[
            0x89, 0x18, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0, 0, 0, 0xff, 0x1f, 0,
        ],
    ),
    cmd(
        op::WRITE_16,
        &[
            0x8a, 0x18, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    cmd(
        op::ORWRITE_16,
        &[
            0x8b, 0x1a, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    cmd(
        op::WRITE_AND_VERIFY_16,
        &[
            0x8e, 0x12, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    cmd(
        op::VERIFY_16,
        &[
            0x8f, 0x16, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    cmd(
        op::PRE_FETCH_16,
        &[
            0x90, 0x02, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    cmd(
        op::SYNCHRONIZE_CACHE_16,
        &[
            0x91, 0x02, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    cmd(
        op::WRITE_SAME_16,
        &[
            0x93, 0x09, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff,
            0x1f, 0,
        ],
    ),
    sa(
        op::SERVICE_ACTION_IN_16,
        op::SA_READ_CAPACITY_16,
        &[
            0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    sa(
        op::SERVICE_ACTION_IN_16,
        op::SA_GET_LBA_STATUS,
        &[
            0x9e, 0x12, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, LBA8, 0xff, 0xff, 0xff, 0xff, 0,
            0,
        ],
    ),
    cmd(
        op::REPORT_LUNS,
        &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0],
    ),
    sa(
        op::MAINTENANCE_IN,
        op::SA_REPORT_SUPPORTED_OPCODES,
        &[
            0xa3, 0x0c, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0,
        ],
    ),
    cmd(
        op::READ_12,
        &[
            0xa8, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0,
        ],
    ),
    cmd(
        op::WRITE_12,
        &[
            0xaa, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0,
        ],
    ),
    cmd(
        op::WRITE_AND_VERIFY_12,
        &[
            0xae, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0,
        ],
    ),
    cmd(
        op::VERIFY_12,
        &[
            0xaf, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, 0,
        ],
    ),
    cmd(
        op::READ_DEFECT_DATA_12,
        &[0xb7, 0x1f, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0],
    ),
];

/// Recommended command timeout reported in timeouts descriptors, in seconds.
const RECOMMENDED_TIMEOUT: u32 = 30;

fn timeouts() -> [u8; 12] {
    let mut out = [0u8; 12];
    out[1] = 0x0a;
    out[8..12].copy_from_slice(&RECOMMENDED_TIMEOUT.to_be_bytes());
    out
}

/// Whether an operation code has service actions.
fn has_actions(opcode: u8) -> bool {
    SUPPORTED
        .iter()
        .any(|s| s.opcode == opcode && s.action.is_some())
}

/// REPORT SUPPORTED OPERATION CODES parameter data; `None` for an invalid request
/// (INVALID FIELD IN CDB).
pub fn report(options: u8, rctd: bool, opcode: u8, action: u16) -> Option<Vec<u8>> {
    match options {
        0 => {
            let mut body = Vec::new();
            for s in SUPPORTED {
                body.push(s.opcode);
                body.push(0);
                body.extend_from_slice(&s.action.unwrap_or(0).to_be_bytes());
                body.push(0);
                body.push(u8::from(rctd) << 1 | u8::from(s.action.is_some()));
                body.extend_from_slice(&(s.usage.len() as u16).to_be_bytes());
                if rctd {
                    body.extend_from_slice(&timeouts());
                }
            }
            let mut out = (body.len() as u32).to_be_bytes().to_vec();
            out.extend(body);
            Some(out)
        }
        1 | 2 => {
            // Option 1 names commands without service actions, option 2 with.
            if has_actions(opcode) != (options == 2) {
                let known = SUPPORTED.iter().any(|s| s.opcode == opcode);
                if known {
                    return None;
                }
            }
            let found = SUPPORTED
                .iter()
                .find(|s| s.opcode == opcode && (options == 1 || s.action == Some(action)));
            let mut out = vec![0u8, 0, 0, 0];
            match found {
                Some(s) => {
                    out[1] = u8::from(rctd) << 7 | 0x03; // supported, to the standard
                    out[2..4].copy_from_slice(&(s.usage.len() as u16).to_be_bytes());
                    out.extend_from_slice(s.usage);
                    if rctd {
                        out.extend_from_slice(&timeouts());
                    }
                }
                None => out[1] = 0x01, // not supported
            }
            Some(out)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_data_starts_with_the_opcode_and_fits_the_group() {
        for s in SUPPORTED {
            assert_eq!(s.usage[0], s.opcode);
            assert_eq!(
                s.usage.len(),
                crate::cdb::cdb_len(s.opcode),
                "{:#x}",
                s.opcode
            );
        }
    }

    #[test]
    fn all_commands_with_timeouts() {
        let data = report(0, true, 0, 0).unwrap();
        let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
        assert_eq!(len, data.len() - 4);
        assert_eq!(len, SUPPORTED.len() * 20);
    }

    #[test]
    fn one_command_forms() {
        assert!(report(1, false, op::PERSISTENT_RESERVE_IN, 0).is_none());
        assert!(report(2, false, op::READ_10, 0).is_none());
        let read10 = report(1, false, op::READ_10, 0).unwrap();
        assert_eq!(read10[1], 0x03);
        assert_eq!(read10[4], op::READ_10);
        let rc16 = report(2, false, op::SERVICE_ACTION_IN_16, 0x10).unwrap();
        assert_eq!(&rc16[4..6], &[0x9e, 0x10]);
        assert_eq!(report(1, false, 0xff, 0).unwrap()[1], 0x01);
    }
}
