//! The PDUs on the initiator's hot path, framed without the codec's
//! intermediate copies: command capsules and H2CData written straight from the
//! command's buffer, and C2HData headers parsed so their data is read straight
//! into the command's buffer. The layout is the codec's ([`crate::pdu`]); the tests
//! check both against it.

use crate::pdu::digest::{crc32c, digest_matches};
use crate::pdu::{flags, CommonHeader, Framing, PduType, DIGEST_LEN};
use crate::sqe::Sqe;

/// Header length of H2CData and C2HData.
pub(crate) const DATA_HEADER_LEN: usize = 24;

/// Where an H2CData PDU's data starts (PDO) and its whole length (PLEN).
fn h2c_layout(framing: &Framing, data_len: usize) -> (usize, usize) {
    let hdgst = if framing.digests.header {
        DIGEST_LEN
    } else {
        0
    };
    let after_header = DATA_HEADER_LEN + hdgst;
    if data_len == 0 {
        return (0, after_header);
    }
    let align = (usize::from(framing.send_pda) + 1) * 4;
    let pdo = after_header.div_ceil(align) * align;
    let ddgst = if framing.digests.data { DIGEST_LEN } else { 0 };
    (pdo, pdo + data_len + ddgst)
}

/// The bytes an H2CData PDU carrying `data_len` bytes takes.
pub(crate) fn h2c_data_len(framing: &Framing, data_len: usize) -> usize {
    h2c_layout(framing, data_len).1
}

/// Writes an H2CData PDU's header, header digest and padding for `data_len`
/// bytes of data at the start of `out`; returns (PDO, PLEN). `out` holds at
/// least PDO bytes (PLEN when there is no data).
fn write_h2c_head(
    out: &mut [u8],
    framing: &Framing,
    cccid: u16,
    ttag: u16,
    offset: u32,
    last: bool,
    data_len: usize,
) -> (usize, usize) {
    let (pdo, plen) = h2c_layout(framing, data_len);
    let hdgst = framing.digests.header;
    let ddgst = framing.digests.data && data_len > 0;
    let mut pdu_flags = if last { flags::DATA_LAST } else { 0 };
    if hdgst {
        pdu_flags |= flags::HDGSTF;
    }
    if ddgst {
        pdu_flags |= flags::DDGSTF;
    }
    CommonHeader {
        pdu_type: PduType::H2CData as u8,
        flags: pdu_flags,
        hlen: DATA_HEADER_LEN as u8,
        pdo: pdo as u8,
        plen: plen as u32,
    }
    .write(out);
    out[8..10].copy_from_slice(&cccid.to_le_bytes());
    out[10..12].copy_from_slice(&ttag.to_le_bytes());
    out[12..16].copy_from_slice(&offset.to_le_bytes());
    out[16..20].copy_from_slice(&(data_len as u32).to_le_bytes());
    out[20..DATA_HEADER_LEN].fill(0);
    let mut at = DATA_HEADER_LEN;
    if hdgst {
        let digest = crc32c(&out[..DATA_HEADER_LEN]);
        out[at..at + DIGEST_LEN].copy_from_slice(&digest.to_le_bytes());
        at += DIGEST_LEN;
    }
    if data_len > 0 {
        out[at..pdo].fill(0);
    }
    (pdo, plen)
}

/// Writes one H2CData PDU carrying `data` at the start of `out` (at least
/// [`h2c_data_len`] bytes, any content); returns its length.
pub(crate) fn write_h2c_data(
    out: &mut [u8],
    framing: &Framing,
    cccid: u16,
    ttag: u16,
    offset: u32,
    last: bool,
    data: &[u8],
) -> usize {
    let (pdo, plen) = write_h2c_head(out, framing, cccid, ttag, offset, last, data.len());
    if !data.is_empty() {
        out[pdo..pdo + data.len()].copy_from_slice(data);
        if framing.digests.data {
            out[pdo + data.len()..plen].copy_from_slice(&crc32c(data).to_le_bytes());
        }
    }
    plen
}

/// An H2CData PDU carrying `data`, without the data: everything before PDO
/// (header, digest, padding), and the data digest if any.
pub(crate) fn h2c_head(
    framing: &Framing,
    cccid: u16,
    ttag: u16,
    offset: u32,
    last: bool,
    data: &[u8],
) -> (Vec<u8>, Option<[u8; DIGEST_LEN]>) {
    let (pdo, plen) = h2c_layout(framing, data.len());
    let mut head = vec![0u8; if data.is_empty() { plen } else { pdo }];
    write_h2c_head(&mut head, framing, cccid, ttag, offset, last, data.len());
    let digest = (framing.digests.data && !data.is_empty()).then(|| crc32c(data).to_le_bytes());
    (head, digest)
}

/// Appends one H2CData PDU carrying `data` to `out`.
#[cfg(test)]
pub(crate) fn put_h2c_data(
    out: &mut Vec<u8>,
    framing: &Framing,
    cccid: u16,
    ttag: u16,
    offset: u32,
    last: bool,
    data: &[u8],
) {
    let start = out.len();
    out.resize(start + h2c_data_len(framing, data.len()), 0xaa);
    write_h2c_data(&mut out[start..], framing, cccid, ttag, offset, last, data);
}

/// Header length of a command capsule (common header and SQE).
const CAPSULE_HEADER_LEN: usize = 72;

/// Appends one command capsule with `data` in it to `out`.
pub(crate) fn put_capsule(out: &mut Vec<u8>, framing: &Framing, sqe: &Sqe, data: &[u8]) {
    let start = out.len();
    let hdgst = framing.digests.header;
    let ddgst = framing.digests.data && !data.is_empty();
    let after_header = CAPSULE_HEADER_LEN + if hdgst { DIGEST_LEN } else { 0 };
    let align = (usize::from(framing.send_pda) + 1) * 4;
    let pdo = if data.is_empty() {
        0
    } else {
        after_header.div_ceil(align) * align
    };
    let plen = if data.is_empty() {
        after_header
    } else {
        pdo + data.len() + if ddgst { DIGEST_LEN } else { 0 }
    };
    let mut pdu_flags = 0;
    if hdgst {
        pdu_flags |= flags::HDGSTF;
    }
    if ddgst {
        pdu_flags |= flags::DDGSTF;
    }
    out.reserve(plen);
    out.resize(start + 8, 0);
    CommonHeader {
        pdu_type: PduType::CapsuleCmd as u8,
        flags: pdu_flags,
        hlen: CAPSULE_HEADER_LEN as u8,
        pdo: pdo as u8,
        plen: plen as u32,
    }
    .write(&mut out[start..]);
    out.extend_from_slice(&sqe.0);
    if hdgst {
        let digest = crc32c(&out[start..start + CAPSULE_HEADER_LEN]);
        out.extend_from_slice(&digest.to_le_bytes());
    }
    if !data.is_empty() {
        out.resize(start + pdo, 0);
        out.extend_from_slice(data);
        if ddgst {
            out.extend_from_slice(&crc32c(data).to_le_bytes());
        }
    }
    debug_assert_eq!(out.len() - start, plen);
}

/// A C2HData header, checked, before its data is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct C2HHeader {
    pub cccid: u16,
    pub offset: u32,
    pub len: u32,
    pub last: bool,
    pub success: bool,
    /// Bytes of padding between the header (and its digest) and the data.
    pub padding: usize,
    pub data_digest: bool,
}

/// Parses the header of a C2HData PDU: `bytes` holds its common header
/// (already checked by [`crate::pdu::pdu_len`]), its specific header and the
/// header digest if any. Errs with why the PDU is malformed.
pub(crate) fn parse_c2h_header(bytes: &[u8], framing: &Framing) -> Result<C2HHeader, String> {
    let common = CommonHeader::parse(bytes).map_err(|e| e.to_string())?;
    let hdgst = if framing.digests.header {
        DIGEST_LEN
    } else {
        0
    };
    if bytes.len() < DATA_HEADER_LEN + hdgst {
        return Err("short C2HData header".into());
    }
    if hdgst != 0
        && !digest_matches(
            &bytes[..DATA_HEADER_LEN],
            &bytes[DATA_HEADER_LEN..DATA_HEADER_LEN + DIGEST_LEN],
        )
    {
        return Err("C2HData header digest mismatch".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let len = u32_at(16);
    let ddgst = if common.has_data_digest() {
        DIGEST_LEN
    } else {
        0
    };
    let after_header = DATA_HEADER_LEN + hdgst;
    let pdo = usize::from(common.pdo);
    let (padding, expected_plen) = if len == 0 {
        (0, after_header)
    } else {
        if pdo < after_header {
            return Err("C2HData data offset inside its header".into());
        }
        (pdo - after_header, pdo + len as usize + ddgst)
    };
    if common.plen as usize != expected_plen {
        return Err("C2HData length does not match its data length".into());
    }
    let last = common.flags & flags::DATA_LAST != 0;
    let success = common.flags & flags::DATA_SUCCESS != 0;
    if success && !last {
        return Err("C2HData SUCCESS without LAST_PDU".into());
    }
    Ok(C2HHeader {
        cccid: u16::from_le_bytes([bytes[8], bytes[9]]),
        offset: u32_at(12),
        len,
        last,
        success,
        padding,
        data_digest: ddgst != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pdu::{decode, C2HData, CapsuleCmd, Digests, H2CData, Pdu};

    fn framings() -> Vec<Framing> {
        let mut all = Vec::new();
        for (header, data) in [(false, false), (true, false), (false, true), (true, true)] {
            for send_pda in [0, 3, 31] {
                all.push(Framing {
                    digests: Digests { header, data },
                    send_pda,
                    ..Framing::default()
                });
            }
        }
        all
    }

    #[test]
    fn h2c_data_matches_the_codec() {
        for framing in framings() {
            for len in [0usize, 1, 4096, 5000] {
                let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let mut ours = Vec::new();
                put_h2c_data(&mut ours, &framing, 7, 9, 4096, true, &data);
                let codec = Pdu::H2CData(H2CData {
                    cccid: 7,
                    ttag: 9,
                    offset: 4096,
                    last: true,
                    data: data.clone(),
                })
                .to_bytes(&framing);
                assert_eq!(ours, codec, "{framing:?} {len}");
                let (mut head, digest) = h2c_head(&framing, 7, 9, 4096, true, &data);
                head.extend_from_slice(&data);
                head.extend_from_slice(digest.as_ref().map_or(&[][..], |d| &d[..]));
                assert_eq!(head, codec, "head {framing:?} {len}");
            }
        }
    }

    #[test]
    fn capsule_matches_the_codec() {
        for framing in framings() {
            for len in [0usize, 1, 1024, 16384] {
                let data: Vec<u8> = (0..len).map(|i| (i * 3) as u8).collect();
                let mut sqe = Sqe::new(0x01, 42);
                sqe.set_cdw(12, 7);
                let mut ours = Vec::new();
                put_capsule(&mut ours, &framing, &sqe, &data);
                let codec = Pdu::CapsuleCmd(CapsuleCmd {
                    sqe,
                    data: data.clone(),
                })
                .to_bytes(&framing);
                assert_eq!(ours, codec, "{framing:?} {len}");
            }
        }
    }

    #[test]
    fn c2h_header_matches_the_codec() {
        for framing in framings() {
            for (len, success) in [(0usize, false), (512, true), (3000, false)] {
                let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let pdu = Pdu::C2HData(C2HData {
                    cccid: 3,
                    offset: 512,
                    last: true,
                    success,
                    data: data.clone(),
                });
                // The target aligns to the host's HPDA, which this host sends as 0.
                let sent = Framing {
                    send_pda: 0,
                    ..framing
                };
                let bytes = pdu.to_bytes(&sent);
                assert!(decode(&bytes, &framing).unwrap().is_some());
                let hdgst = if framing.digests.header { 4 } else { 0 };
                let header = parse_c2h_header(&bytes[..24 + hdgst], &framing).unwrap();
                assert_eq!(header.cccid, 3);
                assert_eq!((header.offset, header.len as usize), (512, len));
                assert_eq!((header.last, header.success), (true, success));
                let at = 24 + hdgst + header.padding;
                assert_eq!(&bytes[at..at + len], &data[..]);
                assert_eq!(header.data_digest, framing.digests.data && len > 0);
                let mut bad = bytes.clone();
                bad[4] ^= 1; // PLEN
                assert!(parse_c2h_header(&bad[..24 + hdgst], &framing).is_err());
            }
        }
    }

    proptest::proptest! {
        /// Any bytes where a C2HData header is expected: an answer, never a
        /// panic, and a header it accepts describes a PDU of its PLEN.
        #[test]
        fn c2h_header_never_panics(
            mut bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            header in proptest::prelude::any::<bool>(),
            data in proptest::prelude::any::<bool>(),
        ) {
            let framing = Framing {
                digests: Digests { header, data },
                ..Framing::default()
            };
            if bytes.len() > 2 {
                bytes[2] = DATA_HEADER_LEN as u8;
            }
            if let Ok(h) = parse_c2h_header(&bytes, &framing) {
                let plen = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
                let hdgst = if header { 4 } else { 0 };
                let ddgst = if h.data_digest { 4 } else { 0 };
                let expected = if h.len == 0 {
                    DATA_HEADER_LEN + hdgst
                } else {
                    DATA_HEADER_LEN + hdgst + h.padding + h.len as usize + ddgst
                };
                proptest::prop_assert_eq!(plen, expected);
            }
        }
    }
}
