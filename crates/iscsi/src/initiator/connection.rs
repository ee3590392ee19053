//! One logged-in connection in the full feature phase (RFC 7143 §4.2.2, §11): a
//! writer shared by every submitting thread and a reader thread that completes
//! commands in whatever order their status arrives.
//!
//! A caller registers its command (a [`Task`]) under a fresh initiator task tag,
//! waits — without holding the writer — until the command window has room, then
//! takes the next CmdSN and sends the command with its immediate and unsolicited
//! data in one vectored write while holding the writer lock, so CmdSN order is send
//! order. The reader thread (reader.rs) puts Data-In straight into the caller's
//! buffer, answers R2Ts with Data-Out from the caller's buffer, answers the target's
//! NOP-In pings, and completes tasks. When the transport breaks, recovery.rs
//! reconnects and replays; when the connection ends for good — reconnecting is off
//! or failed, a PDU breaks the protocol — every task still in flight fails with
//! [`ErrorKind::Disconnected`], and later commands fail at once the same way.
//!
//! This file holds the shared state and the sending side.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Error, ErrorKind, Op};

use super::login::SessionParams;
use super::recovery::Recovery;
use super::session::{self, Outcome, Window};
use super::task::Task;
use super::wire::{Batch, Digests, PduReader};
use crate::pdu::{
    DataOut, LogoutReason, LogoutRequest, Pdu, ScsiCommand, TaskAttribute, RESERVED_TAG,
};

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a dropped connection waits for the target's Logout Response.
const LOGOUT_WAIT: Duration = Duration::from_secs(2);
/// A connection silent this long gets a NOP-Out ping (§11.18: the initiator may
/// ping to check the connection); silent for another interval after it, it is dead.
pub const DEFAULT_NOP_INTERVAL: Duration = Duration::from_secs(10);
/// When the reader thread pings and gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// Silence before a NOP-Out ping; as long again without an answer ends the
    /// connection.
    pub nop_interval: Duration,
    /// A command without status this long fails, with every other on the
    /// connection, which closes (no reconnect: a unit that hangs would hang again).
    pub request_timeout: Option<Duration>,
}

impl Timing {
    /// How often the reader must wake to keep both promises.
    pub(super) fn tick(&self) -> Duration {
        let nop = self.nop_interval.max(Duration::from_millis(1));
        match self.request_timeout {
            Some(limit) => nop.min((limit / 4).max(Duration::from_millis(10))),
            None => nop,
        }
    }
}

/// The initiator task tag of our pings (never a command's: see `register`).
pub(super) const PING_TAG: u32 = RESERVED_TAG - 2;
/// Longest sense data we keep (SPC-4 allows 252 bytes).
pub(super) const MAX_SENSE: usize = 260;

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
pub(super) struct Tasks {
    pub map: HashMap<u32, Arc<Task>>,
    pub next_itt: u32,
    pub closed: Option<Closed>,
    /// The target asked us to log out: no new commands.
    pub draining: bool,
    pub logout_sent: bool,
}

/// The current socket's send side and what its login settled; replaced as a
/// whole by a reconnect.
pub(super) struct Link {
    pub stream: TcpStream,
    pub params: SessionParams,
    pub digests: Digests,
}

/// State shared by submitting threads and the reader thread.
pub(crate) struct Shared {
    /// The LUN field of our commands (SAM-5 single-level addressing).
    pub(super) lun_field: u64,
    pub(super) writer: Mutex<Link>,
    pub(super) window: Mutex<Window>,
    pub(super) window_moved: Condvar,
    /// Senders waiting on `window_moved`, counted under the window's lock: the
    /// reader notifies only when there is one (a notify is a system call, and
    /// nearly every PDU moves the window).
    pub(super) window_waiters: AtomicUsize,
    pub(super) tasks: Mutex<Tasks>,
    /// The reader thread has ended.
    pub(super) ended: Mutex<bool>,
    pub(super) ended_cv: Condvar,
    /// A handle to shut the socket down without waiting for the writer lock.
    pub(super) control: Mutex<TcpStream>,
    pub(super) in_flight: AtomicUsize,
    /// The connection dropped and a reconnect is under way: commands wait.
    pub(super) broken: AtomicBool,
    /// The initiator is closing the connection: no reconnecting.
    pub(super) dropping: AtomicBool,
    /// How to reconnect, when enabled.
    pub(super) recovery: Option<Recovery>,
    /// The logical unit's identity, checked after a reconnect.
    pub(super) identity: Mutex<Option<Vec<u8>>>,
    pub(super) timing: Timing,
    /// How often the reader thread wakes when nothing arrives: the socket's read
    /// timeout.
    pub(super) tick: Duration,
    /// "session N to ADDRESS", for messages.
    pub name: String,
}

impl Shared {
    /// Closes for new commands (first reason wins); returns whether this call did.
    pub(super) fn close(&self, kind: ErrorKind, reason: String) -> bool {
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

    pub(super) fn shutdown(&self) {
        let _ = lock(&self.control).shutdown(Shutdown::Both);
    }

    pub(super) fn nop_interval(&self) -> Duration {
        self.timing.nop_interval
    }

    /// Whether a dropped connection is to be reconnected.
    pub(super) fn recovers(&self) -> bool {
        self.recovery.is_some() && !self.dropping.load(Ordering::Acquire)
    }

    /// A send failed: the connection is over. With recovery the reader sees the
    /// end and reconnects; without, commands fail from now on.
    pub(super) fn kill(&self, reason: String) {
        if self.recovers() {
            tracing::debug!("{reason}");
        } else if self.close(ErrorKind::Disconnected, reason.clone()) {
            tracing::warn!("{reason}");
        }
        self.shutdown();
    }

    /// Sends a batch built from the current link's settings.
    pub(super) fn send_with<'a>(&self, build: impl FnOnce(&Link, &mut Batch<'a>)) {
        let mut link = lock(&self.writer);
        if self.broken.load(Ordering::Acquire) {
            // Whatever this answers belongs to the connection that broke.
            return;
        }
        let mut batch = Batch::new();
        build(&link, &mut batch);
        let sent = batch.send(&mut link.stream);
        drop(link);
        if let Err(e) = sent {
            self.kill(format!("{}: sending failed: {e}", self.name));
        }
    }

    /// A NOP-Out or Logout Request: immediate, carrying the current CmdSN without
    /// taking it (§3.2.2.1).
    pub(super) fn send_immediate(&self, pdu: Pdu, data: &[u8]) {
        let header = pdu.encode(data.len() as u32);
        self.send_with(|link, batch| batch.push(&header, data, link.digests));
    }

    pub(super) fn sequence(&self) -> (u32, u32) {
        let window = lock(&self.window);
        (window.cmd_sn, window.exp_stat_sn)
    }

    /// Sends a Logout Request closing the session (§11.14).
    pub(super) fn logout(&self) {
        let (cmd_sn, exp_stat_sn) = self.sequence();
        let cid = lock(&self.writer).params.cid;
        let request = LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            initiator_task_tag: RESERVED_TAG - 1,
            cid,
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
        recovery: Option<Recovery>,
        timing: Timing,
    ) -> io::Result<Connection> {
        let tick = timing.tick();
        // Set before the reader thread starts: a read under way keeps the timeout
        // it started with.
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(tick))?;
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
            lun_field: crate::target::encode_lun(lun),
            control: Mutex::new(stream.try_clone()?),
            writer: Mutex::new(Link {
                stream,
                params,
                digests,
            }),
            broken: AtomicBool::new(false),
            dropping: AtomicBool::new(false),
            recovery,
            identity: Mutex::new(None),
            timing,
            tick,
            window_moved: Condvar::new(),
            window_waiters: AtomicUsize::new(0),
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
                move || super::reader::read_loop(&shared, reader)
            })?;
        Ok(Connection {
            shared,
            reader: Some(reader),
        })
    }

    /// What the current login settled.
    pub fn params(&self) -> SessionParams {
        lock(&self.shared.writer).params.clone()
    }

    /// Records the logical unit's identity, which a reconnect must find again.
    pub fn set_identity(&self, identity: Vec<u8>) {
        *lock(&self.shared.identity) = Some(identity);
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
        task.set_command(command.cdb, lun_field);
        match self.register(&task) {
            Ok(itt) => self.shared.send_pending(&mut vec![Pending {
                itt,
                task: task.clone(),
            }]),
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
        while itt >= PING_TAG || tasks.map.contains_key(&itt) {
            itt = itt.wrapping_add(1);
        }
        tasks.next_itt = itt.wrapping_add(1);
        tasks.map.insert(itt, task.clone());
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(itt)
    }

    /// Registers a queued command and adds it to `pending` without sending it: a
    /// request queue sends what it gathered in one go ([`send_pending`]). A command
    /// the connection refuses completes at once with the reason.
    ///
    /// [`send_pending`]: Connection::send_pending
    pub fn enqueue(&self, cdb: &[u8], task: Arc<Task>, pending: &mut Vec<Pending>) {
        task.set_command(cdb, self.shared.lun_field);
        match self.register(&task) {
            Ok(itt) => pending.push(Pending { itt, task }),
            Err(error) => task.complete(Err(error)),
        }
    }

    /// Sends registered commands (see [`Shared::send_pending`]).
    pub fn send_pending(&self, pending: &mut Vec<Pending>) {
        self.shared.send_pending(pending);
    }
}

impl Shared {
    /// Sends registered commands in order, as many per system call as the command
    /// window allows, waiting for the window when it is full; empties `pending`.
    /// CmdSNs are taken under the writer lock so that the wire carries them in
    /// order (§3.2.2.1: the target executes in CmdSN order, so a gap would stall it).
    /// While a reconnect is under way nothing is sent: the replay sends it.
    pub(crate) fn send_pending(&self, pending: &mut Vec<Pending>) {
        let mut next = 0;
        while next < pending.len() {
            // Wait for room without the writer: the reader thread may need it to
            // answer an R2T before the target opens the window again.
            {
                let mut window = lock(&self.window);
                while !window.open() && !self.broken.load(Ordering::Acquire) {
                    if lock(&self.tasks).closed.is_some() {
                        // The reader fails these tasks with the others.
                        pending.clear();
                        return;
                    }
                    self.window_waiters.fetch_add(1, Ordering::Relaxed);
                    window = self
                        .window_moved
                        .wait_timeout(window, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    self.window_waiters.fetch_sub(1, Ordering::Relaxed);
                }
            }
            let mut link = lock(&self.writer);
            if self.broken.load(Ordering::Acquire) {
                // The commands are registered: the reconnect replays them.
                break;
            }
            let mut chosen = Vec::new();
            let exp_stat_sn = {
                let mut window = lock(&self.window);
                while next < pending.len() && window.open() {
                    let command = &pending[next];
                    next += 1;
                    // A replay may have sent it already.
                    if command.task.claim_send() {
                        chosen.push((command, window.take()));
                    }
                }
                window.exp_stat_sn
            };
            let mut batch = Batch::new();
            for &(command, cmd_sn) in &chosen {
                // A replay sends from buffers whose owners wait on other threads.
                command.task.lend();
                encode(&link, command, cmd_sn, exp_stat_sn, &mut batch);
            }
            let sent = batch.send(&mut link.stream);
            drop(batch);
            drop(link);
            for (command, _) in &chosen {
                command.task.unlend();
            }
            if let Err(e) = sent {
                self.kill(format!("{}: sending commands failed: {e}", self.name));
                break;
            }
        }
        pending.clear();
    }
}

/// Adds a command PDU and its immediate and unsolicited data to `batch`.
fn encode<'a>(
    link: &Link,
    command: &'a Pending,
    cmd_sn: u32,
    exp_stat_sn: u32,
    batch: &mut Batch<'a>,
) {
    let params = &link.params;
    let task = &command.task;
    let (cdb, lun_field) = task.command();
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
        lun: lun_field,
        initiator_task_tag: command.itt,
        expected_data_transfer_length: read_len.max(write_len),
        cmd_sn,
        exp_stat_sn,
        cdb: cdb.to_vec(),
        bidi_read_length: None,
    };
    // SAFETY: the submitting thread (or the replaying one) reads the task's
    // data-out before completion (task.rs, ownership rule); `command` keeps the
    // task alive.
    let immediate = unsafe { task_write(task, 0, unsolicited.immediate) };
    let header = Pdu::ScsiCommand(pdu).encode(unsolicited.immediate);
    batch.push(&header, immediate, link.digests);
    // Unsolicited Data-Out after the immediate data (§4.2.5.2), DataSN from 0.
    let pieces = session::data_out_pieces(
        unsolicited.immediate,
        unsolicited.data_out,
        params.target_max_recv,
    );
    for (data_sn, (offset, len, last)) in pieces.enumerate() {
        let data_out = DataOut {
            final_bit: last,
            lun: lun_field,
            initiator_task_tag: command.itt,
            target_transfer_tag: RESERVED_TAG,
            exp_stat_sn,
            data_sn: data_sn as u32,
            buffer_offset: offset,
        };
        // SAFETY: as above; the range lies within the write (session.rs).
        let data = unsafe { task_write(task, offset, len) };
        batch.push(&Pdu::DataOut(data_out).encode(len), data, link.digests);
    }
}

/// A registered command not yet sent.
pub(crate) struct Pending {
    pub(super) itt: u32,
    pub(super) task: Arc<Task>,
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
        shared.dropping.store(true, Ordering::Release);
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
