//! Fitting a FUSE request's range to the device: reads and writes clipped at the
//! end as a block device does it, zeroing split at the device's block boundaries.

/// How many of `len` bytes at `offset` a read returns: up to the end of the
/// device, nothing from the end on (end of file).
pub fn read_len(offset: u64, len: u64, size: u64) -> u64 {
    len.min(size.saturating_sub(offset))
}

/// How many of `len` bytes at `offset` a write takes: those before the end (a
/// short write), or `None` when it starts at or past the end with something to
/// write (ENOSPC, as for a block device: the file never grows).
pub fn write_len(offset: u64, len: u64, size: u64) -> Option<u64> {
    if len == 0 {
        return Some(0);
    }
    (offset < size).then(|| len.min(size - offset))
}

/// A byte range, `offset..offset+len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub offset: u64,
    pub len: u64,
}

/// A range cut at block boundaries: the partial blocks at either edge, which must be
/// zeroed by writing (read-modify-write keeps their other bytes), and the whole
/// blocks between, which the device may zero natively.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockSplit {
    pub head: Option<Span>,
    pub whole: Option<Span>,
    pub tail: Option<Span>,
}

/// Splits `offset..offset+len` at multiples of `block` (a power of two or any
/// positive size).
pub fn split_at_blocks(offset: u64, len: u64, block: u64) -> BlockSplit {
    let block = block.max(1);
    let end = offset + len;
    let span = |from: u64, to: u64| {
        (to > from).then_some(Span {
            offset: from,
            len: to - from,
        })
    };
    let first_whole = offset.div_ceil(block) * block;
    let last_whole = end / block * block;
    if first_whole >= last_whole {
        // No whole block inside: all of it is one partial piece.
        return BlockSplit {
            head: span(offset, end),
            ..BlockSplit::default()
        };
    }
    BlockSplit {
        head: span(offset, first_whole),
        whole: span(first_whole, last_whole),
        tail: span(last_whole, end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_end() {
        assert_eq!(read_len(0, 4096, 10_000), 4096);
        assert_eq!(read_len(8192, 4096, 10_000), 1808);
        assert_eq!(read_len(10_000, 4096, 10_000), 0);
        assert_eq!(read_len(u64::MAX, 4096, 10_000), 0);
    }

    #[test]
    fn writes_are_short_across_the_end_and_refused_past_it() {
        assert_eq!(write_len(0, 4096, 10_000), Some(4096));
        assert_eq!(write_len(8192, 4096, 10_000), Some(1808));
        assert_eq!(write_len(10_000, 1, 10_000), None);
        assert_eq!(write_len(20_000, 4096, 10_000), None);
        assert_eq!(write_len(20_000, 0, 10_000), Some(0));
    }

    fn span(offset: u64, len: u64) -> Option<Span> {
        Some(Span { offset, len })
    }

    #[test]
    fn aligned_ranges_are_all_whole_blocks() {
        let split = split_at_blocks(4096, 8192, 4096);
        assert_eq!(split.whole, span(4096, 8192));
        assert_eq!((split.head, split.tail), (None, None));
        let split = split_at_blocks(7, 100, 1);
        assert_eq!(split.whole, span(7, 100));
    }

    #[test]
    fn partial_edges_are_cut_off() {
        let split = split_at_blocks(100, 10_000, 4096);
        assert_eq!(split.head, span(100, 3996));
        assert_eq!(split.whole, span(4096, 4096));
        assert_eq!(split.tail, span(8192, 1908));
    }

    #[test]
    fn a_range_inside_one_block_is_one_partial_piece() {
        let split = split_at_blocks(100, 200, 4096);
        assert_eq!(split.head, span(100, 200));
        assert_eq!((split.whole, split.tail), (None, None));
        // Across one boundary but with no whole block: still one piece.
        let split = split_at_blocks(4000, 200, 4096);
        assert_eq!(split.head, span(4000, 200));
        assert_eq!((split.whole, split.tail), (None, None));
    }
}
