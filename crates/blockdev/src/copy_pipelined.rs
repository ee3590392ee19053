//! The copy between two devices that both have request queues: a reading thread keeps
//! reads in flight on the source's queue and hands each filled buffer to a writing
//! thread, which keeps writes in flight on the destination's queue and hands the
//! buffers back. Neither waits for one request before starting the next, as nbdcopy
//! does with libnbd.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::{plan, CopyOptions, CopyStats, Piece};
use crate::buffer::IoBuf;
use crate::device::{WriteFlags, ZeroFlags};
use crate::error::{Error, Result};
use crate::handle::Device;
use crate::queue::{Completion, QueuedOp, RequestQueue, Submission};

/// What the two threads share.
struct Shared<'a> {
    failed: AtomicBool,
    first_error: Mutex<Option<Error>>,
    data_bytes: AtomicU64,
    zero_bytes: AtomicU64,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl Shared<'_> {
    fn fail(&self, error: Error) {
        self.failed.store(true, Ordering::SeqCst);
        self.first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(error);
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
}

type Queue<'a> = Box<dyn RequestQueue + 'a>;

pub(super) fn copy<'a>(
    source: &'a Device,
    destination: &'a Device,
    (reads, writes): (Queue<'a>, Queue<'a>),
    request_size: u64,
    options: CopyOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<CopyStats> {
    let depth = options.workers.max(1) * 4;
    let shared = Shared {
        failed: AtomicBool::new(false),
        first_error: Mutex::new(None),
        data_bytes: AtomicU64::new(0),
        zero_bytes: AtomicU64::new(0),
        progress,
    };
    let (piece_tx, piece_rx) = crossbeam_channel::bounded(depth * 4);
    // Filled buffers to write, with their offsets; empty ones back to the reader.
    let (filled_tx, filled_rx) = crossbeam_channel::unbounded();
    let (empty_tx, empty_rx) = crossbeam_channel::unbounded();
    let (zero_tx, zero_rx) = crossbeam_channel::unbounded();
    thread::scope(|scope| {
        let shared = &shared;
        scope.spawn(move || {
            read_side(
                reads,
                zero_tx,
                piece_rx,
                filled_tx,
                empty_rx,
                depth,
                request_size,
                shared,
            )
        });
        scope.spawn(move || write_side(writes, filled_rx, empty_tx, shared));
        scope.spawn(move || zero_side(destination, zero_rx, options, shared));
        let planned = plan(source, request_size, |piece| {
            !shared.failed() && piece_tx.send(piece).is_ok()
        });
        drop(piece_tx);
        if let Err(e) = planned {
            shared.fail(e);
        }
    });
    if let Some(e) = shared
        .first_error
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
    {
        return Err(e);
    }
    Ok(CopyStats {
        data_bytes: shared.data_bytes.into_inner(),
        zero_bytes: shared.zero_bytes.into_inner(),
    })
}

/// Takes pieces in order: zero ranges go to the zeroing thread, data ranges are read
/// through the queue (up to `depth` buffers in use) and passed on filled.
#[allow(clippy::too_many_arguments)]
fn read_side(
    mut queue: Queue<'_>,
    zeroes: Sender<(u64, u64)>,
    pieces: Receiver<Piece>,
    filled: Sender<(u64, IoBuf)>,
    empty: Receiver<IoBuf>,
    depth: usize,
    request_size: u64,
    shared: &Shared<'_>,
) {
    let mut spare: Vec<IoBuf> = Vec::new();
    let mut created = 0usize;
    let mut offsets = vec![0u64; depth];
    let mut free_tags: Vec<u64> = (0..depth as u64).rev().collect();
    let mut done: Vec<Completion> = Vec::new();
    let mut planned_all = false;
    loop {
        // Buffers the writer is finished with.
        while let Ok(buf) = empty.try_recv() {
            spare.push(buf);
        }
        // Start reads while there are buffers (made on demand, up to `depth`).
        while !planned_all && !shared.failed() && !free_tags.is_empty() {
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
                    let tag = free_tags.pop().expect("a tag per buffer in use");
                    offsets[tag as usize] = offset;
                    queue.submit(Submission {
                        tag,
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
                free_tags.push(completion.tag);
                match completion.result {
                    Ok(()) if !shared.failed() => {
                        let offset = offsets[completion.tag as usize];
                        if filled.send((offset, completion.buf)).is_err() {
                            return;
                        }
                    }
                    Ok(()) => spare.push(completion.buf),
                    Err(e) => {
                        shared.fail(e);
                        spare.push(completion.buf);
                    }
                }
            }
        } else if planned_all || shared.failed() {
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
    shared: &Shared<'_>,
) {
    for (offset, len) in ranges {
        if shared.failed() {
            continue;
        }
        shared.zero_bytes.fetch_add(len, Ordering::Relaxed);
        let zeroed = if options.destination_is_zero {
            Ok(())
        } else {
            destination.write_zeroes(offset, len, ZeroFlags::default())
        };
        match zeroed {
            Ok(()) => (shared.progress)(len),
            Err(e) => shared.fail(e),
        }
    }
}

/// Writes filled buffers through the queue and hands them back.
fn write_side(
    mut queue: Queue<'_>,
    filled: Receiver<(u64, IoBuf)>,
    empty: Sender<IoBuf>,
    shared: &Shared<'_>,
) {
    let mut done: Vec<Completion> = Vec::new();
    let mut reader_done = false;
    let submit = |queue: &mut Queue<'_>, (offset, buf): (u64, IoBuf)| {
        if shared.failed() {
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
                    Ok(()) => {
                        shared.data_bytes.fetch_add(len, Ordering::Relaxed);
                        (shared.progress)(len);
                    }
                    Err(e) => shared.fail(e),
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
