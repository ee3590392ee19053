//! A read-only shared mapping of a file, so that a target can hand cached file data
//! to a socket with one copy (page cache to socket buffer) instead of two (page cache
//! to a buffer with pread, buffer to socket).
//!
//! This process never reads the mapped bytes itself: it passes their address to the
//! kernel (send(2)). That matters when the file shrinks under the mapping: an access
//! past the new end would raise SIGBUS in user space, but a copy the kernel makes
//! fails with EFAULT instead, which ends one connection and nothing else.

use std::io;
use std::os::fd::RawFd;
use std::ptr::NonNull;

/// The whole of a file mapped read-only; unmapped when dropped.
#[derive(Debug)]
pub struct FileMapping {
    addr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is only ever read (by the kernel), and `munmap` in `drop` needs
// no particular thread.
unsafe impl Send for FileMapping {}
// SAFETY: as above; nothing in it is written after `map` returns.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps `len` bytes of `fd` from offset 0, read-only and shared (it sees every
    /// write to the file through the page cache).
    pub fn map(fd: RawFd, len: u64) -> io::Result<FileMapping> {
        let len = usize::try_from(len)
            .ok()
            .filter(|&len| len > 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "nothing to map"))?;
        // SAFETY: a fresh mapping at an address the kernel picks; no memory of ours
        // is touched.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let addr = NonNull::new(addr.cast()).expect("mmap returned a null mapping");
        Ok(FileMapping { addr, len })
    }

    /// `offset..offset+len` of the file, or `None` past the mapping's end.
    pub fn range(&self, offset: u64, len: usize) -> Option<MappedRange> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| MappedRange {
            // SAFETY: start <= self.len, so the pointer stays inside the mapping.
            ptr: unsafe { self.addr.as_ptr().add(start) },
            len,
        })
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `map` with this address and length, and no
        // `MappedRange` outlives it (holders keep the device, which owns it, alive).
        unsafe { libc::munmap(self.addr.as_ptr().cast(), self.len) };
    }
}

/// A range of a [`FileMapping`]: an address to give the kernel, valid while the
/// device that returned it lives. Never dereference it in this process (see the
/// module documentation).
#[derive(Debug, Clone, Copy)]
pub struct MappedRange {
    ptr: *const u8,
    len: usize,
}

// SAFETY: an address and a length; only the kernel reads through it.
unsafe impl Send for MappedRange {}
// SAFETY: as above.
unsafe impl Sync for MappedRange {}

impl MappedRange {
    /// The first byte's address.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The part of the range after its first `n` bytes.
    pub fn skip(&self, n: usize) -> MappedRange {
        let n = n.min(self.len);
        MappedRange {
            // SAFETY: n <= len, so the pointer stays inside (or one past) the range.
            ptr: unsafe { self.ptr.add(n) },
            len: self.len - n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    /// Sends a range the way a target does, through the kernel.
    fn send(range: MappedRange, socket: &UnixStream) -> io::Result<usize> {
        // SAFETY: the range lies inside a live mapping; the kernel reads it.
        let n = unsafe {
            libc::send(
                socket.as_raw_fd(),
                range.as_ptr().cast(),
                range.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    #[test]
    fn a_range_carries_the_file_bytes() {
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        file.write_all(&data).unwrap();
        let mapping = FileMapping::map(file.as_raw_fd(), data.len() as u64).unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        let range = mapping.range(4000, 5000).unwrap();
        assert_eq!(send(range.skip(1000), &a).unwrap(), 4000);
        let mut got = vec![0u8; 4000];
        b.read_exact(&mut got).unwrap();
        assert_eq!(got, &data[5000..9000]);
        assert!(mapping.range(4096 * 3 - 10, 11).is_none());
        assert!(mapping.range(u64::MAX, 1).is_none());
        assert!(FileMapping::map(file.as_raw_fd(), 0).is_err());
    }

    #[test]
    fn a_file_that_shrank_fails_the_send_instead_of_killing_the_process() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 64 * 1024]).unwrap();
        let mapping = FileMapping::map(file.as_raw_fd(), 64 * 1024).unwrap();
        file.set_len(0).unwrap();
        let (a, _b) = UnixStream::pair().unwrap();
        let err = send(mapping.range(0, 64 * 1024).unwrap(), &a).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT));
    }
}
