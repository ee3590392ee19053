//! The initiator's [`RequestQueue`]: many commands in flight from one thread,
//! spread over the I/O queues, completions collected in any order. A command
//! whose connection is lost is sent again on the new association.
//!
//! Capsules submitted since the queue last sent are gathered per connection and
//! leave in one write when the queue's thread asks for completions, or once a
//! connection's gathered capsules reach [`SEND_COMMANDS`] or [`SEND_BYTES`]: one
//! system call (and one wake-up of the target) per burst, not per command.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Instant;

use blockwire_blockdev::{
    BlockDevice, Completion, Error, ErrorKind, IoBuf, Op, QueuedCommand, QueuedOp, RequestQueue,
    Submission,
};

use super::commands;
use super::connection::{Connection, Done, Lost, Payload, Sink};
use super::device::{disconnected, outcome, NvmeClient};
use super::session::Session;
use crate::sqe::Sqe;

/// Gathered capsules for one connection are sent once there are this many...
const SEND_COMMANDS: usize = 8;
/// ...or they take this many bytes (in-capsule write data included).
const SEND_BYTES: usize = 256 * 1024;

/// Capsules gathered for one connection and not sent yet.
struct Unsent {
    connection: Arc<Connection>,
    capsules: Vec<u8>,
    commands: usize,
}

/// What a command in flight was, so it can be sent again and reported.
struct Flight {
    sqe: Sqe,
    op: Op,
    offset: u64,
    len: u64,
    /// The data of a Dataset Management command (kept to send it again).
    dsm: Option<Vec<u8>>,
    session: Arc<Session>,
    /// When it was first sent: it is sent again only within the reconnect
    /// deadline from then.
    started: Instant,
}

/// A request queue over an [`NvmeClient`].
pub struct NvmeQueue<'a> {
    client: &'a NvmeClient,
    done_rx: Receiver<Done>,
    waker: Arc<Mutex<Option<Waker>>>,
    sink: Sink,
    flights: HashMap<u64, Flight>,
    ready: Vec<Completion>,
    unsent: Vec<Unsent>,
}

impl<'a> NvmeQueue<'a> {
    pub fn new(client: &'a NvmeClient) -> NvmeQueue<'a> {
        let (done_tx, done_rx) = mpsc::channel();
        let waker: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let tx = Mutex::new(done_tx);
        let wake = waker.clone();
        let sink: Sink = Arc::new(move |done: Done| {
            let _ = tx.lock().unwrap_or_else(|e| e.into_inner()).send(done);
            if let Some(w) = wake.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                w.wake_by_ref();
            }
        });
        NvmeQueue {
            client,
            done_rx,
            waker,
            sink,
            flights: HashMap::new(),
            ready: Vec::new(),
            unsent: Vec::new(),
        }
    }

    /// Sends a command on the current association.
    fn send(&mut self, tag: u64, mut flight: Flight, payload: Payload) {
        let session = self.client.current();
        let queue = session.pick().clone();
        flight.session = session;
        let sqe = flight.sqe;
        self.flights.insert(tag, flight);
        let at = match self
            .unsent
            .iter()
            .position(|u| Arc::ptr_eq(&u.connection, &queue))
        {
            Some(at) => at,
            None => {
                self.unsent.push(Unsent {
                    connection: queue,
                    capsules: Vec::new(),
                    commands: 0,
                });
                self.unsent.len() - 1
            }
        };
        let unsent = &mut self.unsent[at];
        unsent
            .connection
            .enqueue(sqe, payload, tag, self.sink.clone(), &mut unsent.capsules);
        unsent.commands += 1;
        if unsent.commands >= SEND_COMMANDS || unsent.capsules.len() >= SEND_BYTES {
            unsent.connection.send_capsules(&mut unsent.capsules);
            unsent.commands = 0;
        }
    }

    /// Sends every gathered capsule.
    fn send_unsent(&mut self) {
        for unsent in &mut self.unsent {
            unsent.connection.send_capsules(&mut unsent.capsules);
            unsent.commands = 0;
        }
        // A connection of an association that was replaced is let go.
        self.unsent.retain(|u| !u.connection.is_dead());
    }

    fn may_retry(&self, flight: &Flight) -> bool {
        self.client
            .options()
            .reconnect
            .is_some_and(|deadline| flight.started.elapsed() < deadline)
    }

    fn fail_now(&mut self, tag: u64, buf: IoBuf, error: Error) {
        self.ready.push(Completion {
            tag,
            buf,
            result: Err(error),
        });
    }

    /// Turns a finished command into a completion, or sends it again when its
    /// connection was lost and the association can be rebuilt.
    fn finish(&mut self, done: Done) {
        let Some(flight) = self.flights.remove(&done.tag) else {
            return;
        };
        let result = match done.result {
            Ok(cqe) => outcome(cqe, flight.op, flight.offset, flight.len),
            Err(Lost) if !self.may_retry(&flight) => {
                Err(disconnected(flight.op, flight.offset, flight.len)
                    .with_detail("connection lost; reconnecting is off or past its deadline"))
            }
            Err(Lost) => match self.client.recover(&flight.session) {
                Ok(_) => {
                    let payload = match &flight.dsm {
                        Some(data) => Payload::Owned(data.clone()),
                        None => done.payload,
                    };
                    self.send(done.tag, flight, payload);
                    return;
                }
                Err(detail) => {
                    Err(disconnected(flight.op, flight.offset, flight.len).with_detail(detail))
                }
            },
        };
        self.ready.push(Completion {
            tag: done.tag,
            buf: done.payload.into_iobuf(),
            result,
        });
    }
}

impl RequestQueue for NvmeQueue<'_> {
    fn submit(&mut self, submission: Submission) {
        let Submission {
            tag,
            op,
            mut buf,
            offset,
        } = submission;
        let client = self.client;
        let len = buf.len() as u64;
        let (kind, sqe) = match op {
            QueuedOp::Read => (Op::Read, None),
            QueuedOp::Write(flags) => (Op::Write, Some(flags)),
        };
        if let Err(e) = client.check(kind, offset, len) {
            return self.fail_now(tag, buf, e);
        }
        if buf.len() > client.max_transfer() || len == 0 {
            // Too big for one command: the synchronous path splits it.
            let result = match op {
                QueuedOp::Read => client.read_at(&mut buf, offset),
                QueuedOp::Write(flags) => client.write_at(&buf, offset, flags),
            };
            self.ready.push(Completion { tag, buf, result });
            return;
        }
        if kind == Op::Write && client.info().read_only {
            return self.fail_now(tag, buf, Error::new(ErrorKind::ReadOnly, kind, offset, len));
        }
        let bs = client.block_size();
        let (lba, blocks) = (offset / bs, (len / bs) as u32);
        let nsid = client.options().nsid;
        let sqe = match sqe {
            None => commands::read(nsid, lba, blocks),
            Some(flags) => commands::write(nsid, lba, blocks, flags.fua),
        };
        let flight = Flight {
            sqe,
            op: kind,
            offset,
            len,
            dsm: None,
            session: client.current(),
            started: Instant::now(),
        };
        self.send(tag, flight, Payload::Io(buf));
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        while let Ok(done) = self.done_rx.try_recv() {
            self.finish(done);
        }
        loop {
            // Nothing gathered may wait behind this thread's sleep (a command
            // sent again after a reconnect included).
            self.send_unsent();
            if self.ready.len() >= min || self.flights.is_empty() {
                break;
            }
            match self.done_rx.recv() {
                Ok(done) => self.finish(done),
                Err(_) => break,
            }
        }
        out.append(&mut self.ready);
    }

    fn in_flight(&self) -> usize {
        self.flights.len() + self.ready.len()
    }

    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        let client = self.client;
        let nsid = client.options().nsid;
        let bs = client.block_size();
        let (sqe, op, offset, len, dsm) = match command {
            QueuedCommand::Flush => (commands::flush(nsid), Op::Flush, 0, 0, None),
            QueuedCommand::Trim { offset, len, .. }
                if client.controller().supports_deallocate()
                    && client.check(Op::Trim, offset, len).is_ok()
                    && len > 0
                    && len / bs <= commands::DSM_MAX_BLOCKS =>
            {
                let (sqe, data) = commands::deallocate(nsid, &[(offset / bs, (len / bs) as u32)]);
                (sqe, Op::Trim, offset, len, Some(data))
            }
            QueuedCommand::WriteZeroes { offset, len, flags }
                if client.controller().supports_write_zeroes()
                    && !flags.fast
                    && client.check(Op::WriteZeroes, offset, len).is_ok()
                    && len > 0
                    && len / bs <= u64::from(commands::MAX_BLOCKS) =>
            {
                let sqe = commands::write_zeroes(
                    nsid,
                    offset / bs,
                    (len / bs) as u32,
                    flags.fua,
                    !flags.no_hole,
                );
                (sqe, Op::WriteZeroes, offset, len, None)
            }
            // Anything larger, misaligned or unsupported: the synchronous path
            // splits it or says why not.
            other => return Err(other),
        };
        let payload = match &dsm {
            Some(data) => Payload::Owned(data.clone()),
            None => Payload::None,
        };
        let flight = Flight {
            sqe,
            op,
            offset,
            len,
            dsm,
            session: client.current(),
            started: Instant::now(),
        };
        self.send(tag, flight, payload);
        Ok(())
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        *self.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker);
        true
    }
}

impl Drop for NvmeQueue<'_> {
    /// Waits for what is still in flight: its buffers belong to this queue.
    fn drop(&mut self) {
        let mut rest = Vec::new();
        let pending = self.flights.len();
        self.complete(pending, &mut rest);
    }
}
