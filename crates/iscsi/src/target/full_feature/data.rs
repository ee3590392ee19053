//! SCSI commands and their data-out: the CmdSN check, immediate and unsolicited
//! data, R2Ts up to MaxOutstandingR2T of at most MaxBurstLength each, and Data-Out
//! checked against its sequence (RFC 7143 §4.2.4, §11.7, §11.8).

use std::collections::HashMap;

use blockwire_blockdev::IoBuf;
use blockwire_scsi::sense::{codes, key, Code};
use blockwire_scsi::{DataDirection, DecodedCdb, Response, Status};

use crate::pdu::{
    Bhs, DataOut, LogoutRequest, NopOut, Pdu, R2t, RejectReason, ScsiCommand, TaskMgmtRequest,
    TextRequest, RESERVED_TAG,
};

use super::super::io::StatSn;
use super::super::naming::decode_lun;
use super::super::tasks::CmdSnCheck;
use super::{CommandJob, FullFeature, SegmentRead, Work};

/// Largest data-out one command may carry; larger commands are refused before any
/// buffer is allocated (the block limits VPD page advertises less).
pub const MAX_COMMAND_DATA: u32 = 64 << 20;
/// Data-out buffered for commands still gathering it, per connection: a bound on
/// the memory one initiator can make us hold.
pub const MAX_PENDING_DATA: usize = 256 << 20;
/// A LUN number no target has: commands with an unusable LUN field go to it, so
/// the SCSI layer answers them as for any missing LUN.
pub const NO_SUCH_LUN: u64 = u64::MAX;

/// ABORTED COMMAND / DATA PHASE ERROR (SPC-4 table D.1): the answer to a command
/// whose Data-Out broke its sequence.
pub const DATA_PHASE_ERROR: Code = Code::new(key::ABORTED_COMMAND, 0x4b, 0x00);
/// ABORTED COMMAND / PROTOCOL SERVICE CRC ERROR: the answer to a command whose data
/// failed its digest.
pub const CRC_ERROR: Code = Code::new(key::ABORTED_COMMAND, 0x47, 0x05);

/// One outstanding R2T: a range of the command's buffer the initiator was asked for.
#[derive(Debug)]
pub struct OpenR2t {
    pub target_transfer_tag: u32,
    pub offset: u32,
    pub len: u32,
    /// The next offset expected in this sequence (data must arrive in order:
    /// blockwire negotiates DataPDUInOrder and DataSequenceInOrder).
    pub next_offset: u32,
    /// The next DataSN expected; each sequence counts from 0 (§4.2.2.4).
    pub next_data_sn: u32,
}

/// A command whose data-out is still arriving.
pub struct PendingWrite {
    pub command: ScsiCommand,
    /// The LUN number, None when the LUN field uses an addressing method we do not.
    pub lun: Option<u64>,
    /// The CDB, decoded once.
    pub decoded: DecodedCdb,
    /// The data, EDTL bytes long; None when the command is answered early and its
    /// unsolicited data is only drained.
    pub buf: Option<IoBuf>,
    /// A response decided before the data arrived (a command too large, say).
    pub early: Option<Response>,
    /// Bytes received: always a prefix of the buffer, as data arrives in order.
    pub received: u32,
    /// Bytes the target solicits in all: the CDB's transfer length, at most EDTL.
    pub want: u32,
    /// Unsolicited Data-Out (TTT = reserved) may still arrive.
    pub unsolicited_open: bool,
    pub unsolicited_next_offset: u32,
    pub unsolicited_next_data_sn: u32,
    /// Where unsolicited data must stop (FirstBurstLength, or EDTL).
    pub unsolicited_limit: u32,
    pub r2ts: Vec<OpenR2t>,
    /// The first byte not yet received or asked for by an R2T.
    pub next_request: u32,
    pub next_r2t_sn: u32,
}

impl PendingWrite {
    /// Whether every byte is in and no more data may come.
    pub fn complete(&self) -> bool {
        !self.unsolicited_open && self.r2ts.is_empty() && self.next_request >= self.want
    }

    fn held_bytes(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }
}

/// What a header asked for, done once its data segment is read.
pub(super) enum Step {
    /// Nothing (a command outside the CmdSN window, or the phase has ended).
    Drop,
    Reject(RejectReason),
    Violation(String),
    /// A command without data-out.
    Read(ScsiCommand),
    /// A write command; its immediate data goes into the task's buffer.
    Write {
        task: Box<PendingWrite>,
    },
    DataOut {
        data: DataOut,
        in_order: bool,
        /// The R2T sequence the PDU belongs to (None: unsolicited).
        index: Option<usize>,
        /// Its data goes straight into the command's buffer.
        buffered: bool,
    },
    TaskManagement(TaskMgmtRequest),
    NopOut(NopOut),
    Text(TextRequest),
    Logout(LogoutRequest),
}

/// The part of a command's buffer a [`Step`]'s data segment of `len` bytes fills.
pub(super) fn buffer_for<'a>(
    step: &'a mut Step,
    pending: &'a mut HashMap<u32, PendingWrite>,
    len: u32,
) -> &'a mut [u8] {
    match step {
        Step::Write { task } => match &mut task.buf {
            Some(buf) => &mut buf[..len as usize],
            None => &mut [],
        },
        Step::DataOut {
            data,
            buffered: true,
            ..
        } => {
            let start = data.buffer_offset as usize;
            match pending
                .get_mut(&data.initiator_task_tag)
                .and_then(|task| task.buf.as_mut())
            {
                Some(buf) => &mut buf[start..start + len as usize],
                None => &mut [],
            }
        }
        _ => &mut [],
    }
}

impl FullFeature {
    pub(super) fn scsi(&self) -> &blockwire_scsi::ScsiTarget {
        self.scsi.as_deref().expect("a normal session")
    }

    /// A SCSI Command's header: checks its CmdSN, tag and immediate data, and for a
    /// write sets up the buffer its data-out goes to.
    pub(super) fn command_header(&mut self, command: ScsiCommand, bhs: &Bhs) -> Step {
        let data_len = bhs.data_len();
        if self.tasks.check_cmd_sn(command.cmd_sn, command.immediate) == CmdSnCheck::Ignore {
            tracing::debug!(
                cmd_sn = command.cmd_sn,
                "command outside the CmdSN window ignored"
            );
            return Step::Drop;
        }
        let itt = command.initiator_task_tag;
        if self.pending.contains_key(&itt) || self.tasks.is_executing(itt) {
            return Step::Reject(RejectReason::TaskInProgress);
        }
        let edtl = command.expected_data_transfer_length;
        if data_len > 0
            && (!command.write
                || !self.negotiated.immediate_data
                || data_len > edtl
                || data_len > self.negotiated.first_burst_length)
        {
            return Step::Violation("immediate data the login did not allow".into());
        }
        if !command.write {
            return Step::Read(command);
        }
        let lun = decode_lun(command.lun);
        let decoded = self.scsi().decode(lun.unwrap_or(NO_SUCH_LUN), &command.cdb);
        let info = decoded.transfer;
        let want = match info.direction {
            DataDirection::Out => u64::from(edtl).min(info.len) as u32,
            _ => 0,
        };
        // The buffer holds what we solicit and what the initiator may send
        // unsolicited; an EDTL beyond both costs nothing.
        let unsolicited_limit = self.negotiated.first_burst_length.min(edtl);
        let buf_len = want.max(unsolicited_limit);
        let mut early = None;
        let mut buf = None;
        if buf_len > MAX_COMMAND_DATA {
            early = Some(Response::code(codes::INVALID_FIELD_IN_CDB, info.len));
        } else if self.pending_bytes + buf_len as usize > MAX_PENDING_DATA {
            early = Some(Response {
                status: Status::TaskSetFull,
                sense: Vec::new(),
                data_in: IoBuf::new(0),
                expected_len: info.len,
            });
        } else {
            buf = Some(IoBuf::new(buf_len as usize));
        }
        let task = PendingWrite {
            lun,
            decoded,
            early,
            received: data_len,
            want,
            unsolicited_open: !command.final_bit,
            unsolicited_next_offset: data_len,
            unsolicited_next_data_sn: 0,
            unsolicited_limit,
            r2ts: Vec::new(),
            // A command answered early solicits nothing.
            next_request: if buf.is_some() {
                data_len
            } else {
                want.max(data_len)
            },
            next_r2t_sn: 0,
            buf,
            command,
        };
        Step::Write {
            task: Box::new(task),
        }
    }

    /// A write command's immediate data is in: it gathers the rest.
    pub(super) fn command_data(&mut self, bhs: &Bhs, task: PendingWrite, read: SegmentRead) {
        if read == SegmentRead::DigestError {
            // RFC 7143 §7.8: the command is rejected and dropped; the initiator
            // sends it again or recovers the session.
            self.send_reject(bhs, RejectReason::DataDigestError);
            return;
        }
        let itt = task.command.initiator_task_tag;
        self.pending_bytes += task.held_bytes();
        self.pending.insert(itt, task);
        self.advance(itt);
    }

    /// Queues a command without data-out.
    pub(super) fn execute_read(&mut self, command: ScsiCommand) {
        let lun = decode_lun(command.lun);
        let decoded = self.scsi().decode(lun.unwrap_or(NO_SUCH_LUN), &command.cdb);
        self.work.push_back(Work::Execute(CommandJob {
            itt: command.initiator_task_tag,
            lun,
            decoded,
            lun_field: command.lun,
            expected_len: command.expected_data_transfer_length,
            reads: command.read,
            writes: command.write,
            cdb: command.cdb,
            data: None,
            early: None,
            r2t_count: 0,
        }));
    }

    /// Sends the R2Ts a command may have outstanding, or queues it once all its
    /// data is in.
    pub(super) fn advance(&mut self, itt: u32) {
        let max_outstanding = self.negotiated.max_outstanding_r2t.max(1) as usize;
        let max_burst = self.negotiated.max_burst_length.max(512);
        let Some(task) = self.pending.get(&itt) else {
            return;
        };
        let mut r2ts = Vec::new();
        if !task.unsolicited_open {
            let mut next = task.next_request;
            let mut outstanding = task.r2ts.len();
            let mut r2t_sn = task.next_r2t_sn;
            while outstanding < max_outstanding && next < task.want {
                let len = (task.want - next).min(max_burst);
                r2ts.push((next, len, r2t_sn));
                next += len;
                outstanding += 1;
                r2t_sn += 1;
            }
        }
        let lun_field = task.command.lun;
        for (offset, len, r2t_sn) in r2ts {
            let ttt = self.new_ttt();
            let task = self.pending.get_mut(&itt).expect("present");
            task.r2ts.push(OpenR2t {
                target_transfer_tag: ttt,
                offset,
                len,
                next_offset: offset,
                next_data_sn: 0,
            });
            task.next_request = offset + len;
            task.next_r2t_sn = r2t_sn + 1;
            let pdu = Pdu::R2t(R2t {
                lun: lun_field,
                initiator_task_tag: itt,
                target_transfer_tag: ttt,
                r2t_sn,
                buffer_offset: offset,
                desired_data_transfer_length: len,
                ..R2t::default()
            });
            self.send(pdu, StatSn::Current, Vec::new());
        }
        if self.pending[&itt].complete() {
            let task = self.pending.remove(&itt).expect("present");
            self.pending_bytes -= task.held_bytes();
            let command = task.command;
            self.work.push_back(Work::Execute(CommandJob {
                itt,
                lun: task.lun,
                decoded: task.decoded,
                lun_field: command.lun,
                expected_len: command.expected_data_transfer_length,
                reads: command.read,
                writes: command.write,
                cdb: command.cdb,
                data: task.buf.map(|buf| (buf, task.received)),
                early: task.early,
                r2t_count: task.next_r2t_sn,
            }));
        }
    }

    /// A Data-Out's header: which sequence it belongs to and whether it is the PDU
    /// expected there.
    pub(super) fn data_out_header(&mut self, data: DataOut, bhs: &Bhs) -> Step {
        let len = bhs.data_len();
        let Some(task) = self.pending.get(&data.initiator_task_tag) else {
            return Step::Reject(RejectReason::InvalidPduField);
        };
        let offset = data.buffer_offset;
        let end = offset.saturating_add(len);
        let (in_order, index) = if data.target_transfer_tag == RESERVED_TAG {
            if !task.unsolicited_open {
                return Step::Reject(RejectReason::ProtocolError);
            }
            let in_order = data.data_sn == task.unsolicited_next_data_sn
                && offset == task.unsolicited_next_offset
                && end <= task.unsolicited_limit;
            (in_order, None)
        } else {
            let Some(index) = task
                .r2ts
                .iter()
                .position(|r| r.target_transfer_tag == data.target_transfer_tag)
            else {
                return Step::Reject(RejectReason::InvalidPduField);
            };
            let r2t = &task.r2ts[index];
            let ends_sequence = end == r2t.offset + r2t.len;
            let in_order = data.data_sn == r2t.next_data_sn
                && offset == r2t.next_offset
                && end <= r2t.offset + r2t.len
                && (!data.final_bit || ends_sequence);
            (in_order, Some(index))
        };
        let buffered = in_order && len > 0 && task.buf.is_some();
        Step::DataOut {
            data,
            in_order,
            index,
            buffered,
        }
    }

    /// A Data-Out's data is in (or skipped): moves its sequence on, or fails the
    /// command when the PDU was out of order or damaged.
    pub(super) fn data_out(
        &mut self,
        bhs: &Bhs,
        data: DataOut,
        in_order: bool,
        index: Option<usize>,
        read: SegmentRead,
    ) {
        let itt = data.initiator_task_tag;
        let len = bhs.data_len();
        let offset = data.buffer_offset;
        let end = offset.saturating_add(len);
        let mut failure = (!in_order).then_some(DATA_PHASE_ERROR);
        if read == SegmentRead::DigestError {
            // RFC 7143 §7.8: a payload digest error is rejected and the PDU
            // dropped; at ErrorRecoveryLevel 0 its data cannot be asked for again.
            self.send_reject(bhs, RejectReason::DataDigestError);
            failure = Some(CRC_ERROR);
        }
        let Some(task) = self.pending.get_mut(&itt) else {
            return;
        };
        if let Some(code) = failure {
            tracing::debug!(
                itt,
                data_sn = data.data_sn,
                offset,
                len,
                "Data-Out out of sequence or damaged; failing the command"
            );
            let index = fail_task(task, index, code, &mut self.pending_bytes);
            close_sequence(task, index, data.final_bit);
            return self.advance(itt);
        }
        task.received = task.received.max(end);
        match index {
            None => {
                task.unsolicited_next_data_sn += 1;
                task.unsolicited_next_offset = end;
                if data.final_bit {
                    task.next_request = task.next_request.max(end);
                }
            }
            Some(i) => {
                task.r2ts[i].next_data_sn += 1;
                task.r2ts[i].next_offset = end;
            }
        }
        close_sequence(task, index, data.final_bit);
        self.advance(itt)
    }

    /// Drops the commands of `lun` (every LUN with None) still gathering data:
    /// aborted tasks get no response (RFC 7143 §4.2.3.3).
    pub(super) fn drop_pending(&mut self, lun: Option<u64>) {
        let before = self.pending.len();
        let mut freed = 0;
        self.pending.retain(|_, task| {
            let doomed = lun.is_none() || task.lun == lun;
            if doomed {
                freed += task.held_bytes();
            }
            !doomed
        });
        if self.pending.len() != before {
            self.pending_bytes -= freed;
        }
    }

    /// Drops the command `itt` if it is still gathering data; whether it was.
    pub(super) fn drop_pending_task(&mut self, itt: u32) -> bool {
        match self.pending.remove(&itt) {
            Some(task) => {
                self.pending_bytes -= task.held_bytes();
                true
            }
            None => false,
        }
    }
}

/// Fails a command whose data went wrong: its buffer is dropped, the command will be
/// answered with `code`, and only the sequence at `index` (the one the bad PDU
/// belongs to) may still send data, so that the initiator can close it. Returns the
/// sequence's new index. At ErrorRecoveryLevel 0 this ends the task, not the
/// connection.
fn fail_task(
    task: &mut PendingWrite,
    index: Option<usize>,
    code: Code,
    pending_bytes: &mut usize,
) -> Option<usize> {
    if let Some(buf) = task.buf.take() {
        *pending_bytes -= buf.len();
    }
    if task.early.is_none() {
        task.early = Some(Response::code(code, u64::from(task.want)));
    }
    task.next_request = task.want;
    let keep = index.map(|i| task.r2ts.swap_remove(i));
    task.r2ts.clear();
    task.r2ts.extend(keep);
    index.map(|_| 0)
}

/// Ends the sequence a Data-Out with the F bit closes: the unsolicited one, or the
/// R2T at `index`.
fn close_sequence(task: &mut PendingWrite, index: Option<usize>, final_bit: bool) {
    if !final_bit {
        return;
    }
    match index {
        None => task.unsolicited_open = false,
        Some(i) => {
            task.r2ts.remove(i);
        }
    }
}
