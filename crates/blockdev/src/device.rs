//! The `BlockDevice` trait: the one interface between storage and everything that moves
//! or measures bytes.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;

use crate::error::{Error, ErrorKind, Op, Result};
use crate::info::DeviceInfo;
use crate::queue::RequestQueue;

/// Options for a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteFlags {
    /// Forced unit access: the data must be durable before the call returns.
    pub fua: bool,
}

impl WriteFlags {
    pub const NONE: WriteFlags = WriteFlags { fua: false };
    pub const FUA: WriteFlags = WriteFlags { fua: true };
}

/// Options for write-zeroes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ZeroFlags {
    /// The data must be durable before the call returns.
    pub fua: bool,
    /// The range must stay allocated (no hole may be punched).
    pub no_hole: bool,
    /// Fail with [`ErrorKind::Unsupported`] unless zeroing is faster than writing.
    pub fast: bool,
}

/// The allocation state of an extent (NBD's `base:allocation` context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtentState {
    /// Allocated, contents unknown.
    Data,
    /// Allocated and known to read as zeroes.
    Zero,
    /// Not allocated; reads as zeroes.
    Hole,
}

impl ExtentState {
    /// Whether the extent reads as zeroes.
    pub fn reads_zero(self) -> bool {
        self != ExtentState::Data
    }
}

/// A run of bytes with one allocation state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    pub state: ExtentState,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A block device: a range of bytes with read, write, flush and friends.
///
/// Devices are shared by many connections and threads at once, so every method takes
/// `&self`. Offsets and lengths are bytes. Callers go through [`crate::Device`], which
/// guarantees that ranges are within the device, aligned to the minimum block size,
/// no larger than the device's maximum transfer, and that an operation is only called
/// when [`DeviceInfo::capabilities`] says it is native. Implementations therefore do
/// only what they natively can; the defaults report [`ErrorKind::Unsupported`].
pub trait BlockDevice: Send + Sync {
    /// Size, block sizes, limits and capabilities.
    fn info(&self) -> DeviceInfo;

    /// Fills `buf` with the bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Like [`read_at`](Self::read_at), but only if it can finish without waiting for
    /// hardware (the data is in a cache). Returns `Ok(false)`, with `buf` unspecified,
    /// when the read would block; the caller then retries with `read_at` on a thread
    /// that may block. Lets a target serve cached reads without a thread hand-off.
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        let _ = (buf, offset);
        Ok(false)
    }

    /// [`try_read_at`](Self::try_read_at) into several buffers filled in order from
    /// `offset` (one `preadv` for a file): lets a target read a run of requests
    /// straight into their response frames. The default tries each buffer in turn.
    fn try_read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<bool> {
        let mut at = offset;
        for buf in bufs.iter_mut() {
            if !self.try_read_at(buf, at)? {
                return Ok(false);
            }
            at += buf.len() as u64;
        }
        Ok(true)
    }

    /// Zero-copy reads: when this device's bytes at `offset..offset+len` are the same
    /// bytes of an open file and that range is entirely in the page cache, returns the
    /// file's descriptor, valid as long as the device lives. A target may then hand the
    /// cached pages straight to a socket (sendfile) instead of copying them through a
    /// buffer. `None` means "use read_at".
    fn cached_file(&self, offset: u64, len: u64) -> Option<RawFd> {
        let _ = (offset, len);
        None
    }

    /// Reads with one copy: when this device's bytes at `offset..offset+len` are the
    /// same bytes of a file and that range is entirely in the page cache, returns the
    /// range in a read-only mapping of the file, valid as long as the device lives. A
    /// target hands the address to send(2), so the data goes from the page cache to
    /// the socket without passing through a buffer. `None` means "use read_at".
    fn mapped_cached(&self, offset: u64, len: u64) -> Option<crate::MappedRange> {
        let _ = (offset, len);
        None
    }

    /// Whether all of `offset..offset+len` is a hole (stores nothing, reads as
    /// zeroes), when the device can tell more cheaply than an extent query; `None`
    /// means "ask [`extents`](Self::extents)". Lets a target answer the read of a hole
    /// without reading it, on every large read, so it must be cheap.
    fn is_hole(&self, offset: u64, len: u64) -> Option<bool> {
        let _ = (offset, len);
        None
    }

    /// Writes `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()>;

    /// Writes several buffers, in order, from `offset` (one `pwritev` for a file):
    /// lets a target write a run of requests without gathering them first. The
    /// default writes each buffer in turn.
    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        write_each(self, bufs, offset, flags)
    }

    /// Makes every completed write durable.
    fn flush(&self) -> Result<()> {
        Err(Error::new(ErrorKind::Unsupported, Op::Flush, 0, 0))
    }

    /// Discards a range; afterwards its contents are unspecified.
    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let _ = flags;
        Err(Error::new(ErrorKind::Unsupported, Op::Trim, offset, len))
    }

    /// Makes a range read as zeroes.
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let _ = flags;
        Err(Error::new(
            ErrorKind::Unsupported,
            Op::WriteZeroes,
            offset,
            len,
        ))
    }

    /// Appends the extents covering `offset..offset+len` to `out`, in order and
    /// without gaps. The last extent may end past the range; at least one is returned.
    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        let _ = out;
        Err(Error::new(ErrorKind::Unsupported, Op::Extents, offset, len))
    }

    /// Hints that a range will be read soon.
    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        Err(Error::new(ErrorKind::Unsupported, Op::Cache, offset, len))
    }

    /// A queue to keep many reads and writes in flight from one thread, when the
    /// device pipelines requests natively (an initiator's connections). `None`: use
    /// a thread per request in flight. Requests reach it through the checked handle
    /// ([`Device::queue`](crate::Device::queue)), already checked and within the
    /// maximum transfer size.
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        None
    }
}

/// Writes each buffer in turn with [`BlockDevice::write_at`], from `offset` on.
pub(crate) fn write_each<D: BlockDevice + ?Sized>(
    device: &D,
    bufs: &[IoSlice<'_>],
    offset: u64,
    flags: WriteFlags,
) -> Result<()> {
    let mut at = offset;
    for buf in bufs {
        device.write_at(buf, at, flags)?;
        at += buf.len() as u64;
    }
    Ok(())
}
