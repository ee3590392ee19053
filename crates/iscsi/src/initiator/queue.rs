//! The initiator's request queue: one thread keeps many reads and writes in flight.
//! Each submission becomes a command on the least-loaded session at once (waiting
//! only while the command window is full); the reader threads hand completions back
//! on a channel, with each request's buffer.

use std::sync::Arc;

use blockwire_blockdev::{Completion, Op, QueuedOp, RequestQueue, Submission};
use crossbeam_channel::{Receiver, Sender};

use super::device::{io_cdb, IscsiClient};
use super::task::Task;

/// A request queue on an [`IscsiClient`]'s sessions.
pub(crate) struct IscsiQueue<'a> {
    client: &'a IscsiClient,
    done_tx: Sender<Completion>,
    done_rx: Receiver<Completion>,
    in_flight: usize,
}

impl<'a> IscsiQueue<'a> {
    pub fn new(client: &'a IscsiClient) -> IscsiQueue<'a> {
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        IscsiQueue {
            client,
            done_tx,
            done_rx,
            in_flight: 0,
        }
    }
}

impl RequestQueue for IscsiQueue<'_> {
    fn submit(&mut self, submission: Submission) {
        let Submission {
            tag,
            op,
            buf,
            offset,
        } = submission;
        self.in_flight += 1;
        let (write, dev_op) = match op {
            QueuedOp::Read => (None, Op::Read),
            QueuedOp::Write(flags) => (Some(flags), Op::Write),
        };
        if buf.is_empty() {
            let _ = self.done_tx.send(Completion {
                tag,
                buf,
                result: Ok(()),
            });
            return;
        }
        let cdb = match io_cdb(self.client, write, offset, buf.len() as u64) {
            Ok(cdb) => cdb,
            Err(error) => {
                let _ = self.done_tx.send(Completion {
                    tag,
                    buf,
                    result: Err(error),
                });
                return;
            }
        };
        let task = Arc::new(Task::queued(
            dev_op,
            offset,
            buf,
            write.is_some(),
            self.done_tx.clone(),
            tag,
        ));
        // A refused command completes through the channel too.
        self.client.pick().submit(&cdb, task);
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        let want = min.min(self.in_flight);
        let mut got = 0;
        while got < want {
            match self.done_rx.recv() {
                Ok(completion) => {
                    out.push(completion);
                    got += 1;
                }
                // Unreachable: this queue holds a sender.
                Err(_) => break,
            }
        }
        while let Ok(completion) = self.done_rx.try_recv() {
            out.push(completion);
            got += 1;
        }
        self.in_flight -= got;
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}
