//! A wrapper that makes any device read-only.

use std::sync::Arc;

use crate::device::{BlockDevice, Extent, WriteFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::fast_path::FastPath;
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

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        self.inner.extents(offset, len, out)
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.cache(offset, len)
    }

    /// The inner device's fast paths, unchanged: reads from the page cache, hole
    /// answers and the request queue. Their writes (a vectored write, a queued write,
    /// trim or write-zeroes) reach a device only through the checked handle, which
    /// refuses every one of them on a read-only device before they get here.
    fn fast_path(&self) -> Option<&dyn FastPath> {
        self.inner.fast_path()
    }
}
