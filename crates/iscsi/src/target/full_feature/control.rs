//! The PDUs that steer the connection rather than move data: task management
//! (RFC 7143 §11.5), NOP-Out (§11.18), text (§11.10) and logout (§11.14).

use blockwire_scsi::ResetKind;

use crate::pdu::{
    Bhs, LogoutReason, LogoutRequest, LogoutResponse, NopIn, NopOut, Pdu, RejectReason,
    TaskFunction, TaskMgmtRequest, TaskMgmtResponse, TextRequest, TextResponse, RESERVED_TAG,
};

use super::super::io::StatSn;
use super::super::naming::decode_lun;
use super::super::tasks::CmdSnCheck;
use super::{Ending, FullFeature, SegmentRead, Transmit, Work};

/// Largest text a Text Request sequence may accumulate (C bit).
pub const MAX_TEXT: usize = 64 * 1024;

/// Task management responses (§11.6.1).
mod response {
    pub const COMPLETE: u8 = 0;
    pub const NO_SUCH_TASK: u8 = 1;
    pub const NO_SUCH_LUN: u8 = 2;
    pub const REASSIGNMENT_NOT_SUPPORTED: u8 = 4;
    pub const NOT_SUPPORTED: u8 = 5;
}

impl FullFeature {
    pub(super) fn task_management(&mut self, request: TaskMgmtRequest) {
        if self.tasks.check_cmd_sn(request.cmd_sn, request.immediate) == CmdSnCheck::Ignore {
            return;
        }
        let lun = decode_lun(request.lun);
        let lun_exists = lun.is_some_and(|lun| self.scsi().lun(lun).is_some());
        // What to wait for before answering, and the answer.
        let (quiesce, code): (Option<Work>, u8) = match request.function {
            TaskFunction::AbortTask => {
                let itt = request.referenced_task_tag;
                if self.drop_pending_task(itt) {
                    (None, response::COMPLETE)
                } else if self.tasks.is_executing(itt) {
                    // Already running on the device: it finishes and answers first,
                    // and then no longer exists.
                    let wait = Work::Quiesce {
                        task: Some(itt),
                        reset: None,
                    };
                    (Some(wait), response::NO_SUCH_TASK)
                } else {
                    (None, response::NO_SUCH_TASK)
                }
            }
            TaskFunction::AbortTaskSet | TaskFunction::ClearTaskSet if !lun_exists => {
                (None, response::NO_SUCH_LUN)
            }
            TaskFunction::AbortTaskSet | TaskFunction::ClearTaskSet => {
                self.drop_pending(lun);
                let wait = Work::Quiesce {
                    task: None,
                    reset: None,
                };
                (Some(wait), response::COMPLETE)
            }
            TaskFunction::LogicalUnitReset if !lun_exists => (None, response::NO_SUCH_LUN),
            TaskFunction::LogicalUnitReset => {
                self.drop_pending(lun);
                let wait = Work::Quiesce {
                    task: None,
                    reset: lun.map(ResetKind::LogicalUnit),
                };
                (Some(wait), response::COMPLETE)
            }
            TaskFunction::TargetWarmReset | TaskFunction::TargetColdReset => {
                self.drop_pending(None);
                let kind = if request.function == TaskFunction::TargetColdReset {
                    ResetKind::TargetCold
                } else {
                    ResetKind::TargetWarm
                };
                let wait = Work::Quiesce {
                    task: None,
                    reset: Some(kind),
                };
                (Some(wait), response::COMPLETE)
            }
            TaskFunction::TaskReassign => (None, response::REASSIGNMENT_NOT_SUPPORTED),
            TaskFunction::ClearAca | TaskFunction::Other(_) => (None, response::NOT_SUPPORTED),
        };
        let answer = Transmit {
            pdu: Pdu::TaskMgmtResponse(TaskMgmtResponse {
                response: code,
                initiator_task_tag: request.initiator_task_tag,
                ..TaskMgmtResponse::default()
            }),
            stat_sn: StatSn::Advance,
            data: Vec::new(),
        };
        // A cold reset ends the connection after its response (§11.5.1).
        let ending = (request.function == TaskFunction::TargetColdReset
            && code == response::COMPLETE)
            .then_some(Ending::ColdReset);
        self.answer_after(quiesce, answer, ending);
    }

    /// Sends `answer` now, or after `quiesce` when there is something to wait
    /// for; then ends the phase with `ending`, if any.
    fn answer_after(&mut self, quiesce: Option<Work>, answer: Transmit, ending: Option<Ending>) {
        match quiesce {
            Some(work) => {
                self.work.push_back(work);
                self.deferred = Some((answer, ending));
            }
            None => {
                self.transmits.push_back(answer);
                if ending.is_some() {
                    self.ending = ending;
                }
            }
        }
    }

    pub(super) fn nop_out(&mut self, bhs: &Bhs, nop: NopOut, read: SegmentRead) {
        if nop.initiator_task_tag == RESERVED_TAG {
            // The answer to our ping; it carries no CmdSN of its own.
            if self
                .ping
                .is_some_and(|(ttt, _)| ttt == nop.target_transfer_tag)
            {
                self.ping = None;
            }
            return;
        }
        let data = match read {
            SegmentRead::Collected(data) => data,
            SegmentRead::DigestError => {
                return self.send_reject(bhs, RejectReason::DataDigestError);
            }
            SegmentRead::Done => Vec::new(),
        };
        if self.tasks.check_cmd_sn(nop.cmd_sn, nop.immediate) == CmdSnCheck::Ignore {
            return;
        }
        let mut echo = data;
        echo.truncate(self.max_send_data());
        let pdu = Pdu::NopIn(NopIn {
            lun: nop.lun,
            initiator_task_tag: nop.initiator_task_tag,
            target_transfer_tag: RESERVED_TAG,
            ..NopIn::default()
        });
        self.send(pdu, StatSn::Advance, echo);
    }

    pub(super) fn text(&mut self, bhs: &Bhs, request: TextRequest, read: SegmentRead) {
        let data = match read {
            SegmentRead::Collected(data) => data,
            SegmentRead::DigestError => {
                return self.send_reject(bhs, RejectReason::DataDigestError);
            }
            SegmentRead::Done => Vec::new(),
        };
        if self.tasks.check_cmd_sn(request.cmd_sn, request.immediate) == CmdSnCheck::Ignore {
            return;
        }
        let reply = |final_bit: bool, continue_bit: bool, ttt: u32| {
            Pdu::TextResponse(TextResponse {
                final_bit,
                continue_bit,
                lun: request.lun,
                initiator_task_tag: request.initiator_task_tag,
                target_transfer_tag: ttt,
                ..TextResponse::default()
            })
        };
        let answer = if request.target_transfer_tag != RESERVED_TAG {
            // The initiator asks for the rest of a long answer (§11.10.4).
            match self.text_out.take() {
                Some((ttt, rest)) if ttt == request.target_transfer_tag => rest,
                _ => return self.send_reject(bhs, RejectReason::InvalidPduField),
            }
        } else {
            self.text_out = None;
            if self.text_in.len() + data.len() > MAX_TEXT {
                self.text_in.clear();
                return self.send_reject(bhs, RejectReason::ProtocolError);
            }
            self.text_in.extend_from_slice(&data);
            if request.continue_bit {
                // More text follows: acknowledge with an empty response.
                let ttt = self.new_ttt();
                return self.send(reply(false, false, ttt), StatSn::Advance, Vec::new());
            }
            let text = std::mem::take(&mut self.text_in);
            match crate::login::answer_text(&self.login, &self.negotiated, &text) {
                Ok(answer) => answer,
                Err(_) => return self.send_reject(bhs, RejectReason::ProtocolError),
            }
        };
        let max = self.max_send_data();
        if answer.len() > max {
            let ttt = self.new_ttt();
            let rest = answer[max..].to_vec();
            let mut now = answer;
            now.truncate(max);
            self.text_out = Some((ttt, rest));
            self.send(reply(false, true, ttt), StatSn::Advance, now)
        } else {
            self.send(reply(true, false, RESERVED_TAG), StatSn::Advance, answer)
        }
    }

    pub(super) fn logout(&mut self, request: LogoutRequest) {
        if self.tasks.check_cmd_sn(request.cmd_sn, request.immediate) == CmdSnCheck::Ignore {
            return;
        }
        // Responses (§11.15.1): 0 closed, 1 CID not found, 2 recovery not supported.
        let code = match request.reason {
            LogoutReason::CloseSession => 0,
            LogoutReason::CloseConnection if request.cid == self.negotiated.cid => 0,
            LogoutReason::CloseConnection => 1,
            LogoutReason::RemoveConnectionForRecovery | LogoutReason::Other(_) => 2,
        };
        let answer = Transmit {
            pdu: Pdu::LogoutResponse(LogoutResponse {
                response: code,
                initiator_task_tag: request.initiator_task_tag,
                time2wait: self.negotiated.default_time2wait,
                time2retain: self.negotiated.default_time2retain,
                ..LogoutResponse::default()
            }),
            stat_sn: StatSn::Advance,
            data: Vec::new(),
        };
        if code != 0 {
            return self.answer_after(None, answer, None);
        }
        // Everything accepted is answered before the logout is (§4.2.3.4).
        self.drop_pending(None);
        let wait = Work::Quiesce {
            task: None,
            reset: None,
        };
        self.answer_after(Some(wait), answer, Some(Ending::LoggedOut));
    }
}
