//! READs and WRITEs to a device with its own request queue (an RBD image): the
//! connection thread hands them to one queue thread per connection, which submits
//! them without waiting and sends each answer when its completion comes back, by
//! task tag. One connection so keeps many commands in flight in the device without
//! a blocked worker per command. A queued WRITE holds its share of the logical
//! unit's write lock until answered, so COMPARE AND WRITE and the other
//! read-modify-write commands (which keep the worker path) still see every write
//! either wholly before them or wholly after.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};

use blockwire_blockdev::channel_waker::ChannelWaker;
use std::sync::Arc;
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

use blockwire_blockdev::{Completion, IoBuf, QueuedOp, RequestQueue, Submission};
use blockwire_scsi::{QueuedRead, QueuedWrite, Response};

use super::command::{send_reply, Reply};
use super::session::Session;

/// How often the queue thread collects without being woken: a queue hands back a
/// request it gave up on (past its deadline) without waking anyone.
const COLLECT_INTERVAL: Duration = Duration::from_millis(500);

/// What a queued command asks of the device.
pub(super) enum Work {
    Read(QueuedRead),
    /// The write and its data-out, exactly its length.
    Write(QueuedWrite, IoBuf),
}

/// What a command in flight keeps for its answer (its data is the device's).
enum Planned {
    Read(QueuedRead),
    Write(QueuedWrite),
}

/// One command for the queue and what its answer needs.
pub(super) struct QueuedJob {
    pub lun: u64,
    pub work: Work,
    pub itt: u32,
    pub lun_field: u64,
    pub expected_len: u32,
    pub max_burst: u32,
    /// R2Ts sent for a write, for its response's ExpDataSN.
    pub r2t_count: u32,
}

/// A job in flight: the job without its data.
struct InFlight {
    lun: u64,
    planned: Planned,
    itt: u32,
    lun_field: u64,
    expected_len: u32,
    max_burst: u32,
    r2t_count: u32,
}

enum Message {
    Job(QueuedJob),
    /// A completion is ready to collect.
    Wake,
    /// No more commands come; stop once every one was answered.
    Stop,
}

/// The queued commands of one connection; stopped (after they are answered)
/// when dropped.
pub(super) struct QueuedCommands {
    to: Sender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl QueuedCommands {
    /// Starts the queue thread when a LUN of the session has a device whose queue
    /// wakes its owner; `None` otherwise.
    pub(super) fn start(session: &Arc<Session>) -> Option<QueuedCommands> {
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
        Some(QueuedCommands {
            to,
            thread: Some(thread),
        })
    }

    /// Hands a command to the queue thread; gives it back if the thread is gone.
    pub(super) fn submit(&self, job: QueuedJob) -> Result<(), Box<QueuedJob>> {
        match self.to.send(Message::Job(job)) {
            Ok(()) => Ok(()),
            Err(mpsc::SendError(Message::Job(job))) => Err(Box::new(job)),
            Err(_) => unreachable!("a job was sent"),
        }
    }
}

impl Drop for QueuedCommands {
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
    // One queue per LUN, made when its first command comes.
    let mut queues: HashMap<u64, Box<dyn RequestQueue + '_>> = HashMap::new();
    let mut jobs: HashMap<u64, InFlight> = HashMap::new();
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
                Message::Job(job) => {
                    let queue = match queues.entry(job.lun) {
                        std::collections::hash_map::Entry::Occupied(queue) => {
                            Some(queue.into_mut())
                        }
                        std::collections::hash_map::Entry::Vacant(slot) => scsi
                            .lun(job.lun)
                            .and_then(|unit| {
                                let mut queue = unit.device().queue()?;
                                queue.set_waker(Waker::from(waker.clone())).then_some(queue)
                            })
                            .map(|queue| slot.insert(queue)),
                    };
                    let tag = next_tag;
                    next_tag += 1;
                    let (submission, in_flight) = split(job, tag);
                    match queue {
                        Some(queue) => {
                            queue.submit(submission);
                            jobs.insert(tag, in_flight);
                        }
                        None => {
                            // Chosen by the device's info, so not expected: answer
                            // as a failed command rather than block here.
                            let error = blockwire_blockdev::Error::new(
                                blockwire_blockdev::ErrorKind::Unsupported,
                                blockwire_blockdev::Op::Read,
                                submission.offset,
                                submission.buf.len() as u64,
                            )
                            .with_detail("the device's request queue is unavailable");
                            answer(session, in_flight, IoBuf::new(0), Err(error));
                        }
                    }
                }
                Message::Wake => {}
                Message::Stop => stopping = true,
            }
            next = from.try_recv().ok();
        }
        waker.collecting();
        for queue in queues.values_mut() {
            queue.complete(0, &mut done);
        }
        for completion in done.drain(..) {
            if let Some(job) = jobs.remove(&completion.tag) {
                answer(session, job, completion.buf, completion.result);
            }
        }
        if stopping && jobs.is_empty() {
            return;
        }
    }
}

/// A job as the device's submission and what stays here for its answer.
fn split(job: QueuedJob, tag: u64) -> (Submission, InFlight) {
    let (submission, planned) = match job.work {
        Work::Read(read) => (
            Submission {
                tag,
                op: QueuedOp::Read,
                buf: IoBuf::new(read.len),
                offset: read.offset,
            },
            Planned::Read(read),
        ),
        Work::Write(write, data) => (
            Submission {
                tag,
                op: QueuedOp::Write(write.flags),
                buf: data,
                offset: write.offset,
            },
            Planned::Write(write),
        ),
    };
    let in_flight = InFlight {
        lun: job.lun,
        planned,
        itt: job.itt,
        lun_field: job.lun_field,
        expected_len: job.expected_len,
        max_burst: job.max_burst,
        r2t_count: job.r2t_count,
    };
    (submission, in_flight)
}

/// Sends a command's answer and marks its task done; a send that fails ends the
/// connection, as for the workers. A write gives back its share of the write lock
/// before its answer leaves.
fn answer(session: &Session, job: InFlight, buf: IoBuf, result: blockwire_blockdev::Result<()>) {
    let Some(scsi) = &session.scsi else {
        session.finish_executing(job.itt);
        return;
    };
    let (response, reads): (Response, bool) = match job.planned {
        Planned::Read(read) => (scsi.finish_read(job.lun, &read, buf, result), true),
        Planned::Write(write) => (scsi.finish_write(job.lun, write, result), false),
    };
    let reply = Reply {
        initiator_task_tag: job.itt,
        lun_field: job.lun_field,
        expected_len: job.expected_len,
        reads,
        writes: !reads,
        r2t_count: job.r2t_count,
        max_burst: job.max_burst,
        response: &response,
    };
    if let Err(e) = send_reply(&session.writer, session, &reply) {
        tracing::debug!("cannot send a response: {e}");
        session.writer.shutdown();
    }
    session.finish_executing(job.itt);
}
