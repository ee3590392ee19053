//! Requests to a device with its own request queue (an RBD image): the connection
//! thread hands reads, writes, flushes, trims and write-zeroes to one queue thread
//! per connection, which submits them without waiting and sends each reply when
//! its completion comes back, out of order. One connection so keeps many requests
//! in flight in the device without a blocked thread per request.
//!
//! Only a queue that can wake its owner ([`RequestQueue::set_waker`]) is driven so;
//! every other device keeps the inline and worker paths of [`super::connection`].

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};

use blockwire_blockdev::channel_waker::ChannelWaker;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

use blockwire_blockdev::{
    Completion, IoBuf, QueuedCommand, QueuedOp, RequestQueue, Submission, WriteFlags,
};

use super::session::{Job, Reply, Session};
use super::writer::{ReplySink, ReplyWriter};

/// Requests one connection may have in its queue at once (as on the workers).
const MAX_QUEUED: usize = 128;
/// Bytes of payloads and read buffers one connection may have in its queue, so a
/// client sending large writes cannot make the server hold more than this.
const MAX_QUEUED_BYTES: usize = 64 << 20;
/// How often the queue thread collects without being woken: a queue hands back a
/// request it gave up on (past its deadline) without waking anyone.
const COLLECT_INTERVAL: Duration = Duration::from_millis(500);

enum Message {
    Job(Job),
    /// A completion is ready to collect.
    Wake,
    /// No more jobs come: stop once every one was answered.
    Stop,
}

/// Requests and bytes a connection has in its queue, bounded.
#[derive(Default)]
struct Budget {
    /// Requests and bytes.
    used: Mutex<(usize, usize)>,
    changed: Condvar,
}

impl Budget {
    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, usize)> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes room for a request of `bytes`, waiting while the queue is full (one
    /// request of any size always fits in an empty queue).
    fn acquire(&self, bytes: usize) {
        let mut used = self.lock();
        while used.0 >= MAX_QUEUED || (used.1 > 0 && used.1 + bytes > MAX_QUEUED_BYTES) {
            used = self.changed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        used.0 += 1;
        used.1 += bytes;
    }

    /// Gives back the room of `requests` requests holding `bytes` in all.
    fn release(&self, requests: usize, bytes: usize) {
        let mut used = self.lock();
        used.0 -= requests;
        used.1 -= bytes;
        self.changed.notify_all();
    }

    fn is_full(&self) -> bool {
        let used = self.lock();
        used.0 >= MAX_QUEUED || used.1 >= MAX_QUEUED_BYTES
    }

    fn wait_idle(&self) {
        let mut used = self.lock();
        while used.0 > 0 {
            used = self.changed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The bytes a job holds while queued: its payload or its read buffer.
fn job_bytes(job: &Job) -> usize {
    match job {
        Job::Read { len, .. } => *len as usize,
        Job::Write { data, .. } => data.len(),
        _ => 0,
    }
}

/// The queue path of one connection.
pub(super) struct QueuedPath {
    to: Sender<Message>,
    budget: Arc<Budget>,
    thread: Option<JoinHandle<()>>,
}

impl QueuedPath {
    /// Starts the queue thread when the session's device offers a queue that can
    /// wake its owner; `None` otherwise.
    pub(super) fn start<W>(
        session: &Arc<Session>,
        writer: &Arc<ReplyWriter<W>>,
    ) -> Option<QueuedPath>
    where
        W: ReplySink + Send + 'static,
    {
        // Only a queue that wakes its owner; asked without making one (an NBD
        // initiator's queue takes over its connections' replies while it lives).
        if !session.device().info().queue_wakes {
            return None;
        }
        let (to, from) = mpsc::channel();
        let (ready_to, ready) = mpsc::channel();
        let budget = Arc::new(Budget::default());
        let waker = Arc::new(ChannelWaker::new(to.clone(), || Message::Wake));
        let (session, writer, counted) = (session.clone(), writer.clone(), budget.clone());
        let thread = std::thread::Builder::new()
            .name("nbd-queue".into())
            .spawn(move || {
                let Some(mut queue) = session.device().queue() else {
                    let _ = ready_to.send(false);
                    return;
                };
                let wakes = queue.set_waker(Waker::from(waker.clone()));
                let _ = ready_to.send(wakes);
                if wakes {
                    let mut driver = Driver {
                        session: &session,
                        queue: &mut *queue,
                        jobs: HashMap::new(),
                        next_tag: 0,
                    };
                    driver.run(&from, &waker, &writer, &counted);
                }
            })
            .ok()?;
        if ready.recv() != Ok(true) {
            let _ = thread.join();
            return None;
        }
        Some(QueuedPath {
            to,
            budget,
            thread: Some(thread),
        })
    }

    /// Hands a job to the queue; gives back those it does not take (block status,
    /// cache), which run as before.
    pub(super) fn submit(&self, job: Job) -> Result<(), Job> {
        match job {
            Job::Read { .. }
            | Job::Write { .. }
            | Job::Flush { .. }
            | Job::Trim { .. }
            | Job::WriteZeroes { .. } => {}
            other => return Err(other),
        }
        let bytes = job_bytes(&job);
        self.budget.acquire(bytes);
        if let Err(mpsc::SendError(Message::Job(job))) = self.to.send(Message::Job(job)) {
            // The queue thread is gone (it cannot start twice): run it as before.
            self.budget.release(1, bytes);
            return Err(job);
        }
        Ok(())
    }

    /// Whether submitting now would wait for a reply to leave first.
    pub(super) fn is_full(&self) -> bool {
        self.budget.is_full()
    }

    /// Waits until every job handed over has been answered, then stops the thread.
    pub(super) fn finish(self) {
        self.budget.wait_idle();
    }
}

impl Drop for QueuedPath {
    /// Stops the thread once what it has is answered (its waker keeps the channel
    /// open, so it is told rather than left to notice).
    fn drop(&mut self) {
        let _ = self.to.send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the queue thread remembers of a request in flight, by queue tag.
struct Queued {
    cookie: u64,
    offset: u64,
    read: bool,
    /// What it holds of the budget.
    bytes: usize,
}

/// What a job asks of the queue.
enum Work {
    Data(QueuedOp, IoBuf),
    Command(QueuedCommand),
}

/// Replies ready to send, and the budget their requests held.
#[derive(Default)]
struct Answered {
    replies: Vec<Reply>,
    bytes: usize,
}

struct Driver<'a> {
    session: &'a Session,
    queue: &'a mut dyn RequestQueue,
    jobs: HashMap<u64, Queued>,
    next_tag: u64,
}

impl Driver<'_> {
    fn run<W: ReplySink>(
        &mut self,
        from: &Receiver<Message>,
        waker: &ChannelWaker<Message>,
        writer: &ReplyWriter<W>,
        budget: &Arc<Budget>,
    ) {
        let mut done = Vec::new();
        let mut answered = Answered::default();
        let mut stopping = false;
        loop {
            let first = if self.queue.in_flight() > 0 {
                from.recv_timeout(COLLECT_INTERVAL)
            } else {
                from.recv().map_err(|_| RecvTimeoutError::Disconnected)
            };
            let mut next = match first {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // Everything already sent to us, then what is ready.
            while let Some(message) = next.take() {
                match message {
                    Message::Job(job) => self.submit(job, &mut answered),
                    Message::Wake => {}
                    Message::Stop => stopping = true,
                }
                next = from.try_recv().ok();
            }
            waker.collecting();
            self.queue.complete(0, &mut done);
            for completion in done.drain(..) {
                self.answer(completion, &mut answered);
            }
            if !answered.replies.is_empty() {
                // A failed send marks the writer broken; the connection thread
                // notices and ends, after every request here has been answered.
                // The budget comes back once the replies have left, so a client
                // that stops reading stops the connection reading its requests.
                let (requests, bytes) = (answered.replies.len(), answered.bytes);
                let budget = budget.clone();
                writer.send_then(
                    &mut answered.replies,
                    Box::new(move || budget.release(requests, bytes)),
                );
                answered.bytes = 0;
            }
            if stopping && self.queue.in_flight() == 0 {
                return;
            }
        }
    }

    /// Starts one job; one the queue cannot take is run here and answered at once.
    fn submit(&mut self, job: Job, answered: &mut Answered) {
        let bytes = job_bytes(&job);
        let (cookie, offset, work) = match job {
            Job::Read {
                cookie,
                offset,
                len,
            } => {
                let buf = IoBuf::new(len as usize);
                (cookie, offset, Work::Data(QueuedOp::Read, buf))
            }
            Job::Write {
                cookie,
                offset,
                data,
                fua,
            } => {
                let op = QueuedOp::Write(WriteFlags { fua });
                (cookie, offset, Work::Data(op, data))
            }
            Job::Flush { cookie, offset } => (cookie, offset, Work::Command(QueuedCommand::Flush)),
            Job::Trim {
                cookie,
                offset,
                len,
                fua,
            } => {
                let flags = WriteFlags { fua };
                let command = QueuedCommand::Trim { offset, len, flags };
                (cookie, offset, Work::Command(command))
            }
            Job::WriteZeroes {
                cookie,
                offset,
                len,
                flags,
            } => {
                let command = QueuedCommand::WriteZeroes { offset, len, flags };
                (cookie, offset, Work::Command(command))
            }
            other => {
                answered.replies.push(self.session.execute(other));
                return;
            }
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        let read = matches!(work, Work::Data(QueuedOp::Read, _));
        let queued = Queued {
            cookie,
            offset,
            read,
            bytes,
        };
        match work {
            Work::Data(op, buf) => {
                self.jobs.insert(tag, queued);
                self.queue.submit(Submission {
                    tag,
                    op,
                    buf,
                    offset,
                });
            }
            Work::Command(command) => match self.queue.submit_command(tag, command) {
                Ok(()) => {
                    self.jobs.insert(tag, queued);
                }
                Err(command) => {
                    // A queue without this command natively (the handle would
                    // emulate it): run it the synchronous way, here.
                    let job = synchronous(cookie, offset, command);
                    answered.replies.push(self.session.execute(job));
                }
            },
        }
    }

    fn answer(&mut self, completion: Completion, answered: &mut Answered) {
        let Some(job) = self.jobs.remove(&completion.tag) else {
            return;
        };
        let session = self.session;
        answered.replies.push(match completion.result {
            Ok(()) if job.read => session.read_reply(job.cookie, job.offset, completion.buf),
            Ok(()) => session.ok_reply(job.cookie, job.offset),
            Err(e) => session.device_error_reply(job.cookie, job.offset, &e),
        });
        answered.bytes += job.bytes;
    }
}

/// The job for a command a queue handed back.
fn synchronous(cookie: u64, offset: u64, command: QueuedCommand) -> Job {
    match command {
        QueuedCommand::Flush => Job::Flush { cookie, offset },
        QueuedCommand::Trim { len, flags, .. } => Job::Trim {
            cookie,
            offset,
            len,
            fua: flags.fua,
        },
        QueuedCommand::WriteZeroes { len, flags, .. } => Job::WriteZeroes {
            cookie,
            offset,
            len,
            flags,
        },
    }
}

#[cfg(test)]
#[path = "queued_tests.rs"]
mod tests;
