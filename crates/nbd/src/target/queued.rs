//! NBD's side of the engine's routes: what each [`Job`] is to the engine, and the
//! queue route's two ends for a device with its own request queue (an RBD image).
//! The engine's queue thread ([`QueueDriver`]) submits reads, writes, flushes, trims
//! and write-zeroes without waiting; here a job becomes queue work and a completion
//! becomes its reply, sent with the others of its collection in one write, out of
//! order. The routes themselves, and why each exists, are the engine's
//! ([`blockwire_engine`]).

use std::sync::Arc;

use blockwire_blockdev::{QueuedCommand, QueuedOp, WriteFlags};
use blockwire_engine::{Done, Outcome, QueueDriver, QueueLimits, QueueWork, Release, Request};

use super::session::{Job, Reply, Session};
use super::writer::{ReplySink, ReplyWriter};

/// What a queued job keeps for its reply.
pub(super) struct Pending {
    cookie: u64,
    offset: u64,
    read: bool,
    fua: bool,
}

/// A job as the engine sees it.
pub(super) fn request(job: &Job) -> Request {
    match job {
        Job::Read { len, .. } => Request::read(*len as usize),
        Job::Write { data, .. } => Request::write(data.len()),
        Job::Flush { .. } => Request::flush(),
        Job::Trim { .. } => Request::trim(),
        Job::WriteZeroes { .. } => Request::write_zeroes(),
        Job::Cache { .. } | Job::BlockStatus { .. } => Request::other(),
    }
}

/// Starts the queue thread when the session's device offers a queue that wakes its
/// owner; its replies go to `writer`. `None` otherwise.
pub(super) fn start<W>(
    session: &Arc<Session>,
    writer: &Arc<ReplyWriter<W>>,
) -> Option<QueueDriver<Pending>>
where
    W: ReplySink + Send + 'static,
{
    let devices = vec![(0, session.device().clone())];
    let (session, writer) = (session.clone(), writer.clone());
    let mut replies: Vec<Reply> = Vec::new();
    let sink = move |done: &mut Vec<Done<Pending>>, release: Release| {
        for Done {
            pending, outcome, ..
        } in done.drain(..)
        {
            replies.push(answer(&session, pending, outcome));
        }
        // A failed send marks the writer broken; the connection thread notices and
        // ends, after every request here has been answered. The budget comes back
        // once the replies have left, so a client that stops reading stops the
        // connection reading its requests.
        writer.send_then(&mut replies, Box::new(move || drop(release)));
    };
    QueueDriver::start("nbd-queue", devices, QueueLimits::default(), sink)
}

/// A queueable job as queue work; hands back the others (block status, cache).
pub(super) fn split(job: Job) -> Result<(QueueWork, Pending), Job> {
    let pending = |cookie, offset, read, fua| Pending {
        cookie,
        offset,
        read,
        fua,
    };
    Ok(match job {
        Job::Read {
            cookie,
            offset,
            len,
        } => (
            QueueWork::read(offset, len as usize),
            pending(cookie, offset, true, false),
        ),
        Job::Write {
            cookie,
            offset,
            data,
            fua,
        } => {
            let op = QueuedOp::Write(WriteFlags { fua });
            let work = QueueWork::Data {
                op,
                buf: data,
                offset,
            };
            (work, pending(cookie, offset, false, fua))
        }
        Job::Flush { cookie, offset } => (
            QueueWork::Command(QueuedCommand::Flush),
            pending(cookie, offset, false, false),
        ),
        Job::Trim {
            cookie,
            offset,
            len,
            fua,
        } => {
            let flags = WriteFlags { fua };
            let command = QueuedCommand::Trim { offset, len, flags };
            (
                QueueWork::Command(command),
                pending(cookie, offset, false, fua),
            )
        }
        Job::WriteZeroes {
            cookie,
            offset,
            len,
            flags,
        } => {
            let command = QueuedCommand::WriteZeroes { offset, len, flags };
            (
                QueueWork::Command(command),
                pending(cookie, offset, false, flags.fua),
            )
        }
        other => return Err(other),
    })
}

/// The job again, for work the queue did not take (its thread has gone).
pub(super) fn rejoin(work: QueueWork, pending: Pending) -> Job {
    let Pending {
        cookie,
        offset,
        read,
        fua,
    } = pending;
    match work {
        QueueWork::Data { buf, .. } if read => Job::Read {
            cookie,
            offset,
            len: buf.len() as u32,
        },
        QueueWork::Data { buf, .. } => Job::Write {
            cookie,
            offset,
            data: buf,
            fua,
        },
        QueueWork::Command(command) => synchronous(cookie, offset, command),
    }
}

/// The reply to a finished queued job.
fn answer(session: &Session, pending: Pending, outcome: Outcome) -> Reply {
    let Pending {
        cookie,
        offset,
        read,
        ..
    } = pending;
    match outcome {
        Outcome::Completed {
            buf,
            result: Ok(()),
        } if read => session.read_reply(cookie, offset, buf),
        Outcome::Completed { result: Ok(()), .. } => session.ok_reply(cookie, offset),
        Outcome::Completed { result: Err(e), .. } => session.device_error_reply(cookie, offset, &e),
        // A queue without this command natively (the handle would emulate it): run
        // it the synchronous way, on the queue thread.
        Outcome::Refused(command) => session.execute(synchronous(cookie, offset, command)),
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
