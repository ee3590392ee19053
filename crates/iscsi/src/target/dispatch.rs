//! Where a command the full feature phase hands over runs: a small cached READ or a
//! small WRITE the device takes into its cache on the connection's own thread (a
//! hand-off to a worker costs more than the command), a READ or WRITE to a device
//! with its own request queue on the queue thread ([`super::queued`]), everything
//! else on the worker pool, where several run at once while the connection thread
//! keeps reading the network.

use std::sync::Arc;

use blockwire_scsi::{Command, Response};

use super::command::{send_reply, Reply};
use super::full_feature::CommandJob;
use super::queued::{QueuedCommands, QueuedJob, Work};
use super::session::Session;
use super::Shared;

/// Reads up to this size are answered on the connection's thread when their data
/// is cached.
const INLINE_READ_MAX: u32 = 64 * 1024;

/// Writes up to this size that the device takes into its cache run on the
/// connection's thread.
const INLINE_WRITE_MAX: u32 = 64 * 1024;

/// Runs the commands of one connection.
pub(super) struct Dispatcher {
    session: Arc<Session>,
    shared: Arc<Shared>,
    max_burst: u32,
    /// READs and WRITEs to LUNs whose device has a request queue (an RBD image).
    queued: Option<QueuedCommands>,
}

impl Dispatcher {
    pub(super) fn new(session: Arc<Session>, shared: Arc<Shared>, max_burst: u32) -> Dispatcher {
        let queued = QueuedCommands::start(&session);
        Dispatcher {
            session,
            shared,
            max_burst,
            queued,
        }
    }

    /// Runs a command and sends its answer (here, on the queue thread or on a
    /// worker); a send that fails ends the connection.
    pub(super) fn run(&self, job: CommandJob) {
        if job.early.is_none() {
            if !job.writes && self.try_inline_read(&job) {
                return;
            }
            if !job.writes && self.try_queued_read(&job) {
                return;
            }
        }
        let job = if job.early.is_none() && job.writes {
            match self.try_queued_write(job) {
                None => return,
                Some(job) => job,
            }
        } else {
            job
        };
        let scsi = self.session.scsi.as_ref().expect("normal session");
        let inline = job.early.is_none()
            && job.writes
            && job.expected_len <= INLINE_WRITE_MAX
            && scsi.write_completes_inline_decoded(&job.decoded);
        if inline {
            execute(&self.session, job, self.max_burst);
            return;
        }
        let session = self.session.clone();
        let itt = job.itt;
        let max_burst = self.max_burst;
        session.start_executing(itt);
        self.shared.pool.submit(move || {
            execute(&session, job, max_burst);
            session.finish_executing(itt);
        });
    }

    /// Answers a small read from the device's cache on this thread; false when it
    /// must go elsewhere.
    fn try_inline_read(&self, job: &CommandJob) -> bool {
        if job.expected_len > INLINE_READ_MAX {
            return false;
        }
        let scsi = self.session.scsi.as_ref().expect("normal session");
        let Some(response) = scsi.try_execute_cached_decoded(
            &job.decoded,
            &Command {
                nexus: &self.session.nexus,
                cdb: &job.cdb,
                data_out: &[],
            },
        ) else {
            return false;
        };
        answer(&self.session, job, &response, self.max_burst);
        true
    }

    /// Hands a READ to the device's request queue when its LUN's device has one
    /// that wakes us; false when it goes the usual way.
    fn try_queued_read(&self, job: &CommandJob) -> bool {
        let (Some(queued), Some(lun)) = (&self.queued, job.lun) else {
            return false;
        };
        let scsi = self.session.scsi.as_ref().expect("normal session");
        if !lun_queues(scsi, lun) {
            return false;
        }
        let plan = scsi.plan_read_decoded(
            &job.decoded,
            &Command {
                nexus: &self.session.nexus,
                cdb: &job.cdb,
                data_out: &[],
            },
        );
        let Some(read) = plan else {
            return false;
        };
        self.submit_queued(queued, job, lun, Work::Read(read))
            .is_ok()
    }

    /// Hands a WRITE whose data-out has all arrived to the device's request queue;
    /// gives the job back when it goes the usual way (None: the queue took it).
    fn try_queued_write(&self, mut job: CommandJob) -> Option<CommandJob> {
        let (Some(queued), Some(lun)) = (&self.queued, job.lun) else {
            return Some(job);
        };
        let scsi = self.session.scsi.as_ref().expect("normal session");
        // Only a buffer holding exactly the data-out goes to the device as is.
        let exact = job
            .data
            .as_ref()
            .is_some_and(|(buf, received)| buf.len() == *received as usize);
        if !exact || !lun_queues(scsi, lun) {
            return Some(job);
        }
        let (buf, received) = job.data.take().expect("checked");
        let plan = scsi.plan_write_decoded(
            &job.decoded,
            &Command {
                nexus: &self.session.nexus,
                cdb: &job.cdb,
                data_out: &buf,
            },
        );
        let Some(write) = plan else {
            job.data = Some((buf, received));
            return Some(job);
        };
        match self.submit_queued(queued, &job, lun, Work::Write(write, buf)) {
            Ok(()) => None,
            Err(queued_job) => match queued_job.work {
                // The queue thread is gone: the write's share of the lock goes
                // with its plan, and the command runs the usual way.
                Work::Write(_, buf) => {
                    job.data = Some((buf, received));
                    Some(job)
                }
                Work::Read(_) => unreachable!("a write was submitted"),
            },
        }
    }

    /// Marks the command executing and hands it to the queue thread.
    fn submit_queued(
        &self,
        queued: &QueuedCommands,
        job: &CommandJob,
        lun: u64,
        work: Work,
    ) -> Result<(), Box<QueuedJob>> {
        let itt = job.itt;
        self.session.start_executing(itt);
        let queued_job = QueuedJob {
            lun,
            work,
            itt,
            lun_field: job.lun_field,
            expected_len: job.expected_len,
            max_burst: self.max_burst,
            r2t_count: job.r2t_count,
        };
        queued.submit(queued_job).inspect_err(|_| {
            self.session.finish_executing(itt);
        })
    }
}

/// Whether `lun`'s device has a request queue that wakes its owner, which
/// [`super::queued`] drives.
fn lun_queues(scsi: &blockwire_scsi::ScsiTarget, lun: u64) -> bool {
    scsi.lun(lun)
        .is_some_and(|unit| unit.device().info().queue_wakes)
}

/// Executes a command on the SCSI layer and sends its answer.
fn execute(session: &Session, mut job: CommandJob, max_burst: u32) {
    let response = match job.early.take() {
        Some(response) => response,
        None => {
            let scsi = session.scsi.as_ref().expect("normal session");
            let data_out = match &job.data {
                Some((buf, received)) => &buf[..*received as usize],
                None => &[][..],
            };
            scsi.execute_decoded(
                &job.decoded,
                &Command {
                    nexus: &session.nexus,
                    cdb: &job.cdb,
                    data_out,
                },
            )
        }
    };
    // The data-out buffer goes back before the answer leaves.
    drop(job.data.take());
    answer(session, &job, &response, max_burst);
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
