//! A request queue over an image: submissions go straight to librbd
//! (`rbd_aio_read`/`rbd_aio_write`, FUA as write + flush; flush, trim and
//! write-zeroes as `rbd_aio_flush`, `rbd_aio_discard`, `rbd_aio_write_zeroes`) and
//! the poller sends each finished one back on the queue's own channel, waking the
//! queue's owner when it asked to be (a target thread that also waits for requests),
//! so one thread keeps as many requests in flight as it likes and no thread blocks
//! per request.
//!
//! Like the synchronous path, the queue gives up on a request the cluster has not
//! answered by its deadline (the cluster timeout plus a grace): it hands back a
//! timed-out completion with a fresh buffer, since the request's own buffer stays
//! librbd's until librbd lets go of it; the late answer is then dropped.

use std::collections::{BTreeMap, HashMap};
use std::task::Waker;
use std::time::{Duration, Instant};

use blockwire_blockdev::{
    Completion, IoBuf, Op, QueuedCommand, QueuedOp, RequestQueue, Submission,
};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::ffi::AioKind;
use crate::poller::{overdue, Pending, Reply, Request, Shared};

/// A request in flight, by our own sequence number (submitters may reuse tags).
struct Outstanding {
    tag: u64,
    op: Op,
    offset: u64,
    /// The range's length, for errors.
    span: u64,
    /// The buffer's length (0 for a command), for the one handed back on expiry.
    len: usize,
}

/// A queue owned by one thread; see [`RequestQueue`].
pub struct RbdQueue<'a> {
    shared: &'a Shared,
    to: Sender<Completion>,
    done: Receiver<Completion>,
    /// How long a request may go unanswered; `None`: as long as librbd takes.
    limit: Option<Duration>,
    next: u64,
    outstanding: HashMap<u64, Outstanding>,
    /// Deadlines in submission order (equal limits make that deadline order).
    deadlines: BTreeMap<u64, Instant>,
    /// Woken by the poller when a completion is on the channel.
    waker: Option<Waker>,
}

impl<'a> RbdQueue<'a> {
    pub(crate) fn new(shared: &'a Shared, limit: Option<Duration>) -> RbdQueue<'a> {
        let (to, done) = crossbeam_channel::unbounded();
        RbdQueue {
            shared,
            to,
            done,
            limit,
            next: 0,
            outstanding: HashMap::new(),
            deadlines: BTreeMap::new(),
            waker: None,
        }
    }

    /// Starts one librbd request; `buf` is its data (none for a command).
    fn start(&mut self, tag: u64, kind: AioKind, op: Op, buf: Option<IoBuf>, then_flush: bool) {
        let (offset, len) = match kind {
            AioKind::Read { offset } | AioKind::Write { offset } => {
                (offset, buf.as_ref().map_or(0, |b| b.len()) as u64)
            }
            AioKind::Discard { offset, len } | AioKind::WriteZeroes { offset, len } => {
                (offset, len)
            }
            AioKind::Flush => (0, 0),
        };
        let seq = self.next;
        self.next += 1;
        let deadline = self.limit.map(|limit| Instant::now() + limit);
        self.outstanding.insert(
            seq,
            Outstanding {
                tag,
                op,
                offset,
                span: len,
                len: buf.as_ref().map_or(0, |b| b.len()),
            },
        );
        if let Some(deadline) = deadline {
            self.deadlines.insert(seq, deadline);
        }
        let pending = Pending {
            op,
            offset,
            len,
            then_flush,
            reply: Reply::Queued {
                tag: seq,
                to: self.to.clone(),
                wake: self.waker.clone(),
            },
        };
        self.shared.submit(Box::new(Request {
            kind,
            buf,
            state: pending,
        }));
    }

    /// Turns an answer from the poller back into the submitter's completion;
    /// `None` for the late answer of a request we gave up on.
    fn answered(&mut self, mut completion: Completion) -> Option<Completion> {
        let outstanding = self.outstanding.remove(&completion.tag)?;
        self.deadlines.remove(&completion.tag);
        completion.tag = outstanding.tag;
        Some(completion)
    }

    /// Gives up on the oldest request if its deadline passed.
    fn expire(&mut self, now: Instant) -> Option<Completion> {
        let (&seq, &deadline) = self.deadlines.first_key_value()?;
        if deadline > now {
            return None;
        }
        self.deadlines.remove(&seq);
        let gone = self.outstanding.remove(&seq)?;
        let secs = self.limit.unwrap_or_default().as_secs_f64();
        Some(Completion {
            tag: gone.tag,
            buf: IoBuf::new(gone.len),
            result: Err(overdue(
                gone.op,
                gone.offset,
                gone.span,
                &self.shared.name,
                secs,
            )),
        })
    }

    /// Waits for the next completion (an answer or an expiry).
    fn next_completion(&mut self, block: bool) -> Option<Completion> {
        loop {
            if let Some(expired) = self.expire(Instant::now()) {
                return Some(expired);
            }
            let received = match (block, self.deadlines.first_key_value()) {
                (false, _) => self.done.try_recv().map_err(|_| RecvTimeoutError::Timeout),
                (true, Some((_, &deadline))) => self
                    .done
                    .recv_timeout(deadline.saturating_duration_since(Instant::now())),
                (true, None) => self.done.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(answer) => {
                    if let Some(completion) = self.answered(answer) {
                        return Some(completion);
                    }
                }
                Err(RecvTimeoutError::Timeout) if block => continue,
                Err(_) => return None,
            }
        }
    }
}

impl RequestQueue for RbdQueue<'_> {
    fn submit(&mut self, submission: Submission) {
        let Submission {
            tag,
            op,
            buf,
            offset,
        } = submission;
        let (kind, op, then_flush) = match op {
            QueuedOp::Read => (AioKind::Read { offset }, Op::Read, false),
            QueuedOp::Write(flags) => (AioKind::Write { offset }, Op::Write, flags.fua),
        };
        self.start(tag, kind, op, Some(buf), then_flush);
    }

    /// Flush is `rbd_aio_flush`, trim `rbd_aio_discard`, write-zeroes
    /// `rbd_aio_write_zeroes`; FUA adds a flush once they finished, as for writes.
    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        let (kind, op, then_flush) = match command {
            QueuedCommand::Flush => (AioKind::Flush, Op::Flush, false),
            QueuedCommand::Trim { offset, len, flags } => {
                (AioKind::Discard { offset, len }, Op::Trim, flags.fua)
            }
            QueuedCommand::WriteZeroes { offset, len, flags } => (
                AioKind::WriteZeroes { offset, len },
                Op::WriteZeroes,
                flags.fua,
            ),
        };
        self.start(tag, kind, op, None, then_flush);
        Ok(())
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        self.waker = Some(waker);
        true
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        let want = min.min(self.outstanding.len());
        let mut got = 0;
        while got < want {
            match self.next_completion(true) {
                Some(completion) => {
                    out.push(completion);
                    got += 1;
                }
                None => break,
            }
        }
        while let Some(completion) = self.next_completion(false) {
            out.push(completion);
        }
    }

    fn in_flight(&self) -> usize {
        self.outstanding.len()
    }
}
