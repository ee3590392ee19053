//! PDUs to bytes.

use super::digest::{append_digest, crc32c};
use super::header::{flags, CommonHeader, PduType, DIGEST_LEN};
use super::types::*;
use super::{align_up, Framing};

impl Pdu {
    /// Appends this PDU, framed by `framing`, to `out`.
    pub fn encode(&self, framing: &Framing, out: &mut Vec<u8>) {
        let digest = self.encode_head(framing, out);
        out.extend_from_slice(self.data());
        if let Some(digest) = digest {
            out.extend_from_slice(&digest);
        }
    }

    /// Appends everything of this PDU that comes before its data (headers, header
    /// digest, padding up to the data offset) to `out`, and returns the data
    /// digest that follows the data, if the framing has one. With
    /// [`Pdu::data`], a transport sends a large PDU without copying its data
    /// (one vectored write of head, data and digest).
    pub fn encode_head(&self, framing: &Framing, out: &mut Vec<u8>) -> Option<[u8; 4]> {
        let pdu_type = self.pdu_type();
        let hlen = pdu_type.header_len();
        let start = out.len();
        out.resize(start + hlen, 0);
        let (type_flags, data): (u8, &[u8]) = {
            let h = &mut out[start..start + hlen];
            write_specific(self, h)
        };
        let hdgst = framing.digests.header && pdu_type.may_have_header_digest();
        let ddgst = framing.digests.data && pdu_type.may_have_data_digest() && !data.is_empty();
        let after_header = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let (pdo, data_at) = match pdu_type {
            _ if data.is_empty() => (0, after_header),
            PduType::H2CTermReq | PduType::C2HTermReq => (0, hlen),
            _ => {
                let at = align_up(after_header, (usize::from(framing.send_pda) + 1) * 4);
                (at, at)
            }
        };
        let plen = if data.is_empty() {
            after_header
        } else {
            data_at + data.len() + if ddgst { DIGEST_LEN } else { 0 }
        };
        let mut pdu_flags = type_flags;
        if hdgst {
            pdu_flags |= flags::HDGSTF;
        }
        if ddgst {
            pdu_flags |= flags::DDGSTF;
        }
        CommonHeader {
            pdu_type: pdu_type as u8,
            flags: pdu_flags,
            hlen: hlen as u8,
            pdo: pdo as u8,
            plen: plen as u32,
        }
        .write(&mut out[start..]);
        if hdgst {
            append_digest(out, start);
        }
        if data.is_empty() {
            debug_assert_eq!(out.len() - start, plen);
            return None;
        }
        out.resize(start + data_at, 0);
        ddgst.then(|| crc32c(data).to_le_bytes())
    }

    /// This PDU's bytes.
    pub fn to_bytes(&self, framing: &Framing) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.pdu_type().header_len() + self.data().len() + 16);
        self.encode(framing, &mut out);
        out
    }
}

/// Writes the type-specific header fields into `h` (HLEN bytes, zeroed); returns
/// the type's own flags and the data to send.
fn write_specific<'a>(pdu: &'a Pdu, h: &mut [u8]) -> (u8, &'a [u8]) {
    let put16 = |h: &mut [u8], at: usize, v: u16| h[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let put32 = |h: &mut [u8], at: usize, v: u32| h[at..at + 4].copy_from_slice(&v.to_le_bytes());
    match pdu {
        Pdu::IcReq(r) => {
            put16(h, 8, r.pfv);
            h[10] = r.hpda;
            h[11] = r.digests.to_byte();
            put32(h, 12, r.maxr2t);
            (0, &[])
        }
        Pdu::IcResp(r) => {
            put16(h, 8, r.pfv);
            h[10] = r.cpda;
            h[11] = r.digests.to_byte();
            put32(h, 12, r.maxh2cdata);
            (0, &[])
        }
        Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => {
            put16(h, 8, t.fes);
            put32(h, 10, t.fei);
            (0, &t.data[..t.data.len().min(TERM_REQ_MAX_DATA)])
        }
        Pdu::CapsuleCmd(c) => {
            h[8..72].copy_from_slice(&c.sqe.0);
            (0, &c.data)
        }
        Pdu::CapsuleResp(r) => {
            h[8..24].copy_from_slice(&r.cqe.to_bytes());
            (0, &[])
        }
        Pdu::H2CData(d) => {
            put16(h, 8, d.cccid);
            put16(h, 10, d.ttag);
            put32(h, 12, d.offset);
            put32(h, 16, d.data.len() as u32);
            (if d.last { flags::DATA_LAST } else { 0 }, &d.data)
        }
        Pdu::C2HData(d) => {
            put16(h, 8, d.cccid);
            put32(h, 12, d.offset);
            put32(h, 16, d.data.len() as u32);
            let mut f = 0;
            if d.last {
                f |= flags::DATA_LAST;
            }
            if d.success {
                f |= flags::DATA_SUCCESS;
            }
            (f, &d.data)
        }
        Pdu::R2T(r) => {
            put16(h, 8, r.cccid);
            put16(h, 10, r.ttag);
            put32(h, 12, r.offset);
            put32(h, 16, r.length);
            (0, &[])
        }
    }
}
