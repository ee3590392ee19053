//! One interface's receive loop: batches of frames in, runs of device I/O, batches of
//! responses out.

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::{IoBuf, WriteFlags};
use blockwire_engine::{Request, WorkerPool};

use super::access::{Admission, ConfigAnswer};
use super::ata::{ata_error, classify, response_args, AtaAction, AtaLimits};
use super::spin::SpinPolicy;
use super::{FrameSink, Port, Shared, FIRMWARE_VERSION};
use crate::rawsock::{RawSocket, RecvBatch};
use crate::wire::{
    ata, pad_to_minimum, AoeError, AtaArgs, Body, Command, ConfigQuery, Header, ATA_HEADER_LEN,
    BROADCAST, ETHERNET_HEADER_LEN, VERSION,
};

/// Frames taken per receive call.
const BATCH: usize = 16;
/// How often an idle receive thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// Largest device I/O a run of consecutive frames grows to.
const MAX_RUN: usize = 1 << 20;
/// A run that goes to a worker may span batches, but holds at most this share of
/// the initiator's window (the buffer count), so several runs stay in flight and the
/// initiator keeps sending while one is on the disk.
const RUNS_PER_WINDOW: usize = 4;
/// How long a held run that is a stream waits for its next frame, from the last one.
const HOLD: Duration = Duration::from_micros(30);

/// A request waiting for its run to complete: everything its response needs.
#[derive(Clone, Copy)]
struct Pending {
    reply: Header,
    args: AtaArgs,
}

/// Consecutive reads (or writes) gathered into one device I/O.
pub(super) struct Run<'f> {
    write: bool,
    offset: u64,
    len: usize,
    frames: Vec<Pending>,
    data: RunData<'f>,
}

/// Where a run's write data is.
enum RunData<'f> {
    /// A read: none.
    None,
    /// Still in the received frames: written with one vectored write, no copy.
    Frames(Vec<&'f [u8]>),
    /// Gathered into one buffer, for a worker (the frames are reused by then).
    Gathered(IoBuf),
}

impl Run<'_> {
    fn continues(&self, write: bool, offset: u64, len: usize, max_frames: usize) -> bool {
        self.write == write
            && self.offset + self.len as u64 == offset
            && self.len + len <= MAX_RUN
            && self.frames.len() < max_frames
    }

    /// Whether the run's last frame carried as many sectors as a frame can: a
    /// request that continues in the next frame (a partly filled frame ends one).
    fn last_frame_full(&self, max_sectors: u8) -> bool {
        self.frames
            .last()
            .is_some_and(|pending| pending.args.sector_count >= max_sectors)
    }

    /// The run for a worker: owns its data.
    fn into_owned(self) -> Run<'static> {
        let data = match self.data {
            RunData::None => RunData::None,
            RunData::Gathered(buffer) => RunData::Gathered(buffer),
            RunData::Frames(slices) => {
                let mut buffer = IoBuf::new(self.len);
                let mut at = 0;
                for slice in slices {
                    buffer[at..at + slice.len()].copy_from_slice(slice);
                    at += slice.len();
                }
                RunData::Gathered(buffer)
            }
        };
        Run {
            write: self.write,
            offset: self.offset,
            len: self.len,
            frames: self.frames,
            data,
        }
    }
}

/// Response frames built during one batch, sent together.
#[derive(Default)]
pub(super) struct Outbox {
    frames: Vec<Vec<u8>>,
    /// Per frame, how many bytes of its buffer have ever been written: those may be
    /// exposed again without zeroing them first.
    initialized: Vec<usize>,
    used: usize,
}

impl Outbox {
    /// A cleared frame buffer to encode the next response into.
    fn next(&mut self) -> &mut Vec<u8> {
        if self.used == self.frames.len() {
            self.frames.push(Vec::with_capacity(2048));
            self.initialized.push(0);
        }
        let index = self.used;
        self.used += 1;
        let frame = &mut self.frames[index];
        self.initialized[index] = self.initialized[index].max(frame.len());
        frame.clear();
        frame
    }

    /// Encodes an ATA response with room for `len` data bytes after its arguments,
    /// to be filled by a read (see [`data_slices`](Self::data_slices)).
    fn ata_with_room(&mut self, reply: &Header, args: &AtaArgs, len: usize) {
        self.next();
        let index = self.used - 1;
        let initialized = self.initialized[index];
        let frame = &mut self.frames[index];
        reply.encode(frame);
        args.encode(frame);
        let needed = ATA_HEADER_LEN + len;
        if needed <= initialized && needed <= frame.capacity() {
            // SAFETY: these bytes were written before (`initialized`) and clear()
            // does not de-initialise a Vec<u8>'s buffer; the read overwrites them.
            unsafe { frame.set_len(needed) };
        } else {
            frame.resize(needed, 0);
        }
    }

    /// The data regions of frames `start..` (those made by `ata_with_room`).
    fn data_slices(&mut self, start: usize) -> Vec<IoSliceMut<'_>> {
        self.frames[start..self.used]
            .iter_mut()
            .map(|frame| IoSliceMut::new(&mut frame[ATA_HEADER_LEN..]))
            .collect()
    }

    /// A response carrying `body`.
    fn message(&mut self, reply: &Header, body: &Body<'_>) {
        let frame = self.next();
        reply.encode(frame);
        body.encode(frame);
        pad_to_minimum(frame);
    }

    fn error(&mut self, reply: &Header, error: AoeError) {
        let frame = self.next();
        let mut header = *reply;
        header.error = error as u8;
        header.encode(frame);
        pad_to_minimum(frame);
    }

    fn ata(&mut self, reply: &Header, args: &AtaArgs, data: &[u8]) {
        let frame = self.next();
        reply.encode(frame);
        args.encode(frame);
        frame.extend_from_slice(data);
        pad_to_minimum(frame);
    }

    pub(super) fn send(&mut self, sink: &dyn FrameSink) {
        if self.used == 0 {
            return;
        }
        let frames: Vec<&[u8]> = self.frames[..self.used].iter().map(Vec::as_slice).collect();
        if let Err(e) = sink.send_batch(&frames) {
            // The initiator retransmits what it does not hear back.
            tracing::warn!("AoE: sending {} responses: {e}", frames.len());
        }
        self.used = 0;
    }
}

/// The receive loop of one interface, until the target stops.
pub(super) fn run(
    shared: &Arc<Shared>,
    port: &Arc<Port>,
    socket: &RawSocket,
    pool: &Arc<WorkerPool>,
) {
    let mtu = port.interface.mtu;
    let mut batch = RecvBatch::new(BATCH, mtu + ETHERNET_HEADER_LEN + 4);
    let mut out = Outbox::default();
    let mut last_frame = Instant::now();
    // Whether to poll the ring or sleep on it (spin.rs), and since when this thread
    // has been waiting for its next batch.
    let mut spin = SpinPolicy::new(last_frame);
    let mut waiting_since = last_frame;
    // A worker's run still growing when its batch ended: more consecutive frames are
    // likely already in the ring, and one larger device I/O costs the disk (and, in
    // a VM, the hypervisor) one request instead of several.
    let mut held: Option<Run<'static>> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        // A held run must not wait for a sleep to end: poll while it is held (HOLD
        // below bounds that).
        let wait = if held.is_some() || spin.poll(Instant::now()) {
            Duration::ZERO
        } else {
            POLL
        };
        let received = match socket.recv_batch(&mut batch, Some(wait)) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("AoE: receiving on {}: {e}", port.interface.name);
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if received == 0 {
            // The ring is empty. A held run whose last frame was full may be a
            // stream: it waits a moment for the next frame. The initiator sends as
            // answers come back, so without the wait runs stay as small as the
            // last answers were (measured at MTU 9000: 8 frames a run on average,
            // most of them single frames).
            let stream = held
                .as_ref()
                .is_some_and(|run| run.last_frame_full(port.max_sectors));
            if stream && last_frame.elapsed() < HOLD {
                std::hint::spin_loop();
                continue;
            }
            start_held(held.take(), shared, port, pool, &mut out);
            std::hint::spin_loop();
            continue;
        }
        last_frame = Instant::now();
        spin.received(waiting_since, last_frame);
        // Frames larger than the MTU were cut short: nothing sane to answer.
        let frames = (0..received)
            .filter(|&i| !batch.is_truncated(i))
            .map(|i| batch.frame(i));
        held = Receiver::resuming(shared, port, pool, held.take()).batch_holding(frames, &mut out);
        out.send(port.sink.as_ref());
        waiting_since = Instant::now();
    }
    start_held(held, shared, port, pool, &mut out);
}

/// Starts a held run, if there is one, and sends what that answers at once.
fn start_held(
    held: Option<Run<'static>>,
    shared: &Arc<Shared>,
    port: &Arc<Port>,
    pool: &Arc<WorkerPool>,
    out: &mut Outbox,
) {
    if held.is_some() {
        Receiver::resuming(shared, port, pool, held).finish_run(out);
        out.send(port.sink.as_ref());
    }
}

/// The frame handling of one interface, without its socket: what [`run`] and the
/// [`TargetHarness`](super::TargetHarness) drive.
pub(super) struct Receiver<'a, 'f> {
    shared: &'a Arc<Shared>,
    port: &'a Arc<Port>,
    pool: &'a Arc<WorkerPool>,
    /// The run being gathered: from the current batch's frames, or held over from
    /// earlier batches (see [`batch_holding`](Self::batch_holding)).
    run: Option<Run<'f>>,
}

impl<'a, 'f> Receiver<'a, 'f> {
    pub(super) fn new(
        shared: &'a Arc<Shared>,
        port: &'a Arc<Port>,
        pool: &'a Arc<WorkerPool>,
    ) -> Receiver<'a, 'f> {
        Receiver::resuming(shared, port, pool, None)
    }

    /// A receiver that continues `held`, a run handed back by
    /// [`batch_holding`](Self::batch_holding).
    pub(super) fn resuming(
        shared: &'a Arc<Shared>,
        port: &'a Arc<Port>,
        pool: &'a Arc<WorkerPool>,
        held: Option<Run<'static>>,
    ) -> Receiver<'a, 'f> {
        Receiver {
            shared,
            port,
            pool,
            run: held,
        }
    }

    /// Handles a batch of received frames; responses that complete here go to
    /// `out`, the others (worker I/O) to the port's sink.
    pub(super) fn batch(&mut self, frames: impl Iterator<Item = &'f [u8]>, out: &mut Outbox) {
        for frame in frames {
            self.frame(frame, out);
        }
        self.finish_run(out);
    }

    /// Like [`batch`](Self::batch), but on a device that completes on workers a run
    /// that may still grow is handed back instead of started: the caller passes it
    /// to the next batch (as `run`) or finishes it when no frame follows. Runs of an
    /// inline device cost little each and are finished here.
    pub(super) fn batch_holding(
        &mut self,
        frames: impl Iterator<Item = &'f [u8]>,
        out: &mut Outbox,
    ) -> Option<Run<'static>> {
        for frame in frames {
            self.frame(frame, out);
        }
        match self.run.take() {
            Some(run)
                if !self.shared.runs_inline(run.write, run.len)
                    && run.frames.len() < self.max_run_frames() =>
            {
                Some(run.into_owned())
            }
            run => {
                self.run = run;
                self.finish_run(out);
                None
            }
        }
    }

    /// Frames one run may gather: a batch's worth at least, a share of the window
    /// at most.
    fn max_run_frames(&self) -> usize {
        (usize::from(self.shared.buffer_count) / RUNS_PER_WINDOW).max(BATCH)
    }

    fn frame(&mut self, frame: &'f [u8], out: &mut Outbox) {
        let Ok((header, body)) = Header::parse(frame) else {
            return;
        };
        let shared = self.shared;
        if header.response
            || (header.dst != self.port.interface.mac && header.dst != BROADCAST)
            || !header.addresses(shared.shelf, shared.slot)
        {
            return;
        }
        let admission = shared.access.admit(&header.src);
        if admission == Admission::Ignored {
            return;
        }
        // Answer with our own address, also to a broadcast.
        let mut reply = header.response_to(self.port.interface.mac);
        reply.shelf = shared.shelf;
        reply.slot = shared.slot;
        if header.version != VERSION {
            return out.error(&reply, AoeError::UnsupportedVersion);
        }
        let Some(command) = Command::from_code(header.command) else {
            return out.error(&reply, AoeError::UnrecognizedCommand);
        };
        let body = match Body::parse(command, body) {
            Ok(body) => body,
            Err(_) => return out.error(&reply, AoeError::BadArgument),
        };
        match body {
            Body::QueryConfig(query) => self.config(&reply, &query, out),
            Body::MacMaskList(_) | Body::Ata(..) if admission == Admission::Reserved => {
                out.error(&reply, AoeError::TargetReserved)
            }
            Body::MacMaskList(list) => match shared.access.mask_list(&list) {
                Ok(list) => out.message(&reply, &Body::MacMaskList(list)),
                Err(e) => out.error(&reply, e),
            },
            Body::ReserveRelease(list) => match shared.access.reserve(&header.src, &list) {
                Ok(list) => out.message(&reply, &Body::ReserveRelease(list)),
                Err(e) => out.error(&reply, e),
            },
            Body::Ata(args, data) => self.ata(reply, args, data, out),
        }
    }

    fn config(&self, reply: &Header, query: &ConfigQuery<'_>, out: &mut Outbox) {
        match self.shared.access.query_config(query) {
            ConfigAnswer::Reply(config) => {
                let answer = ConfigQuery {
                    buffer_count: self.shared.buffer_count,
                    firmware_version: FIRMWARE_VERSION,
                    sector_count: self.port.max_sectors,
                    aoe_version: VERSION,
                    command: query.command,
                    config: &config,
                };
                out.message(reply, &Body::QueryConfig(answer));
            }
            ConfigAnswer::Silent => {}
            ConfigAnswer::Error(e) => out.error(reply, e),
        }
    }

    fn ata(&mut self, reply: Header, args: AtaArgs, data: &'f [u8], out: &mut Outbox) {
        let limits = AtaLimits {
            sectors: self.shared.sectors,
            max_sectors: self.port.max_sectors,
            read_only: self.shared.read_only,
        };
        let pending = Pending { reply, args };
        match classify(&args, data.len(), &limits) {
            // Zero sectors: nothing to move, and no room for a run to grow from.
            AtaAction::Read { len: 0, .. } | AtaAction::Write { len: 0, .. } => {
                out.ata(&reply, &response_args(&args, None), &[])
            }
            AtaAction::Read { offset, len } => self.gather(false, offset, len, pending, &[], out),
            AtaAction::Write { offset, len } => {
                self.gather(true, offset, len, pending, &data[..len], out)
            }
            AtaAction::Flush => {
                // Writes received before the flush go to the device first.
                self.finish_run(out);
                let shared = self.shared.clone();
                let port = self.port.clone();
                let engine = &self.shared.engine;
                engine.offload(self.pool, Request::flush(), move |slot| {
                    let error = slot
                        .run(|| shared.device.flush())
                        .err()
                        .map(|e| ata_error(e.kind(), true));
                    let mut out = Outbox::default();
                    out.ata(&reply, &response_args(&args, error), &[]);
                    out.send(port.sink.as_ref());
                    drop(slot);
                });
            }
            AtaAction::Identify => {
                let mut answer = response_args(&args, None);
                answer.sector_count = 1;
                out.ata(&reply, &answer, &self.shared.identity);
            }
            AtaAction::CheckPowerMode => {
                let mut answer = response_args(&args, None);
                answer.sector_count = ata::POWER_ACTIVE;
                out.ata(&reply, &answer, &[]);
            }
            AtaAction::Fail { error } => out.ata(&reply, &response_args(&args, Some(error)), &[]),
            AtaAction::Reject(e) => out.error(&reply, e),
        }
    }

    /// Adds a read or write to the current run, or starts a new one.
    fn gather(
        &mut self,
        write: bool,
        offset: u64,
        len: usize,
        pending: Pending,
        data: &'f [u8],
        out: &mut Outbox,
    ) {
        if !self
            .run
            .as_ref()
            .is_some_and(|run| run.continues(write, offset, len, self.max_run_frames()))
        {
            self.finish_run(out);
            let data = match (write, self.shared.runs_inline(write, len)) {
                (false, _) => RunData::None,
                (true, true) => RunData::Frames(Vec::with_capacity(BATCH)),
                (true, false) => RunData::Gathered(IoBuf::new(MAX_RUN)),
            };
            self.run = Some(Run {
                write,
                offset,
                len: 0,
                frames: Vec::with_capacity(BATCH),
                data,
            });
        }
        let run = self.run.as_mut().expect("a run was just started");
        match &mut run.data {
            RunData::None => {}
            RunData::Frames(slices) => slices.push(data),
            RunData::Gathered(buffer) => buffer[run.len..run.len + len].copy_from_slice(data),
        }
        run.len += len;
        run.frames.push(pending);
    }

    /// Carries out the current run: here if the device completes inline, else on a
    /// worker that sends the responses itself.
    fn finish_run(&mut self, out: &mut Outbox) {
        let Some(run) = self.run.take() else {
            return;
        };
        let shared = self.shared;
        if shared.runs_inline(run.write, run.len) {
            if let RunData::Frames(slices) = &run.data {
                let slices: Vec<IoSlice<'_>> = slices.iter().map(|s| IoSlice::new(s)).collect();
                let result =
                    shared
                        .device
                        .write_vectored(&slices, run.offset, WriteFlags::default());
                return respond(&run, None, result.err().map(|e| e.kind()), out);
            }
            if !run.write {
                // Straight into the response frames: one preadv, no copy.
                let start = out.used;
                for pending in &run.frames {
                    let args = response_args(&pending.args, None);
                    out.ata_with_room(&pending.reply, &args, pending.args.data_len());
                }
                let mut slices = out.data_slices(start);
                match shared.device.try_read_vectored(&mut slices, run.offset) {
                    Ok(true) => return,
                    Ok(false) => out.used = start,
                    Err(e) => {
                        out.used = start;
                        return respond(&run, None, Some(e.kind()), out);
                    }
                }
            }
        }
        // On a worker: the device does not complete inline, or the inline read
        // found it would wait (not cached).
        let run = run.into_owned();
        let request = if run.write {
            Request::write(run.len)
        } else {
            Request::read(run.len)
        };
        let port = self.port.clone();
        let owner = shared.clone();
        shared.engine.offload(self.pool, request, move |slot| {
            let shared = owner;
            let mut out = Outbox::default();
            match &run.data {
                RunData::Gathered(data) => {
                    let result = slot.run(|| {
                        shared
                            .device
                            .write(&data[..run.len], run.offset, WriteFlags::default())
                    });
                    respond(&run, None, result.err().map(|e| e.kind()), &mut out);
                }
                _ => {
                    let mut buffer = IoBuf::new(run.len);
                    match slot.run(|| shared.device.read(&mut buffer, run.offset)) {
                        Ok(()) => send_read(&run, &buffer, port.sink.as_ref()),
                        Err(e) => respond(&run, None, Some(e.kind()), &mut out),
                    }
                }
            }
            out.send(port.sink.as_ref());
            drop(slot);
        });
    }
}

/// Sends the answers of a read run that completed on a worker: each frame's head
/// encoded here, its data sent from where the read put it (no copy into frames).
fn send_read(run: &Run<'_>, data: &[u8], sink: &dyn FrameSink) {
    // Every head is ATA_HEADER_LEN bytes: one buffer holds them all.
    let mut heads = Vec::with_capacity(run.frames.len() * ATA_HEADER_LEN);
    for pending in &run.frames {
        pending.reply.encode(&mut heads);
        response_args(&pending.args, None).encode(&mut heads);
    }
    let mut at = 0;
    let frames: Vec<(&[u8], &[u8])> = heads
        .chunks(ATA_HEADER_LEN)
        .zip(&run.frames)
        .map(|(head, pending)| {
            let len = pending.args.data_len();
            at += len;
            (head, &data[at - len..at])
        })
        .collect();
    if let Err(e) = sink.send_gathered(&frames) {
        // The initiator retransmits what it does not hear back.
        tracing::warn!("AoE: sending {} responses: {e}", frames.len());
    }
}

/// Encodes the responses of a completed run: each frame its slice of the read data,
/// or the error.
fn respond(
    run: &Run<'_>,
    read: Option<&[u8]>,
    error: Option<blockwire_blockdev::ErrorKind>,
    out: &mut Outbox,
) {
    let error = error.map(|kind| ata_error(kind, run.write));
    let mut at = 0;
    for pending in &run.frames {
        let len = pending.args.data_len();
        let data = match (read, error) {
            (Some(read), None) => &read[at..at + len],
            _ => &[][..],
        };
        at += len;
        out.ata(&pending.reply, &response_args(&pending.args, error), data);
    }
}
