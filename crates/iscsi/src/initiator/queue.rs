//! The initiator's request queue: one thread keeps many reads and writes in flight.
//! Each submission is registered on the least-loaded session and gathered with the
//! others submitted since the queue last sent: they leave in one vectored write when
//! the queue's thread asks for completions, or once a session's gathered commands
//! reach [`SEND_COMMANDS`] or [`SEND_BYTES`] (so large writes stream without
//! waiting). Sending waits only while the command window is full. The reader
//! threads hand completions back on a channel, with each request's buffer.

use std::sync::Arc;

use blockwire_blockdev::{Completion, Op, QueuedOp, RequestQueue, Submission};
use crossbeam_channel::{Receiver, Sender};

use super::connection::Pending;
use super::device::{io_cdb, IscsiClient};
use super::task::Task;

/// Gathered commands for one session are sent once there are this many...
const SEND_COMMANDS: usize = 8;
/// ...or they carry this many bytes of data-out.
const SEND_BYTES: usize = 256 * 1024;

/// A request queue on an [`IscsiClient`]'s sessions.
pub(crate) struct IscsiQueue<'a> {
    client: &'a IscsiClient,
    done_tx: Sender<Completion>,
    done_rx: Receiver<Completion>,
    in_flight: usize,
    /// Per session: registered commands not yet sent, and their data-out bytes.
    pending: Vec<(Vec<Pending>, usize)>,
}

impl<'a> IscsiQueue<'a> {
    pub fn new(client: &'a IscsiClient) -> IscsiQueue<'a> {
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        IscsiQueue {
            client,
            done_tx,
            done_rx,
            in_flight: 0,
            pending: (0..client.sessions()).map(|_| (Vec::new(), 0)).collect(),
        }
    }

    /// Sends every gathered command.
    fn send_all(&mut self) {
        for (index, (pending, bytes)) in self.pending.iter_mut().enumerate() {
            if !pending.is_empty() {
                self.client.session(index).send_pending(pending);
                *bytes = 0;
            }
        }
    }
}

impl Drop for IscsiQueue<'_> {
    fn drop(&mut self) {
        // Commands submitted and never waited for still reach the target.
        self.send_all();
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
        let index = self.client.pick_index();
        let session = self.client.session(index);
        let (pending, bytes) = &mut self.pending[index];
        session.enqueue(&cdb, task, pending);
        *bytes += pending.last().map_or(0, |p| p.write_len() as usize);
        if pending.len() >= SEND_COMMANDS || *bytes >= SEND_BYTES {
            session.send_pending(pending);
            *bytes = 0;
        }
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        // Nothing gathered may wait behind this thread's sleep.
        self.send_all();
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
