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
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Error, ErrorKind, Op};

use super::login::SessionParams;
use super::recovery::{self, Attempt, Recovery};
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
    fn tick(&self) -> Duration {
        let nop = self.nop_interval.max(Duration::from_millis(1));
        match self.request_timeout {
            Some(limit) => nop.min((limit / 4).max(Duration::from_millis(10))),
            None => nop,
        }
    }
}

/// The initiator task tag of our pings (never a command's: see `register`).
const PING_TAG: u32 = RESERVED_TAG - 2;
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

/// The current socket's send side and what its login settled; replaced as a
/// whole by a reconnect.
struct Link {
    stream: TcpStream,
    params: SessionParams,
    digests: Digests,
}

/// State shared by submitting threads and the reader thread.
pub(crate) struct Shared {
    /// The LUN field of our commands (SAM-5 single-level addressing).
    lun_field: u64,
    writer: Mutex<Link>,
    window: Mutex<Window>,
    window_moved: Condvar,
    tasks: Mutex<Tasks>,
    /// The reader thread has ended.
    ended: Mutex<bool>,
    ended_cv: Condvar,
    /// A handle to shut the socket down without waiting for the writer lock.
    control: Mutex<TcpStream>,
    in_flight: AtomicUsize,
    /// The connection dropped and a reconnect is under way: commands wait.
    broken: AtomicBool,
    /// The initiator is closing the connection: no reconnecting.
    dropping: AtomicBool,
    /// How to reconnect, when enabled.
    recovery: Option<Recovery>,
    /// The logical unit's identity, checked after a reconnect.
    identity: Mutex<Option<Vec<u8>>>,
    timing: Timing,
    /// How often the reader thread wakes when nothing arrives: the socket's read
    /// timeout.
    tick: Duration,
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
        let _ = lock(&self.control).shutdown(Shutdown::Both);
    }

    fn nop_interval(&self) -> Duration {
        self.timing.nop_interval
    }

    /// Whether a dropped connection is to be reconnected.
    fn recovers(&self) -> bool {
        self.recovery.is_some() && !self.dropping.load(Ordering::Acquire)
    }

    /// A send failed: the connection is over. With recovery the reader sees the
    /// end and reconnects; without, commands fail from now on.
    fn kill(&self, reason: String) {
        if self.recovers() {
            tracing::debug!("{reason}");
        } else if self.close(ErrorKind::Disconnected, reason.clone()) {
            tracing::warn!("{reason}");
        }
        self.shutdown();
    }

    /// Sends a batch built from the current link's settings.
    fn send_with<'a>(&self, build: impl FnOnce(&Link, &mut Batch<'a>)) {
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
    fn send_immediate(&self, pdu: Pdu, data: &[u8]) {
        let header = pdu.encode(data.len() as u32);
        self.send_with(|link, batch| batch.push(&header, data, link.digests));
    }

    fn sequence(&self) -> (u32, u32) {
        let window = lock(&self.window);
        (window.cmd_sn, window.exp_stat_sn)
    }

    /// Sends a Logout Request closing the session (§11.14).
    fn logout(&self) {
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
                    window = self
                        .window_moved
                        .wait_timeout(window, Duration::from_millis(100))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
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
                encode(&link, command, cmd_sn, exp_stat_sn, &mut batch);
            }
            let sent = batch.send(&mut link.stream);
            drop(link);
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
    itt: u32,
    task: Arc<Task>,
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

/// Why reading ended.
enum End {
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

/// Longest pause between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Reconnects after the connection dropped (recovery.rs), with backoff, for up to
/// the recovery limit; installs the new socket and replays every command without
/// status. Returns the new socket's reader.
fn recover(shared: &Arc<Shared>, end: &End) -> Result<PduReader, String> {
    let recovery = shared.recovery.as_ref().expect("recovery enabled");
    shared.broken.store(true, Ordering::Release);
    shared.shutdown();
    tracing::warn!(
        "{}: connection lost ({end}); reconnecting for up to {:?}",
        shared.name,
        recovery.limit
    );
    let expected = lock(&shared.identity).clone();
    let deadline = Instant::now() + recovery.limit;
    let mut delay = Duration::from_millis(50);
    let (stream, params) = loop {
        if shared.dropping.load(Ordering::Acquire) {
            return Err("closed by the initiator while reconnecting".into());
        }
        match recovery::attempt(recovery, expected.as_deref()) {
            Ok(fresh) => break fresh,
            Err(Attempt::Fatal(reason)) => return Err(reason),
            Err(Attempt::Retry(reason)) => {
                if Instant::now() + delay > deadline {
                    return Err(format!(
                        "the connection dropped ({end}) and reconnecting failed for {:?}: {reason}",
                        recovery.limit
                    ));
                }
                tracing::debug!("{}: reconnecting: {reason}", shared.name);
                thread::sleep(delay);
                delay = (delay * 2).min(MAX_BACKOFF);
            }
        }
    };
    let digests = Digests {
        header: params.header_digest,
        data: params.data_digest,
    };
    stream
        .set_read_timeout(Some(shared.tick))
        .map_err(|e| e.to_string())?;
    let control = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = PduReader::new(
        stream.try_clone().map_err(|e| e.to_string())?,
        params.initiator_max_recv,
    );
    reader.digests = digests;
    let replay: Vec<Pending> = {
        // Under the writer lock: no sender sends on the old link meanwhile, and
        // every command registered so far is either in the replay or sent by its
        // own thread after `broken` clears (each task is claimed once).
        let mut link = lock(&shared.writer);
        *lock(&shared.control) = control;
        *lock(&shared.window) = Window::new(
            params.cmd_sn,
            params.exp_cmd_sn,
            params.max_cmd_sn,
            params.exp_stat_sn,
        );
        *link = Link {
            stream,
            params,
            digests,
        };
        let tasks = lock(&shared.tasks);
        let mut replay: Vec<Pending> = tasks
            .map
            .iter()
            .map(|(&itt, task)| {
                task.reset_for_replay();
                Pending {
                    itt,
                    task: task.clone(),
                }
            })
            .collect();
        // Oldest first (tags count up from 1; a wrap merely reorders).
        replay.sort_by_key(|p| p.itt);
        shared.broken.store(false, Ordering::Release);
        replay
    };
    shared.window_moved.notify_all();
    tracing::info!(
        "{}: reconnected; re-sending {} command(s)",
        shared.name,
        replay.len()
    );
    if !replay.is_empty() {
        // Sent from another thread: this one must read the answers meanwhile, or a
        // large replay could fill both sockets and stall.
        let sender = shared.clone();
        let mut replay = replay;
        thread::Builder::new()
            .name("iscsi-replay".into())
            .spawn(move || sender.send_pending(&mut replay))
            .map_err(|e| format!("cannot start the replay: {e}"))?;
    }
    Ok(reader)
}

/// The reader thread.
fn read_loop(shared: &Arc<Shared>, mut reader: PduReader) {
    let end = loop {
        let mut heard = Instant::now();
        let mut pinged: Option<Instant> = None;
        let mut checked = Instant::now();
        let end = loop {
            match read_one(shared, &mut reader) {
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
