//! Copying one device to another: sparse-aware and parallel.
//!
//! The source's extents are walked once, ahead of the workers: data ranges are cut into
//! requests and copied by `workers` threads at once; ranges the source reports as
//! reading zero are not read at all, and are either skipped (the destination is known
//! to be zero there, e.g. a freshly created sparse file) or zeroed with one cheap
//! write-zeroes. The destination is flushed before the copy reports success.
//!
//! A source without extents (an AoE target; an NBD server without block status) is
//! all data to the plan, so onto a destination known to be zero the data read is
//! also searched for zero blocks (of the destination's preferred size, at least
//! 4 KiB, aligned to the device), and those are not written: the new file stays as
//! sparse as with a source that reports its holes. qemu-img convert and nbdcopy
//! look for zeroes the same way.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread;

use crate::buffer::IoBuf;
use crate::device::{WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::handle::Device;
use crate::queue::{InlineQueue, RequestQueue};

#[path = "copy_pipelined.rs"]
mod pipelined;

/// How many bytes of the source's extents are looked up at a time.
const EXTENT_WINDOW: u64 = 1 << 30;
/// Largest single write-zeroes request.
const ZERO_PIECE: u64 = 1 << 30;
/// Smallest block searched for zeroes in data read: a file system block.
const MIN_ZERO_GRANULE: u64 = 4096;

/// How to copy.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    /// Bytes per read/write request.
    pub request_size: usize,
    /// Requests in flight (threads).
    pub workers: usize,
    /// The destination already reads as zeroes everywhere (a new sparse file), so
    /// zero ranges of the source need not be written: neither those its extents
    /// report nor zero blocks found in the data read.
    pub destination_is_zero: bool,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            request_size: 1 << 20,
            workers: 8,
            destination_is_zero: false,
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Bytes read from the source and written to the destination.
    pub data_bytes: u64,
    /// Bytes the source reported as zero (zeroed on the destination or skipped), and
    /// zero blocks found in data read and not written to a zero destination.
    pub zero_bytes: u64,
}

/// One unit of work.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Piece {
    Data { offset: u64, len: u64 },
    Zero { offset: u64, len: u64 },
}

fn check_sizes(source: &Device, destination: &Device) -> Result<()> {
    if destination.size() < source.size() {
        return Err(
            Error::new(ErrorKind::NoSpace, Op::Write, 0, source.size()).with_detail(format!(
                "destination holds {} bytes, source has {}",
                destination.size(),
                source.size()
            )),
        );
    }
    Ok(())
}

/// Cuts the source into pieces, in order, by its extents.
pub(crate) fn plan(
    source: &Device,
    request_size: u64,
    mut emit: impl FnMut(Piece) -> bool,
) -> Result<()> {
    let size = source.size();
    let mut at = 0;
    while at < size {
        let window = (size - at).min(EXTENT_WINDOW);
        for extent in source.extents(at, window)? {
            let end = extent.end().min(size);
            if extent.state.reads_zero() {
                let mut offset = extent.offset;
                while offset < end {
                    let len = (end - offset).min(ZERO_PIECE);
                    if !emit(Piece::Zero { offset, len }) {
                        return Ok(());
                    }
                    offset += len;
                }
            } else {
                let mut offset = extent.offset;
                while offset < end {
                    let len = (end - offset).min(request_size);
                    if !emit(Piece::Data { offset, len }) {
                        return Ok(());
                    }
                    offset += len;
                }
            }
            at = end;
        }
    }
    Ok(())
}

/// Copies all of `source` onto the start of `destination`. `progress` is called with
/// the number of bytes each finished piece covered.
///
/// When either device has a request queue (an initiator), two threads pipeline the
/// copy — one keeps reads in flight, the other writes what they bring — with
/// `workers × 4` requests in flight (a local side's requests run inline on its
/// thread); between two local devices `workers` threads each read and then write
/// one piece at a time.
pub fn copy(
    source: &Device,
    destination: &Device,
    options: CopyOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<CopyStats> {
    check_sizes(source, destination)?;
    let request_size = options
        .request_size
        .clamp(4096, shared_maximum(source, destination)) as u64;
    let queues = match (source.queue(), destination.queue()) {
        (Some(reads), Some(writes)) => Some((reads, writes)),
        // One initiator and a local device: the local side's requests run inline
        // on its thread of the pipeline, which keeps the initiator's queue full.
        (Some(reads), None) => Some((reads, inline(destination))),
        (None, Some(writes)) => Some((inline(source), writes)),
        (None, None) => None,
    };
    let state = CopyState::new(progress, zero_granule(destination, options));
    if let Some((reads, writes)) = queues {
        pipelined::copy(
            source,
            destination,
            (reads, writes),
            request_size,
            options,
            &state,
        );
        return state.finish(destination);
    }
    let (sender, receiver) = crossbeam_channel::bounded(options.workers * 4);
    thread::scope(|scope| {
        for _ in 0..options.workers.max(1) {
            let receiver = receiver.clone();
            let state = &state;
            scope.spawn(move || {
                let mut buf = IoBuf::new(request_size as usize);
                let mut runs = Vec::new();
                for piece in receiver {
                    if state.failed() {
                        continue;
                    }
                    match piece {
                        Piece::Data { offset, len } => {
                            buf.set_len(len as usize);
                            match source.read(&mut buf, offset) {
                                Ok(()) => state.write_data(destination, &buf, offset, &mut runs),
                                Err(e) => state.fail(e),
                            }
                        }
                        Piece::Zero { offset, len } => {
                            state.zero(destination, offset, len, options)
                        }
                    }
                }
            });
        }
        let planned = plan(source, request_size, |piece| {
            !state.failed() && sender.send(piece).is_ok()
        });
        // Closing the queue lets the workers finish.
        drop(sender);
        if let Err(e) = planned {
            state.fail(e);
        }
    });
    state.finish(destination)
}

/// What the threads of one copy share: the first error, the counts and the progress.
struct CopyState<'a> {
    failed: AtomicBool,
    first_error: Mutex<Option<Error>>,
    data_bytes: AtomicU64,
    zero_bytes: AtomicU64,
    progress: &'a (dyn Fn(u64) + Sync),
    /// Zero blocks of this size found in data read are not written (the destination
    /// reads as zeroes); `None`: data is written as read.
    zero_granule: Option<u64>,
}

impl<'a> CopyState<'a> {
    fn new(progress: &'a (dyn Fn(u64) + Sync), zero_granule: Option<u64>) -> CopyState<'a> {
        CopyState {
            failed: AtomicBool::new(false),
            first_error: Mutex::new(None),
            data_bytes: AtomicU64::new(0),
            zero_bytes: AtomicU64::new(0),
            progress,
            zero_granule,
        }
    }

    /// Records an error (the first one is reported) and stops the copy.
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

    /// A data piece of `len` bytes is on the destination.
    fn copied(&self, len: u64) {
        self.data_bytes.fetch_add(len, Ordering::Relaxed);
        (self.progress)(len);
    }

    /// Where `buf` (the source's bytes at `offset`) has to be written: all of it, or,
    /// onto a zero destination, its blocks that are not zero (`runs` empty: none).
    fn data_runs(&self, buf: &[u8], offset: u64, runs: &mut Vec<Range<usize>>) {
        match self.zero_granule {
            Some(granule) => nonzero_runs(buf, offset, granule, runs),
            None => {
                runs.clear();
                runs.push(0..buf.len());
            }
        }
    }

    /// Writes `buf`, the source's bytes at `offset`, to the destination: only its
    /// blocks that are not zero when the destination reads as zeroes already.
    fn write_data(
        &self,
        destination: &Device,
        buf: &[u8],
        offset: u64,
        runs: &mut Vec<Range<usize>>,
    ) {
        self.data_runs(buf, offset, runs);
        self.write_runs(destination, buf, offset, runs);
    }

    /// Writes the `runs` of `buf` (the source's bytes at `offset`), one request
    /// each; what lies between them is zero and counts as such.
    fn write_runs(&self, destination: &Device, buf: &[u8], offset: u64, runs: &[Range<usize>]) {
        let mut written = 0;
        for run in runs {
            let at = offset + run.start as u64;
            if let Err(e) = destination.write(&buf[run.clone()], at, WriteFlags::NONE) {
                self.fail(e);
                return;
            }
            written += run.len() as u64;
        }
        let zero = buf.len() as u64 - written;
        self.data_bytes.fetch_add(written, Ordering::Relaxed);
        self.zero_bytes.fetch_add(zero, Ordering::Relaxed);
        (self.progress)(written + zero);
    }

    /// Makes a range the source reads as zeroes read as zeroes on the destination:
    /// one write-zeroes, or nothing when the destination is known to be zero.
    fn zero(&self, destination: &Device, offset: u64, len: u64, options: CopyOptions) {
        self.zero_bytes.fetch_add(len, Ordering::Relaxed);
        let zeroed = if options.destination_is_zero {
            Ok(())
        } else {
            destination.write_zeroes(offset, len, ZeroFlags::default())
        };
        match zeroed {
            Ok(()) => (self.progress)(len),
            Err(e) => self.fail(e),
        }
    }

    /// Once every thread is done: the first error, or the destination flushed and
    /// the counts.
    fn finish(self, destination: &Device) -> Result<CopyStats> {
        if let Some(e) = self
            .first_error
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
        {
            return Err(e);
        }
        if destination.info().capabilities.flush.available() {
            destination.flush()?;
        }
        Ok(CopyStats {
            data_bytes: self.data_bytes.into_inner(),
            zero_bytes: self.zero_bytes.into_inner(),
        })
    }
}

/// Compares the first `source.size()` bytes of two devices, in parallel. Returns the
/// offset of the first request-sized range that differs, if any.
pub fn compare(
    source: &Device,
    destination: &Device,
    options: CopyOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Option<u64>> {
    check_sizes(source, destination)?;
    let size = source.size();
    let request_size = options
        .request_size
        .clamp(4096, shared_maximum(source, destination)) as u64;
    let next = AtomicU64::new(0);
    let mismatch = AtomicU64::new(u64::MAX);
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    thread::scope(|scope| {
        for _ in 0..options.workers.max(1) {
            scope.spawn(|| {
                let mut a = IoBuf::new(request_size as usize);
                let mut b = IoBuf::new(request_size as usize);
                loop {
                    let offset = next.fetch_add(request_size, Ordering::Relaxed);
                    if offset >= size || mismatch.load(Ordering::Relaxed) < offset {
                        return;
                    }
                    let len = (size - offset).min(request_size) as usize;
                    a.set_len(len);
                    b.set_len(len);
                    let read = source
                        .read(&mut a, offset)
                        .and_then(|()| destination.read(&mut b, offset));
                    match read {
                        Ok(()) if a[..] != b[..] => {
                            mismatch.fetch_min(offset, Ordering::Relaxed);
                        }
                        Ok(()) => progress(len as u64),
                        Err(e) => {
                            first_error
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .get_or_insert(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let at = mismatch.into_inner();
    Ok((at != u64::MAX).then_some(at))
}

fn inline(device: &Device) -> Box<dyn RequestQueue + '_> {
    Box::new(InlineQueue::new(device))
}

/// The size of the blocks searched for zeroes in data read, when the destination
/// reads as zeroes: its preferred block size (a write of less may cost a
/// read-modify-write), at least [`MIN_ZERO_GRANULE`].
fn zero_granule(destination: &Device, options: CopyOptions) -> Option<u64> {
    let sizes = destination.info().block_sizes;
    let granule = u64::from(sizes.minimum.max(sizes.preferred)).max(MIN_ZERO_GRANULE);
    options.destination_is_zero.then_some(granule)
}

/// The ranges of `buf` (the bytes at device offset `offset`) that hold anything but
/// zeroes, in blocks of `granule` bytes aligned to the device, adjacent ones merged:
/// what has to be written to a destination that reads as zeroes.
fn nonzero_runs(buf: &[u8], offset: u64, granule: u64, runs: &mut Vec<Range<usize>>) {
    runs.clear();
    let mut at = 0;
    while at < buf.len() {
        // The end of the granule `offset + at` lies in, clipped to the buffer.
        let into = (offset + at as u64) % granule;
        let end = at.saturating_add((granule - into) as usize).min(buf.len());
        if !is_zero(&buf[at..end]) {
            match runs.last_mut() {
                Some(last) if last.end == at => last.end = end,
                _ => runs.push(at..end),
            }
        }
        at = end;
    }
}

/// Whether every byte is zero; ORs 64 bytes at a time, which the compiler turns into
/// vector instructions (a byte-by-byte `all` would stop it from doing so).
fn is_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(64);
    blocks.all(|block| block.iter().fold(0, |acc, &b| acc | b) == 0)
        && blocks.remainder().iter().all(|&b| b == 0)
}

/// The largest request both devices take.
fn shared_maximum(a: &Device, b: &Device) -> usize {
    a.info()
        .block_sizes
        .maximum
        .min(b.info().block_sizes.maximum) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::pattern;
    use crate::memory::MemoryDevice;
    use crate::{BlockDevice, FastPath};
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    fn device(size: u64) -> Device {
        Device::from_device(MemoryDevice::new(size))
    }

    #[test]
    fn copies_data_and_zeroes_holes() {
        let source = device(8 << 20);
        let data = pattern(1, 0, 3 << 20);
        source.write(&data, 1 << 20, WriteFlags::NONE).unwrap();
        let destination = device(8 << 20);
        // Old data where the source has a hole must be zeroed.
        destination
            .write(&[0xEE; 65536], 6 << 20, WriteFlags::NONE)
            .unwrap();
        let done = AtomicU64::new(0);
        let options = CopyOptions {
            request_size: 256 * 1024,
            workers: 4,
            destination_is_zero: false,
        };
        let stats = copy(&source, &destination, options, &|n| {
            done.fetch_add(n, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(stats.data_bytes, 3 << 20);
        assert_eq!(stats.zero_bytes, 5 << 20);
        assert_eq!(done.load(Ordering::Relaxed), 8 << 20);
        assert_eq!(
            compare(&source, &destination, options, &|_| {}).unwrap(),
            None
        );
    }

    #[test]
    fn a_zero_destination_skips_holes_and_compare_finds_differences() {
        let source = device(4 << 20);
        source
            .write(&[7u8; 4096], 2 << 20, WriteFlags::NONE)
            .unwrap();
        let destination = device(4 << 20);
        let options = CopyOptions {
            destination_is_zero: true,
            ..CopyOptions::default()
        };
        copy(&source, &destination, options, &|_| {}).unwrap();
        assert_eq!(
            compare(&source, &destination, options, &|_| {}).unwrap(),
            None
        );
        destination
            .write(&[1u8; 1], 3 << 20, WriteFlags::NONE)
            .unwrap();
        let at = compare(
            &source,
            &destination,
            CopyOptions {
                request_size: 1 << 20,
                ..options
            },
            &|_| {},
        )
        .unwrap();
        assert_eq!(at, Some(3 << 20));
    }

    /// A memory device that reports no extents (as an AoE target does), with a
    /// request queue of its own (as an initiator) or without, that records the
    /// writes it takes.
    struct Plain {
        memory: MemoryDevice,
        queued: bool,
        writes: Mutex<Vec<(u64, u64)>>,
    }

    impl Plain {
        fn new(size: u64, queued: bool) -> Plain {
            Plain {
                memory: MemoryDevice::new(size),
                queued,
                writes: Mutex::new(Vec::new()),
            }
        }

        /// The writes taken, sorted, adjacent ones merged.
        fn written(&self) -> Vec<(u64, u64)> {
            let mut writes = self.writes.lock().unwrap().clone();
            writes.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::new();
            for (offset, len) in writes {
                match merged.last_mut() {
                    Some(last) if last.0 + last.1 == offset => last.1 += len,
                    _ => merged.push((offset, len)),
                }
            }
            merged
        }
    }

    impl BlockDevice for Plain {
        fn info(&self) -> crate::DeviceInfo {
            let mut info = self.memory.info();
            info.capabilities.extents = crate::info::Support::None;
            info
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.memory.read_at(buf, offset)
        }

        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
            self.writes.lock().unwrap().push((offset, buf.len() as u64));
            self.memory.write_at(buf, offset, flags)
        }

        fn flush(&self) -> Result<()> {
            Ok(())
        }

        fn fast_path(&self) -> Option<&dyn FastPath> {
            self.queued.then_some(self as &dyn FastPath)
        }
    }

    impl FastPath for Plain {
        fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
            Some(Box::new(AtOnce {
                device: self,
                ready: Vec::new(),
            }))
        }
    }

    /// A queue that runs each request when it is submitted.
    struct AtOnce<'a> {
        device: &'a Plain,
        ready: Vec<crate::queue::Completion>,
    }

    impl RequestQueue for AtOnce<'_> {
        fn submit(&mut self, submission: crate::queue::Submission) {
            let crate::queue::Submission {
                tag,
                op,
                mut buf,
                offset,
            } = submission;
            let result = match op {
                crate::QueuedOp::Read => self.device.read_at(&mut buf, offset),
                crate::QueuedOp::Write(flags) => self.device.write_at(&buf, offset, flags),
            };
            self.ready
                .push(crate::queue::Completion { tag, buf, result });
        }

        fn complete(&mut self, _min: usize, out: &mut Vec<crate::queue::Completion>) {
            out.append(&mut self.ready);
        }

        fn in_flight(&self) -> usize {
            self.ready.len()
        }
    }

    /// The runs as (start, end) pairs.
    fn runs(buf: &[u8], offset: u64, granule: u64) -> Vec<(usize, usize)> {
        // Left over from an earlier buffer: cleared.
        let mut runs = vec![0..1, 2..3];
        nonzero_runs(buf, offset, granule, &mut runs);
        runs.iter().map(|r| (r.start, r.end)).collect()
    }

    #[test]
    fn nonzero_runs_are_blocks_of_the_device_merged() {
        // 16 KiB read at 2 KiB: blocks of 4 KiB end at 2, 6, 10 and 14 KiB into it.
        let mut buf = vec![0u8; 16 << 10];
        assert_eq!(runs(&buf, 2048, 4096), []);
        buf[3000] = 1;
        buf[7000] = 1;
        buf[(16 << 10) - 1] = 1;
        assert_eq!(
            runs(&buf, 2048, 4096),
            vec![(2048, 10240), (14336, 16384)],
            "blocks 2 and 3 merged, the last one clipped to the buffer"
        );
        buf[0] = 1;
        assert_eq!(runs(&buf, 2048, 4096), [(0, 10240), (14336, 16384)]);
        let data = vec![1u8; 12 << 10];
        assert_eq!(runs(&data, 0, 4096), [(0, 12 << 10)]);
        assert_eq!(runs(&data, 512, 4096), [(0, 12 << 10)]);
        // Zero detection sees every byte, whatever its place in a 64-byte block.
        for at in [0, 63, 64, 4095 - 63, 4095] {
            let mut one = vec![0u8; 4096];
            one[at] = 0x80;
            assert_eq!(runs(&one, 0, 4096), [(0, 4096)], "byte {at}");
        }
    }

    /// A source without extents, 8 MiB with 1 MiB + 8 KiB of data, copied onto a
    /// destination that reads as zeroes: only the blocks holding data are written.
    fn zero_blocks_found_in_what_was_read(queued: bool) {
        let source = Plain::new(8 << 20, queued);
        let pieces: [(u64, usize); 3] =
            [(1 << 20, 4096), ((3 << 20) + 10, 100), (5 << 20, 1 << 20)];
        for (i, (offset, len)) in pieces.iter().enumerate() {
            source
                .write_at(&pattern(i as u64 + 1, 0, *len), *offset, WriteFlags::NONE)
                .unwrap();
        }
        let source = Device::from_device(source);
        let destination = Arc::new(Plain::new(8 << 20, false));
        let destination_device = Device::new(destination.clone());
        let done = AtomicU64::new(0);
        let options = CopyOptions {
            request_size: 256 * 1024,
            workers: 2,
            destination_is_zero: true,
        };
        let stats = copy(&source, &destination_device, options, &|n| {
            done.fetch_add(n, Ordering::Relaxed);
        })
        .unwrap();
        // 100 bytes at 3 MiB + 10 lie in the 4 KiB block at 3 MiB.
        let expected = vec![(1 << 20, 4096), (3 << 20, 4096), (5 << 20, 1 << 20)];
        assert_eq!(destination.written(), expected, "queued source: {queued}");
        let data: u64 = expected.iter().map(|(_, len)| len).sum();
        assert_eq!(stats.data_bytes, data);
        assert_eq!(stats.zero_bytes, (8 << 20) - data);
        assert_eq!(done.load(Ordering::Relaxed), 8 << 20);
        assert_eq!(
            compare(&source, &destination_device, options, &|_| {}).unwrap(),
            None
        );

        // Onto a destination that may hold anything, everything read is written.
        let destination = Arc::new(Plain::new(8 << 20, false));
        let destination_device = Device::new(destination.clone());
        let options = CopyOptions {
            destination_is_zero: false,
            ..options
        };
        let stats = copy(&source, &destination_device, options, &|_| {}).unwrap();
        assert_eq!(stats.data_bytes, 8 << 20);
        assert_eq!(destination.written(), vec![(0, 8 << 20)]);
    }

    #[test]
    fn zero_blocks_in_data_read_are_not_written_to_a_zero_destination() {
        zero_blocks_found_in_what_was_read(false);
    }

    #[test]
    fn zero_blocks_in_data_read_through_a_queue_are_not_written_to_a_zero_destination() {
        zero_blocks_found_in_what_was_read(true);
    }

    #[test]
    fn a_small_destination_is_refused_before_anything_is_written() {
        let source = device(4 << 20);
        let destination = device(1 << 20);
        let err = copy(&source, &destination, CopyOptions::default(), &|_| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoSpace);
    }
}
