//! Device work through the one request engine: on the connection thread when it
//! cannot block, on a worker when it would (or when its measured cost says so), or
//! in the device's own request queue (an RBD image, an initiator) when it has one
//! that wakes its owner: then one queue thread per connection keeps many commands
//! in flight without a blocked thread each.

use std::sync::Arc;

use blockwire_blockdev::{Device, IoBuf, QueuedCommand, QueuedOp, WriteFlags, ZeroFlags};
use blockwire_engine::{
    Done, Engine, Outcome, QueueDriver, QueueLimits, QueueWork, Release, Request, Route, WorkerPool,
};

use super::writer::Writer;
use crate::controller::{status_for, Accounting, IoCommand, IoOp, Reply};
use crate::cqe::{Cqe, Status};

/// Reads at least this long go from the page cache through the file's mapping
/// when they can (one copy instead of two); shorter ones are copied, which is
/// cheaper than asking the page cache whether they are resident.
const MAPPED_MIN: u64 = 64 * 1024;

/// What a command in the device's queue keeps for its answer.
pub(crate) struct Pending {
    cqe: Cqe,
    answer: Answer,
    read: bool,
    /// Bytes the command moves, counted when it succeeds.
    len: u64,
    accounting: Accounting,
}

/// The engine of one connection.
pub(crate) type NvmeEngine = Engine<Pending>;

/// What the engine needs to know of a command. A deallocation of several ranges
/// is not one queue command: it takes the other routes.
fn request(cmd: &IoCommand) -> Request {
    match &cmd.op {
        IoOp::Read { len, .. } => Request::read(*len as usize),
        IoOp::Write { data, .. } => Request::write(data.len()),
        IoOp::Flush => Request::flush(),
        IoOp::WriteZeroes { .. } => Request::write_zeroes(),
        IoOp::Deallocate { ranges } if ranges.len() == 1 => Request::trim(),
        IoOp::Deallocate { .. } | IoOp::Compare { .. } | IoOp::Nothing => Request::other(),
    }
}

/// Where a command's answer goes.
#[derive(Clone, Copy)]
pub(crate) struct Answer {
    pub transfer_len: u32,
    pub sq_flow_control_disabled: bool,
}

/// Starts the queue thread of an I/O queue whose namespace's device has a request
/// queue that wakes its owner; its answers go to `writer`. None otherwise.
pub(crate) fn start_queue(device: &Device, writer: &Arc<Writer>) -> Option<QueueDriver<Pending>> {
    let writer = writer.clone();
    let sync_device = device.clone();
    let sink = move |done: &mut Vec<Done<Pending>>, release: Release| {
        for Done {
            pending, outcome, ..
        } in done.drain(..)
        {
            let mut cqe = pending.cqe;
            let result = match outcome {
                Outcome::Completed { buf, result } => result.map(|()| buf),
                // The queue does not take it natively: the device handle runs (and
                // may emulate) it here, behind the requests queued before it.
                Outcome::Refused(command) => {
                    run_command(&sync_device, command).map(|()| IoBuf::new(0))
                }
            };
            // A read's buffer goes to the socket as the device filled it.
            let data = match result {
                Ok(buf) if pending.read => buf,
                Ok(_) => IoBuf::new(0),
                Err(e) => {
                    tracing::debug!("NVMe I/O failed: {e}");
                    cqe.status = status_for(&e);
                    IoBuf::new(0)
                }
            };
            pending.accounting.finished(&cqe, pending.len);
            writer.reply(
                Reply { cqe, data },
                pending.answer.transfer_len,
                pending.answer.sq_flow_control_disabled,
            );
        }
        // The budget comes back once the answers have left.
        drop(release);
    };
    QueueDriver::start(
        "nvme-queue",
        vec![(0, device.clone())],
        QueueLimits::default(),
        sink,
    )
}

fn run_command(device: &Device, command: QueuedCommand) -> blockwire_blockdev::Result<()> {
    match command {
        QueuedCommand::Flush => match device.flush() {
            Err(e) if e.kind() == blockwire_blockdev::ErrorKind::Unsupported => Ok(()),
            other => other,
        },
        QueuedCommand::Trim { offset, len, flags } => device.trim(offset, len, flags),
        QueuedCommand::WriteZeroes { offset, len, flags } => {
            device.write_zeroes(offset, len, flags)
        }
    }
}

/// The command as queue work, or back when it is none.
fn queue_work(mut cmd: IoCommand, answer: Answer) -> Result<(QueueWork, Pending), Box<IoCommand>> {
    let cqe = cmd.cqe;
    let len = cmd.len();
    let accounting = cmd.accounting();
    let pending = |read| Pending {
        cqe,
        answer,
        read,
        len,
        accounting,
    };
    // The op is taken out so that a write's buffer moves on uncopied; one the
    // queue does not take goes back into the command.
    let work = match std::mem::replace(&mut cmd.op, IoOp::Nothing) {
        IoOp::Read { offset, len } => {
            return Ok((QueueWork::read(offset, len as usize), pending(true)))
        }
        IoOp::Write { offset, data, fua } => QueueWork::Data {
            op: QueuedOp::Write(WriteFlags { fua }),
            buf: data,
            offset,
        },
        IoOp::Flush => QueueWork::Command(QueuedCommand::Flush),
        IoOp::WriteZeroes {
            offset,
            len,
            fua,
            deallocate,
        } => QueueWork::Command(QueuedCommand::WriteZeroes {
            offset,
            len,
            flags: ZeroFlags {
                fua,
                no_hole: !deallocate,
                fast: false,
            },
        }),
        IoOp::Deallocate { ranges } if ranges.len() == 1 => {
            QueueWork::Command(QueuedCommand::Trim {
                offset: ranges[0].0,
                len: ranges[0].1,
                flags: WriteFlags::NONE,
            })
        }
        op => {
            cmd.op = op;
            return Err(Box::new(cmd));
        }
    };
    Ok((work, pending(false)))
}

/// What becomes of an answer made on the connection thread.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inline {
    /// Sent now.
    Send,
    /// Held back to leave with the rest of the burst the host has sent.
    Batch,
}

/// Runs `cmd` and sends its answer. `more_waiting`: the host has sent more
/// commands behind this one (so offloading a large one overlaps work).
pub(crate) fn run(
    engine: &NvmeEngine,
    pool: &WorkerPool,
    writer: &Arc<Writer>,
    cmd: IoCommand,
    answer: Answer,
    inline: Inline,
    more_waiting: impl FnOnce() -> bool,
) {
    if cmd.is_read() && cmd.len() >= MAPPED_MIN && writer.sends_mapped() {
        if let Some(range) = cmd.mapped_read() {
            let no_flow = answer.sq_flow_control_disabled;
            writer.queue_mapped(cmd.cqe, range, cmd.device().clone(), no_flow);
            if inline == Inline::Batch {
                // The send is the read's one copy: a worker makes it, so that
                // the connection thread reads on (and queues more) while the
                // socket drains, instead of sleeping in sendmsg with them unread.
                let writer = writer.clone();
                engine.offload(pool, Request::other(), move |slot| {
                    writer.flush();
                    drop(slot);
                });
            } else {
                writer.flush();
            }
            return;
        }
    }
    let request = request(&cmd);
    let cmd = match engine.route(request, more_waiting) {
        Route::Inline => match engine.inline(request, || cmd.try_inline()) {
            Ok(reply) => {
                let (len, no_flow) = (answer.transfer_len, answer.sq_flow_control_disabled);
                match inline {
                    Inline::Send => writer.reply(reply, len, no_flow),
                    Inline::Batch => writer.reply_later(reply, len, no_flow),
                }
                return;
            }
            Err(cmd) => *cmd,
        },
        Route::Queue => match queue_work(cmd, answer) {
            Ok((work, pending)) => {
                if let Err((_, pending)) = engine.submit(request, work, pending) {
                    // The queue thread has gone: the host retries elsewhere.
                    let mut cqe = pending.cqe;
                    cqe.status = Status::NAMESPACE_NOT_READY;
                    writer.complete(cqe);
                }
                return;
            }
            Err(cmd) => *cmd,
        },
        Route::Worker => cmd,
    };
    let writer = writer.clone();
    engine.offload(pool, request, move |slot| {
        let reply = slot.run(|| cmd.execute());
        writer.reply(reply, answer.transfer_len, answer.sq_flow_control_disabled);
        drop(slot);
    });
}
