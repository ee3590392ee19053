//! A device with a small block size over one with a larger block size, by
//! read-modify-write: what lets a protocol with 512-byte sectors (AoE) serve a file
//! opened for direct I/O on a device or file system whose offsets and lengths must be
//! multiples of 4 KiB.
//!
//! Writes that cover only part of an inner block read the partial edge blocks first.
//! Two writes that touch the same inner block would then race (each writes back the
//! other's old data), so every write locks the blocks it touches, in one global order
//! (stripe index) so that two writes never wait for each other in a cycle.

use std::sync::{Mutex, MutexGuard};

use crate::buffer::IoBuf;
use crate::device::{BlockDevice, WriteFlags};
use crate::error::Result;
use crate::handle::Device;
use crate::info::{DeviceInfo, Support};

/// Lock stripes: enough that unrelated writes rarely share one.
const STRIPES: usize = 256;

/// Presents `inner` with a smaller minimum block size, emulating partial-block writes
/// by read-modify-write.
pub struct ReadModifyWrite {
    inner: Device,
    /// The inner device's minimum block size: the unit of read-modify-write.
    block: u64,
    info: DeviceInfo,
    stripes: Box<[Mutex<()>]>,
}

impl ReadModifyWrite {
    /// Wraps `inner`, presenting `minimum` (a power of two no larger than the inner
    /// minimum block size) as the minimum block size.
    pub fn new(inner: Device, minimum: u32) -> ReadModifyWrite {
        let mut info = *inner.info();
        let block = u64::from(info.block_sizes.minimum);
        info.block_sizes.minimum = minimum.min(info.block_sizes.minimum).max(1);
        info.block_sizes.preferred = info.block_sizes.preferred.max(block as u32);
        // Trim, zeroing and extents of partial blocks would need the same
        // read-modify-write; leave them to the checked handle's emulation (zeroes
        // become writes, everything reads as data).
        let caps = &mut info.capabilities;
        caps.trim = Support::None;
        caps.write_zeroes = Support::None;
        caps.fast_zero = Support::None;
        caps.extents = Support::None;
        caps.cache = Support::None;
        ReadModifyWrite {
            inner,
            block,
            info,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    fn aligned(&self, offset: u64, len: u64) -> bool {
        offset.is_multiple_of(self.block) && len.is_multiple_of(self.block)
    }

    /// The enclosing range of whole inner blocks.
    fn enclosing(&self, offset: u64, len: u64) -> (u64, u64) {
        let start = offset / self.block * self.block;
        let end = (offset + len).div_ceil(self.block) * self.block;
        (start, end - start)
    }

    /// Locks the stripes of every inner block in `[start, start+len)`, in stripe order.
    fn lock(&self, start: u64, len: u64) -> Vec<MutexGuard<'_, ()>> {
        let first = start / self.block;
        let blocks = len.div_ceil(self.block).max(1);
        let mut stripes: Vec<usize> = if blocks >= STRIPES as u64 {
            (0..STRIPES).collect()
        } else {
            (first..first + blocks)
                .map(|b| (b % STRIPES as u64) as usize)
                .collect()
        };
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .into_iter()
            .map(|s| self.stripes[s].lock().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }
}

impl BlockDevice for ReadModifyWrite {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        if self.aligned(offset, len) {
            return self.inner.read(buf, offset);
        }
        let (start, whole) = self.enclosing(offset, len);
        let mut bounce = IoBuf::new(whole as usize);
        self.inner.read(&mut bounce, start)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&bounce[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let len = buf.len() as u64;
        let (start, whole) = self.enclosing(offset, len);
        let _locks = self.lock(start, whole);
        if self.aligned(offset, len) {
            return self.inner.write(buf, offset, flags);
        }
        let mut merged = IoBuf::new(whole as usize);
        let block = self.block as usize;
        // Only the partial edge blocks hold data we must keep.
        if offset != start {
            self.inner.read(&mut merged[..block], start)?;
        }
        let end = offset + len;
        if !end.is_multiple_of(self.block) && (whole as usize > block || offset == start) {
            let last = whole as usize - block;
            self.inner.read(&mut merged[last..], start + last as u64)?;
        }
        let at = (offset - start) as usize;
        merged[at..at + buf.len()].copy_from_slice(buf);
        self.inner.write(&merged, start, flags)
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;
    use crate::file::{FileDevice, FileOptions};
    use crate::memory::MemoryDevice;
    use std::sync::Arc;

    /// An inner device with 4 KiB blocks: memory behind a handle that insists on them.
    struct FourK(MemoryDevice);

    impl BlockDevice for FourK {
        fn info(&self) -> DeviceInfo {
            let mut info = self.0.info();
            info.block_sizes.minimum = 4096;
            info
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
            self.0.write_at(buf, offset, flags)
        }
        fn flush(&self) -> Result<()> {
            self.0.flush()
        }
    }

    fn adapter(size: u64) -> Device {
        let inner = Device::from_device(FourK(MemoryDevice::new(size)));
        Device::from_device(ReadModifyWrite::new(inner, 512))
    }

    #[test]
    fn sector_writes_keep_their_neighbours() {
        let device = adapter(1 << 20);
        device
            .write(&[0xaa; 8192], 0, WriteFlags::default())
            .unwrap();
        device
            .write(&[0x55; 1024], 512, WriteFlags::default())
            .unwrap();
        device
            .write(&[0x11; 5120], 3584, WriteFlags::default())
            .unwrap();
        let mut back = vec![0; 12288];
        device.read(&mut back, 0).unwrap();
        assert!(back[..512].iter().all(|&b| b == 0xaa));
        assert!(back[512..1536].iter().all(|&b| b == 0x55));
        assert!(back[1536..3584].iter().all(|&b| b == 0xaa));
        assert!(back[3584..8704].iter().all(|&b| b == 0x11));
        assert!(back[8704..].iter().all(|&b| b == 0));
        let mut middle = vec![0; 1024];
        device.read(&mut middle, 1024).unwrap();
        assert_eq!(&middle[..512], &[0x55; 512]);
        assert_eq!(&middle[512..], &[0xaa; 512]);
    }

    #[test]
    fn concurrent_sector_writes_to_one_block_all_land() {
        let device = Arc::new(adapter(1 << 20));
        std::thread::scope(|s| {
            for sector in 0..8u64 {
                let device = device.clone();
                s.spawn(move || {
                    for round in 0..200u8 {
                        let fill = [sector as u8 * 16 + round % 16; 512];
                        device
                            .write(&fill, sector * 512, WriteFlags::default())
                            .unwrap();
                    }
                });
            }
        });
        let mut back = vec![0; 4096];
        device.read(&mut back, 0).unwrap();
        for sector in 0..8usize {
            let expected = sector as u8 * 16 + 199 % 16;
            assert!(back[sector * 512..(sector + 1) * 512]
                .iter()
                .all(|&b| b == expected));
        }
    }

    #[test]
    fn passes_the_conformance_suite() {
        conformance::run_all(&adapter(8 << 20));
    }

    #[test]
    fn passes_the_conformance_suite_over_direct_io() {
        let file = tempfile::NamedTempFile::new_in(".").unwrap();
        file.as_file().set_len(8 << 20).unwrap();
        let options = FileOptions {
            direct: true,
            ..FileOptions::default()
        };
        let Ok(direct) = FileDevice::open(file.path(), options) else {
            eprintln!("skipped: O_DIRECT not supported here");
            return;
        };
        let device = Device::from_device(ReadModifyWrite::new(Device::from_device(direct), 512));
        assert_eq!(device.info().block_sizes.minimum, 512);
        conformance::run_all(&device);
    }
}
