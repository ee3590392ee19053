//! A receive ring (PACKET_RX_RING, TPACKET_V2) shared between the kernel and us.
//!
//! The kernel copies each admitted frame into the next free slot of a memory map and
//! marks the slot as the user's; we read frames where they lie and hand the slots
//! back. Receiving then costs no system call while frames keep coming (poll(2) only
//! when the ring is empty), and no copy out of a socket buffer: on a veth pair that
//! copy, and the `recvmmsg` bookkeeping per frame, were a quarter of the target's
//! CPU at MTU 1500.
//!
//! One thread consumes a ring at a time (a receive thread per socket). A slot is
//! the user's from the moment we see its status say so until [`RxRing::release`];
//! the kernel does not touch it meanwhile, which is what makes handing out slices
//! into the map sound.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::set_option;

/// Bytes per ring block (the unit the kernel allocates): frames do not straddle
/// blocks, and 64 KiB wastes under 3% at MTU 1500 and 9000 alike.
const BLOCK_BYTES: usize = 64 << 10;
/// The per-slot header (struct tpacket2_hdr) and its sockaddr_ll, rounded up the way
/// the kernel lays out a slot, plus room for the Ethernet header before the
/// network header it aligns: a frame of `frame_bytes` fits behind this.
const SLOT_OVERHEAD: usize = 128;

/// A frame lying in a ring slot, as the kernel left it there.
#[derive(Debug, Clone, Copy)]
pub(super) struct RingFrame {
    pub slot: usize,
    pub data: *const u8,
    pub len: usize,
    pub truncated: bool,
}

/// The mapped ring of one socket.
#[derive(Debug)]
pub(crate) struct RxRing {
    map: *mut u8,
    map_len: usize,
    slot_bytes: usize,
    slots_per_block: usize,
    slots: usize,
    /// The next slot the kernel fills after the ones taken so far.
    next: Mutex<usize>,
}

// SAFETY: the map is shared memory whose slots change hands through the status
// word with acquire/release ordering (see `take` and `release`); `next` is behind a
// mutex.
unsafe impl Send for RxRing {}
// SAFETY: as above.
unsafe impl Sync for RxRing {}

fn align16(n: usize) -> usize {
    n.div_ceil(16) * 16
}

impl RxRing {
    /// Switches `fd` (a packet socket not yet bound) to TPACKET_V2 and maps a ring of
    /// about `ring_bytes` whose slots hold frames of up to `frame_bytes`.
    pub fn map(fd: BorrowedFd<'_>, frame_bytes: usize, ring_bytes: usize) -> io::Result<RxRing> {
        let slot_bytes = align16(SLOT_OVERHEAD + frame_bytes);
        if slot_bytes > BLOCK_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a {frame_bytes}-byte frame does not fit a ring block"),
            ));
        }
        let slots_per_block = BLOCK_BYTES / slot_bytes;
        let blocks = ring_bytes.div_ceil(BLOCK_BYTES).max(2);
        let slots = blocks * slots_per_block;
        set_option(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &(libc::tpacket_versions::TPACKET_V2 as libc::c_int),
        )?;
        let request = libc::tpacket_req {
            tp_block_size: BLOCK_BYTES as libc::c_uint,
            tp_block_nr: blocks as libc::c_uint,
            tp_frame_size: slot_bytes as libc::c_uint,
            tp_frame_nr: slots as libc::c_uint,
        };
        set_option(fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &request)?;
        let map_len = blocks * BLOCK_BYTES;
        // SAFETY: a shared mapping of the ring the kernel just allocated for this
        // socket, at an address of the kernel's choosing; checked below.
        let map = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(RxRing {
            map: map.cast(),
            map_len,
            slot_bytes,
            slots_per_block,
            slots,
            next: Mutex::new(0),
        })
    }

    fn header(&self, slot: usize) -> *mut libc::tpacket2_hdr {
        let block = slot / self.slots_per_block;
        let within = slot % self.slots_per_block;
        // SAFETY: `slot < self.slots`, so the offset lies inside the map.
        unsafe { self.map.add(block * BLOCK_BYTES + within * self.slot_bytes) }.cast()
    }

    fn status(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: tp_status is the first field, a naturally aligned u32 that the
        // kernel and we only access atomically; the map outlives `self`.
        unsafe { &*ptr::addr_of_mut!((*self.header(slot)).tp_status).cast::<AtomicU32>() }
    }

    fn lock_next(&self) -> MutexGuard<'_, usize> {
        self.next.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the frames the kernel has filled since the last call, up to `max`,
    /// oldest first, into `out`; returns how many. Each slot stays the caller's
    /// until [`release`](Self::release).
    pub fn take(&self, max: usize, out: &mut Vec<RingFrame>) -> usize {
        let mut next = self.lock_next();
        let mut taken = 0;
        while taken < max {
            let slot = *next;
            let status = self.status(slot).load(Ordering::Acquire);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            let header = self.header(slot);
            // SAFETY: the slot is ours (TP_STATUS_USER, read with acquire), so the
            // kernel's writes to its header and data are visible and finished.
            let (mac, snaplen, len) = unsafe {
                (
                    usize::from((*header).tp_mac),
                    (*header).tp_snaplen as usize,
                    (*header).tp_len as usize,
                )
            };
            let fits = mac + snaplen <= self.slot_bytes;
            out.push(RingFrame {
                slot,
                // SAFETY: `mac` lies within the slot (checked through `fits`; a
                // slot the kernel got wrong yields an empty frame).
                data: unsafe { header.cast::<u8>().add(if fits { mac } else { 0 }) },
                len: if fits { snaplen } else { 0 },
                truncated: !fits || snaplen < len,
            });
            *next = (slot + 1) % self.slots;
            taken += 1;
        }
        taken
    }

    /// Hands a slot taken by [`take`](Self::take) back to the kernel; no slice into
    /// it may be used afterwards.
    pub fn release(&self, slot: usize) {
        self.status(slot)
            .store(libc::TP_STATUS_KERNEL, Ordering::Release);
    }
}

impl Drop for RxRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of `map_len` bytes; nothing refers into
        // it any more (batches hold the ring alive while they hold slots).
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

/// The slot size for frames of `frame_bytes`, for tests and sizing.
#[cfg(test)]
pub(super) fn slot_bytes(frame_bytes: usize) -> usize {
    align16(SLOT_OVERHEAD + frame_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem;

    #[test]
    fn slots_fit_the_largest_frames_and_the_kernels_layout() {
        // The kernel puts the MAC header at TPACKET_ALIGN(hdrlen + 16) - 14 for a
        // SOCK_RAW socket; the frame must fit behind it.
        let hdrlen = libc::TPACKET2_HDRLEN;
        let mac = align16(hdrlen + 16) - 14;
        for frame in [1500 + 14 + 4, 9000 + 14 + 4, 9216 + 64] {
            assert!(mac + frame <= slot_bytes(frame), "frame {frame}");
            assert_eq!(slot_bytes(frame) % 16, 0);
        }
        assert!(mem::size_of::<libc::tpacket2_hdr>() <= 32);
    }
}
