//! How iSCSI names SCSI things: initiator ports, their TransportIDs, and LUNs.

/// The SCSI initiator port name of an iSCSI session (RFC 7143 §4.4.3.1: the
/// initiator's name, ",i,0x" and the ISID in hex).
pub fn initiator_port(initiator_name: &str, isid: u64) -> String {
    format!("{initiator_name},i,0x{isid:012x}")
}

/// The SPC-4 TransportID of an iSCSI initiator port (§7.6.4.6, format 01b: name
/// with ISID): protocol identifier 5, the NUL-terminated port name padded to a
/// multiple of four bytes, at least 20 bytes in all.
pub fn transport_id(initiator_name: &str, isid: u64) -> Vec<u8> {
    let name = initiator_port(initiator_name, isid);
    let body = padded_to_four(name.len() + 1).max(16);
    let mut out = Vec::with_capacity(4 + body);
    out.push(0x40 | 0x05);
    out.push(0);
    out.extend_from_slice(&(body as u16).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.resize(4 + body, 0);
    out
}

fn padded_to_four(len: usize) -> usize {
    (len + 3) & !3
}

/// The LUN number in an 8-byte SAM LUN field (SAM-5 §4.7): peripheral device
/// addressing (a LUN below 256) or flat space addressing (below 16384). `None` for
/// the other methods, which no blockwire LUN uses.
pub fn decode_lun(field: u64) -> Option<u64> {
    let bytes = field.to_be_bytes();
    if bytes[2..].iter().any(|&b| b != 0) {
        return None;
    }
    match bytes[0] >> 6 {
        0 if bytes[0] == 0 => Some(u64::from(bytes[1])),
        1 => Some((u64::from(bytes[0] & 0x3f) << 8) | u64::from(bytes[1])),
        _ => None,
    }
}

/// The 8-byte SAM LUN field for a LUN number (peripheral addressing below 256,
/// flat space above).
pub fn encode_lun(lun: u64) -> u64 {
    let field: u16 = if lun < 256 {
        lun as u16
    } else {
        0x4000 | (lun as u16 & 0x3fff)
    };
    u64::from(field) << 48
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_id_is_padded_and_terminated() {
        let id = transport_id("iqn.a", 0x23d0_0000_0001);
        let name = b"iqn.a,i,0x23d000000001";
        assert_eq!(id[0], 0x45);
        let body = u16::from_be_bytes([id[2], id[3]]) as usize;
        assert_eq!(body % 4, 0);
        assert_eq!(id.len(), 4 + body);
        assert_eq!(&id[4..4 + name.len()], name);
        assert_eq!(id[4 + name.len()], 0);
        assert!(id.len() >= 20);
    }

    #[test]
    fn luns_round_trip() {
        for lun in [0u64, 1, 255, 256, 16383] {
            assert_eq!(decode_lun(encode_lun(lun)), Some(lun));
        }
        assert_eq!(decode_lun(0x0001_0000_0000_0000), Some(1));
        assert_eq!(decode_lun(0x4101_0000_0000_0000), Some(0x101));
        assert_eq!(decode_lun(0x8000_0000_0000_0000), None);
        assert_eq!(decode_lun(0x0000_0000_0000_0001), None);
        assert_eq!(decode_lun(0x0100_0000_0000_0000), None);
    }
}
