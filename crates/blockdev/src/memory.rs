//! A sparse in-memory device: only chunks that were written hold memory.

use std::collections::HashMap;
use std::sync::RwLock;

use crate::device::{BlockDevice, Extent, ExtentState, WriteFlags, ZeroFlags};
use crate::error::Result;
use crate::fast_path::FastPath;
use crate::info::{Capabilities, DeviceInfo, Support};

const CHUNK: u64 = 64 * 1024;
const SHARDS: usize = 64;
/// Chunk indices one extents call scans before returning what it has.
const MAX_SCAN_CHUNKS: u64 = 1 << 20;

type Chunk = Box<[u8]>;

/// A device backed by memory, allocated in 64 KiB chunks on first write. Locks are
/// sharded by chunk so concurrent requests rarely meet.
pub struct MemoryDevice {
    size: u64,
    shards: Vec<RwLock<HashMap<u64, Chunk>>>,
}

impl MemoryDevice {
    /// A zero-filled device of `size` bytes that holds no memory yet.
    pub fn new(size: u64) -> MemoryDevice {
        MemoryDevice {
            size,
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, index: u64) -> &RwLock<HashMap<u64, Chunk>> {
        &self.shards[(index % SHARDS as u64) as usize]
    }

    /// Bytes of memory held by allocated chunks.
    pub fn allocated_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len() as u64 * CHUNK)
            .sum()
    }

    /// Calls `f(chunk index, offset within chunk, position in the request, length)`
    /// for each chunk-sized piece of `offset..offset+len`.
    fn for_each_piece(offset: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut done = 0u64;
        while done < len {
            let at = offset + done;
            let index = at / CHUNK;
            let within = (at % CHUNK) as usize;
            let piece = (CHUNK - within as u64).min(len - done) as usize;
            f(index, within, done as usize, piece);
            done += piece as u64;
        }
    }

    /// Zeroes a range, dropping chunks it covers completely (or, with `keep`, keeping
    /// them allocated).
    fn zero_range(&self, offset: u64, len: u64, keep: bool) {
        Self::for_each_piece(offset, len, |index, within, _, piece| {
            let mut shard = self.shard(index).write().unwrap_or_else(|e| e.into_inner());
            let whole = within == 0 && piece as u64 == CHUNK;
            if whole && !keep {
                shard.remove(&index);
            } else if let Some(chunk) = shard.get_mut(&index) {
                chunk[within..within + piece].fill(0);
            } else if keep {
                shard.insert(index, vec![0u8; CHUNK as usize].into_boxed_slice());
            }
        });
    }
}

impl BlockDevice for MemoryDevice {
    fn info(&self) -> DeviceInfo {
        let mut info = DeviceInfo::new(self.size);
        info.completes_inline = true;
        info.capabilities = Capabilities {
            flush: Support::Native,
            fua: Support::Native,
            trim: Support::Native,
            write_zeroes: Support::Native,
            fast_zero: Support::Native,
            extents: Support::Native,
            cache: Support::Native,
        };
        info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        Self::for_each_piece(offset, buf.len() as u64, |index, within, at, piece| {
            let shard = self.shard(index).read().unwrap_or_else(|e| e.into_inner());
            let out = &mut buf[at..at + piece];
            match shard.get(&index) {
                Some(chunk) => out.copy_from_slice(&chunk[within..within + piece]),
                None => out.fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _flags: WriteFlags) -> Result<()> {
        Self::for_each_piece(offset, buf.len() as u64, |index, within, at, piece| {
            let data = &buf[at..at + piece];
            let mut shard = self.shard(index).write().unwrap_or_else(|e| e.into_inner());
            if let Some(chunk) = shard.get_mut(&index) {
                chunk[within..within + piece].copy_from_slice(data);
            } else if data.iter().any(|&b| b != 0) {
                let mut chunk = vec![0u8; CHUNK as usize].into_boxed_slice();
                chunk[within..within + piece].copy_from_slice(data);
                shard.insert(index, chunk);
            }
        });
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, _flags: WriteFlags) -> Result<()> {
        self.zero_range(offset, len, false);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.zero_range(offset, len, flags.no_hole);
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        let end = offset + len;
        let first = offset / CHUNK;
        let last = (end - 1) / CHUNK;
        let scan_last = last.min(first + MAX_SCAN_CHUNKS - 1);
        for index in first..=scan_last {
            let present = self
                .shard(index)
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(&index);
            let state = if present {
                ExtentState::Data
            } else {
                ExtentState::Hole
            };
            let start = (index * CHUNK).max(offset);
            let stop = ((index + 1) * CHUNK).min(self.size);
            match out.last_mut() {
                Some(prev) if prev.state == state => prev.len = stop - prev.offset,
                _ => out.push(Extent {
                    offset: start,
                    len: stop - start,
                    state,
                }),
            }
        }
        Ok(())
    }

    fn cache(&self, _offset: u64, _len: u64) -> Result<()> {
        Ok(())
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// Memory never waits for hardware: every read can run on the caller's thread.
impl FastPath for MemoryDevice {
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        self.read_at(buf, offset).map(|()| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{conformance, Device};

    #[test]
    fn passes_the_conformance_suite() {
        conformance::run_all(&Device::from_device(MemoryDevice::new(16 << 20)));
    }

    #[test]
    fn passes_the_conformance_suite_read_only() {
        let device = Device::from_device(MemoryDevice::new(16 << 20));
        conformance::run_read_only(&device.read_only(), &device);
    }

    #[test]
    fn writing_zeroes_into_a_hole_allocates_nothing() {
        let device = MemoryDevice::new(1 << 20);
        device
            .write_at(&[0u8; 4096], 8192, WriteFlags::NONE)
            .unwrap();
        assert_eq!(device.allocated_bytes(), 0);
        device.write_at(&[1u8; 10], 8192, WriteFlags::NONE).unwrap();
        assert_eq!(device.allocated_bytes(), CHUNK);
        device.trim(0, CHUNK, WriteFlags::NONE).unwrap();
        assert_eq!(device.allocated_bytes(), 0);
    }
}
