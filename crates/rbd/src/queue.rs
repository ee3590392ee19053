//! A request queue over an image: submissions go straight to librbd
//! (`rbd_aio_read`/`rbd_aio_write`, FUA as write + flush) and the poller sends each
//! finished one back on the queue's own channel, so one thread keeps as many
//! requests in flight as it likes and no thread blocks per request.
//!
//! Like the synchronous path, the queue gives up on a request the cluster has not
//! answered by its deadline (the cluster timeout plus a grace): it hands back a
//! timed-out completion with a fresh buffer, since the request's own buffer stays
//! librbd's until librbd lets go of it; the late answer is then dropped.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Completion, IoBuf, Op, QueuedOp, RequestQueue, Submission};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::ffi::AioKind;
use crate::poller::{overdue, Pending, Reply, Request, Shared};

/// A request in flight, by our own sequence number (submitters may reuse tags).
struct Outstanding {
    tag: u64,
    op: Op,
    offset: u64,
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
        }
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
                gone.len as u64,
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
        let len = buf.len();
        let (kind, op, then_flush) = match op {
            QueuedOp::Read => (AioKind::Read { offset }, Op::Read, false),
            QueuedOp::Write(flags) => (AioKind::Write { offset }, Op::Write, flags.fua),
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
                len,
            },
        );
        if let Some(deadline) = deadline {
            self.deadlines.insert(seq, deadline);
        }
        let pending = Pending {
            op,
            offset,
            len: len as u64,
            then_flush,
            reply: Reply::Queued {
                tag: seq,
                to: self.to.clone(),
            },
        };
        self.shared.submit(Box::new(Request {
            kind,
            buf: Some(buf),
            state: pending,
        }));
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
