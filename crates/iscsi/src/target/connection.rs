//! One TCP connection of the target: the login phase, then the full feature phase
//! (RFC 7143 §6, §4.2), driven by one thread that reads PDUs; commands run on the
//! worker pool and answer through the shared writer.

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::{IoBuf, OpenSession};
use blockwire_scsi::sense::{codes, key, Code};
use blockwire_scsi::{Command, DataDirection, ResetKind, Response, Status};

use crate::login::{
    failure_response, status, LoginConfig, LoginMachine, LoginStep, Negotiated, SessionType,
};
use crate::pdu::{
    Bhs, DataOut, LoginResponse, LogoutReason, LogoutRequest, LogoutResponse, NopIn, NopOut, Pdu,
    R2t, Reject, RejectReason, ScsiCommand, TaskFunction, TaskMgmtRequest, TaskMgmtResponse,
    TextRequest, TextResponse, RESERVED_TAG,
};

use super::command::{send_reply, OpenR2t, PendingWrite, Reply};
use super::io::{Incoming, Outgoing, PduReader, PduWriter, ReadError, StatSn};
use super::naming::decode_lun;
use super::queued::{QueuedCommands, QueuedJob, Work};
use super::session::{CmdSnCheck, Session, SessionKey};
use super::Shared;

/// Largest data-out one command may carry; larger commands are refused before any
/// buffer is allocated (the block limits VPD page advertises less).
const MAX_COMMAND_DATA: u32 = 64 << 20;
/// Data-out buffered for commands still gathering it, per connection: a bound on
/// the memory one initiator can make us hold.
const MAX_PENDING_DATA: usize = 256 << 20;
/// Largest text a Text Request sequence may accumulate (C bit).
const MAX_TEXT: usize = 64 * 1024;
/// A LUN number no target has: commands with an unusable LUN field go to it, so
/// the SCSI layer answers them as for any missing LUN.
const NO_SUCH_LUN: u64 = u64::MAX;

/// ABORTED COMMAND / DATA PHASE ERROR (SPC-4 table D.1): the answer to a command
/// whose Data-Out broke its sequence.
const DATA_PHASE_ERROR: Code = Code::new(key::ABORTED_COMMAND, 0x4b, 0x00);
/// ABORTED COMMAND / PROTOCOL SERVICE CRC ERROR: the answer to a command whose data
/// failed its digest.
const CRC_ERROR: Code = Code::new(key::ABORTED_COMMAND, 0x47, 0x05);

/// Reads up to this size are answered on the connection's thread when their data
/// is cached.
const INLINE_READ_MAX: u32 = 64 * 1024;

/// Writes up to this size that the device takes into its cache run on the
/// connection's thread.
const INLINE_WRITE_MAX: u32 = 64 * 1024;

/// One command on its way to the SCSI layer and back.
struct Job {
    session: Arc<Session>,
    itt: u32,
    cdb: Vec<u8>,
    lun: Option<u64>,
    lun_field: u64,
    expected_len: u32,
    reads: bool,
    writes: bool,
    max_burst: u32,
    /// The data-out buffer and how much of it arrived.
    data: Option<(IoBuf, u32)>,
    /// An answer decided before the command reached the SCSI layer.
    early: Option<Response>,
    r2t_count: u32,
}

impl Job {
    /// Executes the command and sends its answer; a send that fails ends the
    /// connection.
    fn run(self) {
        let session = &self.session;
        let response = self.early.unwrap_or_else(|| {
            let scsi = session.scsi.as_ref().expect("normal session");
            let data_out = match &self.data {
                Some((buf, received)) => &buf[..*received as usize],
                None => &[][..],
            };
            scsi.execute(
                self.lun.unwrap_or(NO_SUCH_LUN),
                &Command {
                    nexus: &session.nexus,
                    cdb: &self.cdb,
                    data_out,
                },
            )
        });
        drop(self.data);
        let reply = Reply {
            initiator_task_tag: self.itt,
            lun_field: self.lun_field,
            expected_len: self.expected_len,
            reads: self.reads,
            writes: self.writes,
            r2t_count: self.r2t_count,
            max_burst: self.max_burst,
            response: &response,
        };
        if let Err(e) = send_reply(&session.writer, &**session, &reply) {
            tracing::debug!("cannot send a response: {e}");
            session.writer.shutdown();
        }
    }
}

/// Why a connection ended.
enum Ending {
    Closed,
    LoggedOut,
    Violation(String),
    Failed(io::Error),
}

impl From<ReadError> for Ending {
    fn from(e: ReadError) -> Ending {
        match e {
            ReadError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ending::Closed,
            ReadError::Io(e) => Ending::Failed(e),
            other => Ending::Violation(other.to_string()),
        }
    }
}

impl From<io::Error> for Ending {
    fn from(e: io::Error) -> Ending {
        Ending::Failed(e)
    }
}

/// Serves one accepted connection until it ends.
pub(super) fn serve(stream: TcpStream, id: u64, shared: Arc<Shared>) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let portal = stream.local_addr().ok();
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(shared.config.send_timeout));
    let writer = match stream.try_clone() {
        Ok(clone) => Arc::new(PduWriter::new(clone, 0)),
        Err(e) => {
            tracing::warn!(%peer, "cannot clone socket: {e}");
            return;
        }
    };
    let mut reader = PduReader::new(stream);
    let login = shared.login_config_for(portal);
    let Some((negotiated, session)) =
        login_phase(&mut reader, &writer, &shared, login.clone(), id, &peer)
    else {
        return;
    };
    let initiator = negotiated.initiator_name.clone();
    // Discovery sessions serve no export: not counted.
    let target = negotiated.target_name.clone();
    let _open = match (&shared.config.sessions, &target) {
        (Some(meter), Some(target)) => Some(OpenSession::open(meter.as_ref(), target)),
        _ => None,
    };
    tracing::info!(
        %peer,
        initiator = %initiator,
        target = negotiated.target_name.as_deref().unwrap_or("(discovery)"),
        tsih = session.tsih,
        "logged in"
    );
    let mut connection = Connection {
        reader,
        session: session.clone(),
        shared: shared.clone(),
        login,
        negotiated,
        pending: HashMap::new(),
        pending_bytes: 0,
        next_ttt: 1,
        ping: None,
        text_in: Vec::new(),
        text_out: None,
        queued: QueuedCommands::start(&session),
    };
    let ending = connection.run();
    drop(connection);
    // Every command the connection started answers (or fails to) before the
    // session goes: SCSI state must not see a command after its nexus is gone.
    session.wait_executing(None);
    shared.registry.remove(&session);
    if let Some(scsi) = &session.scsi {
        scsi.nexus_lost(&session.nexus);
    }
    session.writer.shutdown();
    match ending {
        Ending::Closed => tracing::info!(%peer, initiator = %initiator, "connection closed"),
        Ending::LoggedOut => tracing::info!(%peer, initiator = %initiator, "logged out"),
        Ending::Violation(reason) => {
            tracing::warn!(%peer, initiator = %initiator, "closed connection: {reason}")
        }
        Ending::Failed(e) => {
            tracing::warn!(%peer, initiator = %initiator, "connection failed: {e}")
        }
    }
}

/// Runs the login phase; returns the negotiated parameters and the registered
/// session, or None when the login failed or the peer left.
fn login_phase(
    reader: &mut PduReader,
    writer: &Arc<PduWriter>,
    shared: &Arc<Shared>,
    login: Arc<LoginConfig>,
    id: u64,
    peer: &str,
) -> Option<(Negotiated, Arc<Session>)> {
    let deadline = Instant::now() + shared.config.login_timeout;
    let mut machine = LoginMachine::new(login);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() || reader.set_idle_timeout(Some(remaining)).is_err() {
            tracing::info!(%peer, "login not finished in time; closing");
            return None;
        }
        let (bhs, ahs) = match reader.read_header() {
            Ok(Incoming::Header { bhs, ahs }) => (bhs, ahs),
            Ok(Incoming::Idle) => {
                tracing::info!(%peer, "login not finished in time; closing");
                return None;
            }
            Ok(Incoming::Closed) => return None,
            Err(e) => {
                tracing::info!(%peer, "login failed: {e}");
                return None;
            }
        };
        let request = match Pdu::decode(&bhs, &ahs) {
            Ok(Pdu::LoginRequest(request)) => request,
            _ => {
                // Only Login Requests are valid before the full feature phase (§6.1).
                tracing::info!(%peer, opcode = bhs.opcode(), "a PDU other than Login during login; closing");
                return None;
            }
        };
        let data = match reader.read_data_vec(bhs.data_len()) {
            Ok(data) => data,
            Err(e) => {
                tracing::info!(%peer, "login failed: {e}");
                return None;
            }
        };
        match machine.handle(&request, &data) {
            LoginStep::Continue { response, data } => {
                send_login(writer, &response, &data).ok()?;
            }
            LoginStep::Fail {
                response,
                data,
                reason,
            } => {
                tracing::warn!(%peer, "login refused: {reason}");
                let _ = send_login(writer, &response, &data);
                return None;
            }
            LoginStep::Complete {
                mut response,
                data,
                negotiated,
            } => {
                if !shared.admission.finish(id) {
                    tracing::info!(%peer, "login closed by a connection limit");
                    return None;
                }
                let session = match establish(shared, writer, id, &negotiated) {
                    Ok(session) => session,
                    Err((status, reason)) => {
                        tracing::warn!(%peer, "login refused: {reason}");
                        let _ = send_login(writer, &failure_response(&response, status), &[]);
                        return None;
                    }
                };
                response.tsih = session.tsih;
                if send_login(writer, &response, &data).is_err() {
                    shared.registry.remove(&session);
                    return None;
                }
                writer.set_parameters(
                    negotiated.header_digest,
                    negotiated.data_digest,
                    negotiated.initiator_max_recv_data_segment_length,
                    negotiated.stat_sn,
                );
                reader.set_parameters(
                    negotiated.header_digest,
                    negotiated.data_digest,
                    negotiated.target_max_recv_data_segment_length,
                );
                return Some((negotiated, session));
            }
        }
    }
}

fn send_login(writer: &PduWriter, response: &LoginResponse, data: &[u8]) -> io::Result<()> {
    let header = Pdu::LoginResponse(response.clone()).encode(data.len() as u32);
    writer.send_unstamped(&header.bhs, data)
}

/// Creates (or reinstates) the session a completed login asked for. Errors carry
/// the login status (RFC 7143 §11.13.5) and a reason for the log.
fn establish(
    shared: &Arc<Shared>,
    writer: &Arc<PduWriter>,
    id: u64,
    negotiated: &Negotiated,
) -> Result<Arc<Session>, (u16, String)> {
    let key = SessionKey {
        initiator_name: negotiated.initiator_name.clone(),
        isid: negotiated.isid,
        target_name: negotiated.target_name.clone(),
    };
    let old = if negotiated.tsih == 0 {
        // Session reinstatement (§6.3.5): a new login with the ISID of a live
        // session ends the old one.
        shared.registry.find(&key)
    } else {
        match shared.registry.by_tsih(negotiated.tsih) {
            Some((old_key, old)) if old_key == key => Some(old),
            _ => {
                return Err((
                    status::SESSION_DOES_NOT_EXIST,
                    format!("no session with TSIH {}", negotiated.tsih),
                ))
            }
        }
    };
    if let Some(old) = old {
        tracing::info!(
            initiator = %key.initiator_name,
            tsih = old.tsih,
            "reinstating session: closing its old connection"
        );
        old.writer.shutdown();
        if !shared.registry.wait_removed(&old, Duration::from_secs(10)) {
            return Err((
                status::TARGET_ERROR,
                "the old session did not end in time".into(),
            ));
        }
    }
    if shared.stopping.load(Ordering::SeqCst) {
        return Err((
            status::SERVICE_UNAVAILABLE,
            "the target is shutting down".into(),
        ));
    }
    let scsi = match (&negotiated.session_type, &negotiated.target_name) {
        (SessionType::Normal, Some(name)) => match shared.scsi_target(name) {
            Some(scsi) => Some(scsi),
            None => return Err((status::TARGET_NOT_FOUND, format!("target {name} not found"))),
        },
        _ => None,
    };
    let tsih = shared.registry.allocate_tsih();
    let session = Arc::new(Session::new(
        tsih,
        id,
        &negotiated.initiator_name,
        negotiated.isid,
        scsi,
        writer.clone(),
        negotiated.exp_cmd_sn,
        shared.config.limits.cmd_window,
    ));
    shared.registry.insert(key, session.clone());
    Ok(session)
}

/// The full feature phase of one connection.
struct Connection {
    reader: PduReader,
    session: Arc<Session>,
    shared: Arc<Shared>,
    login: Arc<LoginConfig>,
    negotiated: Negotiated,
    /// Commands gathering data-out, by initiator task tag.
    pending: HashMap<u32, PendingWrite>,
    pending_bytes: usize,
    next_ttt: u32,
    /// Our outstanding NOP-In ping: its tag and when it went out.
    ping: Option<(u32, Instant)>,
    /// Text of a Text Request sequence still being continued (C bit).
    text_in: Vec<u8>,
    /// A long Text Response still being handed out: its tag and the rest.
    text_out: Option<(u32, Vec<u8>)>,
    /// READs and WRITEs to LUNs whose device has a request queue (an RBD image).
    queued: Option<QueuedCommands>,
}

impl Connection {
    fn run(&mut self) -> Ending {
        let idle = self.shared.config.nop_interval;
        if self.reader.set_idle_timeout(Some(idle)).is_err() {
            return Ending::Closed;
        }
        loop {
            let incoming = match self.reader.read_header() {
                Ok(incoming) => incoming,
                Err(e) => return e.into(),
            };
            let result = match incoming {
                Incoming::Closed => return Ending::Closed,
                Incoming::Idle => self.on_idle(),
                Incoming::Header { bhs, ahs } => self.dispatch(bhs, &ahs),
            };
            match result {
                Ok(()) => {}
                Err(ending) => return ending,
            }
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

    fn send(&self, pdu: Pdu, stat_sn: StatSn, data: &[u8]) -> Result<(), Ending> {
        let header = pdu.encode(data.len() as u32);
        self.session.writer.send(
            Outgoing {
                bhs: header.bhs,
                ahs: &header.ahs,
                stat_sn,
                data,
            },
            &*self.session,
        )?;
        Ok(())
    }

    /// Rejects a PDU (§11.17): the Reject carries the offending header.
    fn reject(&mut self, bhs: &Bhs, reason: RejectReason) -> Result<(), Ending> {
        self.reader.skip_data(bhs.data_len())?;
        self.send_reject(bhs, reason)
    }

    fn send_reject(&self, bhs: &Bhs, reason: RejectReason) -> Result<(), Ending> {
        let pdu = Pdu::Reject(Reject {
            reason,
            ..Reject::default()
        });
        self.send(pdu, StatSn::Advance, &bhs.0)
    }

    /// Rejects a PDU that breaks the protocol and ends the connection: at
    /// ErrorRecoveryLevel 0 that is the recovery RFC 7143 §7.1.4 leaves us.
    fn violation(&mut self, bhs: &Bhs, reason: String) -> Result<(), Ending> {
        let _ = self.send_reject(bhs, RejectReason::ProtocolError);
        Err(Ending::Violation(reason))
    }

    /// Reads a PDU's data segment; a data digest error is answered with a Reject
    /// and the PDU dropped (None).
    fn read_payload(&mut self, bhs: &Bhs) -> Result<Option<Vec<u8>>, Ending> {
        match self.reader.read_data_vec(bhs.data_len()) {
            Ok(data) => Ok(Some(data)),
            Err(ReadError::DataDigest) => {
                self.send_reject(bhs, RejectReason::DataDigestError)?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn on_idle(&mut self) -> Result<(), Ending> {
        match self.ping {
            Some((_, sent)) if sent.elapsed() >= self.shared.config.nop_timeout => Err(
                Ending::Violation("the initiator did not answer a NOP-In ping".into()),
            ),
            Some(_) => Ok(()),
            None => {
                // A NOP-In with a tag asks the initiator to answer (§11.19): it
                // tells a silent connection from a dead one.
                let ttt = self.new_ttt();
                self.ping = Some((ttt, Instant::now()));
                let pdu = Pdu::NopIn(NopIn {
                    initiator_task_tag: RESERVED_TAG,
                    target_transfer_tag: ttt,
                    ..NopIn::default()
                });
                self.send(pdu, StatSn::Current, &[])
            }
        }
    }

    fn dispatch(&mut self, bhs: Bhs, ahs: &[u8]) -> Result<(), Ending> {
        let pdu = match Pdu::decode(&bhs, ahs) {
            Ok(pdu) => pdu,
            Err(crate::pdu::PduError::UnknownOpcode(_)) => {
                return self.reject(&bhs, RejectReason::CommandNotSupported)
            }
            Err(_) => return self.reject(&bhs, RejectReason::InvalidPduField),
        };
        let discovery = self.session.scsi.is_none();
        match pdu {
            Pdu::ScsiCommand(command) if !discovery => self.on_command(command, &bhs),
            Pdu::DataOut(data) if !discovery => self.on_data_out(data, &bhs),
            Pdu::TaskMgmtRequest(request) if !discovery => self.on_task_management(request, &bhs),
            Pdu::NopOut(nop) => self.on_nop_out(nop, &bhs),
            Pdu::TextRequest(request) => self.on_text(request, &bhs),
            Pdu::LogoutRequest(request) => self.on_logout(request, &bhs),
            Pdu::Snack(_) => {
                // SNACK needs ErrorRecoveryLevel > 0, which we never negotiate.
                self.reject(&bhs, RejectReason::ProtocolError)
            }
            Pdu::LoginRequest(_) => {
                self.reader.skip_data(bhs.data_len())?;
                self.violation(&bhs, "a Login Request in the full feature phase".into())
            }
            // Commands in a discovery session, or PDUs only a target sends.
            _ => self.reject(&bhs, RejectReason::ProtocolError),
        }
    }

    fn on_command(&mut self, command: ScsiCommand, bhs: &Bhs) -> Result<(), Ending> {
        let data_len = bhs.data_len();
        if self.session.check_cmd_sn(command.cmd_sn, command.immediate) == CmdSnCheck::Ignore {
            tracing::debug!(
                cmd_sn = command.cmd_sn,
                "command outside the CmdSN window ignored"
            );
            return Ok(self.reader.skip_data(data_len)?);
        }
        let itt = command.initiator_task_tag;
        if self.pending.contains_key(&itt) || self.session.is_executing(itt) {
            return self.reject(bhs, RejectReason::TaskInProgress);
        }
        let edtl = command.expected_data_transfer_length;
        if data_len > 0
            && (!command.write
                || !self.negotiated.immediate_data
                || data_len > edtl
                || data_len > self.negotiated.first_burst_length)
        {
            self.reader.skip_data(data_len)?;
            return self.violation(bhs, "immediate data the login did not allow".into());
        }
        let lun = decode_lun(command.lun);
        if !command.write {
            self.reader.skip_data(data_len)?;
            if !self.try_inline(&command, lun)? && !self.try_queued(&command, lun) {
                self.execute(&command, lun, None, None, 0);
            }
            return Ok(());
        }
        let scsi = self.session.scsi.as_ref().expect("normal session");
        let info = scsi.transfer_info(lun.unwrap_or(NO_SUCH_LUN), &command.cdb);
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
        let read = match &mut buf {
            Some(buf) => self.reader.read_data(&mut buf[..data_len as usize]),
            None => self.reader.skip_data(data_len),
        };
        match read {
            Ok(()) => {}
            Err(ReadError::DataDigest) => {
                // RFC 7143 §7.8: the command is rejected and dropped; the initiator
                // sends it again or recovers the session.
                return self.send_reject(bhs, RejectReason::DataDigestError);
            }
            Err(e) => return Err(e.into()),
        }
        let unsolicited_open = !command.final_bit;
        let task = PendingWrite {
            lun,
            early,
            received: data_len,
            want,
            unsolicited_open,
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
        self.pending_bytes += task.buf.as_ref().map_or(0, |b| b.len());
        self.pending.insert(itt, task);
        self.advance(itt)
    }

    /// Sends the R2Ts a command may have outstanding, or runs it once all its data
    /// is in.
    fn advance(&mut self, itt: u32) -> Result<(), Ending> {
        let max_outstanding = self.negotiated.max_outstanding_r2t.max(1) as usize;
        let max_burst = self.negotiated.max_burst_length.max(512);
        let mut r2ts = Vec::new();
        let Some(task) = self.pending.get(&itt) else {
            return Ok(());
        };
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
        let mut pdus = Vec::with_capacity(r2ts.len());
        let mut opened = Vec::with_capacity(r2ts.len());
        for &(offset, len, r2t_sn) in &r2ts {
            let ttt = self.new_ttt();
            opened.push(OpenR2t {
                target_transfer_tag: ttt,
                offset,
                len,
                next_offset: offset,
                next_data_sn: 0,
            });
            let task = &self.pending[&itt];
            pdus.push(
                Pdu::R2t(R2t {
                    lun: task.command.lun,
                    initiator_task_tag: itt,
                    target_transfer_tag: ttt,
                    r2t_sn,
                    buffer_offset: offset,
                    desired_data_transfer_length: len,
                    ..R2t::default()
                })
                .encode(0)
                .bhs,
            );
        }
        let task = self.pending.get_mut(&itt).expect("present");
        if let Some(last) = opened.last() {
            task.next_request = last.offset + last.len;
            task.next_r2t_sn += opened.len() as u32;
            task.r2ts.extend(opened);
        }
        if !pdus.is_empty() {
            let mut outgoing: Vec<Outgoing<'_>> = pdus
                .iter()
                .map(|bhs| Outgoing {
                    bhs: *bhs,
                    ahs: &[],
                    stat_sn: StatSn::Current,
                    data: &[],
                })
                .collect();
            self.session
                .writer
                .send_all(&mut outgoing, &*self.session)?;
        }
        if self.pending[&itt].complete() {
            let task = self.pending.remove(&itt).expect("present");
            self.pending_bytes -= task.buf.as_ref().map_or(0, |b| b.len());
            let data = task.buf.map(|buf| (buf, task.received));
            self.execute(&task.command, task.lun, data, task.early, task.next_r2t_sn);
        }
        Ok(())
    }

    fn on_data_out(&mut self, data: DataOut, bhs: &Bhs) -> Result<(), Ending> {
        let len = bhs.data_len();
        let itt = data.initiator_task_tag;
        let Some(task) = self.pending.get_mut(&itt) else {
            return self.reject(bhs, RejectReason::InvalidPduField);
        };
        let offset = data.buffer_offset;
        let end = offset.saturating_add(len);
        // Which sequence the PDU belongs to, and whether it is the one expected there.
        let (in_order, index) = if data.target_transfer_tag == RESERVED_TAG {
            if !task.unsolicited_open {
                return self.reject(bhs, RejectReason::ProtocolError);
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
                return self.reject(bhs, RejectReason::InvalidPduField);
            };
            let r2t = &task.r2ts[index];
            let ends_sequence = end == r2t.offset + r2t.len;
            let in_order = data.data_sn == r2t.next_data_sn
                && offset == r2t.next_offset
                && end <= r2t.offset + r2t.len
                && (!data.final_bit || ends_sequence);
            (in_order, Some(index))
        };
        // Read the data where it belongs; a data digest error leaves the stream
        // in step (the whole segment was read), so only the command suffers.
        let mut failure = (!in_order).then_some(DATA_PHASE_ERROR);
        let read = match &mut task.buf {
            Some(buf) if in_order => self
                .reader
                .read_data(&mut buf[offset as usize..end as usize]),
            _ => self.reader.skip_data(len),
        };
        match read {
            Ok(()) => {}
            Err(ReadError::DataDigest) => failure = Some(CRC_ERROR),
            Err(e) => return Err(e.into()),
        }
        if let Some(code) = failure {
            if code == CRC_ERROR {
                // RFC 7143 §7.8: a payload digest error is rejected and the PDU
                // dropped; at ErrorRecoveryLevel 0 its data cannot be asked for again.
                self.send_reject(bhs, RejectReason::DataDigestError)?;
            }
            let task = self.pending.get_mut(&itt).expect("present");
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
        let task = self.pending.get_mut(&itt).expect("present");
        if in_order {
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
        }
        close_sequence(task, index, data.final_bit);
        self.advance(itt)
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

/// Whether `lun`'s device has a request queue that wakes its owner, which
/// [`super::queued`] drives.
fn lun_queues(scsi: &blockwire_scsi::ScsiTarget, lun: u64) -> bool {
    scsi.lun(lun)
        .is_some_and(|unit| unit.device().info().queue_wakes)
}

impl Connection {
    /// Answers a small read from the device's cache on this thread: a hand-off to a
    /// worker costs more than the read. Large reads go to the pool, where several
    /// run at once and this thread keeps reading the network.
    fn try_inline(&self, command: &ScsiCommand, lun: Option<u64>) -> Result<bool, Ending> {
        if command.expected_data_transfer_length > INLINE_READ_MAX {
            return Ok(false);
        }
        let scsi = self.session.scsi.as_ref().expect("normal session");
        let Some(response) = scsi.try_execute_cached(
            lun.unwrap_or(NO_SUCH_LUN),
            &Command {
                nexus: &self.session.nexus,
                cdb: &command.cdb,
                data_out: &[],
            },
        ) else {
            return Ok(false);
        };
        let reply = Reply {
            initiator_task_tag: command.initiator_task_tag,
            lun_field: command.lun,
            expected_len: command.expected_data_transfer_length,
            reads: command.read,
            writes: command.write,
            r2t_count: 0,
            max_burst: self.negotiated.max_burst_length,
            response: &response,
        };
        send_reply(&self.session.writer, &*self.session, &reply)?;
        Ok(true)
    }

    /// Hands a READ to the device's request queue when its LUN's device has one
    /// that wakes us (see [`super::queued`]); false when it goes the usual way.
    fn try_queued(&self, command: &ScsiCommand, lun: Option<u64>) -> bool {
        let (Some(queued), Some(lun)) = (&self.queued, lun) else {
            return false;
        };
        let scsi = self.session.scsi.as_ref().expect("normal session");
        if !lun_queues(scsi, lun) {
            return false;
        }
        let plan = scsi.plan_read(
            lun,
            &Command {
                nexus: &self.session.nexus,
                cdb: &command.cdb,
                data_out: &[],
            },
        );
        let Some(read) = plan else {
            return false;
        };
        self.submit_queued(queued, command, lun, Work::Read(read), 0)
            .is_ok()
    }

    /// Hands a WRITE whose data-out has all arrived to the device's request queue,
    /// as [`try_queued`](Self::try_queued) does READs; gives the data back when it
    /// goes the usual way.
    fn try_queued_write(
        &self,
        command: &ScsiCommand,
        lun: Option<u64>,
        data: Option<(IoBuf, u32)>,
        r2t_count: u32,
    ) -> Result<(), Option<(IoBuf, u32)>> {
        let (Some(queued), Some(lun)) = (&self.queued, lun) else {
            return Err(data);
        };
        let Some((buf, received)) = data else {
            return Err(None);
        };
        let scsi = self.session.scsi.as_ref().expect("normal session");
        // Only a buffer holding exactly the data-out goes to the device as is.
        if !lun_queues(scsi, lun) || buf.len() != received as usize {
            return Err(Some((buf, received)));
        }
        let plan = scsi.plan_write(
            lun,
            &Command {
                nexus: &self.session.nexus,
                cdb: &command.cdb,
                data_out: &buf,
            },
        );
        let Some(write) = plan else {
            return Err(Some((buf, received)));
        };
        match self.submit_queued(queued, command, lun, Work::Write(write, buf), r2t_count) {
            Ok(()) => Ok(()),
            Err(job) => match job.work {
                // The queue thread is gone: the write's share of the lock goes
                // with its plan, and the command runs the usual way.
                Work::Write(_, buf) => Err(Some((buf, received))),
                Work::Read(_) => unreachable!("a write was submitted"),
            },
        }
    }

    /// Marks the command executing and hands it to the queue thread.
    fn submit_queued(
        &self,
        queued: &QueuedCommands,
        command: &ScsiCommand,
        lun: u64,
        work: Work,
        r2t_count: u32,
    ) -> Result<(), Box<QueuedJob>> {
        let itt = command.initiator_task_tag;
        self.session.start_executing(itt);
        let job = QueuedJob {
            lun,
            work,
            itt,
            lun_field: command.lun,
            expected_len: command.expected_data_transfer_length,
            max_burst: self.negotiated.max_burst_length,
            r2t_count,
        };
        queued.submit(job).inspect_err(|_| {
            self.session.finish_executing(itt);
        })
    }

    /// Runs a command and sends its answer: on this thread for a small write the
    /// device takes into its cache (a hand-off to a worker costs more than the
    /// write), on the worker pool otherwise.
    fn execute(
        &self,
        command: &ScsiCommand,
        lun: Option<u64>,
        data: Option<(IoBuf, u32)>,
        early: Option<Response>,
        r2t_count: u32,
    ) {
        let data = if early.is_none() && command.write {
            match self.try_queued_write(command, lun, data, r2t_count) {
                Ok(()) => return,
                Err(data) => data,
            }
        } else {
            data
        };
        let job = Job {
            session: self.session.clone(),
            itt: command.initiator_task_tag,
            cdb: command.cdb.clone(),
            lun,
            lun_field: command.lun,
            expected_len: command.expected_data_transfer_length,
            reads: command.read,
            writes: command.write,
            max_burst: self.negotiated.max_burst_length,
            data,
            early,
            r2t_count,
        };
        let scsi = self.session.scsi.as_ref().expect("normal session");
        let inline = job.early.is_none()
            && command.write
            && command.expected_data_transfer_length <= INLINE_WRITE_MAX
            && scsi.write_completes_inline(lun.unwrap_or(NO_SUCH_LUN), &command.cdb);
        if inline {
            job.run();
            return;
        }
        let session = self.session.clone();
        let itt = job.itt;
        session.start_executing(itt);
        self.shared.pool.submit(move || {
            job.run();
            session.finish_executing(itt);
        });
    }

    /// Drops the commands of `lun` (every LUN with None) still gathering data:
    /// aborted tasks get no response (RFC 7143 §4.2.3.3).
    fn drop_pending(&mut self, lun: Option<u64>) {
        let doomed: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, task)| lun.is_none() || task.lun == lun)
            .map(|(&itt, _)| itt)
            .collect();
        for itt in doomed {
            if let Some(task) = self.pending.remove(&itt) {
                self.pending_bytes -= task.buf.as_ref().map_or(0, |b| b.len());
            }
        }
    }

    fn on_task_management(&mut self, request: TaskMgmtRequest, bhs: &Bhs) -> Result<(), Ending> {
        self.reader.skip_data(bhs.data_len())?;
        if self.session.check_cmd_sn(request.cmd_sn, request.immediate) == CmdSnCheck::Ignore {
            return Ok(());
        }
        let scsi = self.session.scsi.clone().expect("normal session");
        let lun = decode_lun(request.lun);
        let lun_exists = lun.is_some_and(|lun| scsi.luns().contains(&lun));
        // Responses (§11.6.1): 0 complete, 1 no such task, 2 no such LUN,
        // 4 reassignment not supported, 5 function not supported.
        let response = match request.function {
            TaskFunction::AbortTask => {
                let itt = request.referenced_task_tag;
                if let Some(task) = self.pending.remove(&itt) {
                    self.pending_bytes -= task.buf.as_ref().map_or(0, |b| b.len());
                    0
                } else if self.session.is_executing(itt) {
                    // Already running on the device: it finishes and answers first,
                    // and then no longer exists.
                    self.session.wait_executing(Some(itt));
                    1
                } else {
                    1
                }
            }
            TaskFunction::AbortTaskSet | TaskFunction::ClearTaskSet if !lun_exists => 2,
            TaskFunction::AbortTaskSet | TaskFunction::ClearTaskSet => {
                self.drop_pending(lun);
                self.session.wait_executing(None);
                0
            }
            TaskFunction::LogicalUnitReset if !lun_exists => 2,
            TaskFunction::LogicalUnitReset => {
                self.drop_pending(lun);
                self.session.wait_executing(None);
                scsi.reset(
                    ResetKind::LogicalUnit(lun.expect("exists")),
                    &self.session.nexus,
                );
                0
            }
            TaskFunction::TargetWarmReset | TaskFunction::TargetColdReset => {
                self.drop_pending(None);
                self.session.wait_executing(None);
                let kind = if request.function == TaskFunction::TargetColdReset {
                    ResetKind::TargetCold
                } else {
                    ResetKind::TargetWarm
                };
                scsi.reset(kind, &self.session.nexus);
                0
            }
            TaskFunction::TaskReassign => 4,
            TaskFunction::ClearAca | TaskFunction::Other(_) => 5,
        };
        let pdu = Pdu::TaskMgmtResponse(TaskMgmtResponse {
            response,
            initiator_task_tag: request.initiator_task_tag,
            ..TaskMgmtResponse::default()
        });
        self.send(pdu, StatSn::Advance, &[])?;
        if request.function == TaskFunction::TargetColdReset && response == 0 {
            // A cold reset ends the connection after the response (§11.5.1).
            return Err(Ending::Closed);
        }
        Ok(())
    }

    fn on_nop_out(&mut self, nop: NopOut, bhs: &Bhs) -> Result<(), Ending> {
        let len = bhs.data_len();
        if nop.initiator_task_tag == RESERVED_TAG {
            // The answer to our ping; it carries no CmdSN of its own.
            self.reader.skip_data(len)?;
            if self
                .ping
                .is_some_and(|(ttt, _)| ttt == nop.target_transfer_tag)
            {
                self.ping = None;
            }
            return Ok(());
        }
        let Some(data) = self.read_payload(bhs)? else {
            return Ok(());
        };
        if self.session.check_cmd_sn(nop.cmd_sn, nop.immediate) == CmdSnCheck::Ignore {
            return Ok(());
        }
        let echo = &data[..data.len().min(self.session.writer.max_data() as usize)];
        let pdu = Pdu::NopIn(NopIn {
            lun: nop.lun,
            initiator_task_tag: nop.initiator_task_tag,
            target_transfer_tag: RESERVED_TAG,
            ..NopIn::default()
        });
        self.send(pdu, StatSn::Advance, echo)
    }

    fn on_text(&mut self, request: TextRequest, bhs: &Bhs) -> Result<(), Ending> {
        let Some(data) = self.read_payload(bhs)? else {
            return Ok(());
        };
        if self.session.check_cmd_sn(request.cmd_sn, request.immediate) == CmdSnCheck::Ignore {
            return Ok(());
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
                return self.send(reply(false, false, ttt), StatSn::Advance, &[]);
            }
            let text = std::mem::take(&mut self.text_in);
            match crate::login::answer_text(&self.login, &self.negotiated, &text) {
                Ok(answer) => answer,
                Err(_) => return self.send_reject(bhs, RejectReason::ProtocolError),
            }
        };
        let max = self.session.writer.max_data() as usize;
        if answer.len() > max {
            let ttt = self.new_ttt();
            let (now, rest) = answer.split_at(max);
            self.text_out = Some((ttt, rest.to_vec()));
            self.send(reply(false, true, ttt), StatSn::Advance, now)
        } else {
            self.send(reply(true, false, RESERVED_TAG), StatSn::Advance, &answer)
        }
    }

    fn on_logout(&mut self, request: LogoutRequest, bhs: &Bhs) -> Result<(), Ending> {
        self.reader.skip_data(bhs.data_len())?;
        if self.session.check_cmd_sn(request.cmd_sn, request.immediate) == CmdSnCheck::Ignore {
            return Ok(());
        }
        // Responses (§11.15.1): 0 closed, 1 CID not found, 2 recovery not supported.
        let response = match request.reason {
            LogoutReason::CloseSession => 0,
            LogoutReason::CloseConnection if request.cid == self.negotiated.cid => 0,
            LogoutReason::CloseConnection => 1,
            LogoutReason::RemoveConnectionForRecovery | LogoutReason::Other(_) => 2,
        };
        if response == 0 {
            // Everything accepted is answered before the logout is (§4.2.3.4).
            self.drop_pending(None);
            self.session.wait_executing(None);
        }
        let pdu = Pdu::LogoutResponse(LogoutResponse {
            response,
            initiator_task_tag: request.initiator_task_tag,
            time2wait: self.negotiated.default_time2wait,
            time2retain: self.negotiated.default_time2retain,
            ..LogoutResponse::default()
        });
        self.send(pdu, StatSn::Advance, &[])?;
        if response == 0 {
            Err(Ending::LoggedOut)
        } else {
            Ok(())
        }
    }
}
