//! The optional fast paths of a device: reads served without a thread hand-off or a
//! copy, cheap hole answers, vectored writes and a device's own request queue.
//!
//! A [`BlockDevice`] that has any of them returns itself from
//! [`BlockDevice::fast_path`]; one that has none keeps the default `None` and every
//! request takes the plain route (the answers below are then what the defaults
//! give). A composer that only passes requests on forwards that one method; one that
//! changes what a fast path does (counts it, splits it across members, paces it)
//! implements this trait itself. Callers reach these hooks through the checked handle
//! ([`crate::Device`]), which has already checked the range, the alignment and, for a
//! write, that the device is writable.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::RawFd;

use crate::device::{write_each, BlockDevice, WriteFlags};
use crate::error::Result;
use crate::mapping::MappedRange;
use crate::queue::RequestQueue;

/// The fast-path hooks of a device, each with a default that means "take the plain
/// route". A device implements the ones it has and returns `Some(self)` from
/// [`BlockDevice::fast_path`].
pub trait FastPath: BlockDevice {
    /// Like [`read_at`](BlockDevice::read_at), but only if it can finish without
    /// waiting for hardware (the data is in a cache). Returns `Ok(false)`, with `buf`
    /// unspecified, when the read would block; the caller then retries with `read_at`
    /// on a thread that may block. Lets a target serve cached reads without a thread
    /// hand-off.
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
    fn mapped_cached(&self, offset: u64, len: u64) -> Option<MappedRange> {
        let _ = (offset, len);
        None
    }

    /// Whether all of `offset..offset+len` is a hole (stores nothing, reads as
    /// zeroes), when the device can tell more cheaply than an extent query; `None`
    /// means "ask [`extents`](BlockDevice::extents)". Lets a target answer the read of
    /// a hole without reading it, on every large read, so it must be cheap.
    fn is_hole(&self, offset: u64, len: u64) -> Option<bool> {
        let _ = (offset, len);
        None
    }

    /// Writes several buffers, in order, from `offset` (one `pwritev` for a file):
    /// lets a target write a run of requests without gathering them first. The
    /// default writes each buffer in turn with [`write_at`](BlockDevice::write_at).
    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        write_each(self, bufs, offset, flags)
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

#[cfg(test)]
mod tests {
    use std::io::IoSlice;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::error::{ErrorKind, Op};
    use crate::info::DeviceInfo;
    use crate::meter::IoMeter;
    use crate::{
        Device, Extent, FileDevice, FileOptions, MemoryDevice, Metered, ReadOnly, Stripe, Throttle,
        ThrottleConfig,
    };

    /// Every request the meter saw: the operation and the bytes it moved.
    #[derive(Default)]
    struct Seen(Mutex<Vec<(Op, u64)>>);

    impl IoMeter for Arc<Seen> {
        fn started(&self) {}

        fn finished(&self, op: Op, bytes: u64, _elapsed: Duration, _error: Option<ErrorKind>) {
            self.0.lock().unwrap().push((op, bytes));
        }
    }

    /// A 1 MiB file in tmpfs (where every page is resident, so the cached-read paths
    /// always answer) with 64 KiB of fives at its start and a hole from 512 KiB on.
    fn resident_file() -> Option<(tempfile::TempDir, Arc<FileDevice>)> {
        let dir = tempfile::tempdir_in("/dev/shm").ok()?;
        let path = dir.path().join("disk.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let file = FileDevice::open(&path, FileOptions::default()).unwrap();
        file.write_at(&[5u8; 65536], 0, WriteFlags::NONE).unwrap();
        // The fast paths below must answer on their own, never by luck of residency.
        let direct = file.fast_path().unwrap();
        direct.mapped_cached(0, 65536)?;
        direct.is_hole(512 << 10, 512 << 10)?;
        Some((dir, Arc::new(file)))
    }

    #[test]
    fn a_stack_of_composers_reaches_the_files_fast_paths_through_one_method() {
        let Some((_dir, file)) = resident_file() else {
            eprintln!("skipped: no tmpfs at /dev/shm with mappable files");
            return;
        };
        let seen = Arc::new(Seen::default());
        let read_only = Device::new(Arc::new(ReadOnly::new(file.clone())));
        let stack = Metered::wrap(read_only, seen.clone());
        assert!(stack.has_fast_path());

        let direct = file.fast_path().unwrap();
        let mapped = stack
            .mapped_cached(0, 65536)
            .unwrap()
            .expect("a mapped read");
        assert_eq!(mapped.len(), 65536);
        let same = direct.mapped_cached(0, 65536).unwrap();
        assert_eq!(mapped.as_ptr(), same.as_ptr(), "the file's own mapping");
        let fd = stack.cached_file(0, 65536).unwrap();
        assert!(fd.is_some());
        assert_eq!(fd, direct.cached_file(0, 65536));
        assert!(stack.is_hole(512 << 10, 512 << 10).unwrap());
        assert!(!stack.is_hole(0, 65536).unwrap());
        let mut buf = vec![0u8; 4096];
        assert!(stack.try_read(&mut buf, 4096).unwrap());
        assert!(buf.iter().all(|&b| b == 5));

        // Each answer was counted as the read it stands for, and none of them took
        // the slow road (an extent query, or a read).
        let counted = seen.0.lock().unwrap().clone();
        assert_eq!(
            counted,
            [
                (Op::Read, 65536),
                (Op::Read, 65536),
                (Op::Read, 512 << 10),
                (Op::Read, 4096),
            ]
        );
    }

    #[test]
    fn the_read_only_view_refuses_the_fast_paths_writes() {
        let Some((_dir, file)) = resident_file() else {
            eprintln!("skipped: no tmpfs at /dev/shm with mappable files");
            return;
        };
        let view = Device::new(Arc::new(ReadOnly::new(file.clone())));
        let new_bytes = [9u8; 4096];
        let error = view
            .write_vectored(&[IoSlice::new(&new_bytes)], 0, WriteFlags::NONE)
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ReadOnly);
        let error = Device::from_device(ReadOnly::new(file.clone()))
            .write(&new_bytes, 0, WriteFlags::NONE)
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ReadOnly);
        let mut back = vec![0u8; 4096];
        file.read_at(&mut back, 0).unwrap();
        assert!(back.iter().all(|&b| b == 5), "the file is unchanged");
    }

    #[test]
    fn a_throttle_keeps_only_the_fast_paths_that_pay_for_their_bytes() {
        let Some((_dir, file)) = resident_file() else {
            eprintln!("skipped: no tmpfs at /dev/shm with mappable files");
            return;
        };
        let config = ThrottleConfig {
            rate: Some(1 << 30),
            latency: Duration::ZERO,
        };
        let throttled = Device::from_device(Throttle::new(Device::new(file.clone()), config));
        let mut buf = vec![0u8; 4096];
        assert!(!throttled.try_read(&mut buf, 0).unwrap());
        assert_eq!(throttled.cached_file(0, 65536).unwrap(), None);
        assert!(throttled.mapped_cached(0, 65536).unwrap().is_none());
        assert!(!throttled.is_hole(512 << 10, 512 << 10).unwrap());
        assert!(throttled.queue().is_none());
        let parts = [[1u8; 4096], [2u8; 4096]];
        let slices = parts.map(|p| p.to_vec());
        let slices: Vec<IoSlice<'_>> = slices.iter().map(|p| IoSlice::new(p)).collect();
        throttled
            .write_vectored(&slices, 65536, WriteFlags::NONE)
            .unwrap();
        let mut back = vec![0u8; 8192];
        throttled.read(&mut back, 65536).unwrap();
        assert_eq!(back, [parts[0], parts[1]].concat());
    }

    /// Only the required core, as an initiator without a request queue would have.
    struct CoreOnly {
        inner: MemoryDevice,
        writes: AtomicU64,
    }

    impl BlockDevice for CoreOnly {
        fn info(&self) -> DeviceInfo {
            self.inner.info()
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.inner.read_at(buf, offset)
        }

        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.inner.write_at(buf, offset, flags)
        }

        fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
            self.inner.extents(offset, len, out)
        }
    }

    fn core_only() -> Arc<CoreOnly> {
        Arc::new(CoreOnly {
            inner: MemoryDevice::new(1 << 20),
            writes: AtomicU64::new(0),
        })
    }

    #[test]
    fn a_device_without_fast_paths_takes_the_plain_route() {
        let device = core_only();
        let handle = Device::new(device.clone());
        assert!(!handle.has_fast_path());
        let mut buf = vec![0u8; 4096];
        assert!(!handle.try_read(&mut buf, 0).unwrap());
        assert_eq!(handle.cached_file(0, 4096).unwrap(), None);
        assert!(handle.mapped_cached(0, 4096).unwrap().is_none());
        assert!(handle.queue().is_none());
        // Holes are still found, by an extent query.
        assert!(handle.is_hole(0, 65536).unwrap());
        // A vectored write is one write per buffer.
        let parts = [vec![3u8; 4096], vec![4u8; 8192]];
        let slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        handle
            .write_vectored(&slices, 4096, WriteFlags::NONE)
            .unwrap();
        assert_eq!(device.writes.load(Ordering::Relaxed), 2);
        let mut back = vec![0u8; 12288];
        handle.read(&mut back, 4096).unwrap();
        assert_eq!(back, parts.concat());
        assert!(!handle.is_hole(0, 65536).unwrap());

        // Composers over it offer none either, so it stays on the plain route.
        let seen = Arc::new(Seen::default());
        assert!(!Metered::wrap(handle.clone(), seen).has_fast_path());
        assert!(!handle.read_only().has_fast_path());
        let stripe = Stripe::new(vec![handle.clone(), Device::new(core_only())], 65536);
        assert!(!Device::from_device(stripe.unwrap()).has_fast_path());
    }

    #[test]
    fn devices_with_fast_paths_offer_them() {
        let memory = Device::from_device(MemoryDevice::new(1 << 20));
        assert!(memory.has_fast_path());
        let mut buf = vec![1u8; 4096];
        assert!(memory.try_read(&mut buf, 0).unwrap(), "memory never blocks");
        assert!(buf.iter().all(|&b| b == 0));
        let plain = Device::new(core_only());
        let stripe = Stripe::new(vec![memory.clone(), plain], 65536).unwrap();
        assert!(Device::from_device(stripe).has_fast_path());
        assert!(memory.read_only().has_fast_path());
    }
}
