//! READs to a device with its own request queue (an RBD image): the connection
//! thread hands them to one queue thread per connection, which submits them
//! without waiting and sends each answer when its completion comes back, by task
//! tag. One connection so keeps many reads in flight in the device without a
//! blocked worker per command. Writes keep the worker path: the SCSI layer orders
//! them against partial-block and compare-and-write commands while they run.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};

use blockwire_blockdev::channel_waker::ChannelWaker;
use std::sync::Arc;
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

use blockwire_blockdev::{Completion, IoBuf, QueuedOp, RequestQueue, Submission};
use blockwire_scsi::QueuedRead;

use super::command::{send_reply, Reply};
use super::session::Session;

/// How often the queue thread collects without being woken: a queue hands back a
/// request it gave up on (past its deadline) without waking anyone.
const COLLECT_INTERVAL: Duration = Duration::from_millis(500);

/// One READ and what its answer needs.
pub(super) struct ReadJob {
    pub lun: u64,
    pub read: QueuedRead,
    pub itt: u32,
    pub lun_field: u64,
    pub expected_len: u32,
    pub max_burst: u32,
}

enum Message {
    Read(ReadJob),
    /// A completion is ready to collect.
    Wake,
    /// No more reads come; stop once every one was answered.
    Stop,
}

/// The queued reads of one connection; stopped (after its reads are answered)
/// when dropped.
pub(super) struct QueuedReads {
    to: Sender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl QueuedReads {
    /// Starts the queue thread when a LUN of the session has a device whose queue
    /// wakes its owner; `None` otherwise.
    pub(super) fn start(session: &Arc<Session>) -> Option<QueuedReads> {
        let scsi = session.scsi.as_ref()?;
        let queued: Vec<u64> = scsi
            .luns()
            .into_iter()
            .filter(|&lun| {
                scsi.lun(lun)
                    .is_some_and(|unit| unit.device().info().queue_wakes)
            })
            .collect();
        if queued.is_empty() {
            return None;
        }
        let (to, from) = mpsc::channel();
        let waker = Arc::new(ChannelWaker::new(to.clone(), || Message::Wake));
        let session = session.clone();
        let thread = std::thread::Builder::new()
            .name("iscsi-queue".into())
            .spawn(move || run(&session, &from, &waker))
            .ok()?;
        Some(QueuedReads {
            to,
            thread: Some(thread),
        })
    }

    /// Hands a read to the queue thread; gives it back if the thread is gone.
    pub(super) fn submit(&self, job: ReadJob) -> Result<(), ReadJob> {
        match self.to.send(Message::Read(job)) {
            Ok(()) => Ok(()),
            Err(mpsc::SendError(Message::Read(job))) => Err(job),
            Err(_) => unreachable!("a read was sent"),
        }
    }
}

impl Drop for QueuedReads {
    fn drop(&mut self) {
        let _ = self.to.send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(session: &Arc<Session>, from: &Receiver<Message>, waker: &Arc<ChannelWaker<Message>>) {
    let Some(scsi) = session.scsi.as_ref() else {
        return;
    };
    // One queue per LUN, made when its first read comes.
    let mut queues: HashMap<u64, Box<dyn RequestQueue + '_>> = HashMap::new();
    let mut jobs: HashMap<u64, ReadJob> = HashMap::new();
    let mut next_tag = 0u64;
    let mut done: Vec<Completion> = Vec::new();
    let mut stopping = false;
    loop {
        let busy = !jobs.is_empty();
        let first = if busy {
            from.recv_timeout(COLLECT_INTERVAL)
        } else {
            from.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        let mut next = match first {
            Ok(message) => Some(message),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        while let Some(message) = next.take() {
            match message {
                Message::Read(job) => {
                    let tag = next_tag;
                    next_tag += 1;
                    let queue = match queues.entry(job.lun) {
                        std::collections::hash_map::Entry::Occupied(queue) => queue.into_mut(),
                        std::collections::hash_map::Entry::Vacant(slot) => {
                            let queue = scsi.lun(job.lun).and_then(|unit| {
                                let mut queue = unit.device().queue()?;
                                queue.set_waker(Waker::from(waker.clone())).then_some(queue)
                            });
                            match queue {
                                Some(queue) => slot.insert(queue),
                                None => {
                                    // Chosen by the device's info, so not expected:
                                    // answer as a failed read rather than block here.
                                    let error = blockwire_blockdev::Error::new(
                                        blockwire_blockdev::ErrorKind::Unsupported,
                                        blockwire_blockdev::Op::Read,
                                        job.read.offset,
                                        job.read.len as u64,
                                    )
                                    .with_detail("the device's request queue is unavailable");
                                    answer(session, &job, IoBuf::new(0), Err(error));
                                    continue_next(&mut next, from);
                                    continue;
                                }
                            }
                        }
                    };
                    queue.submit(Submission {
                        tag,
                        op: QueuedOp::Read,
                        buf: IoBuf::new(job.read.len),
                        offset: job.read.offset,
                    });
                    jobs.insert(tag, job);
                }
                Message::Wake => {}
                Message::Stop => stopping = true,
            }
            continue_next(&mut next, from);
        }
        waker.collecting();
        for queue in queues.values_mut() {
            queue.complete(0, &mut done);
        }
        for completion in done.drain(..) {
            if let Some(job) = jobs.remove(&completion.tag) {
                answer(session, &job, completion.buf, completion.result);
            }
        }
        if stopping && jobs.is_empty() {
            return;
        }
    }
}

fn continue_next(next: &mut Option<Message>, from: &Receiver<Message>) {
    *next = from.try_recv().ok();
}

/// Sends a read's answer and marks its task done; a send that fails ends the
/// connection, as for the workers.
fn answer(session: &Session, job: &ReadJob, buf: IoBuf, result: blockwire_blockdev::Result<()>) {
    if let Some(scsi) = &session.scsi {
        let response = scsi.finish_read(job.lun, &job.read, buf, result);
        let reply = Reply {
            initiator_task_tag: job.itt,
            lun_field: job.lun_field,
            expected_len: job.expected_len,
            reads: true,
            writes: false,
            r2t_count: 0,
            max_burst: job.max_burst,
            response: &response,
        };
        if let Err(e) = send_reply(&session.writer, session, &reply) {
            tracing::debug!("cannot send a response: {e}");
            session.writer.shutdown();
        }
    }
    session.finish_executing(job.itt);
}
