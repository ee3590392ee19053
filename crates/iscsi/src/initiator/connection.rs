//! One logged-in connection in the full feature phase (RFC 7143 §4.2.2, §11): a
//! writer shared by every submitting thread and a reader thread that completes
//! commands in whatever order their status arrives.
//!
//! A caller registers its command (a [`Task`]) under a fresh initiator task tag,
//! waits — without holding the writer — until the command window has room, then
//! takes the next CmdSN and sends the command with its immediate and unsolicited
//! data in one vectored write while holding the writer lock, so CmdSN order is send
//! order. The reader thread puts Data-In straight into the caller's buffer, answers
//! R2Ts with Data-Out from the caller's buffer, answers the target's NOP-In pings,
//! and completes tasks. When the connection ends — the target closes it, a write
//! fails, a PDU breaks the protocol — every task still in flight fails with
//! [`ErrorKind::Disconnected`], and later commands fail at once the same way.
//!
//! An Asynchronous Message asking for a logout (§11.9.1, event 1) stops new
//! commands; once the last one in flight has finished, we log out.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Error, ErrorKind, Op};

use super::login::SessionParams;
use super::session::{self, Outcome, Window};
use super::task::Task;
use super::wire::{Batch, Digests, PduReader, WireError};
use crate::pdu::{
    AsyncMessage, DataIn, DataOut, LogoutReason, LogoutRequest, NopIn, NopOut, Pdu, R2t, Reject,
    ScsiCommand, ScsiResponse, TaskAttribute, RESERVED_TAG,
};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a dropped connection waits for the target's Logout Response.
const LOGOUT_WAIT: Duration = Duration::from_secs(2);
/// Longest sense data we keep (SPC-4 allows 252 bytes).
const MAX_SENSE: usize = 260;

/// Why a connection takes no more commands.
#[derive(Debug, Clone)]
pub(crate) struct Closed {
    pub kind: ErrorKind,
    pub reason: String,
}

impl Closed {
    pub fn error(&self, op: Op, offset: u64, len: u64) -> Error {
        Error::new(self.kind, op, offset, len).with_detail(self.reason.clone())
    }
}

/// Commands in flight.
#[derive(Default)]
struct Tasks {
    map: HashMap<u32, Arc<Task>>,
    next_itt: u32,
    closed: Option<Closed>,
    /// The target asked us to log out: no new commands.
    draining: bool,
    logout_sent: bool,
}

/// State shared by submitting threads and the reader thread.
pub(crate) struct Shared {
    pub params: SessionParams,
    digests: Digests,
    /// The LUN field of our commands (SAM-5 single-level addressing).
    lun_field: u64,
    writer: Mutex<TcpStream>,
    window: Mutex<Window>,
    window_moved: Condvar,
    tasks: Mutex<Tasks>,
    /// The reader thread has ended.
    ended: Mutex<bool>,
    ended_cv: Condvar,
    control: TcpStream,
    in_flight: AtomicUsize,
    /// "session N to ADDRESS", for messages.
    pub name: String,
}

impl Shared {
    /// Closes for new commands (first reason wins); returns whether this call did.
    fn close(&self, kind: ErrorKind, reason: String) -> bool {
        let mut tasks = lock(&self.tasks);
        let first = tasks.closed.is_none();
        if first {
            tasks.closed = Some(Closed { kind, reason });
        }
        drop(tasks);
        // Wake senders waiting for the window: they must see the end.
        let _guard = lock(&self.window);
        self.window_moved.notify_all();
        first
    }

    fn shutdown(&self) {
        let _ = self.control.shutdown(Shutdown::Both);
    }

    fn kill(&self, reason: String) {
        if self.close(ErrorKind::Disconnected, reason.clone()) {
            tracing::warn!("{reason}");
        }
        self.shutdown();
    }

    fn send(&self, batch: &Batch<'_>) {
        let sent = batch.send(&mut *lock(&self.writer));
        if let Err(e) = sent {
            self.kill(format!("{}: sending failed: {e}", self.name));
        }
    }

    /// A NOP-Out or Logout Request: immediate, carrying the current CmdSN without
    /// taking it (§3.2.2.1).
    fn send_immediate(&self, pdu: Pdu, data: &[u8]) {
        let header = pdu.encode(data.len() as u32);
        let mut batch = Batch::new();
        batch.push(&header, data, self.digests);
        self.send(&batch);
    }

    fn sequence(&self) -> (u32, u32) {
        let window = lock(&self.window);
        (window.cmd_sn, window.exp_stat_sn)
    }

    /// Sends a Logout Request closing the session (§11.14).
    fn logout(&self) {
        let (cmd_sn, exp_stat_sn) = self.sequence();
        let request = LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            initiator_task_tag: RESERVED_TAG - 1,
            cid: self.params.cid,
            cmd_sn,
            exp_stat_sn,
        };
        self.send_immediate(Pdu::LogoutRequest(request), &[]);
    }
}

/// One connection (our sessions have one each).
pub(crate) struct Connection {
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
}

/// A command to send.
pub(crate) struct Command<'a> {
    pub cdb: &'a [u8],
    pub op: Op,
    /// The byte range the command serves, for error messages.
    pub offset: u64,
    pub len: u64,
}

impl Connection {
    /// Starts the full feature phase on a logged-in socket.
    pub fn start(
        stream: TcpStream,
        params: SessionParams,
        lun: u64,
        name: String,
    ) -> io::Result<Connection> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(None)?;
        let digests = Digests {
            header: params.header_digest,
            data: params.data_digest,
        };
        let mut reader = PduReader::new(stream.try_clone()?, params.initiator_max_recv);
        reader.digests = digests;
        let shared = Arc::new(Shared {
            window: Mutex::new(Window::new(
                params.cmd_sn,
                params.exp_cmd_sn,
                params.max_cmd_sn,
                params.exp_stat_sn,
            )),
            params,
            digests,
            lun_field: crate::target::encode_lun(lun),
            control: stream.try_clone()?,
            writer: Mutex::new(stream),
            window_moved: Condvar::new(),
            tasks: Mutex::new(Tasks {
                next_itt: 1,
                ..Tasks::default()
            }),
            ended: Mutex::new(false),
            ended_cv: Condvar::new(),
            in_flight: AtomicUsize::new(0),
            name,
        });
        let reader = thread::Builder::new()
            .name("iscsi-initiator".into())
            .spawn({
                let shared = shared.clone();
                move || read_loop(&shared, reader)
            })?;
        Ok(Connection {
            shared,
            reader: Some(reader),
        })
    }

    pub fn params(&self) -> &SessionParams {
        &self.shared.params
    }

    /// Whether the connection still takes commands.
    pub fn alive(&self) -> bool {
        let tasks = lock(&self.shared.tasks);
        tasks.closed.is_none() && !tasks.draining
    }

    /// Commands in flight, for spreading load over sessions.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// Sends a command and waits for its status. Data-In lands in `read` (its
    /// length is the Expected Data Transfer Length); `write` is the data-out.
    pub fn execute(
        &self,
        command: &Command<'_>,
        read: Option<&mut [u8]>,
        write: Option<&[u8]>,
    ) -> Result<Outcome, Error> {
        self.execute_on(self.shared.lun_field, command, read, write)
    }

    /// [`execute`](Self::execute) for another logical unit than the session's
    /// (`lun_field` in SAM-5 form), as REPORT LUNS's answers are inquired.
    pub fn execute_on(
        &self,
        lun_field: u64,
        command: &Command<'_>,
        read: Option<&mut [u8]>,
        write: Option<&[u8]>,
    ) -> Result<Outcome, Error> {
        // `read` and `write` stay borrowed until this returns, after completion
        // (task.rs, ownership rule).
        let task = Arc::new(Task::new(
            command.op,
            command.offset,
            command.len,
            read,
            write,
        ));
        match self.register(&task) {
            Ok(itt) => self.send_command(itt, task.clone(), command.cdb, lun_field),
            Err(error) => task.complete(Err(error)),
        }
        task.wait()
    }

    fn register(&self, task: &Arc<Task>) -> Result<u32, Error> {
        let mut tasks = lock(&self.shared.tasks);
        if let Some(closed) = &tasks.closed {
            return Err(closed.error(task.op, task.offset, task.len));
        }
        if tasks.draining {
            return Err(
                Error::new(ErrorKind::ShuttingDown, task.op, task.offset, task.len).with_detail(
                    format!("{}: the target asked us to log out", self.shared.name),
                ),
            );
        }
        // A tag not in use and not the reserved one (§11.2.1.8).
        let mut itt = tasks.next_itt;
        while itt == RESERVED_TAG || itt == RESERVED_TAG - 1 || tasks.map.contains_key(&itt) {
            itt = itt.wrapping_add(1);
        }
        tasks.next_itt = itt.wrapping_add(1);
        tasks.map.insert(itt, task.clone());
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(itt)
    }

    /// Waits for the window, then sends the command and its unsolicited data.
    fn send_command(&self, itt: u32, task: Arc<Task>, cdb: &[u8], lun_field: u64) {
        let mut one = vec![Pending {
            itt,
            task,
            cdb: cdb.to_vec(),
            lun_field,
        }];
        self.send_pending(&mut one);
    }

    /// Registers a queued command and adds it to `pending` without sending it: a
    /// request queue sends what it gathered in one go ([`send_pending`]). A command
    /// the connection refuses completes at once with the reason.
    ///
    /// [`send_pending`]: Connection::send_pending
    pub fn enqueue(&self, cdb: &[u8], task: Arc<Task>, pending: &mut Vec<Pending>) {
        match self.register(&task) {
            Ok(itt) => pending.push(Pending {
                itt,
                task,
                cdb: cdb.to_vec(),
                lun_field: self.shared.lun_field,
            }),
            Err(error) => task.complete(Err(error)),
        }
    }

    /// Sends registered commands in order, as many per system call as the command
    /// window allows, waiting for the window when it is full; empties `pending`.
    /// CmdSNs are taken under the writer lock so that the wire carries them in
    /// order (§3.2.2.1: the target executes in CmdSN order, so a gap would stall it).
    pub fn send_pending(&self, pending: &mut Vec<Pending>) {
        let shared = &*self.shared;
        let mut next = 0;
        while next < pending.len() {
            // Wait for room without the writer: the reader thread may need it to
            // answer an R2T before the target opens the window again.
            {
                let mut window = lock(&shared.window);
                while !window.open() {
                    if lock(&shared.tasks).closed.is_some() {
                        // The reader fails these tasks with the others.
                        pending.clear();
                        return;
                    }
                    window = shared
                        .window_moved
                        .wait_timeout(window, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            let mut writer = lock(&shared.writer);
            let mut numbers = Vec::new();
            let exp_stat_sn = {
                let mut window = lock(&shared.window);
                while next + numbers.len() < pending.len() && window.open() {
                    numbers.push(window.take());
                }
                window.exp_stat_sn
            };
            let mut batch = Batch::new();
            for (command, &cmd_sn) in pending[next..].iter().zip(&numbers) {
                self.encode(command, cmd_sn, exp_stat_sn, &mut batch);
            }
            next += numbers.len();
            if let Err(e) = batch.send(&mut *writer) {
                drop(writer);
                shared.kill(format!("{}: sending commands failed: {e}", shared.name));
                break;
            }
        }
        pending.clear();
    }

    /// Adds a command PDU and its immediate and unsolicited data to `batch`.
    fn encode<'a>(
        &self,
        command: &'a Pending,
        cmd_sn: u32,
        exp_stat_sn: u32,
        batch: &mut Batch<'a>,
    ) {
        let shared = &*self.shared;
        let params = &shared.params;
        let task = &command.task;
        let write_len = task.write_len().unwrap_or(0);
        let read_len = task.read_len().unwrap_or(0);
        let unsolicited = session::unsolicited(
            write_len,
            params.immediate_data,
            params.initial_r2t,
            params.first_burst_length,
            params.target_max_recv,
        );
        let pdu = ScsiCommand {
            immediate: false,
            final_bit: unsolicited.data_out == 0,
            read: read_len > 0,
            write: write_len > 0,
            attribute: TaskAttribute::Simple,
            lun: command.lun_field,
            initiator_task_tag: command.itt,
            expected_data_transfer_length: read_len.max(write_len),
            cmd_sn,
            exp_stat_sn,
            cdb: command.cdb.clone(),
            bidi_read_length: None,
        };
        // SAFETY: the submitting thread reads its own task's data-out before
        // completion (task.rs, ownership rule); `command` keeps the task alive.
        let immediate = unsafe { task_write(task, 0, unsolicited.immediate) };
        let header = Pdu::ScsiCommand(pdu).encode(unsolicited.immediate);
        batch.push(&header, immediate, shared.digests);
        // Unsolicited Data-Out after the immediate data (§4.2.5.2), DataSN from 0.
        let pieces = session::data_out_pieces(
            unsolicited.immediate,
            unsolicited.data_out,
            params.target_max_recv,
        );
        for (data_sn, (offset, len, last)) in pieces.enumerate() {
            let data_out = DataOut {
                final_bit: last,
                lun: command.lun_field,
                initiator_task_tag: command.itt,
                target_transfer_tag: RESERVED_TAG,
                exp_stat_sn,
                data_sn: data_sn as u32,
                buffer_offset: offset,
            };
            // SAFETY: as above; the range lies within the write (session.rs).
            let data = unsafe { task_write(task, offset, len) };
            batch.push(&Pdu::DataOut(data_out).encode(len), data, shared.digests);
        }
    }
}

/// A registered command not yet sent.
pub(crate) struct Pending {
    itt: u32,
    task: Arc<Task>,
    cdb: Vec<u8>,
    lun_field: u64,
}

impl Pending {
    /// Data-out bytes the command carries.
    pub fn write_len(&self) -> u32 {
        self.task.write_len().unwrap_or(0)
    }
}

/// `len` bytes of `task`'s data-out at `offset` (empty for none).
///
/// # Safety
///
/// As [`Task::write_buf`].
unsafe fn task_write(task: &Task, offset: u32, len: u32) -> &[u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: forwarded to the caller.
    unsafe { task.write_buf(offset as usize, len as usize) }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // No caller can be waiting: they all borrow the device this belongs to.
        let shared = &self.shared;
        let polite = {
            let mut tasks = lock(&shared.tasks);
            let polite = tasks.closed.is_none() && !tasks.logout_sent;
            tasks.logout_sent = true;
            polite
        };
        if polite {
            shared.logout();
            let deadline = Instant::now() + LOGOUT_WAIT;
            let mut ended = lock(&shared.ended);
            while !*ended {
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    break;
                };
                ended = shared
                    .ended_cv
                    .wait_timeout(ended, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        shared.close(
            ErrorKind::Disconnected,
            format!("{}: closed by the initiator", shared.name),
        );
        shared.shutdown();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Why reading ended.
enum End {
    Wire(WireError),
    Violation(String),
    LoggedOut,
}

/// The reader thread.
fn read_loop(shared: &Shared, mut reader: PduReader) {
    let end = loop {
        if let Err(end) = read_one(shared, &mut reader) {
            break end;
        }
    };
    let (kind, reason) = match end {
        End::Wire(WireError::Closed) => (
            ErrorKind::Disconnected,
            "the target closed the connection".to_string(),
        ),
        End::Wire(WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => (
            ErrorKind::Disconnected,
            "the target closed the connection in the middle of a PDU".to_string(),
        ),
        End::Wire(e) => (ErrorKind::Disconnected, format!("connection failed: {e}")),
        End::Violation(reason) => (
            ErrorKind::Disconnected,
            format!("protocol error by the target: {reason}"),
        ),
        End::LoggedOut => (ErrorKind::ShuttingDown, "logged out".to_string()),
    };
    let reason = format!("{}: {reason}", shared.name);
    if shared.close(kind, reason.clone()) && kind != ErrorKind::ShuttingDown {
        tracing::warn!("{reason}");
    }
    shared.shutdown();
    let (closed, pending) = {
        let mut tasks = lock(&shared.tasks);
        let closed = tasks.closed.clone().expect("closed above");
        (
            closed,
            tasks.map.drain().map(|(_, t)| t).collect::<Vec<_>>(),
        )
    };
    for task in pending {
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        task.complete(Err(closed.error(task.op, task.offset, task.len)));
    }
    *lock(&shared.ended) = true;
    shared.ended_cv.notify_all();
}

/// The task `itt` names, taken out of the table when `finish`.
fn find(shared: &Shared, itt: u32, finish: bool) -> Result<Arc<Task>, End> {
    let mut tasks = lock(&shared.tasks);
    let task = if finish {
        tasks.map.remove(&itt)
    } else {
        tasks.map.get(&itt).cloned()
    };
    task.ok_or_else(|| End::Violation(format!("a PDU for task {itt:#x}, which is not in flight")))
}

/// Completes a task taken out of the table; logs out if the target asked and this
/// was the last one.
fn finish(shared: &Shared, task: Arc<Task>, result: Result<Outcome, Error>) {
    shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    task.complete(result);
    logout_if_drained(shared);
}

fn logout_if_drained(shared: &Shared) {
    let send = {
        let mut tasks = lock(&shared.tasks);
        let send = tasks.draining && tasks.map.is_empty() && !tasks.logout_sent;
        if send {
            tasks.logout_sent = true;
        }
        send
    };
    if send {
        tracing::info!("{}: logging out, as the target asked", shared.name);
        shared.logout();
    }
}

/// Reads one PDU and acts on it.
fn read_one(shared: &Shared, reader: &mut PduReader) -> Result<(), End> {
    let (bhs, ahs) = reader.read_header().map_err(End::Wire)?;
    let pdu = Pdu::decode(&bhs, &ahs).map_err(|e| End::Violation(format!("{e}")))?;
    let data_len = bhs.data_len();
    // Every target PDU carries ExpCmdSN and MaxCmdSN at these offsets (§11).
    let (exp_cmd_sn, max_cmd_sn) = (bhs.u32_at(28), bhs.u32_at(32));
    let mut status_sn = None;
    match pdu {
        Pdu::DataIn(data_in) => {
            if data_in.status.is_some() {
                status_sn = Some(data_in.stat_sn);
            }
            data_in_pdu(shared, reader, &data_in, data_len)?;
        }
        Pdu::ScsiResponse(response) => {
            status_sn = Some(response.stat_sn);
            let data = reader.read_data_vec(data_len).map_err(End::Wire)?;
            scsi_response(shared, &response, &data)?;
        }
        Pdu::R2t(r2t) => {
            skip(reader, data_len)?;
            r2t_pdu(shared, &r2t)?;
        }
        Pdu::NopIn(nop) => {
            if nop.initiator_task_tag != RESERVED_TAG {
                status_sn = Some(nop.stat_sn);
            }
            let data = reader.read_data_vec(data_len).map_err(End::Wire)?;
            nop_in(shared, &nop, &data);
        }
        Pdu::Reject(reject) => {
            status_sn = Some(reject.stat_sn);
            let data = reader.read_data_vec(data_len).map_err(End::Wire)?;
            rejected(shared, &reject, &data)?;
        }
        Pdu::AsyncMessage(message) => {
            status_sn = Some(message.stat_sn);
            skip(reader, data_len)?;
            async_message(shared, &message)?;
        }
        Pdu::LogoutResponse(_) => {
            skip(reader, data_len)?;
            return Err(End::LoggedOut);
        }
        Pdu::TextResponse(_) | Pdu::TaskMgmtResponse(_) => {
            // We send neither in the full feature phase; a stray one is harmless.
            skip(reader, data_len)?;
            tracing::debug!("{}: ignoring an unexpected {:?}", shared.name, bhs);
        }
        other => {
            return Err(End::Violation(format!(
                "a {} PDU in the full feature phase",
                pdu_name(&other)
            )))
        }
    }
    let mut window = lock(&shared.window);
    if let Some(stat_sn) = status_sn {
        window.status(stat_sn);
    }
    if window.update(exp_cmd_sn, max_cmd_sn) {
        shared.window_moved.notify_all();
    }
    Ok(())
}

fn pdu_name(pdu: &Pdu) -> &'static str {
    match pdu {
        Pdu::LoginResponse(_) => "Login Response",
        Pdu::NopOut(_)
        | Pdu::ScsiCommand(_)
        | Pdu::TaskMgmtRequest(_)
        | Pdu::LoginRequest(_)
        | Pdu::TextRequest(_)
        | Pdu::DataOut(_)
        | Pdu::LogoutRequest(_)
        | Pdu::Snack(_) => "initiator's",
        _ => "unexpected",
    }
}

fn skip(reader: &mut PduReader, len: u32) -> Result<(), End> {
    reader.read_data_vec(len).map(drop).map_err(End::Wire)
}

/// Data-In (§11.7): straight into the task's buffer; with S set it ends the task
/// (phase collapse, §11.7.3).
fn data_in_pdu(
    shared: &Shared,
    reader: &mut PduReader,
    data_in: &DataIn,
    len: u32,
) -> Result<(), End> {
    let itt = data_in.initiator_task_tag;
    let task = find(shared, itt, false)?;
    session::check_data_in(itt, data_in.buffer_offset, len, task.read_len())
        .map_err(|e| End::Violation(e.to_string()))?;
    // SAFETY: this is the reader thread and the task is not completed; the range
    // was checked just above.
    let buf = unsafe { task.read_buf(data_in.buffer_offset as usize, len as usize) };
    reader.read_data(buf).map_err(End::Wire)?;
    task.add_received(len);
    if let Some(status) = data_in.status {
        if !data_in.final_bit {
            return Err(End::Violation(format!(
                "Data-In with status but without F for task {itt:#x}"
            )));
        }
        let task = find(shared, itt, true)?;
        let outcome = Outcome {
            status,
            sense: Vec::new(),
            residual: data_in.residual,
            received: task.received(),
        };
        finish(shared, task, Ok(outcome));
    }
    Ok(())
}

/// SCSI Response (§11.4): status, sense, residuals.
fn scsi_response(shared: &Shared, response: &ScsiResponse, data: &[u8]) -> Result<(), End> {
    let task = find(shared, response.initiator_task_tag, true)?;
    if response.response != 0 {
        let error = Error::new(ErrorKind::Io, task.op, task.offset, task.len).with_detail(format!(
            "{}: the target reports a target failure (iSCSI response {:#04x})",
            shared.name, response.response
        ));
        finish(shared, task, Err(error));
        return Ok(());
    }
    // The data segment is SenseLength (2 bytes) then the sense data (§11.4.7).
    let sense = match data {
        [high, low, rest @ ..] => {
            let n = usize::from(u16::from_be_bytes([*high, *low]));
            rest[..n.min(rest.len())]
                .iter()
                .take(MAX_SENSE)
                .copied()
                .collect()
        }
        _ => Vec::new(),
    };
    let outcome = Outcome {
        status: response.status,
        sense,
        residual: response.residual,
        received: task.received(),
    };
    finish(shared, task, Ok(outcome));
    Ok(())
}

/// R2T (§11.8): Data-Out for the range asked, from the task's buffer.
fn r2t_pdu(shared: &Shared, r2t: &R2t) -> Result<(), End> {
    let itt = r2t.initiator_task_tag;
    let task = find(shared, itt, false)?;
    let (offset, len) = (r2t.buffer_offset, r2t.desired_data_transfer_length);
    session::check_r2t(itt, offset, len, task.write_len())
        .map_err(|e| End::Violation(e.to_string()))?;
    let exp_stat_sn = lock(&shared.window).exp_stat_sn;
    let mut batch = Batch::new();
    let pieces = session::data_out_pieces(offset, len, shared.params.target_max_recv);
    for (data_sn, (at, piece, last)) in pieces.enumerate() {
        let data_out = DataOut {
            final_bit: last,
            lun: shared.lun_field,
            initiator_task_tag: itt,
            target_transfer_tag: r2t.target_transfer_tag,
            exp_stat_sn,
            // DataSN counts from 0 in each R2T's sequence (§11.7.5).
            data_sn: data_sn as u32,
            buffer_offset: at,
        };
        // SAFETY: the reader thread, before completion; the range was checked.
        let data = unsafe { task.write_buf(at as usize, piece as usize) };
        batch.push(&Pdu::DataOut(data_out).encode(piece), data, shared.digests);
    }
    shared.send(&batch);
    Ok(())
}

/// NOP-In (§11.19): a ping from the target (TTT set) is answered with a NOP-Out
/// echoing its tag and data (§11.18.3).
fn nop_in(shared: &Shared, nop: &NopIn, data: &[u8]) {
    if nop.target_transfer_tag == RESERVED_TAG {
        return;
    }
    let (cmd_sn, exp_stat_sn) = shared.sequence();
    let answer = NopOut {
        immediate: true,
        lun: nop.lun,
        initiator_task_tag: RESERVED_TAG,
        target_transfer_tag: nop.target_transfer_tag,
        cmd_sn,
        exp_stat_sn,
    };
    shared.send_immediate(Pdu::NopOut(answer), data);
}

/// Reject (§11.17): the data segment is the rejected PDU's header; the command it
/// belonged to fails. A Reject of anything else ends the connection.
fn rejected(shared: &Shared, reject: &Reject, data: &[u8]) -> Result<(), End> {
    let reason = format!(
        "the target rejected a PDU (reason {:#04x})",
        reject.reason.code()
    );
    let Some(itt) = data
        .get(16..20)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    else {
        return Err(End::Violation(reason));
    };
    let task = lock(&shared.tasks).map.remove(&itt);
    match task {
        Some(task) => {
            let error = Error::new(ErrorKind::Io, task.op, task.offset, task.len)
                .with_detail(format!("{}: {reason}", shared.name));
            finish(shared, task, Err(error));
            Ok(())
        }
        None => Err(End::Violation(format!("{reason} for no command in flight"))),
    }
}

/// Asynchronous Message (§11.9).
fn async_message(shared: &Shared, message: &AsyncMessage) -> Result<(), End> {
    match message.event {
        AsyncMessage::REQUEST_LOGOUT => {
            tracing::info!(
                "{}: the target asks us to log out within {} s",
                shared.name,
                message.parameter3
            );
            lock(&shared.tasks).draining = true;
            logout_if_drained(shared);
        }
        // The target will drop the connection or session (events 2, 3); the end
        // of the stream fails what is in flight.
        2 | 3 => tracing::info!("{}: the target is dropping the connection", shared.name),
        other => tracing::debug!("{}: asynchronous event {other} ignored", shared.name),
    }
    Ok(())
}
