//! The copy between two devices that both have request queues: a reading thread keeps
//! reads in flight on the source's queue and hands each filled buffer to a writing
//! thread, which keeps writes in flight on the destination's queue and hands the
//! buffers back. Neither waits for one request before starting the next, as nbdcopy
//! does with libnbd. Onto a destination that reads as zeroes, a buffer that is all
//! zero is not written, and one that is partly zero is written (its blocks that are
//! not) by the writing thread itself.

use std::thread;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::{plan, CopyOptions, CopyState, Piece};
use crate::buffer::IoBuf;
use crate::device::WriteFlags;
use crate::handle::Device;
use crate::queue::{Completion, QueuedOp, RequestQueue, Submission};

type Queue<'a> = Box<dyn RequestQueue + 'a>;

/// Runs the copy; its outcome is in `state` when this returns.
pub(super) fn copy<'a>(
    source: &'a Device,
    destination: &'a Device,
    (reads, writes): (Queue<'a>, Queue<'a>),
    request_size: u64,
    options: CopyOptions,
    state: &CopyState<'_>,
) {
    let depth = options.workers.max(1) * 4;
    let (piece_tx, piece_rx) = crossbeam_channel::bounded(depth * 4);
    // Filled buffers to write, with their offsets; empty ones back to the reader.
    let (filled_tx, filled_rx) = crossbeam_channel::unbounded();
    let (empty_tx, empty_rx) = crossbeam_channel::unbounded();
    let (zero_tx, zero_rx) = crossbeam_channel::unbounded();
    thread::scope(|scope| {
        scope.spawn(move || {
            read_side(
                reads,
                zero_tx,
                piece_rx,
                filled_tx,
                empty_rx,
                depth,
                request_size,
                state,
            )
        });
        scope.spawn(move || write_side(destination, writes, filled_rx, empty_tx, state));
        scope.spawn(move || zero_side(destination, zero_rx, options, state));
        let planned = plan(source, request_size, |piece| {
            !state.failed() && piece_tx.send(piece).is_ok()
        });
        drop(piece_tx);
        if let Err(e) = planned {
            state.fail(e);
        }
    });
}

/// Takes pieces in order: zero ranges go to the zeroing thread, data ranges are read
/// through the queue (up to `depth` buffers in use, so at most `depth` reads in
/// flight; each read's tag is its offset) and passed on filled.
#[allow(clippy::too_many_arguments)]
fn read_side(
    mut queue: Queue<'_>,
    zeroes: Sender<(u64, u64)>,
    pieces: Receiver<Piece>,
    filled: Sender<(u64, IoBuf)>,
    empty: Receiver<IoBuf>,
    depth: usize,
    request_size: u64,
    state: &CopyState<'_>,
) {
    let mut spare: Vec<IoBuf> = Vec::new();
    let mut created = 0usize;
    let mut done: Vec<Completion> = Vec::new();
    let mut planned_all = false;
    loop {
        // Buffers the writer is finished with.
        while let Ok(buf) = empty.try_recv() {
            spare.push(buf);
        }
        // Start reads while there are buffers (made on demand, up to `depth`).
        while !planned_all && !state.failed() {
            let buf = match spare.pop() {
                Some(buf) => buf,
                None if created < depth => {
                    created += 1;
                    IoBuf::new(request_size as usize)
                }
                None => break,
            };
            match pieces.recv() {
                Ok(Piece::Data { offset, len }) => {
                    let mut buf = buf;
                    buf.set_len(len as usize);
                    queue.submit(Submission {
                        tag: offset,
                        op: QueuedOp::Read,
                        buf,
                        offset,
                    });
                }
                Ok(Piece::Zero { offset, len }) => {
                    spare.push(buf);
                    // Zeroing is a round trip of its own: the reads go on meanwhile.
                    let _ = zeroes.send((offset, len));
                }
                Err(_) => planned_all = true,
            }
        }
        if queue.in_flight() > 0 {
            queue.complete(1, &mut done);
            for completion in done.drain(..) {
                match completion.result {
                    Ok(()) if !state.failed() => {
                        if filled.send((completion.tag, completion.buf)).is_err() {
                            return;
                        }
                    }
                    Ok(()) => spare.push(completion.buf),
                    Err(e) => {
                        state.fail(e);
                        spare.push(completion.buf);
                    }
                }
            }
        } else if planned_all || state.failed() {
            // Nothing in flight and nothing more to read; dropping `filled` ends
            // the writer once it has written what it has.
            return;
        } else {
            // Every buffer is with the writer: wait for one to come back.
            match empty.recv() {
                Ok(buf) => spare.push(buf),
                Err(_) => return,
            }
        }
    }
}

/// Zeroes the destination's ranges that read as zeroes in the source, one request
/// at a time, beside the reads and writes.
fn zero_side(
    destination: &Device,
    ranges: Receiver<(u64, u64)>,
    options: CopyOptions,
    state: &CopyState<'_>,
) {
    for (offset, len) in ranges {
        if !state.failed() {
            state.zero(destination, offset, len, options);
        }
    }
}

/// Writes filled buffers through the queue and hands them back.
fn write_side(
    destination: &Device,
    mut queue: Queue<'_>,
    filled: Receiver<(u64, IoBuf)>,
    empty: Sender<IoBuf>,
    state: &CopyState<'_>,
) {
    let mut done: Vec<Completion> = Vec::new();
    let mut reader_done = false;
    let mut runs = Vec::new();
    let mut submit = |queue: &mut Queue<'_>, (offset, buf): (u64, IoBuf)| {
        if state.failed() {
            let _ = empty.send(buf);
            return;
        }
        state.data_runs(&buf, offset, &mut runs);
        if runs.len() != 1 || runs[0] != (0..buf.len()) {
            // Zero blocks in it, onto a zero destination: no write at all, or one
            // per run of data, here (a queued request writes a whole buffer). The
            // rest of the copy goes on meanwhile; on a local destination (the usual
            // zero one, a new file) the queue would run the write inline anyway.
            state.write_runs(destination, &buf, offset, &runs);
            let _ = empty.send(buf);
            return;
        }
        queue.submit(Submission {
            tag: offset,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf,
            offset,
        });
    };
    loop {
        loop {
            match filled.try_recv() {
                Ok(item) => submit(&mut queue, item),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    reader_done = true;
                    break;
                }
            }
        }
        if queue.in_flight() > 0 {
            queue.complete(1, &mut done);
            for completion in done.drain(..) {
                let len = completion.buf.len() as u64;
                match completion.result {
                    Ok(()) => state.copied(len),
                    Err(e) => state.fail(e),
                }
                // The reader may be gone (finished or failed); the buffer is then
                // simply freed.
                let _ = empty.send(completion.buf);
            }
        } else if reader_done {
            return;
        } else {
            match filled.recv() {
                Ok(item) => submit(&mut queue, item),
                Err(_) => reader_done = true,
            }
        }
    }
}
