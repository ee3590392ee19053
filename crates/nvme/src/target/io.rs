//! Device work through the one request engine: on the connection thread when it
//! cannot block, on a worker when it would (or when its measured cost says so).

use std::sync::Arc;

use blockwire_engine::{Engine, Request, Route, WorkerPool};

use super::writer::Writer;
use crate::controller::{IoCommand, IoOp};

/// What the engine needs to know of a command.
fn request(cmd: &IoCommand) -> Request {
    match &cmd.op {
        IoOp::Read { len, .. } => Request::read(*len as usize),
        IoOp::Write { data, .. } => Request::write(data.len()),
        IoOp::Flush => Request::flush(),
        IoOp::WriteZeroes { .. } => Request::write_zeroes(),
        IoOp::Deallocate { .. } => Request::trim(),
        IoOp::Compare { .. } | IoOp::Nothing => Request::other(),
    }
}

/// Where a command's answer goes.
#[derive(Clone, Copy)]
pub(crate) struct Answer {
    pub transfer_len: u32,
    pub sq_flow_control_disabled: bool,
}

/// Runs `cmd` and sends its answer. `more_waiting`: the host has sent more
/// commands behind this one (so offloading a large one overlaps work).
pub(crate) fn run(
    engine: &Engine,
    pool: &WorkerPool,
    writer: &Arc<Writer>,
    cmd: IoCommand,
    answer: Answer,
    more_waiting: impl FnOnce() -> bool,
) {
    let request = request(&cmd);
    let cmd = match engine.route(request, more_waiting) {
        Route::Inline => match engine.inline(request, || cmd.try_inline()) {
            Ok(reply) => {
                writer.reply(reply, answer.transfer_len, answer.sq_flow_control_disabled);
                return;
            }
            Err(cmd) => *cmd,
        },
        // No queue thread is started for NVMe/TCP yet: a queue route cannot come.
        Route::Worker | Route::Queue => cmd,
    };
    let writer = writer.clone();
    engine.offload(pool, request, move |slot| {
        let reply = slot.run(|| cmd.execute());
        writer.reply(reply, answer.transfer_len, answer.sq_flow_control_disabled);
        drop(slot);
    });
}
