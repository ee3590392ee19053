//! A composer that counts every request on its way to a device: the operation, the
//! bytes moved, how long it took and how it failed, reported to an [`IoMeter`].
//! `serve` puts one in front of each export for each protocol, so the protocol
//! targets count nothing themselves.
//!
//! It wraps a checked handle and presents every operation the handle offers as
//! native, so the handle in front of it passes requests through as the target made
//! them (a write-zeroes stays one write-zeroes, a FUA write one FUA write) and the
//! emulation happens behind the count.
//!
//! Fast paths count as the reads they answer: a range served straight from the page
//! cache ([`FastPath::cached_file`]) or known to be a hole ([`FastPath::is_hole`]) is
//! counted as a read of its length when the target is told it may skip the read. A
//! [`FastPath::try_read_at`] that would block is not counted; the `read_at` that
//! follows it is.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;
use std::time::Instant;

use crate::device::{BlockDevice, Extent, WriteFlags, ZeroFlags};
use crate::error::{Op, Result};
use crate::fast_path::FastPath;
use crate::handle::Device;
use crate::info::{DeviceInfo, Support};
use crate::meter::IoMeter;
use crate::metered_queue::MeteredQueue;
use crate::queue::RequestQueue;

/// A device whose requests are counted by `M`.
pub struct Metered<M> {
    inner: Device,
    info: DeviceInfo,
    meter: M,
}

/// What the handle offers, as native: the handle does the emulating.
fn as_native(support: Support) -> Support {
    if support.available() {
        Support::Native
    } else {
        Support::None
    }
}

impl<M: IoMeter> Metered<M> {
    pub fn new(inner: Device, meter: M) -> Metered<M> {
        let mut info = *inner.info();
        let caps = &mut info.capabilities;
        caps.flush = as_native(caps.flush);
        caps.fua = as_native(caps.fua);
        caps.trim = as_native(caps.trim);
        caps.write_zeroes = as_native(caps.write_zeroes);
        caps.extents = as_native(caps.extents);
        caps.cache = as_native(caps.cache);
        // fast_zero stays as the handle says: only native zeroing is fast.
        Metered { inner, info, meter }
    }

    /// `inner` behind a counting layer, as a checked handle.
    pub fn wrap(inner: Device, meter: M) -> Device
    where
        M: 'static,
    {
        Device::from_device(Metered::new(inner, meter))
    }

    /// Runs one request, counting it: `bytes` are reported only if it succeeds.
    fn count<T>(&self, op: Op, bytes: u64, run: impl FnOnce() -> Result<T>) -> Result<T> {
        self.meter.started();
        let started = Instant::now();
        let result = run();
        let elapsed = started.elapsed();
        match &result {
            Ok(_) => self.meter.finished(op, bytes, elapsed, None),
            Err(e) => self.meter.finished(op, 0, elapsed, Some(e.kind())),
        }
        result
    }

    /// Counts a read answered without reading (a cached-file or hole reply).
    fn count_answered_read(&self, len: u64, started: Instant) {
        self.meter.started();
        self.meter.finished(Op::Read, len, started.elapsed(), None);
    }
}

impl<M: IoMeter> BlockDevice for Metered<M> {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.count(Op::Read, len, || self.inner.read(buf, offset))
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let len = buf.len() as u64;
        self.count(Op::Write, len, || self.inner.write(buf, offset, flags))
    }

    fn flush(&self) -> Result<()> {
        self.count(Op::Flush, 0, || self.inner.flush())
    }

    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.count(Op::Trim, 0, || self.inner.trim(offset, len, flags))
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.count(Op::WriteZeroes, 0, || {
            self.inner.write_zeroes(offset, len, flags)
        })
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        let extents = self.count(Op::Extents, 0, || self.inner.extents(offset, len))?;
        out.extend(extents);
        Ok(())
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.count(Op::Cache, 0, || self.inner.cache(offset, len))
    }

    /// Counted fast paths, when the device behind the handle has any; without, every
    /// request takes the plain route, counted there.
    fn fast_path(&self) -> Option<&dyn FastPath> {
        self.inner.has_fast_path().then_some(self as &dyn FastPath)
    }
}

impl<M: IoMeter> FastPath for Metered<M> {
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        let started = Instant::now();
        match self.inner.try_read(buf, offset) {
            Ok(true) => {
                self.count_answered_read(buf.len() as u64, started);
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => {
                self.meter.started();
                self.meter
                    .finished(Op::Read, 0, started.elapsed(), Some(e.kind()));
                Err(e)
            }
        }
    }

    fn try_read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<bool> {
        let started = Instant::now();
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        match self.inner.try_read_vectored(bufs, offset) {
            Ok(true) => {
                self.count_answered_read(len, started);
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => {
                self.meter.started();
                self.meter
                    .finished(Op::Read, 0, started.elapsed(), Some(e.kind()));
                Err(e)
            }
        }
    }

    fn cached_file(&self, offset: u64, len: u64) -> Option<RawFd> {
        let started = Instant::now();
        let fd = self.inner.cached_file(offset, len).ok().flatten()?;
        self.count_answered_read(len, started);
        Some(fd)
    }

    fn mapped_cached(&self, offset: u64, len: u64) -> Option<crate::MappedRange> {
        let started = Instant::now();
        let range = self.inner.mapped_cached(offset, len).ok().flatten()?;
        self.count_answered_read(len, started);
        Some(range)
    }

    fn is_hole(&self, offset: u64, len: u64) -> Option<bool> {
        let started = Instant::now();
        let hole = self.inner.is_hole(offset, len).ok()?;
        if hole {
            self.count_answered_read(len, started);
        }
        Some(hole)
    }

    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let len = bufs.iter().map(|b| b.len() as u64).sum();
        self.count(Op::Write, len, || {
            self.inner.write_vectored(bufs, offset, flags)
        })
    }

    /// The handle's queue (checked there), each request counted.
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        let inner = self.inner.queue()?;
        Some(Box::new(MeteredQueue::new(inner, &self.meter)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::{conformance, MemoryDevice};
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Counts what it is told; a lock is fine in a test.
    #[derive(Default)]
    struct Tally {
        in_flight: AtomicI64,
        bytes: AtomicU64,
        seen: Mutex<Vec<(Op, u64, Option<ErrorKind>)>>,
    }

    impl IoMeter for Arc<Tally> {
        fn started(&self) {
            self.in_flight.fetch_add(1, Ordering::Relaxed);
        }

        fn finished(&self, op: Op, bytes: u64, _elapsed: Duration, error: Option<ErrorKind>) {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
            self.seen.lock().unwrap().push((op, bytes, error));
        }
    }

    fn metered(inner: Device) -> (Device, Arc<Tally>) {
        let tally = Arc::new(Tally::default());
        (Metered::wrap(inner, tally.clone()), tally)
    }

    #[test]
    fn passes_the_conformance_suite() {
        let (device, tally) = metered(Device::from_device(MemoryDevice::new(16 << 20)));
        conformance::run_all(&device);
        assert_eq!(tally.in_flight.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn counts_requests_as_the_target_made_them() {
        let (device, tally) = metered(Device::from_device(MemoryDevice::new(1 << 20)));
        device.write(&[7u8; 8192], 4096, WriteFlags::FUA).unwrap();
        device.write_zeroes(0, 65536, ZeroFlags::default()).unwrap();
        let mut buf = [0u8; 4096];
        device.read(&mut buf, 4096).unwrap();
        device.flush().unwrap();
        let seen = tally.seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                (Op::Write, 8192, None),
                (Op::WriteZeroes, 0, None),
                (Op::Read, 4096, None),
                (Op::Flush, 0, None),
            ]
        );
        assert_eq!(tally.in_flight.load(Ordering::Relaxed), 0);
    }

    /// Fails every read as a broken medium would.
    struct BadMedium;

    impl BlockDevice for BadMedium {
        fn info(&self) -> DeviceInfo {
            DeviceInfo::new(1 << 20)
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            Err(crate::Error::new(
                ErrorKind::Io,
                Op::Read,
                offset,
                buf.len() as u64,
            ))
        }

        fn write_at(&self, _buf: &[u8], _offset: u64, _flags: WriteFlags) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn counts_a_failure_by_its_kind_and_no_bytes() {
        let (device, tally) = metered(Device::from_device(BadMedium));
        let mut buf = [0u8; 512];
        assert_eq!(device.read(&mut buf, 0).unwrap_err().kind(), ErrorKind::Io);
        device.write(&buf, 0, WriteFlags::NONE).unwrap();
        assert_eq!(
            tally.seen.lock().unwrap().clone(),
            [(Op::Read, 0, Some(ErrorKind::Io)), (Op::Write, 512, None)]
        );
        assert_eq!(tally.bytes.load(Ordering::Relaxed), 512);
        assert_eq!(tally.in_flight.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_hole_answered_without_reading_counts_as_a_read() {
        let (device, tally) = metered(Device::from_device(MemoryDevice::new(1 << 20)));
        assert!(device.is_hole(0, 65536).unwrap());
        assert_eq!(
            tally.seen.lock().unwrap().clone(),
            [(Op::Read, 65536, None)]
        );
    }
}
