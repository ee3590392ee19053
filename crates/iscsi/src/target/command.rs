//! Sending a SCSI command's answer as Data-In PDUs and a status (RFC 7143 §11.4,
//! §11.7).

use std::io;

use blockwire_scsi::{Response, Status};

use crate::pdu::{DataIn, Pdu, ResidualKind, ScsiResponse, RESERVED_TAG};

use super::io::{Outgoing, PduWriter, StatSn, Window};

/// How a command's answer goes out.
pub struct Reply<'a> {
    pub initiator_task_tag: u32,
    pub lun_field: u64,
    /// The initiator's Expected Data Transfer Length.
    pub expected_len: u32,
    /// The command's R bit: the initiator takes data-in.
    pub reads: bool,
    /// The command's W bit.
    pub writes: bool,
    /// R2Ts sent for the command (ExpDataSN of a write's response).
    pub r2t_count: u32,
    pub max_burst: u32,
    pub response: &'a Response,
}

/// Sends a command's answer: its data-in (if any) in PDUs of at most what the
/// initiator accepts, the status folded into the last Data-In when there is no
/// sense data (§11.7.4), else a SCSI Response.
pub fn send_reply(writer: &PduWriter, window: &dyn Window, reply: &Reply<'_>) -> io::Result<()> {
    let response = reply.response;
    let data = if reply.reads {
        let data = response.data_in.as_ref();
        &data[..data.len().min(reply.expected_len as usize)]
    } else {
        &[][..]
    };
    let residual = residual(reply, data.len() as u64);
    let status = response.status as u8;
    let collapse = response.sense.is_empty() && response.status == Status::Good && !data.is_empty();
    let max_data = writer.max_data().max(512) as usize;
    let max_burst = reply.max_burst.max(max_data as u32) as usize;
    let mut pdus: Vec<Outgoing<'_>> = Vec::with_capacity(data.len() / max_data + 2);
    let mut offset = 0usize;
    let mut data_sn = 0u32;
    while offset < data.len() {
        let len = (data.len() - offset).min(max_data);
        // A PDU never crosses a MaxBurstLength boundary; the one that ends a burst
        // carries F (§11.7.1).
        let burst_end = (offset / max_burst + 1) * max_burst;
        let len = len.min(burst_end - offset);
        let last = offset + len == data.len();
        let header = DataIn {
            final_bit: last || offset + len == burst_end,
            acknowledge: false,
            status: (last && collapse).then_some(status),
            residual: if last && collapse {
                residual
            } else {
                ResidualKind::None
            },
            lun: reply.lun_field,
            initiator_task_tag: reply.initiator_task_tag,
            target_transfer_tag: RESERVED_TAG,
            data_sn,
            buffer_offset: offset as u32,
            ..DataIn::default()
        };
        let bhs = Pdu::DataIn(header).encode(len as u32).bhs;
        pdus.push(Outgoing {
            bhs,
            ahs: &[],
            stat_sn: if last && collapse {
                StatSn::Advance
            } else {
                StatSn::Reserved
            },
            data: &data[offset..offset + len],
        });
        offset += len;
        data_sn += 1;
    }
    let mut sense_segment = Vec::new();
    if !collapse {
        if !response.sense.is_empty() {
            sense_segment.reserve(2 + response.sense.len());
            sense_segment.extend_from_slice(&(response.sense.len() as u16).to_be_bytes());
            sense_segment.extend_from_slice(&response.sense);
        }
        let header = ScsiResponse {
            response: 0,
            status,
            residual,
            bidi_residual: ResidualKind::None,
            initiator_task_tag: reply.initiator_task_tag,
            exp_data_sn: if reply.reads {
                data_sn
            } else {
                reply.r2t_count
            },
            ..ScsiResponse::default()
        };
        let bhs = Pdu::ScsiResponse(header)
            .encode(sense_segment.len() as u32)
            .bhs;
        pdus.push(Outgoing {
            bhs,
            ahs: &[],
            stat_sn: StatSn::Advance,
            data: &sense_segment,
        });
    }
    writer.send_all(&mut pdus, window)
}

/// The residual of a command (§11.4.5): what the command wanted to move against
/// what the initiator expected.
fn residual(reply: &Reply<'_>, sent: u64) -> ResidualKind {
    let expected = u64::from(reply.expected_len);
    let wanted = reply.response.expected_len;
    if reply.reads || !reply.writes {
        if wanted > expected {
            ResidualKind::Overflow((wanted - expected).min(u64::from(u32::MAX)) as u32)
        } else if reply.reads && sent < expected {
            ResidualKind::Underflow((expected - sent) as u32)
        } else if !reply.reads && wanted < expected {
            ResidualKind::Underflow((expected - wanted) as u32)
        } else {
            ResidualKind::None
        }
    } else {
        ResidualKind::of(wanted, reply.expected_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(reads: bool, writes: bool, edtl: u32, response: &Response) -> Reply<'_> {
        Reply {
            initiator_task_tag: 1,
            lun_field: 0,
            expected_len: edtl,
            reads,
            writes,
            r2t_count: 0,
            max_burst: 1 << 20,
            response,
        }
    }

    #[test]
    fn residuals_follow_rfc_7143() {
        let good = |wanted| Response::good(wanted);
        // A read returning less than expected: underflow by what was not sent.
        let r = good(4096);
        assert_eq!(
            residual(&reply(true, false, 8192, &r), 4096),
            ResidualKind::Underflow(4096)
        );
        // A read asking more than the initiator expects: overflow.
        let r = good(8192);
        assert_eq!(
            residual(&reply(true, false, 4096, &r), 4096),
            ResidualKind::Overflow(4096)
        );
        // A write sent less than the CDB wants: overflow; more: underflow.
        let r = good(8192);
        assert_eq!(
            residual(&reply(false, true, 4096, &r), 0),
            ResidualKind::Overflow(4096)
        );
        let r = good(512);
        assert_eq!(
            residual(&reply(false, true, 4096, &r), 0),
            ResidualKind::Underflow(3584)
        );
        let r = good(0);
        assert_eq!(residual(&reply(false, false, 0, &r), 0), ResidualKind::None);
    }
}
