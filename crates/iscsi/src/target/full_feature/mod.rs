//! The full feature phase of one target connection (RFC 7143 §4.2, §11) as a state
//! machine with no socket, thread or clock in it: the CmdSN window, SCSI commands
//! and their Data-Out (immediate, unsolicited and R2T by R2T), task management,
//! NOP-In pings, text and logout.
//!
//! Call order, for the driver that owns the socket ([`super::connection`]):
//! 1. For each PDU read, [`FullFeature::handle_header`] says where its data segment
//!    goes ([`Segment`]); the driver reads it there (for [`Segment::Buffer`], into
//!    [`FullFeature::segment_buffer`], so Data-Out lands in its command's buffer
//!    without a copy) and reports with [`FullFeature::handle_segment`].
//!    [`FullFeature::handle_pdu`] does both for a PDU already in memory.
//! 2. It sends everything [`FullFeature::poll_transmit`] gives, in order, then runs
//!    each [`FullFeature::poll_work`]: a command for the device, or a wait for the
//!    commands on the device followed by [`FullFeature::quiesced`] (which may queue
//!    more to send).
//! 3. It stops once [`FullFeature::ending`] says so.
//! 4. When nothing arrives before [`FullFeature::next_timeout`], it calls
//!    [`FullFeature::handle_timeout`].
//!
//! Times are passed in, so tests run on a virtual clock.

mod control;
mod data;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::IoBuf;
use blockwire_scsi::{DecodedCdb, ResetKind, Response, ScsiTarget};

use crate::login::{LoginConfig, Negotiated};
use crate::pdu::{Bhs, Pdu, PduError, Reject, RejectReason, RESERVED_TAG};

use super::tasks::Tasks;

pub use super::io::StatSn;
pub use data::{
    OpenR2t, PendingWrite, CRC_ERROR, DATA_PHASE_ERROR, MAX_COMMAND_DATA, MAX_PENDING_DATA,
    NO_SUCH_LUN,
};

/// Where the data segment of the header just handled goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// Read and drop it (its digest need not be checked).
    Skip,
    /// Read it into a vector and hand it to [`FullFeature::handle_segment`].
    Collect,
    /// Read it into [`FullFeature::segment_buffer`].
    Buffer,
}

/// How reading a data segment went.
#[derive(Debug, PartialEq, Eq)]
pub enum SegmentRead {
    /// Skipped or read into the buffer.
    Done,
    /// Read into a vector ([`Segment::Collect`]).
    Collected(Vec<u8>),
    /// Read whole (the stream is still in step) but its data digest is wrong.
    DigestError,
}

/// One PDU to send. The driver stamps StatSN, ExpCmdSN and MaxCmdSN as it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub pdu: Pdu,
    pub stat_sn: StatSn,
    pub data: Vec<u8>,
}

/// A SCSI command whose data-out is all in: to run on its logical unit, answered
/// by whoever runs it.
pub struct CommandJob {
    pub itt: u32,
    /// The LUN number; None when the LUN field uses an addressing method we do not.
    pub lun: Option<u64>,
    /// The LUN field as the initiator sent it.
    pub lun_field: u64,
    pub cdb: Vec<u8>,
    /// The CDB decoded once, for the LUN (where it runs and its execution read it).
    pub decoded: DecodedCdb,
    /// The initiator's Expected Data Transfer Length.
    pub expected_len: u32,
    /// The command's R and W bits.
    pub reads: bool,
    pub writes: bool,
    /// The data-out buffer and how much of it arrived (a prefix).
    pub data: Option<(IoBuf, u32)>,
    /// An answer decided before the command reached the SCSI layer (a broken data
    /// phase, a command too large).
    pub early: Option<Response>,
    /// R2Ts sent for the command (its response's ExpDataSN).
    pub r2t_count: u32,
}

/// Work for the driver beyond sending PDUs.
pub enum Work {
    /// Run a command on the device and send its answer.
    Execute(CommandJob),
    /// Wait until the command with this tag (every command, with None) running on
    /// the device has answered, apply the reset if any, then call
    /// [`FullFeature::quiesced`]: a task management function or a logout answers
    /// only after the tasks it ends (RFC 7143 §4.2.3.3, §4.2.3.4).
    Quiesce {
        task: Option<u32>,
        reset: Option<ResetKind>,
    },
}

/// Why the full feature phase ended; the driver closes the connection once
/// everything queued is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The initiator logged out.
    LoggedOut,
    /// A TARGET COLD RESET ends the connection after its response (§11.5.1).
    ColdReset,
    /// The initiator broke the protocol or stopped answering; the reason, for the log.
    Violation(String),
}

/// Timers of the phase.
#[derive(Debug, Clone, Copy)]
pub struct Timers {
    /// A connection silent this long gets a NOP-In ping...
    pub nop_interval: Duration,
    /// ...and ends when nothing arrives within this time of the ping.
    pub nop_timeout: Duration,
}

/// The header whose data segment is being read, and what follows it.
struct Current {
    bhs: Bhs,
    step: data::Step,
}

/// The full feature phase of one connection.
pub struct FullFeature {
    negotiated: Negotiated,
    login: Arc<LoginConfig>,
    /// The SCSI target; None for a discovery session.
    scsi: Option<Arc<ScsiTarget>>,
    tasks: Arc<Tasks>,
    timers: Timers,
    /// Commands gathering data-out, by initiator task tag.
    pending: HashMap<u32, PendingWrite>,
    /// Bytes of buffer the pending commands hold.
    pending_bytes: usize,
    next_ttt: u32,
    /// Our outstanding NOP-In ping: its tag and when it went out.
    ping: Option<(u32, Instant)>,
    last_received: Instant,
    /// Text of a Text Request sequence still being continued (C bit).
    text_in: Vec<u8>,
    /// A long Text Response still being handed out: its tag and the rest.
    text_out: Option<(u32, Vec<u8>)>,
    current: Option<Current>,
    /// An answer that goes out once the tasks it waits for are done, and the
    /// ending that follows it.
    deferred: Option<(Transmit, Option<Ending>)>,
    transmits: VecDeque<Transmit>,
    work: VecDeque<Work>,
    ending: Option<Ending>,
}

impl FullFeature {
    /// The phase after a login that negotiated `negotiated`, starting at `now`.
    /// `scsi` is None for a discovery session; `tasks` holds the CmdSN window.
    pub fn new(
        negotiated: Negotiated,
        login: Arc<LoginConfig>,
        scsi: Option<Arc<ScsiTarget>>,
        tasks: Arc<Tasks>,
        timers: Timers,
        now: Instant,
    ) -> FullFeature {
        FullFeature {
            negotiated,
            login,
            scsi,
            tasks,
            timers,
            pending: HashMap::new(),
            pending_bytes: 0,
            next_ttt: 1,
            ping: None,
            last_received: now,
            text_in: Vec::new(),
            text_out: None,
            current: None,
            deferred: None,
            transmits: VecDeque::new(),
            work: VecDeque::new(),
            ending: None,
        }
    }

    /// What the login negotiated.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Takes a PDU's header (and AHS); says where its data segment goes.
    pub fn handle_header(&mut self, now: Instant, bhs: &Bhs, ahs: &[u8]) -> Segment {
        if self.deferred.is_some() {
            // The driver waits before reading on; a caller that did not is taken to
            // have waited.
            self.quiesced();
        }
        self.current = None;
        self.last_received = now;
        if self.ending.is_some() {
            self.current = Some(Current {
                bhs: *bhs,
                step: data::Step::Drop,
            });
            return Segment::Skip;
        }
        let step = self.classify(bhs, ahs);
        let segment = self.segment_for(&step);
        self.current = Some(Current { bhs: *bhs, step });
        segment
    }

    /// Where a [`Segment::Buffer`] data segment goes: exactly its length, inside its
    /// command's buffer. Empty when the header asked for no buffer.
    pub fn segment_buffer(&mut self) -> &mut [u8] {
        let Some(current) = self.current.as_mut() else {
            return &mut [];
        };
        data::buffer_for(&mut current.step, &mut self.pending, current.bhs.data_len())
    }

    /// Takes how the data segment of the last header was read, and acts on the PDU.
    pub fn handle_segment(&mut self, now: Instant, read: SegmentRead) {
        self.last_received = now;
        let Some(Current { bhs, step }) = self.current.take() else {
            return;
        };
        if self.ending.is_some() {
            return;
        }
        self.act(&bhs, step, read);
    }

    /// A whole PDU already in memory: [`handle_header`](Self::handle_header), the
    /// data segment put where it goes, [`handle_segment`](Self::handle_segment).
    /// `data` beyond the header's DataSegmentLength is ignored; missing bytes stay
    /// zero.
    pub fn handle_pdu(&mut self, now: Instant, bhs: &Bhs, ahs: &[u8], data: &[u8]) {
        let len = (bhs.data_len() as usize).min(data.len());
        let read = match self.handle_header(now, bhs, ahs) {
            Segment::Skip => SegmentRead::Done,
            Segment::Collect => {
                let mut segment = vec![0u8; bhs.data_len() as usize];
                segment[..len].copy_from_slice(&data[..len]);
                SegmentRead::Collected(segment)
            }
            Segment::Buffer => {
                let buf = self.segment_buffer();
                let n = buf.len().min(len);
                buf[..n].copy_from_slice(&data[..n]);
                SegmentRead::Done
            }
        };
        self.handle_segment(now, read);
    }

    /// Nothing arrived up to `now`: pings a silent initiator, and ends the phase
    /// when a ping went unanswered (and nothing else arrived) for the NOP timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.ending.is_some() {
            return;
        }
        match self.ping {
            Some((_, sent)) if now >= sent.max(self.last_received) + self.timers.nop_timeout => {
                self.ending = Some(Ending::Violation(
                    "the initiator did not answer a NOP-In ping".into(),
                ));
            }
            Some(_) => {}
            None if now >= self.last_received + self.timers.nop_interval => {
                // A NOP-In with a tag asks the initiator to answer (§11.19): it
                // tells a silent connection from a dead one.
                let ttt = self.new_ttt();
                self.ping = Some((ttt, now));
                let pdu = Pdu::NopIn(crate::pdu::NopIn {
                    initiator_task_tag: RESERVED_TAG,
                    target_transfer_tag: ttt,
                    ..Default::default()
                });
                self.send(pdu, StatSn::Current, Vec::new());
            }
            None => {}
        }
    }

    /// When [`handle_timeout`](Self::handle_timeout) has something to do next;
    /// None once the phase ended.
    pub fn next_timeout(&self) -> Option<Instant> {
        if self.ending.is_some() {
            return None;
        }
        Some(match self.ping {
            Some((_, sent)) => sent.max(self.last_received) + self.timers.nop_timeout,
            None => self.last_received + self.timers.nop_interval,
        })
    }

    /// The next PDU to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next work for the driver.
    pub fn poll_work(&mut self) -> Option<Work> {
        self.work.pop_front()
    }

    /// The tasks a [`Work::Quiesce`] waited for are done (and its reset applied):
    /// the answer that waited for them goes out.
    pub fn quiesced(&mut self) {
        if let Some((transmit, ending)) = self.deferred.take() {
            self.transmits.push_back(transmit);
            if ending.is_some() && self.ending.is_none() {
                self.ending = ending;
            }
        }
    }

    /// Why the phase ended, once it has: send what is queued, then close.
    pub fn ending(&self) -> Option<&Ending> {
        self.ending.as_ref()
    }

    /// Commands still gathering data-out, and the bytes of buffer they hold.
    pub fn pending(&self) -> (usize, usize) {
        (self.pending.len(), self.pending_bytes)
    }

    /// Decodes a header and decides what its PDU asks for.
    fn classify(&mut self, bhs: &Bhs, ahs: &[u8]) -> data::Step {
        use data::Step;
        let pdu = match Pdu::decode(bhs, ahs) {
            Ok(pdu) => pdu,
            Err(PduError::UnknownOpcode(_)) => {
                return Step::Reject(RejectReason::CommandNotSupported)
            }
            Err(_) => return Step::Reject(RejectReason::InvalidPduField),
        };
        let discovery = self.scsi.is_none();
        match pdu {
            Pdu::ScsiCommand(command) if !discovery => self.command_header(command, bhs),
            Pdu::DataOut(data) if !discovery => self.data_out_header(data, bhs),
            Pdu::TaskMgmtRequest(request) if !discovery => Step::TaskManagement(request),
            Pdu::NopOut(nop) => Step::NopOut(nop),
            Pdu::TextRequest(request) => Step::Text(request),
            Pdu::LogoutRequest(request) => Step::Logout(request),
            // SNACK needs ErrorRecoveryLevel > 0, which we never negotiate.
            Pdu::Snack(_) => Step::Reject(RejectReason::ProtocolError),
            Pdu::LoginRequest(_) => {
                Step::Violation("a Login Request in the full feature phase".into())
            }
            // Commands in a discovery session, or PDUs only a target sends.
            _ => Step::Reject(RejectReason::ProtocolError),
        }
    }

    fn segment_for(&self, step: &data::Step) -> Segment {
        use data::Step;
        match step {
            Step::Write { task, .. } if task.buf.is_some() && task.received > 0 => Segment::Buffer,
            Step::DataOut { buffered: true, .. } => Segment::Buffer,
            Step::NopOut(nop) if nop.initiator_task_tag != RESERVED_TAG => Segment::Collect,
            Step::Text(_) => Segment::Collect,
            _ => Segment::Skip,
        }
    }

    fn act(&mut self, bhs: &Bhs, step: data::Step, read: SegmentRead) {
        use data::Step;
        match step {
            Step::Drop => {}
            Step::Reject(reason) => self.send_reject(bhs, reason),
            Step::Violation(reason) => self.violation(bhs, reason),
            Step::Read(command) => self.execute_read(command),
            Step::Write { task } => self.command_data(bhs, *task, read),
            Step::DataOut {
                data,
                in_order,
                index,
                ..
            } => self.data_out(bhs, data, in_order, index, read),
            Step::TaskManagement(request) => self.task_management(request),
            Step::NopOut(nop) => self.nop_out(bhs, nop, read),
            Step::Text(request) => self.text(bhs, request, read),
            Step::Logout(request) => self.logout(request),
        }
    }

    fn new_ttt(&mut self) -> u32 {
        let ttt = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        ttt
    }

    fn send(&mut self, pdu: Pdu, stat_sn: StatSn, data: Vec<u8>) {
        self.transmits.push_back(Transmit { pdu, stat_sn, data });
    }

    /// Rejects a PDU (§11.17): the Reject carries the offending header.
    fn send_reject(&mut self, bhs: &Bhs, reason: RejectReason) {
        let pdu = Pdu::Reject(Reject {
            reason,
            ..Reject::default()
        });
        self.send(pdu, StatSn::Advance, bhs.0.to_vec());
    }

    /// Rejects a PDU that breaks the protocol and ends the connection: at
    /// ErrorRecoveryLevel 0 that is the recovery RFC 7143 §7.1.4 leaves us.
    fn violation(&mut self, bhs: &Bhs, reason: String) {
        self.send_reject(bhs, RejectReason::ProtocolError);
        self.ending = Some(Ending::Violation(reason));
    }

    /// The most data one PDU to the initiator may carry.
    fn max_send_data(&self) -> usize {
        self.negotiated
            .initiator_max_recv_data_segment_length
            .max(512) as usize
    }
}
