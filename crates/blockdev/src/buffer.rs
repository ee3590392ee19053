//! Owned, page-aligned I/O buffers, recycled through a small pool.
//!
//! Aligned so the same buffer works for O_DIRECT files; owned so it can be handed to a
//! worker thread (or, later, to io_uring) and back; pooled because a 1 MiB request
//! stream would otherwise pay for a fresh, page-faulting allocation every time.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Mutex;

/// Alignment of every buffer: a page, enough for O_DIRECT on any common device.
pub const ALIGNMENT: usize = 4096;

const SMALLEST_CLASS_SHIFT: u32 = 12; // 4 KiB
const LARGEST_CLASS_SHIFT: u32 = 26; // 64 MiB
const CLASSES: usize = (LARGEST_CLASS_SHIFT - SMALLEST_CLASS_SHIFT + 1) as usize;
/// Bytes each size class may keep idle in the pool.
const IDLE_BYTES_PER_CLASS: usize = 64 << 20;

struct FreeList(Mutex<Vec<NonNull<u8>>>);

// SAFETY: the pointers are exclusively owned allocations; the mutex serialises access.
unsafe impl Send for FreeList {}
// SAFETY: as above.
unsafe impl Sync for FreeList {}

static POOL: [FreeList; CLASSES] = [const { FreeList(Mutex::new(Vec::new())) }; CLASSES];

fn class_of(capacity: usize) -> Option<usize> {
    let shift = capacity
        .max(1 << SMALLEST_CLASS_SHIFT)
        .next_power_of_two()
        .trailing_zeros();
    (shift <= LARGEST_CLASS_SHIFT).then(|| (shift - SMALLEST_CLASS_SHIFT) as usize)
}

fn class_capacity(class: usize) -> usize {
    1 << (class as u32 + SMALLEST_CLASS_SHIFT)
}

/// A page-aligned byte buffer with a length up to its capacity.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
}

// SAFETY: IoBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for IoBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A buffer of `len` bytes. Its contents are unspecified (zeroes or old data from a
    /// recycled buffer): callers fill it before they read it.
    pub fn new(len: usize) -> IoBuf {
        let capacity = match class_of(len) {
            Some(class) => class_capacity(class),
            None => len.div_ceil(ALIGNMENT) * ALIGNMENT,
        };
        let recycled = class_of(capacity).and_then(|class| {
            POOL[class]
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop()
        });
        let ptr = recycled.unwrap_or_else(|| {
            let layout = Layout::from_size_align(capacity, ALIGNMENT).expect("buffer layout");
            // SAFETY: the layout has a non-zero size (capacity >= 4096).
            let raw = unsafe { alloc::alloc_zeroed(layout) };
            NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout))
        });
        IoBuf { ptr, len, capacity }
    }

    /// A buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> IoBuf {
        let mut buf = IoBuf::new(len);
        buf.fill(0);
        buf
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut buf = IoBuf::new(data.len());
        buf.copy_from_slice(data);
        buf
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Changes the length, keeping the allocation. Panics beyond the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.capacity, "IoBuf::set_len beyond capacity");
        self.len = len;
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity >= len initialised bytes (zeroed at
        // allocation, only ever written through &mut [u8] since).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        if let Some(class) = class_of(self.capacity) {
            if class_capacity(class) == self.capacity {
                let mut free = POOL[class].0.lock().unwrap_or_else(|e| e.into_inner());
                if (free.len() + 1) * self.capacity <= IDLE_BYTES_PER_CLASS.max(self.capacity * 2) {
                    free.push(self.ptr);
                    return;
                }
            }
        }
        let layout = Layout::from_size_align(self.capacity, ALIGNMENT).expect("buffer layout");
        // SAFETY: allocated in `new` with exactly this layout and not freed since.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// A copy of `data` in an aligned buffer, for callers holding a `Vec` (tests, fuzz
/// targets, small protocol replies) that call an API taking an [`IoBuf`].
impl From<Vec<u8>> for IoBuf {
    fn from(data: Vec<u8>) -> IoBuf {
        IoBuf::from_slice(&data)
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IoBuf({} of {} bytes)", self.len, self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_sized() {
        for len in [0, 1, 4096, 5000, 1 << 20, (64 << 20) + 1] {
            let buf = IoBuf::new(len);
            assert_eq!(buf.len(), len);
            assert!(buf.capacity() >= len);
            assert_eq!(buf.as_ptr() as usize % ALIGNMENT, 0);
        }
    }

    #[test]
    fn vectors_and_slices_convert_to_aligned_copies() {
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let from_vec = IoBuf::from(data.clone());
        assert_eq!(&from_vec[..], &data[..]);
        assert_eq!(from_vec.as_ptr() as usize % ALIGNMENT, 0);
        assert!(IoBuf::from(Vec::new()).is_empty());
    }

    #[test]
    fn recycled_buffers_keep_their_class() {
        let first = IoBuf::from_slice(&[7u8; 10000]);
        let capacity = first.capacity();
        drop(first);
        let second = IoBuf::zeroed(9000);
        assert_eq!(second.capacity(), capacity);
        assert!(second.iter().all(|&b| b == 0));
    }
}
