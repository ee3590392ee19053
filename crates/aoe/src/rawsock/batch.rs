//! Receive buffers for `recvmmsg`, or the frames taken from a receive ring or an
//! AF_XDP socket.

use std::sync::Arc;

use super::ring::{RingFrame, RxRing};
use super::xdp::Xsk;

/// Where a batch's frames lie when they are not in its own buffers: the kernel
/// lent them, and they go back when the batch is done with them.
pub(super) enum Lender {
    /// Slots of a packet socket's receive ring.
    Ring(Arc<RxRing>),
    /// Chunks of an AF_XDP socket's UMEM (a frame's `slot` is its address there).
    Xsk(Arc<Xsk>),
}

/// Reusable receive buffers for [`RawSocket::recv_batch`](super::RawSocket::recv_batch): `count` buffers of
/// `frame_bytes` each. Size them for the interface: MTU + 14 bytes of Ethernet
/// header, plus some slack (at most 9216 + 64 for jumbo frames).
///
/// On a socket with a receive ring the frames stay where the kernel put them, in
/// the ring: the batch holds their slots until the next `recv_batch` (or its drop)
/// gives them back, so a frame can be used until then without a copy.
pub struct RecvBatch {
    pub(super) buffer: Vec<u8>,
    /// One iovec per buffer, and one mmsghdr per iovec, built once: a receive thread
    /// calls `recv_batch` for every batch (and in a loop while it polls), so the
    /// arrays are not rebuilt each time. They point into `buffer` and `iovecs`,
    /// heap allocations that never move or resize. (`iovecs` is only kept alive.)
    #[allow(dead_code)]
    iovecs: Vec<libc::iovec>,
    pub(super) msgs: Vec<libc::mmsghdr>,
    pub(super) frame_bytes: usize,
    pub(super) lens: Vec<usize>,
    pub(super) truncated: Vec<bool>,
    pub(super) received: usize,
    /// What the last `recv_batch` took its frames from, and those frames.
    pub(super) lender: Option<Lender>,
    pub(super) lent_frames: Vec<RingFrame>,
}

// SAFETY: the raw pointers in `iovecs` and `msgs` point only into this batch's own
// heap buffers, which move with it; the kernel writes through them only during
// `recv_batch`, which holds `&mut RecvBatch`. Ring frames point into a ring the
// batch keeps alive, in slots the kernel leaves alone until the batch releases them.
unsafe impl Send for RecvBatch {}
// SAFETY: shared references only read `buffer`, `lens`, `truncated` and the ring
// frames.
unsafe impl Sync for RecvBatch {}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch")
            .field("capacity", &self.lens.len())
            .field("frame_bytes", &self.frame_bytes)
            .field("received", &self.received)
            .finish()
    }
}

impl RecvBatch {
    /// `count` buffers of `frame_bytes` each; both must be non-zero.
    pub fn new(count: usize, frame_bytes: usize) -> RecvBatch {
        assert!(
            count > 0 && frame_bytes > 0,
            "RecvBatch needs at least one non-empty buffer"
        );
        let mut buffer = vec![0u8; count * frame_bytes];
        let mut iovecs: Vec<libc::iovec> = buffer
            .chunks_exact_mut(frame_bytes)
            .map(|buf| libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            })
            .collect();
        let msgs = iovecs
            .iter_mut()
            .map(|iov| {
                // SAFETY: mmsghdr is plain data; all zeroes (null pointers, zero
                // lengths) is a valid value.
                let mut msg: libc::mmsghdr = unsafe { std::mem::zeroed() };
                msg.msg_hdr.msg_iov = iov;
                msg.msg_hdr.msg_iovlen = 1;
                msg
            })
            .collect();
        RecvBatch {
            buffer,
            iovecs,
            msgs,
            frame_bytes,
            lens: vec![0; count],
            truncated: vec![false; count],
            received: 0,
            lender: None,
            lent_frames: Vec::with_capacity(count),
        }
    }

    /// Gives the frames the last `recv_batch` borrowed back to the kernel.
    pub(super) fn release_lent_frames(&mut self) {
        match &self.lender {
            Some(Lender::Ring(ring)) => {
                for frame in self.lent_frames.drain(..) {
                    ring.release(frame.slot);
                }
            }
            Some(Lender::Xsk(xsk)) => {
                xsk.give_back(self.lent_frames.drain(..).map(|frame| frame.slot as u64));
            }
            None => {}
        }
        self.received = 0;
    }

    /// Prepares to receive into the batch's own buffers, after giving back what a
    /// lender had lent.
    pub(super) fn use_buffers(&mut self) {
        self.release_lent_frames();
        self.lender = None;
    }

    /// Prepares to take frames from `ring`, after giving back what was held.
    pub(super) fn use_ring(&mut self, ring: &Arc<RxRing>) {
        self.release_lent_frames();
        if !matches!(&self.lender, Some(Lender::Ring(held)) if Arc::ptr_eq(held, ring)) {
            self.lender = Some(Lender::Ring(ring.clone()));
        }
    }

    /// Prepares to take frames from the AF_XDP socket `xsk`, after giving back what
    /// was held.
    pub(super) fn use_xsk(&mut self, xsk: &Arc<Xsk>) {
        self.release_lent_frames();
        if !matches!(&self.lender, Some(Lender::Xsk(held)) if Arc::ptr_eq(held, xsk)) {
            self.lender = Some(Lender::Xsk(xsk.clone()));
        }
    }

    /// How many frames one `recv_batch` can take.
    pub fn capacity(&self) -> usize {
        self.lens.len()
    }

    /// How many frames the last `recv_batch` received.
    pub fn len(&self) -> usize {
        self.received
    }

    /// Whether the last `recv_batch` received nothing.
    pub fn is_empty(&self) -> bool {
        self.received == 0
    }

    /// The i-th received frame of the last `recv_batch` (a whole Ethernet frame,
    /// starting with the destination MAC). Panics when `i >= self.len()`.
    pub fn frame(&self, i: usize) -> &[u8] {
        assert!(
            i < self.received,
            "frame {i} asked of a batch holding {}",
            self.received
        );
        if self.lender.is_some() {
            let frame = self.lent_frames[i];
            // SAFETY: the slot is held by this batch (taken from the ring it keeps
            // alive, not yet released), so the kernel does not write it; `len`
            // bytes from `data` lie within the slot (RxRing::take).
            return unsafe { std::slice::from_raw_parts(frame.data, frame.len) };
        }
        let start = i * self.frame_bytes;
        &self.buffer[start..start + self.lens[i]]
    }

    /// Whether the i-th frame was longer than its buffer and was cut short.
    pub fn is_truncated(&self, i: usize) -> bool {
        assert!(
            i < self.received,
            "frame {i} asked of a batch holding {}",
            self.received
        );
        if self.lender.is_some() {
            return self.lent_frames[i].truncated;
        }
        self.truncated[i]
    }

    /// The frames of the last `recv_batch`, in arrival order.
    pub fn frames(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.received).map(|i| self.frame(i))
    }
}

impl Drop for RecvBatch {
    fn drop(&mut self) {
        self.release_lent_frames();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recv_batch_indexing() {
        let mut batch = RecvBatch::new(3, 100);
        assert_eq!(batch.capacity(), 3);
        assert!(batch.is_empty());
        // Fill it as recv_batch would.
        for (i, chunk) in batch.buffer.chunks_exact_mut(100).enumerate() {
            chunk.fill(i as u8 + 1);
        }
        batch.lens[..2].copy_from_slice(&[60, 100]);
        batch.truncated[1] = true;
        batch.received = 2;
        assert_eq!(batch.len(), 2);
        assert_eq!(batch.frame(0), &[1u8; 60][..]);
        assert_eq!(batch.frame(1), &[2u8; 100][..]);
        assert!(!batch.is_truncated(0));
        assert!(batch.is_truncated(1));
        assert_eq!(
            batch.frames().map(<[u8]>::len).collect::<Vec<_>>(),
            [60, 100]
        );
    }

    #[test]
    #[should_panic(expected = "frame 2 asked of a batch holding 2")]
    fn recv_batch_frame_beyond_received_panics() {
        let mut batch = RecvBatch::new(3, 100);
        batch.received = 2;
        let _ = batch.frame(2);
    }
}
