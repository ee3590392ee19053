//! The request queue of a [`Metered`](crate::Metered) device: each queued request
//! is counted as the synchronous ones are, from its submission to its completion.

use std::collections::HashMap;
use std::task::Waker;
use std::time::Instant;

use crate::error::Op;
use crate::meter::IoMeter;
use crate::queue::{Completion, QueuedCommand, QueuedOp, RequestQueue, Submission};

/// A request in flight, by our own sequence number (submitters may reuse tags).
struct Started {
    tag: u64,
    op: Op,
    bytes: u64,
    at: Instant,
}

/// Counts what passes through `inner`.
pub(crate) struct MeteredQueue<'a, M> {
    inner: Box<dyn RequestQueue + 'a>,
    meter: &'a M,
    started: HashMap<u64, Started>,
    next: u64,
    done: Vec<Completion>,
}

impl<'a, M: IoMeter> MeteredQueue<'a, M> {
    pub(crate) fn new(inner: Box<dyn RequestQueue + 'a>, meter: &'a M) -> MeteredQueue<'a, M> {
        MeteredQueue {
            inner,
            meter,
            started: HashMap::new(),
            next: 0,
            done: Vec::new(),
        }
    }

    fn start(&mut self, tag: u64, op: Op, bytes: u64) -> u64 {
        let seq = self.next;
        self.next += 1;
        self.meter.started();
        let at = Instant::now();
        self.started.insert(seq, Started { tag, op, bytes, at });
        seq
    }
}

impl<M: IoMeter> RequestQueue for MeteredQueue<'_, M> {
    fn submit(&mut self, mut submission: Submission) {
        let op = match submission.op {
            QueuedOp::Read => Op::Read,
            QueuedOp::Write(_) => Op::Write,
        };
        let bytes = submission.buf.len() as u64;
        submission.tag = self.start(submission.tag, op, bytes);
        self.inner.submit(submission);
    }

    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        let op = match command {
            QueuedCommand::Flush => Op::Flush,
            QueuedCommand::Trim { .. } => Op::Trim,
            QueuedCommand::WriteZeroes { .. } => Op::WriteZeroes,
        };
        // Offered under the number it will have; its completion cannot come back
        // before the next `complete`, so counting it after it was taken is in time.
        self.inner.submit_command(self.next, command)?;
        // Counted as the synchronous methods count them: no bytes moved.
        self.start(tag, op, 0);
        Ok(())
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        self.inner.complete(min, &mut self.done);
        for mut completion in self.done.drain(..) {
            let Some(started) = self.started.remove(&completion.tag) else {
                continue;
            };
            let elapsed = started.at.elapsed();
            match &completion.result {
                Ok(()) => self
                    .meter
                    .finished(started.op, started.bytes, elapsed, None),
                Err(e) => self.meter.finished(started.op, 0, elapsed, Some(e.kind())),
            }
            completion.tag = started.tag;
            out.push(completion);
        }
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        self.inner.set_waker(waker)
    }
}
