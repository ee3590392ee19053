//! Copying one device to another: sparse-aware and parallel.
//!
//! The source's extents are walked once, ahead of the workers: data ranges are cut into
//! requests and copied by `workers` threads at once; ranges the source reports as
//! reading zero are not read at all, and are either skipped (the destination is known
//! to be zero there, e.g. a freshly created sparse file) or zeroed with one cheap
//! write-zeroes. The destination is flushed before the copy reports success.

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

/// How to copy.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    /// Bytes per read/write request.
    pub request_size: usize,
    /// Requests in flight (threads).
    pub workers: usize,
    /// The destination already reads as zeroes everywhere (a new sparse file), so
    /// zero ranges of the source need not be written.
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
    /// Bytes the source reported as zero: zeroed on the destination or skipped.
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
    let state = CopyState::new(progress);
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
                for piece in receiver {
                    if state.failed() {
                        continue;
                    }
                    match piece {
                        Piece::Data { offset, len } => {
                            buf.set_len(len as usize);
                            let copied = source
                                .read(&mut buf, offset)
                                .and_then(|()| destination.write(&buf, offset, WriteFlags::NONE));
                            match copied {
                                Ok(()) => state.copied(len),
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
}

impl<'a> CopyState<'a> {
    fn new(progress: &'a (dyn Fn(u64) + Sync)) -> CopyState<'a> {
        CopyState {
            failed: AtomicBool::new(false),
            first_error: Mutex::new(None),
            data_bytes: AtomicU64::new(0),
            zero_bytes: AtomicU64::new(0),
            progress,
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
    use std::sync::atomic::AtomicU64;

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

    #[test]
    fn a_small_destination_is_refused_before_anything_is_written() {
        let source = device(4 << 20);
        let destination = device(1 << 20);
        let err = copy(&source, &destination, CopyOptions::default(), &|_| {}).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NoSpace);
    }
}
