//! The checked handle between devices and their users.
//!
//! Every request passes through here: ranges, alignment and read-only are checked once,
//! requests are split by the device's limits, and operations the device lacks are
//! emulated (FUA as write + flush, write-zeroes as writes of zeroes, extents as "all
//! data"). Backends implement only what they natively can and targets never re-check.

use std::io::{IoSlice, IoSliceMut};
use std::sync::Arc;

use crate::buffer::IoBuf;
use crate::device::{write_each, BlockDevice, Extent, ExtentState, WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::info::{Capabilities, DeviceInfo, Support};
use crate::queue::{Completion, QueuedCommand, QueuedOp, RequestQueue, Submission};
use crate::read_only::ReadOnly;

/// Largest zero buffer written at once when write-zeroes is emulated.
const ZERO_CHUNK: u64 = 1 << 20;
/// Most extents one call returns; callers ask again from where it stopped.
const MAX_EXTENTS: usize = 1 << 16;

/// A shared, checked handle to a block device. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    inner: Arc<dyn BlockDevice>,
    native: Capabilities,
    info: DeviceInfo,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

impl Device {
    /// Wraps a device. Its info is read once: a device's size and capabilities are
    /// fixed for the handle's lifetime.
    pub fn new(inner: Arc<dyn BlockDevice>) -> Device {
        let raw = inner.info();
        let native = raw.capabilities;
        let writable = !raw.read_only;
        let emulate_if_writable = |support: Support| match support {
            _ if !writable => Support::None,
            Support::Native => Support::Native,
            _ => Support::Emulated,
        };
        let capabilities = Capabilities {
            flush: native.flush,
            fua: match native.fua {
                _ if !writable => Support::None,
                Support::Native => Support::Native,
                _ if native.flush.available() => Support::Emulated,
                _ => Support::None,
            },
            trim: if writable { native.trim } else { Support::None },
            write_zeroes: emulate_if_writable(native.write_zeroes),
            fast_zero: if writable && native.write_zeroes.is_native() {
                native.fast_zero
            } else {
                Support::None
            },
            extents: match native.extents {
                Support::Native => Support::Native,
                _ => Support::Emulated,
            },
            cache: match native.cache {
                Support::Native => Support::Native,
                _ => Support::Emulated,
            },
        };
        let mut info = raw;
        info.capabilities = capabilities;
        info.block_sizes.minimum = info.block_sizes.minimum.max(1);
        info.block_sizes.maximum = info
            .block_sizes
            .maximum
            .clamp(info.block_sizes.minimum, DeviceInfo::DEFAULT_MAX_TRANSFER);
        Device {
            inner,
            native,
            info,
        }
    }

    /// Wraps a concrete device.
    pub fn from_device(device: impl BlockDevice + 'static) -> Device {
        Device::new(Arc::new(device))
    }

    /// The same device, refusing every write.
    pub fn read_only(&self) -> Device {
        if self.info.read_only {
            return self.clone();
        }
        Device::new(Arc::new(ReadOnly::new(self.inner.clone())))
    }

    /// The effective info: capabilities include what this handle emulates.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn size(&self) -> u64 {
        self.info.size
    }

    fn check(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        let writes = matches!(op, Op::Write | Op::Trim | Op::WriteZeroes);
        if writes && self.info.read_only {
            return Err(Error::new(ErrorKind::ReadOnly, op, offset, len));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size => {}
            _ => {
                return Err(Error::new(ErrorKind::OutOfRange, op, offset, len)
                    .with_detail(format!("device size is {}", self.info.size)))
            }
        }
        let minimum = u64::from(self.info.block_sizes.minimum);
        if !offset.is_multiple_of(minimum) || !len.is_multiple_of(minimum) {
            return Err(Error::new(ErrorKind::Misaligned, op, offset, len)
                .with_detail(format!("minimum block size is {minimum}")));
        }
        Ok(())
    }

    fn max_transfer(&self) -> usize {
        self.info.block_sizes.maximum as usize
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(Op::Read, offset, buf.len() as u64)?;
        let max = self.max_transfer();
        for (index, chunk) in buf.chunks_mut(max).enumerate() {
            self.inner.read_at(chunk, offset + (index * max) as u64)?;
        }
        Ok(())
    }

    /// Whether the device has any fast path ([`BlockDevice::fast_path`]): composers
    /// over this handle offer theirs only when it does.
    pub fn has_fast_path(&self) -> bool {
        self.inner.fast_path().is_some()
    }

    /// Reads without blocking on hardware; `Ok(false)` means "retry with [`read`]
    /// where blocking is fine". See
    /// [`FastPath::try_read_at`](crate::FastPath::try_read_at).
    ///
    /// [`read`]: Device::read
    pub fn try_read(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        self.check(Op::Read, offset, buf.len() as u64)?;
        let Some(fast) = self.inner.fast_path() else {
            return Ok(false);
        };
        let max = self.max_transfer();
        for (index, chunk) in buf.chunks_mut(max).enumerate() {
            if !fast.try_read_at(chunk, offset + (index * max) as u64)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// [`try_read`](Device::try_read) into several buffers filled in order from
    /// `offset`; see
    /// [`FastPath::try_read_vectored_at`](crate::FastPath::try_read_vectored_at).
    pub fn try_read_vectored(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<bool> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        self.check(Op::Read, offset, total as u64)?;
        match self.inner.fast_path() {
            Some(fast) if total <= self.max_transfer() => fast.try_read_vectored_at(bufs, offset),
            _ => Ok(false),
        }
    }

    /// [`write`](Device::write) of several buffers, in order, from `offset`.
    pub fn write_vectored(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        self.check(Op::Write, offset, total as u64)?;
        let native_fua = flags.fua && self.native.fua.is_native();
        if total <= self.max_transfer() {
            let pass = WriteFlags { fua: native_fua };
            match self.inner.fast_path() {
                Some(fast) => fast.write_vectored_at(bufs, offset, pass)?,
                None => write_each(&*self.inner, bufs, offset, pass)?,
            }
        } else {
            let mut at = offset;
            for buf in bufs {
                self.write(buf, at, WriteFlags { fua: native_fua })?;
                at += buf.len() as u64;
            }
        }
        if flags.fua && !native_fua {
            self.flush_for(Op::Write, offset, total as u64)?;
        }
        Ok(())
    }

    /// The file and page-cache residency for a zero-copy read of this range; see
    /// [`FastPath::cached_file`](crate::FastPath::cached_file). The descriptor stays
    /// valid while any clone of this handle lives.
    pub fn cached_file(&self, offset: u64, len: u64) -> Result<Option<std::os::fd::RawFd>> {
        self.check(Op::Read, offset, len)?;
        Ok(self
            .inner
            .fast_path()
            .and_then(|f| f.cached_file(offset, len)))
    }

    /// The range in a mapping of the cached file, for a read with one copy; see
    /// [`FastPath::mapped_cached`](crate::FastPath::mapped_cached). Valid while any
    /// clone of this handle lives.
    pub fn mapped_cached(&self, offset: u64, len: u64) -> Result<Option<crate::MappedRange>> {
        self.check(Op::Read, offset, len)?;
        Ok(self
            .inner
            .fast_path()
            .and_then(|f| f.mapped_cached(offset, len)))
    }

    /// Writes `buf` at `offset`; with FUA the data is durable when this returns.
    pub fn write(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.check(Op::Write, offset, buf.len() as u64)?;
        let native_fua = flags.fua && self.native.fua.is_native();
        let max = self.max_transfer();
        for (index, chunk) in buf.chunks(max).enumerate() {
            let pass = WriteFlags { fua: native_fua };
            self.inner
                .write_at(chunk, offset + (index * max) as u64, pass)?;
        }
        if flags.fua && !native_fua {
            self.flush_for(Op::Write, offset, buf.len() as u64)?;
        }
        Ok(())
    }

    /// A queue for many requests in flight from one thread, when the device has one
    /// natively (see [`FastPath::queue`](crate::FastPath::queue)); every submission
    /// is checked here first. FUA on a queued write needs native FUA.
    pub fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        let inner = self.inner.fast_path()?.queue()?;
        Some(Box::new(CheckedQueue {
            device: self,
            inner,
            refused: Vec::new(),
            waker: None,
        }))
    }

    /// Makes all completed writes durable.
    pub fn flush(&self) -> Result<()> {
        if self.native.flush.is_native() {
            self.inner.flush()
        } else {
            Err(Error::new(ErrorKind::Unsupported, Op::Flush, 0, 0))
        }
    }

    fn flush_for(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        self.flush().map_err(|e| {
            Error::new(e.kind(), op, offset, len).with_detail(format!("FUA flush failed: {e}"))
        })
    }

    /// Discards a range. Trim is a hint: a device that cannot trim ignores it.
    pub fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.check(Op::Trim, offset, len)?;
        if self.native.trim.is_native() {
            let native_fua = flags.fua && self.native.fua.is_native();
            for (at, piece) in pieces(offset, len, self.info.limits.max_trim) {
                match self.inner.trim(at, piece, WriteFlags { fua: native_fua }) {
                    Err(e) if e.kind() == ErrorKind::Unsupported => return Ok(()),
                    other => other?,
                }
            }
            if flags.fua && !native_fua {
                self.flush_for(Op::Trim, offset, len)?;
            }
        }
        Ok(())
    }

    /// Makes a range read as zeroes. With `fast`, fails with
    /// [`ErrorKind::Unsupported`] (and changes nothing) unless zeroing is native.
    pub fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.check(Op::WriteZeroes, offset, len)?;
        if self.native.write_zeroes.is_native() {
            let fast_ok = !flags.fast || self.native.fast_zero.is_native();
            if fast_ok {
                let native_fua = flags.fua && self.native.fua.is_native();
                let pass = ZeroFlags {
                    fua: native_fua,
                    ..flags
                };
                let mut result = Ok(());
                for (at, piece) in pieces(offset, len, self.info.limits.max_write_zeroes) {
                    result = self.inner.write_zeroes(at, piece, pass);
                    if result.is_err() {
                        break;
                    }
                }
                match result {
                    Ok(()) => {
                        if flags.fua && !native_fua {
                            self.flush_for(Op::WriteZeroes, offset, len)?;
                        }
                        return Ok(());
                    }
                    // The device declined this range (a file system without
                    // fallocate modes, say): fall through to writing zeroes.
                    Err(e) if e.kind() == ErrorKind::Unsupported && !flags.fast => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if flags.fast {
            return Err(
                Error::new(ErrorKind::Unsupported, Op::WriteZeroes, offset, len)
                    .with_detail("zeroing is not faster than writing on this device"),
            );
        }
        self.write_zero_buffers(offset, len, flags.fua)
    }

    fn write_zero_buffers(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        let chunk = ZERO_CHUNK.min(len).min(self.max_transfer() as u64) as usize;
        let zeroes = IoBuf::zeroed(chunk);
        let minimum = u64::from(self.info.block_sizes.minimum);
        let step = (chunk as u64 / minimum).max(1) * minimum;
        for (at, piece) in pieces(offset, len, step) {
            self.inner
                .write_at(&zeroes[..piece as usize], at, WriteFlags::NONE)
                .map_err(|e| {
                    Error::new(e.kind(), Op::WriteZeroes, offset, len)
                        .with_detail(format!("emulated by writing zeroes: {e}"))
                })?;
        }
        if fua {
            self.flush_for(Op::WriteZeroes, offset, len)?;
        }
        Ok(())
    }

    /// Whether all of `offset..offset+len` is a hole that reads as zeroes (see
    /// [`FastPath::is_hole`](crate::FastPath::is_hole)); `false` when the device
    /// cannot tell.
    pub fn is_hole(&self, offset: u64, len: u64) -> Result<bool> {
        self.check(Op::Extents, offset, len)?;
        if len == 0 || !self.native.extents.is_native() {
            return Ok(false);
        }
        if let Some(hole) = self.inner.fast_path().and_then(|f| f.is_hole(offset, len)) {
            return Ok(hole);
        }
        let extents = self.extents(offset, len)?;
        Ok(extents.len() == 1 && extents[0].state.reads_zero())
    }

    /// The extents covering `offset..offset+len`, in order, starting exactly at
    /// `offset`. The list may stop short of the end (ask again from there) and its
    /// last extent is clipped to the range.
    pub fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.check(Op::Extents, offset, len)?;
        let whole = || {
            vec![Extent {
                offset,
                len,
                state: ExtentState::Data,
            }]
        };
        if len == 0 || !self.native.extents.is_native() {
            return Ok(whole());
        }
        let mut raw = Vec::new();
        match self.inner.extents(offset, len, &mut raw) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Unsupported => return Ok(whole()),
            Err(e) => return Err(e),
        }
        Ok(normalise_extents(raw, offset, offset + len).unwrap_or_else(whole))
    }

    /// Hints that a range will be read soon.
    pub fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.check(Op::Cache, offset, len)?;
        if self.native.cache.is_native() {
            match self.inner.cache(offset, len) {
                Err(e) if e.kind() == ErrorKind::Unsupported => {}
                other => other?,
            }
        }
        Ok(())
    }
}

/// Splits `offset..offset+len` into pieces of at most `max` bytes.
/// A device's own queue behind the handle's checks: a request the handle refuses
/// comes back failed from the next `complete`, without reaching the device.
struct CheckedQueue<'a> {
    device: &'a Device,
    inner: Box<dyn RequestQueue + 'a>,
    refused: Vec<Completion>,
    waker: Option<std::task::Waker>,
}

impl CheckedQueue<'_> {
    fn refuse(&mut self, tag: u64, buf: IoBuf, error: Error) {
        self.refused.push(Completion {
            tag,
            buf,
            result: Err(error),
        });
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }

    /// Whether the device does `command` natively, as one request: otherwise the
    /// synchronous method has to split or emulate it.
    fn takes(&self, command: &QueuedCommand) -> bool {
        let native = &self.device.native;
        let limits = &self.device.info.limits;
        let fua_ok = |flags: WriteFlags| !flags.fua || native.fua.is_native();
        match *command {
            QueuedCommand::Flush => native.flush.is_native(),
            QueuedCommand::Trim { len, flags, .. } => {
                native.trim.is_native() && fua_ok(flags) && len <= limits.max_trim
            }
            QueuedCommand::WriteZeroes { len, flags, .. } => {
                native.write_zeroes.is_native()
                    && fua_ok(WriteFlags { fua: flags.fua })
                    && (!flags.fast || native.fast_zero.is_native())
                    && len <= limits.max_write_zeroes
            }
        }
    }

    fn check(&self, submission: &Submission) -> Result<()> {
        let len = submission.buf.len() as u64;
        let op = match submission.op {
            QueuedOp::Read => Op::Read,
            QueuedOp::Write(_) => Op::Write,
        };
        self.device.check(op, submission.offset, len)?;
        if len > self.device.max_transfer() as u64 {
            return Err(
                Error::new(ErrorKind::TooLarge, op, submission.offset, len).with_detail(format!(
                    "a queued request is at most {} bytes",
                    self.device.max_transfer()
                )),
            );
        }
        if matches!(submission.op, QueuedOp::Write(flags) if flags.fua)
            && !self.device.native.fua.is_native()
        {
            return Err(
                Error::new(ErrorKind::Unsupported, op, submission.offset, len)
                    .with_detail("FUA on a queued write needs a device with native FUA"),
            );
        }
        Ok(())
    }
}

impl RequestQueue for CheckedQueue<'_> {
    fn submit(&mut self, submission: Submission) {
        match self.check(&submission) {
            Ok(()) => self.inner.submit(submission),
            Err(error) => self.refuse(submission.tag, submission.buf, error),
        }
    }

    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        let range = match command {
            QueuedCommand::Flush => None,
            QueuedCommand::Trim { offset, len, .. } => Some((Op::Trim, offset, len)),
            QueuedCommand::WriteZeroes { offset, len, .. } => Some((Op::WriteZeroes, offset, len)),
        };
        if let Some((op, offset, len)) = range {
            if let Err(error) = self.device.check(op, offset, len) {
                self.refuse(tag, IoBuf::new(0), error);
                return Ok(());
            }
        }
        if !self.takes(&command) {
            return Err(command);
        }
        self.inner.submit_command(tag, command)
    }

    fn set_waker(&mut self, waker: std::task::Waker) -> bool {
        self.waker = Some(waker.clone());
        self.inner.set_waker(waker)
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        let refused = self.refused.len();
        out.append(&mut self.refused);
        self.inner.complete(min.saturating_sub(refused), out);
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.refused.len()
    }
}

fn pieces(offset: u64, len: u64, max: u64) -> impl Iterator<Item = (u64, u64)> {
    let max = max.max(1);
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        (at < end).then(|| {
            let piece = (end - at).min(max);
            let this = (at, piece);
            at += piece;
            this
        })
    })
}

/// Makes a device's extent list safe to pass on: contiguous from `start`, adjacent
/// extents of one state merged, clipped to `end`, at most [`MAX_EXTENTS`] long.
/// `None` when the device returned something unusable (a gap, an empty list).
fn normalise_extents(raw: Vec<Extent>, start: u64, end: u64) -> Option<Vec<Extent>> {
    let mut out: Vec<Extent> = Vec::with_capacity(raw.len().min(MAX_EXTENTS));
    let mut expected = start;
    for extent in raw {
        if extent.len == 0 {
            continue;
        }
        if extent.offset > expected || extent.end() <= expected {
            return None;
        }
        let clipped_end = extent.end().min(end);
        let piece = Extent {
            offset: expected,
            len: clipped_end - expected,
            state: extent.state,
        };
        let count = out.len();
        match out.last_mut() {
            Some(last) if last.state == piece.state => last.len += piece.len,
            _ if count == MAX_EXTENTS => break,
            _ => out.push(piece),
        }
        expected = clipped_end;
        if expected >= end {
            break;
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryDevice;

    fn extent(offset: u64, len: u64, state: ExtentState) -> Extent {
        Extent { offset, len, state }
    }

    #[test]
    fn pieces_cover_the_range() {
        let got: Vec<_> = pieces(10, 25, 10).collect();
        assert_eq!(got, vec![(10, 10), (20, 10), (30, 5)]);
        assert_eq!(pieces(0, 0, 10).count(), 0);
    }

    #[test]
    fn extents_are_merged_and_clipped() {
        let raw = vec![
            extent(0, 100, ExtentState::Data),
            extent(100, 50, ExtentState::Data),
            extent(150, 1000, ExtentState::Hole),
        ];
        let got = normalise_extents(raw, 20, 400).unwrap();
        assert_eq!(
            got,
            vec![
                extent(20, 130, ExtentState::Data),
                extent(150, 250, ExtentState::Hole)
            ]
        );
    }

    #[test]
    fn extents_with_gaps_are_rejected() {
        let raw = vec![
            extent(0, 10, ExtentState::Data),
            extent(20, 10, ExtentState::Hole),
        ];
        assert_eq!(normalise_extents(raw, 0, 30), None);
        assert_eq!(normalise_extents(Vec::new(), 0, 30), None);
    }

    #[test]
    fn handle_checks_ranges_before_the_device_sees_them() {
        let device = Device::from_device(MemoryDevice::new(4096));
        let mut buf = [0u8; 16];
        let err = device.read(&mut buf, 4090).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::OutOfRange);
        let err = device
            .write(&buf, u64::MAX - 4, WriteFlags::NONE)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::OutOfRange);
    }

    #[test]
    fn read_only_handle_refuses_writes() {
        let device = Device::from_device(MemoryDevice::new(4096)).read_only();
        assert!(device.info().read_only);
        let err = device.write(&[1, 2, 3], 0, WriteFlags::NONE).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ReadOnly);
        let err = device.trim(0, 512, WriteFlags::NONE).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ReadOnly);
    }
}
