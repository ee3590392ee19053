//! The reader thread of a connection: reads what the target sends and acts on it
//! (RFC 7143 §11): Data-In straight into the caller's buffer, SCSI Responses and
//! phase-collapsed status completing tasks in any order, R2Ts answered with Data-Out
//! from the caller's buffer, NOP-In pings answered, Rejects failing their command,
//! logout requests honoured. It pings an idle connection, enforces the request
//! timeout, and when the transport breaks hands over to recovery.rs; when the
//! connection ends for good it fails every task still in flight.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::{Error, ErrorKind};

use super::connection::{lock, Closed, Shared, MAX_SENSE, PING_TAG};
use super::recovery::recover;
use super::session::{self, Outcome};
use super::task::{Gathered, Task};
use super::wire::{PduReader, WireError};
use crate::pdu::{
    AsyncMessage, DataIn, DataOut, NopIn, NopOut, Pdu, R2t, Reject, ScsiResponse, RESERVED_TAG,
};

/// Why reading ended.
pub(super) enum End {
    Wire(WireError),
    Violation(String),
    LoggedOut,
    /// Reconnecting failed, for this reason.
    GaveUp(String),
    /// A command waited longer than the request timeout.
    TimedOut(String),
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Wire(e) => write!(f, "{e}"),
            End::Violation(reason) | End::GaveUp(reason) | End::TimedOut(reason) => {
                f.write_str(reason)
            }
            End::LoggedOut => f.write_str("logged out"),
        }
    }
}

/// A command older than `limit` ends the connection with a timeout.
fn overdue(shared: &Shared, limit: Duration) -> Option<End> {
    let tasks = lock(&shared.tasks);
    let oldest = tasks.map.values().map(|task| task.age()).max()?;
    (oldest >= limit).then(|| {
        End::TimedOut(format!(
            "a command had no status for {oldest:.1?} (the limit is {limit:?}); connection closed"
        ))
    })
}

/// The reader thread.
pub(super) fn read_loop(shared: &Arc<Shared>, mut reader: PduReader) {
    let _fail_on_panic = FailOnPanic(shared);
    // Completions wait here while more PDUs sit read in the buffer.
    let mut gathered = Gathered::default();
    let end = loop {
        let mut heard = Instant::now();
        let mut pinged: Option<Instant> = None;
        let mut checked = Instant::now();
        let end = loop {
            if !reader.header_buffered() {
                // The next read may block: what is done goes now.
                gathered.flush();
            }
            match read_one(shared, &mut reader, &mut gathered) {
                Ok(()) => {
                    heard = Instant::now();
                    pinged = None;
                }
                Err(End::Wire(WireError::Idle)) => {
                    let interval = shared.nop_interval();
                    match pinged {
                        None if heard.elapsed() >= interval => {
                            ping(shared);
                            pinged = Some(Instant::now());
                        }
                        Some(at) if at.elapsed() >= interval => {
                            break End::Wire(WireError::Io(io::Error::new(
                                io::ErrorKind::TimedOut,
                                format!("no answer to a NOP-Out ping within {interval:?}"),
                            )))
                        }
                        _ => {}
                    }
                }
                Err(end) => break end,
            }
            if let Some(limit) = shared.timing.request_timeout {
                if checked.elapsed() >= shared.tick {
                    checked = Instant::now();
                    if let Some(end) = overdue(shared, limit) {
                        break end;
                    }
                }
            }
        };
        gathered.flush();
        // Only a broken transport is worth a reconnect: a target that breaks the
        // protocol or logs us out would do it again.
        let transport = matches!(end, End::Wire(_));
        let open = {
            let tasks = lock(&shared.tasks);
            tasks.closed.is_none() && !tasks.draining
        };
        if !(transport && open && shared.recovers()) {
            break end;
        }
        match recover(shared, &end) {
            Ok(fresh) => reader = fresh,
            Err(reason) => break End::GaveUp(reason),
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
        End::GaveUp(reason) => (ErrorKind::Disconnected, reason),
        End::TimedOut(reason) => (ErrorKind::TimedOut, reason),
    };
    let reason = format!("{}: {reason}", shared.name);
    if shared.close(kind, reason.clone()) && kind != ErrorKind::ShuttingDown {
        tracing::warn!("{reason}");
    }
    fail_everything(shared);
}

/// Fails every task still in flight with the reason the connection closed, and
/// lets a dropping connection know the reader is done.
fn fail_everything(shared: &Shared) {
    shared.shutdown();
    let (closed, pending) = {
        let mut tasks = lock(&shared.tasks);
        let closed = tasks.closed.clone().unwrap_or_else(|| Closed {
            kind: ErrorKind::Disconnected,
            reason: format!("{}: closed", shared.name),
        });
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

/// Fails everything in flight if the reader thread panics (a bug), so that no
/// caller waits for a status nobody will read.
struct FailOnPanic<'a>(&'a Shared);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let shared = self.0;
            shared.close(
                ErrorKind::Disconnected,
                format!("{}: the reader thread stopped", shared.name),
            );
            fail_everything(shared);
        }
    }
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
fn finish(
    shared: &Shared,
    task: Arc<Task>,
    result: Result<Outcome, Error>,
    gathered: &mut Gathered,
) {
    shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    task.complete_gathered(result, gathered);
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

/// Pings an idle connection (§11.18): a NOP-Out with a task tag, immediate, which
/// the target answers with a NOP-In.
fn ping(shared: &Shared) {
    let (cmd_sn, exp_stat_sn) = shared.sequence();
    let nop = NopOut {
        immediate: true,
        lun: 0,
        initiator_task_tag: PING_TAG,
        target_transfer_tag: RESERVED_TAG,
        cmd_sn,
        exp_stat_sn,
    };
    shared.send_immediate(Pdu::NopOut(nop), &[]);
}

/// Reads one PDU and acts on it.
fn read_one(shared: &Shared, reader: &mut PduReader, gathered: &mut Gathered) -> Result<(), End> {
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
            data_in_pdu(shared, reader, &data_in, data_len, gathered)?;
        }
        Pdu::ScsiResponse(response) => {
            status_sn = Some(response.stat_sn);
            let data = reader.read_data_vec(data_len).map_err(End::Wire)?;
            scsi_response(shared, &response, &data, gathered)?;
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
            rejected(shared, &reject, &data, gathered)?;
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
    // The waiter count is read under the window's lock, where waiters count
    // themselves in: no wake-up is lost.
    if window.update(exp_cmd_sn, max_cmd_sn) && shared.window_waiters.load(Ordering::Relaxed) > 0 {
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
    gathered: &mut Gathered,
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
        finish(shared, task, Ok(outcome), gathered);
    }
    Ok(())
}

/// SCSI Response (§11.4): status, sense, residuals.
fn scsi_response(
    shared: &Shared,
    response: &ScsiResponse,
    data: &[u8],
    gathered: &mut Gathered,
) -> Result<(), End> {
    let task = find(shared, response.initiator_task_tag, true)?;
    if response.response != 0 {
        let error = Error::new(ErrorKind::Io, task.op, task.offset, task.len).with_detail(format!(
            "{}: the target reports a target failure (iSCSI response {:#04x})",
            shared.name, response.response
        ));
        finish(shared, task, Err(error), gathered);
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
    finish(shared, task, Ok(outcome), gathered);
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
    shared.send_with(|link, batch| {
        let pieces = session::data_out_pieces(offset, len, link.params.target_max_recv);
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
            batch.push(&Pdu::DataOut(data_out).encode(piece), data, link.digests);
        }
    });
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
    // The echo must fit what the target takes in one PDU.
    let max = lock(&shared.writer).params.target_max_recv as usize;
    shared.send_immediate(Pdu::NopOut(answer), &data[..data.len().min(max)]);
}

/// Reject (§11.17): the data segment is the rejected PDU's header; the command it
/// belonged to fails. A Reject of anything else ends the connection.
fn rejected(
    shared: &Shared,
    reject: &Reject,
    data: &[u8],
    gathered: &mut Gathered,
) -> Result<(), End> {
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
            finish(shared, task, Err(error), gathered);
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
