//! A request queue over an image: submissions go straight to librbd
//! (`rbd_aio_read`/`rbd_aio_write`, FUA as write + flush) and the poller sends each
//! finished one back on the queue's own channel, so one thread keeps as many
//! requests in flight as it likes and no thread blocks per request.

use blockwire_blockdev::{Completion, Op, QueuedOp, RequestQueue, Submission};
use crossbeam_channel::{Receiver, Sender};

use crate::ffi::AioKind;
use crate::poller::{Pending, Reply, Request, Shared};

/// A queue owned by one thread; see [`RequestQueue`].
pub struct RbdQueue<'a> {
    shared: &'a Shared,
    to: Sender<Completion>,
    done: Receiver<Completion>,
    in_flight: usize,
}

impl<'a> RbdQueue<'a> {
    pub(crate) fn new(shared: &'a Shared) -> RbdQueue<'a> {
        let (to, done) = crossbeam_channel::unbounded();
        RbdQueue {
            shared,
            to,
            done,
            in_flight: 0,
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
        let len = buf.len() as u64;
        let (kind, op, then_flush) = match op {
            QueuedOp::Read => (AioKind::Read { offset }, Op::Read, false),
            QueuedOp::Write(flags) => (AioKind::Write { offset }, Op::Write, flags.fua),
        };
        let pending = Pending {
            op,
            offset,
            len,
            then_flush,
            reply: Reply::Queued {
                tag,
                to: self.to.clone(),
            },
        };
        self.in_flight += 1;
        self.shared.submit(Box::new(Request {
            kind,
            buf: Some(buf),
            state: pending,
        }));
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        let want = min.min(self.in_flight);
        let mut got = 0;
        while got < want {
            match self.done.recv() {
                Ok(completion) => {
                    out.push(completion);
                    got += 1;
                }
                Err(_) => break,
            }
        }
        while let Ok(completion) = self.done.try_recv() {
            out.push(completion);
            got += 1;
        }
        self.in_flight -= got;
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}
