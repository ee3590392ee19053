//! A memory disk with a volatile write cache, for durability tests: writes land in
//! the cache, a flush copies the cache to the medium, a FUA write also writes its
//! range through, and [`VolatileCache::medium`] is what a power loss would leave.
//! Put it under a target (through a [`WriteLog`](crate::WriteLog)) to see whether
//! what the target acknowledged as durable really was.

use std::sync::{Mutex, MutexGuard};

use crate::device::{BlockDevice, WriteFlags};
use crate::error::Result;
use crate::info::{DeviceInfo, Support};
use crate::memory::MemoryDevice;

/// What the disk holds: the cache (what reads see) and the medium.
struct Contents {
    cache: Vec<u8>,
    medium: Vec<u8>,
}

/// A cached disk of a fixed size, reading as zeroes at first.
pub struct VolatileCache {
    info: DeviceInfo,
    /// One lock for both, so a flush's copy and a FUA write's write-through never
    /// interleave (a flush copying an older cache over a newer FUA write).
    contents: Mutex<Contents>,
    /// A broken disk, for tests of the tests: its flush and FUA do nothing.
    lies: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl VolatileCache {
    pub fn new(size: u64) -> VolatileCache {
        VolatileCache::with_honesty(size, true)
    }

    /// A disk whose flush and FUA return without making anything durable.
    pub fn lying(size: u64) -> VolatileCache {
        VolatileCache::with_honesty(size, false)
    }

    fn with_honesty(size: u64, honest: bool) -> VolatileCache {
        let mut info = MemoryDevice::new(size).info();
        info.capabilities.flush = Support::Native;
        info.capabilities.fua = Support::Native;
        info.completes_inline = false;
        VolatileCache {
            info,
            contents: Mutex::new(Contents {
                cache: vec![0; size as usize],
                medium: vec![0; size as usize],
            }),
            lies: !honest,
        }
    }

    /// What a power loss now would leave.
    pub fn medium(&self) -> Vec<u8> {
        lock(&self.contents).medium.clone()
    }

    /// What a power loss now would leave of `len` bytes at `offset`.
    pub fn medium_range(&self, offset: u64, len: usize) -> Vec<u8> {
        let at = offset as usize;
        lock(&self.contents).medium[at..at + len].to_vec()
    }
}

impl BlockDevice for VolatileCache {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let at = offset as usize;
        buf.copy_from_slice(&lock(&self.contents).cache[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let at = offset as usize;
        let mut contents = lock(&self.contents);
        contents.cache[at..at + buf.len()].copy_from_slice(buf);
        if flags.fua && !self.lies {
            contents.medium[at..at + buf.len()].copy_from_slice(buf);
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        if !self.lies {
            let contents = &mut *lock(&self.contents);
            contents.medium.copy_from_slice(&contents.cache);
        }
        Ok(())
    }
}
