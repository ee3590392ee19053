//! Where a command the full feature phase hands over runs, decided by the one
//! request engine ([`blockwire_engine`]): READs and WRITEs to a device with its own
//! request queue (an RBD image) go to the connection's queue thread; a READ the
//! device's cache holds and a WRITE it takes into its cache run on the connection's
//! own thread, unless the engine's measurements say a large one is better offloaded;
//! everything else, and whatever would wait for hardware, runs on a worker while the
//! connection thread keeps reading the network. A command answered before it reaches
//! the device (a broken data phase) is answered here at once.

use std::sync::Arc;

use blockwire_blockdev::{ErrorKind, IoBuf, QueuedOp};
use blockwire_engine::{
    Done, Engine, EngineConfig, Outcome, QueueDriver, QueueLimits, QueueWork, Release, Request,
    Route,
};
use blockwire_scsi::cdb::Cdb;
use blockwire_scsi::{Command, QueuedRead, QueuedWrite, Response, ScsiTarget};

use super::command::{send_reply, Reply};
use super::full_feature::{CommandJob, NO_SUCH_LUN};
use super::session::Session;
use super::Shared;

/// What a queued READ or WRITE keeps for its answer (its data is the device's).
pub(super) struct QueuedAnswer {
    plan: Plan,
    itt: u32,
    lun_field: u64,
    expected_len: u32,
    r2t_count: u32,
}

/// A planned READ, or a WRITE holding its share of the unit's write lock.
enum Plan {
    Read(QueuedRead),
    Write(QueuedWrite),
}

/// Runs the commands of one connection.
pub(super) struct Dispatcher {
    session: Arc<Session>,
    shared: Arc<Shared>,
    max_burst: u32,
    engine: Engine<QueuedAnswer>,
}

impl Dispatcher {
    /// The dispatcher of a session's connection; starts a queue thread when a LUN's
    /// device has a request queue that wakes its owner.
    pub(super) fn new(session: Arc<Session>, shared: Arc<Shared>, max_burst: u32) -> Dispatcher {
        let queue = session.scsi.as_ref().and_then(|scsi| {
            let devices = scsi
                .luns()
                .into_iter()
                .filter_map(|lun| Some((lun, scsi.lun(lun)?.device().clone())))
                .collect();
            let sink_session = session.clone();
            QueueDriver::start(
                "iscsi-queue",
                devices,
                QueueLimits::default(),
                move |done: &mut Vec<Done<QueuedAnswer>>, release: Release| {
                    answer_queued(&sink_session, done, max_burst);
                    // The budget comes back once the answers have left.
                    drop(release);
                },
            )
        });
        Dispatcher {
            session,
            shared,
            max_burst,
            engine: Engine::new(EngineConfig::default()).with_queue(queue),
        }
    }

    /// Runs a command and sends its answer (here, on the queue thread or on a
    /// worker); a send that fails ends the connection. `more_waiting` says whether
    /// the initiator has sent more behind it (asked only when the route depends
    /// on it).
    pub(super) fn run(&self, mut job: CommandJob, more_waiting: impl FnOnce() -> bool) {
        if let Some(response) = job.early.take() {
            // Answered before it reached the device: nothing to wait for.
            job.data = None;
            return answer(&self.session, &job, &response, self.max_burst);
        }
        let request = request_of(&job);
        let route = self.engine.route(request, more_waiting);
        // Boxed: the job travels by value through the inline attempt and back.
        let job = match route {
            Route::Queue => match self.try_queue(request, job) {
                None => return,
                Some(job) => Box::new(job),
            },
            Route::Inline | Route::Worker => Box::new(job),
        };
        let inline = match route {
            Route::Worker => Err(job),
            Route::Inline | Route::Queue => self.engine.inline(request, || self.try_inline(job)),
        };
        if let Err(job) = inline {
            self.offload(request, job);
        }
    }

    fn scsi(&self) -> &ScsiTarget {
        self.session.scsi.as_deref().expect("a normal session")
    }

    /// Runs a command on this thread when it will not wait for hardware: a READ
    /// the device's cache holds, a WRITE it takes into its cache. Gives it back
    /// otherwise.
    fn try_inline(&self, job: Box<CommandJob>) -> Result<(), Box<CommandJob>> {
        let scsi = self.scsi();
        let command = Command {
            nexus: &self.session.nexus,
            cdb: &job.cdb,
            data_out: data_out(&job),
        };
        let response = match job.decoded.cdb {
            Ok(Cdb::Read(_)) => scsi.try_execute_cached_decoded(&job.decoded, &command),
            Ok(Cdb::Write(_)) if scsi.write_completes_inline_decoded(&job.decoded) => {
                Some(scsi.execute_decoded(&job.decoded, &command))
            }
            _ => None,
        };
        match response {
            Some(response) => {
                answer(&self.session, &job, &response, self.max_burst);
                Ok(())
            }
            None => Err(job),
        }
    }

    /// Hands a command to a worker; it answers from there.
    fn offload(&self, request: Request, mut job: Box<CommandJob>) {
        let session = self.session.clone();
        let max_burst = self.max_burst;
        let itt = job.itt;
        session.start_executing(itt);
        self.engine
            .offload(&self.shared.pool, request, move |slot| {
                let response = slot.run(|| {
                    let scsi = session.scsi.as_ref().expect("a normal session");
                    scsi.execute_decoded(
                        &job.decoded,
                        &Command {
                            nexus: &session.nexus,
                            cdb: &job.cdb,
                            data_out: data_out(&job),
                        },
                    )
                });
                // The data-out buffer goes back before the answer leaves.
                job.data = None;
                answer(&session, &job, &response, max_burst);
                drop(slot);
                session.finish_executing(itt);
            });
    }

    /// Hands a READ or WRITE to the device's request queue; gives the job back
    /// when it goes another way (None: the queue took it).
    fn try_queue(&self, request: Request, mut job: CommandJob) -> Option<CommandJob> {
        let Some((work, plan)) = self.plan_queued(&mut job) else {
            return Some(job);
        };
        let pending = QueuedAnswer {
            plan,
            itt: job.itt,
            lun_field: job.lun_field,
            expected_len: job.expected_len,
            r2t_count: job.r2t_count,
        };
        self.session.start_executing(job.itt);
        match self.engine.submit(request, work, pending) {
            Ok(()) => None,
            Err((work, _pending)) => {
                // The queue thread is gone: the write's share of the lock goes with
                // its plan, and the command runs another way.
                self.session.finish_executing(job.itt);
                if let (QueueWork::Data { buf, .. }, true) = (work, job.writes) {
                    let received = buf.len() as u32;
                    job.data = Some((buf, received));
                }
                Some(job)
            }
        }
    }

    /// The device request of a READ or WRITE the queue may take as is: checked as
    /// execution would check it. None sends it the usual way (a WRITE keeps its
    /// data).
    fn plan_queued(&self, job: &mut CommandJob) -> Option<(QueueWork, Plan)> {
        let scsi = self.scsi();
        match job.decoded.cdb {
            Ok(Cdb::Read(_)) => {
                let command = Command {
                    nexus: &self.session.nexus,
                    cdb: &job.cdb,
                    data_out: &[],
                };
                let read = scsi.plan_read_decoded(&job.decoded, &command)?;
                Some((QueueWork::read(read.offset, read.len), Plan::Read(read)))
            }
            Ok(Cdb::Write(_)) => {
                // Only a buffer holding exactly the data-out goes to the device as is.
                let exact = job
                    .data
                    .as_ref()
                    .is_some_and(|(buf, received)| buf.len() == *received as usize);
                if !exact {
                    return None;
                }
                let (buf, received) = job.data.take()?;
                let command = Command {
                    nexus: &self.session.nexus,
                    cdb: &job.cdb,
                    data_out: &buf,
                };
                let Some(write) = scsi.plan_write_decoded(&job.decoded, &command) else {
                    job.data = Some((buf, received));
                    return None;
                };
                let work = QueueWork::Data {
                    op: QueuedOp::Write(write.flags),
                    buf,
                    offset: write.offset,
                };
                Some((work, Plan::Write(write)))
            }
            _ => None,
        }
    }
}

/// A command as the engine sees it: what it does, the bytes it moves, its LUN.
fn request_of(job: &CommandJob) -> Request {
    let len = job.decoded.transfer.len as usize;
    let request = match job.decoded.cdb {
        Ok(Cdb::Read(_)) => Request::read(len),
        Ok(Cdb::Write(_)) => Request::write(len),
        // SCSI's other commands (and its read-modify-write ones) are never queued
        // or measured.
        _ => Request::other(),
    };
    request.on(job.lun.unwrap_or(NO_SUCH_LUN))
}

/// The data-out that arrived for a command.
fn data_out(job: &CommandJob) -> &[u8] {
    match &job.data {
        Some((buf, received)) => &buf[..*received as usize],
        None => &[],
    }
}

/// Answers queued commands the device finished (on the queue thread).
fn answer_queued(session: &Session, done: &mut Vec<Done<QueuedAnswer>>, max_burst: u32) {
    let Some(scsi) = &session.scsi else {
        return;
    };
    for Done {
        key,
        pending,
        outcome,
    } in done.drain(..)
    {
        let (buf, result) = match outcome {
            Outcome::Completed { buf, result } => (buf, result),
            // Only reads and writes are queued, and every queue takes those.
            Outcome::Refused(_) => {
                let error = blockwire_blockdev::Error::new(
                    ErrorKind::Unsupported,
                    blockwire_blockdev::Op::Read,
                    0,
                    0,
                )
                .with_detail("the device's request queue refused the command");
                (IoBuf::new(0), Err(error))
            }
        };
        let (response, reads) = match pending.plan {
            Plan::Read(read) => (scsi.finish_read(key, &read, buf, result), true),
            // The write gives back its share of the write lock before its answer
            // leaves.
            Plan::Write(write) => (scsi.finish_write(key, write, result), false),
        };
        let reply = Reply {
            initiator_task_tag: pending.itt,
            lun_field: pending.lun_field,
            expected_len: pending.expected_len,
            reads,
            writes: !reads,
            r2t_count: pending.r2t_count,
            max_burst,
            response: &response,
        };
        if let Err(e) = send_reply(&session.writer, session, &reply) {
            tracing::debug!("cannot send a response: {e}");
            session.writer.shutdown();
        }
        session.finish_executing(pending.itt);
    }
}

/// Sends a command's answer; a send that fails ends the connection.
fn answer(session: &Session, job: &CommandJob, response: &Response, max_burst: u32) {
    let reply = Reply {
        initiator_task_tag: job.itt,
        lun_field: job.lun_field,
        expected_len: job.expected_len,
        reads: job.reads,
        writes: job.writes,
        r2t_count: job.r2t_count,
        max_burst,
        response,
    };
    if let Err(e) = send_reply(&session.writer, session, &reply) {
        tracing::debug!("cannot send a response: {e}");
        session.writer.shutdown();
    }
}
