//! The `BlockDevice` trait: the one interface between storage and everything that moves
//! or measures bytes.

use std::io::IoSlice;

use crate::error::{Error, ErrorKind, Op, Result};
use crate::fast_path::FastPath;
use crate::info::DeviceInfo;

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

    /// Writes `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()>;

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

    /// The device's fast paths (cached reads without a thread hand-off or a copy,
    /// cheap hole answers, vectored writes, its own request queue), when it has any:
    /// a device that has them returns `Some(self)`, a composer that only passes
    /// requests on returns its inner device's. `None`, the default, sends every
    /// request the plain route. The answer does not change over the device's life.
    fn fast_path(&self) -> Option<&dyn FastPath> {
        None
    }
}

/// Writes each buffer in turn with [`BlockDevice::write_at`], from `offset` on: the
/// default of [`FastPath::write_vectored_at`], and the route when a device has no fast
/// path.
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
