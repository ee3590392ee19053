//! Receive buffers for `recvmmsg`.

/// Reusable receive buffers for [`RawSocket::recv_batch`](super::RawSocket::recv_batch): `count` buffers of
/// `frame_bytes` each. Size them for the interface: MTU + 14 bytes of Ethernet
/// header, plus some slack (at most 9216 + 64 for jumbo frames).
#[derive(Debug)]
pub struct RecvBatch {
    pub(super) buffer: Vec<u8>,
    pub(super) frame_bytes: usize,
    pub(super) lens: Vec<usize>,
    pub(super) truncated: Vec<bool>,
    pub(super) received: usize,
}

impl RecvBatch {
    /// `count` buffers of `frame_bytes` each; both must be non-zero.
    pub fn new(count: usize, frame_bytes: usize) -> RecvBatch {
        assert!(
            count > 0 && frame_bytes > 0,
            "RecvBatch needs at least one non-empty buffer"
        );
        RecvBatch {
            buffer: vec![0; count * frame_bytes],
            frame_bytes,
            lens: vec![0; count],
            truncated: vec![false; count],
            received: 0,
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
        self.truncated[i]
    }

    /// The frames of the last `recv_batch`, in arrival order.
    pub fn frames(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.received).map(|i| self.frame(i))
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
