//! A wrapper that makes any device read-only.

use std::sync::Arc;

use crate::device::{BlockDevice, Extent, WriteFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::info::{DeviceInfo, Support};

/// Serves reads from the inner device and refuses every write.
pub struct ReadOnly {
    inner: Arc<dyn BlockDevice>,
}

impl ReadOnly {
    pub fn new(inner: Arc<dyn BlockDevice>) -> ReadOnly {
        ReadOnly { inner }
    }
}

impl BlockDevice for ReadOnly {
    fn info(&self) -> DeviceInfo {
        let mut info = self.inner.info();
        info.read_only = true;
        let caps = &mut info.capabilities;
        caps.fua = Support::None;
        caps.trim = Support::None;
        caps.write_zeroes = Support::None;
        caps.fast_zero = Support::None;
        info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        self.inner.try_read_at(buf, offset)
    }

    fn cached_file(&self, offset: u64, len: u64) -> Option<std::os::fd::RawFd> {
        self.inner.cached_file(offset, len)
    }

    fn mapped_cached(&self, offset: u64, len: u64) -> Option<crate::MappedRange> {
        self.inner.mapped_cached(offset, len)
    }

    fn write_at(&self, buf: &[u8], offset: u64, _flags: WriteFlags) -> Result<()> {
        Err(Error::new(
            ErrorKind::ReadOnly,
            Op::Write,
            offset,
            buf.len() as u64,
        ))
    }

    fn flush(&self) -> Result<()> {
        // Nothing is ever written through this wrapper, but a flush must still reach
        // writes made through other handles to the same device.
        self.inner.flush()
    }

    fn is_hole(&self, offset: u64, len: u64) -> Option<bool> {
        self.inner.is_hole(offset, len)
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        self.inner.extents(offset, len, out)
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.cache(offset, len)
    }

    /// The inner device's queue: requests reach it only through the checked
    /// handle, which refuses every write, trim and write-zeroes of a read-only
    /// device before they get here, so only reads and flushes pass.
    fn queue(&self) -> Option<Box<dyn crate::RequestQueue + '_>> {
        self.inner.queue()
    }
}
