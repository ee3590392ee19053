//! Bytes to PDUs.

use super::digest::digest_matches;
use super::header::{flags, CommonHeader, PduType, COMMON_HEADER_LEN, DIGEST_LEN};
use super::types::*;
use super::{Framing, PduError};
use crate::cqe::Cqe;
use crate::sqe::Sqe;

fn invalid(offset: u32, reason: &'static str) -> PduError {
    PduError::InvalidField { offset, reason }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Where a PDU's parts are, from its common header.
struct Layout {
    pdu_type: PduType,
    header: CommonHeader,
    hlen: usize,
    /// Header digest length (0 or 4).
    hdgst: usize,
    /// Data range within the PDU.
    data: std::ops::Range<usize>,
    /// Data digest length (0 or 4).
    ddgst: usize,
}

/// Checks a common header and works out where header, data and digests are.
fn layout(bytes: &[u8], framing: &Framing) -> Result<Layout, PduError> {
    let header = CommonHeader::parse(bytes)?;
    let pdu_type = PduType::from_u8(header.pdu_type).ok_or(invalid(0, "unknown PDU type"))?;
    let hlen = pdu_type.header_len();
    if usize::from(header.hlen) != hlen {
        return Err(invalid(2, "header length does not match the PDU type"));
    }
    if header.plen > framing.max_pdu_len {
        return Err(PduError::TooLong {
            plen: header.plen,
            max: framing.max_pdu_len,
        });
    }
    let plen = header.plen as usize;
    let wants_hdgst = framing.digests.header && pdu_type.may_have_header_digest();
    if header.has_header_digest() != wants_hdgst {
        return Err(invalid(
            1,
            "header digest flag does not match the negotiation",
        ));
    }
    let hdgst = if wants_hdgst { DIGEST_LEN } else { 0 };
    let ddgst = if header.has_data_digest() {
        if !(framing.digests.data && pdu_type.may_have_data_digest()) {
            return Err(invalid(1, "data digest flag where none was negotiated"));
        }
        DIGEST_LEN
    } else {
        0
    };
    let after_header = hlen + hdgst;
    if plen < after_header {
        return Err(invalid(4, "PDU length shorter than its header"));
    }
    let data = match pdu_type {
        PduType::IcReq | PduType::IcResp | PduType::CapsuleResp | PduType::R2T => {
            if plen != after_header || header.pdo != 0 {
                return Err(invalid(4, "PDU without data has a data length"));
            }
            after_header..after_header
        }
        // A TermReq's data (the offending header) follows its header directly.
        PduType::H2CTermReq | PduType::C2HTermReq => {
            if plen - hlen > TERM_REQ_MAX_DATA {
                return Err(invalid(4, "TermReq data too long"));
            }
            hlen..plen
        }
        PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData => {
            if header.pdo == 0 {
                if plen != after_header || ddgst != 0 {
                    return Err(invalid(3, "data without a data offset"));
                }
                after_header..after_header
            } else {
                let pdo = usize::from(header.pdo);
                if pdo < after_header || pdo + ddgst > plen {
                    return Err(invalid(3, "data offset outside the PDU"));
                }
                if framing.digests.data && ddgst == 0 && plen > pdo {
                    return Err(invalid(1, "data digest flag missing"));
                }
                pdo..plen - ddgst
            }
        }
    };
    Ok(Layout {
        pdu_type,
        header,
        hlen,
        hdgst,
        data,
        ddgst,
    })
}

/// The length of the PDU whose common header starts `bytes` (at least 8 bytes),
/// after checking that header: a transport reads the rest before [`decode`].
pub fn pdu_len(bytes: &[u8], framing: &Framing) -> Result<usize, PduError> {
    if bytes.len() < COMMON_HEADER_LEN {
        return Err(PduError::Truncated);
    }
    Ok(layout(bytes, framing)?.header.plen as usize)
}

/// Decodes the PDU at the start of `buf`: `Ok(None)` while it is incomplete,
/// otherwise the PDU and how many bytes it took.
pub fn decode(buf: &[u8], framing: &Framing) -> Result<Option<(Pdu, usize)>, PduError> {
    if buf.len() < COMMON_HEADER_LEN {
        return Ok(None);
    }
    let layout = layout(buf, framing)?;
    let plen = layout.header.plen as usize;
    if buf.len() < plen {
        return Ok(None);
    }
    let bytes = &buf[..plen];
    let hlen = layout.hlen;
    if layout.hdgst != 0 && !digest_matches(&bytes[..hlen], &bytes[hlen..hlen + DIGEST_LEN]) {
        return Err(PduError::HeaderDigest);
    }
    let data = &bytes[layout.data.clone()];
    let pdu = parse_specific(&layout, bytes, data)?;
    if layout.ddgst != 0 {
        let end = layout.data.end;
        if !digest_matches(data, &bytes[end..end + DIGEST_LEN]) {
            // A capsule's command ID is in its SQE (bytes 2..4 of the SQE).
            let at = if layout.pdu_type == PduType::CapsuleCmd {
                10
            } else {
                8
            };
            return Err(PduError::DataDigest {
                cccid: u16_at(bytes, at),
                len: plen,
            });
        }
    }
    Ok(Some((pdu, plen)))
}

fn parse_specific(layout: &Layout, b: &[u8], data: &[u8]) -> Result<Pdu, PduError> {
    let pdu_flags = layout.header.flags;
    Ok(match layout.pdu_type {
        PduType::IcReq => Pdu::IcReq(IcReq {
            pfv: u16_at(b, 8),
            hpda: b[10],
            digests: Digests::from_byte(b[11]),
            maxr2t: u32_at(b, 12),
        }),
        PduType::IcResp => Pdu::IcResp(IcResp {
            pfv: u16_at(b, 8),
            cpda: b[10],
            digests: Digests::from_byte(b[11]),
            maxh2cdata: u32_at(b, 12),
        }),
        PduType::H2CTermReq | PduType::C2HTermReq => {
            let term = TermReq {
                fes: u16_at(b, 8),
                fei: u32_at(b, 10),
                data: data.to_vec(),
            };
            if layout.pdu_type == PduType::H2CTermReq {
                Pdu::H2CTermReq(term)
            } else {
                Pdu::C2HTermReq(term)
            }
        }
        PduType::CapsuleCmd => Pdu::CapsuleCmd(CapsuleCmd {
            sqe: Sqe::from_slice(&b[8..]).ok_or(invalid(8, "short SQE"))?,
            data: data.to_vec(),
        }),
        PduType::CapsuleResp => Pdu::CapsuleResp(CapsuleResp {
            cqe: Cqe::parse(&b[8..]).ok_or(invalid(8, "short CQE"))?,
        }),
        PduType::H2CData => {
            if u32_at(b, 16) as usize != data.len() {
                return Err(invalid(16, "data length does not match the PDU"));
            }
            Pdu::H2CData(H2CData {
                cccid: u16_at(b, 8),
                ttag: u16_at(b, 10),
                offset: u32_at(b, 12),
                last: pdu_flags & flags::DATA_LAST != 0,
                data: data.to_vec(),
            })
        }
        PduType::C2HData => {
            if u32_at(b, 16) as usize != data.len() {
                return Err(invalid(16, "data length does not match the PDU"));
            }
            let last = pdu_flags & flags::DATA_LAST != 0;
            let success = pdu_flags & flags::DATA_SUCCESS != 0;
            if success && !last {
                return Err(invalid(1, "SUCCESS flag without LAST_PDU"));
            }
            Pdu::C2HData(C2HData {
                cccid: u16_at(b, 8),
                offset: u32_at(b, 12),
                last,
                success,
                data: data.to_vec(),
            })
        }
        PduType::R2T => Pdu::R2T(R2T {
            cccid: u16_at(b, 8),
            ttag: u16_at(b, 10),
            offset: u32_at(b, 12),
            length: u32_at(b, 16),
        }),
    })
}

/// The header of an H2CData or C2HData PDU, decoded before its data is read (see
/// [`decode_data_header`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    pub pdu_type: PduType,
    pub cccid: u16,
    /// H2CData only: the R2T's transfer tag.
    pub ttag: u16,
    /// Where the data goes in the command's data.
    pub offset: u32,
    /// How many data bytes follow.
    pub length: u32,
    pub last: bool,
    /// C2HData only: the SUCCESS flag.
    pub success: bool,
    /// Bytes from the start of the PDU to its data (padding included).
    pub data_at: usize,
    /// Whether a data digest follows the data.
    pub data_digest: bool,
    /// The PDU's whole length.
    pub plen: usize,
}

/// How many bytes of a data PDU come before anything [`decode_data_header`] does
/// not need: its header and header digest.
pub fn data_header_len(framing: &Framing) -> usize {
    PduType::H2CData.header_len()
        + if framing.digests.header {
            DIGEST_LEN
        } else {
            0
        }
}

/// Decodes the header of an H2CData or C2HData PDU from `head`, which holds at
/// least [`data_header_len`] bytes from its start, checking everything but the
/// data and its digest: a transport then reads the data straight into the
/// command's buffer (and checks its digest with [`super::digest::crc32c`]).
/// Other PDU types give an error.
pub fn decode_data_header(head: &[u8], framing: &Framing) -> Result<DataHeader, PduError> {
    let layout = layout(head, framing)?;
    if !matches!(layout.pdu_type, PduType::H2CData | PduType::C2HData) {
        return Err(invalid(0, "not a data PDU"));
    }
    let head_len = layout.hlen + layout.hdgst;
    if head.len() < head_len {
        return Err(PduError::Truncated);
    }
    if layout.hdgst != 0 && !digest_matches(&head[..layout.hlen], &head[layout.hlen..head_len]) {
        return Err(PduError::HeaderDigest);
    }
    let length = u32_at(head, 16);
    if length as usize != layout.data.len() {
        return Err(invalid(16, "data length does not match the PDU"));
    }
    let flags_byte = layout.header.flags;
    let last = flags_byte & flags::DATA_LAST != 0;
    let success = layout.pdu_type == PduType::C2HData && flags_byte & flags::DATA_SUCCESS != 0;
    if success && !last {
        return Err(invalid(1, "SUCCESS flag without LAST_PDU"));
    }
    Ok(DataHeader {
        pdu_type: layout.pdu_type,
        cccid: u16_at(head, 8),
        ttag: if layout.pdu_type == PduType::H2CData {
            u16_at(head, 10)
        } else {
            0
        },
        offset: u32_at(head, 12),
        length,
        last,
        success,
        data_at: layout.data.start,
        data_digest: layout.ddgst != 0,
        plen: layout.header.plen as usize,
    })
}
