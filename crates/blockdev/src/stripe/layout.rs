//! Where the bytes of a striped volume live (RAID-0): the volume is cut into chunks,
//! and chunk `c` is chunk `c / n` of member `c % n`. Pure arithmetic, no I/O.
//!
//! One property makes the stripe cheap: the part of any volume range that falls on
//! one member is a single contiguous range of that member (consecutive rows of the
//! stripe are consecutive chunks of each member). Trim, write-zeroes and cache
//! therefore cost one call per member, and a write one vectored call per member.

/// The geometry of a stripe: how many members, how large a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    members: u64,
    chunk: u64,
}

/// A piece of a volume request that lies in one chunk of one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Index of the member.
    pub member: usize,
    /// Byte offset on that member.
    pub member_offset: u64,
    /// Byte offset on the volume.
    pub offset: u64,
    pub len: u64,
}

impl Layout {
    /// A layout of `members` members and `chunk`-byte chunks; `None` when either is
    /// zero.
    pub fn new(members: usize, chunk: u64) -> Option<Layout> {
        (members > 0 && chunk > 0).then_some(Layout {
            members: members as u64,
            chunk,
        })
    }

    pub fn members(&self) -> usize {
        self.members as usize
    }

    pub fn chunk(&self) -> u64 {
        self.chunk
    }

    /// The member holding volume byte `offset`, and its offset on that member.
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        let index = offset / self.chunk;
        let member = (index % self.members) as usize;
        let row = index / self.members;
        (member, row * self.chunk + offset % self.chunk)
    }

    /// The volume offset of byte `member_offset` of `member` (the inverse of
    /// [`locate`](Self::locate)).
    pub fn volume_offset(&self, member: usize, member_offset: u64) -> u64 {
        let row = member_offset / self.chunk;
        (row * self.members + member as u64) * self.chunk + member_offset % self.chunk
    }

    /// The pieces of `offset..offset+len`, in volume order, split on chunk
    /// boundaries. The caller guarantees the range does not overflow.
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (member, member_offset) = self.locate(at);
            let piece_len = (self.chunk - at % self.chunk).min(end - at);
            let piece = Piece {
                member,
                member_offset,
                offset: at,
                len: piece_len,
            };
            at += piece_len;
            Some(piece)
        })
    }

    /// Whether `offset..offset+len` lies within one chunk (a request that needs no
    /// splitting and no other thread).
    pub fn within_one_chunk(&self, offset: u64, len: u64) -> bool {
        len == 0 || offset / self.chunk == (offset + len - 1) / self.chunk
    }

    /// How many members `offset..offset+len` touches.
    pub fn members_touched(&self, offset: u64, len: u64) -> usize {
        if len == 0 {
            return 0;
        }
        let chunks = (offset + len - 1) / self.chunk - offset / self.chunk + 1;
        chunks.min(self.members) as usize
    }

    /// The contiguous range `(member offset, len)` of `member` that holds its part of
    /// the volume range `offset..offset+len`; `None` when the range misses it.
    pub fn member_span(&self, member: usize, offset: u64, len: u64) -> Option<(u64, u64)> {
        if len == 0 {
            return None;
        }
        let n = self.members;
        let m = member as u64;
        let end = offset + len;
        let first_chunk = offset / self.chunk;
        let last_chunk = (end - 1) / self.chunk;
        // The member's first and last chunks inside the range.
        let first = first_chunk + (m + n - first_chunk % n) % n;
        if first > last_chunk {
            return None;
        }
        let last = last_chunk - (last_chunk % n + n - m) % n;
        let start = if first == first_chunk {
            (first / n) * self.chunk + offset % self.chunk
        } else {
            (first / n) * self.chunk
        };
        let stop = if last == last_chunk {
            (last / n) * self.chunk + (end - 1) % self.chunk + 1
        } else {
            (last / n + 1) * self.chunk
        };
        Some((start, stop - start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_map_round_robin_by_chunk() {
        let layout = Layout::new(3, 4096).unwrap();
        assert_eq!(layout.locate(0), (0, 0));
        assert_eq!(layout.locate(4095), (0, 4095));
        assert_eq!(layout.locate(4096), (1, 0));
        assert_eq!(layout.locate(2 * 4096 + 10), (2, 10));
        // The second row starts on member 0 again, one chunk in.
        assert_eq!(layout.locate(3 * 4096 + 7), (0, 4096 + 7));
        assert_eq!(layout.locate(7 * 4096), (1, 2 * 4096));
        for offset in [0, 1, 4095, 4096, 12345, 1 << 20, (1 << 30) + 17] {
            let (member, member_offset) = layout.locate(offset);
            assert_eq!(layout.volume_offset(member, member_offset), offset);
        }
    }

    #[test]
    fn pieces_split_on_chunk_boundaries_in_order() {
        let layout = Layout::new(2, 1024).unwrap();
        let got: Vec<_> = layout.pieces(1000, 2100).collect();
        let piece = |member, member_offset, offset, len| Piece {
            member,
            member_offset,
            offset,
            len,
        };
        assert_eq!(
            got,
            vec![
                piece(0, 1000, 1000, 24),
                piece(1, 0, 1024, 1024),
                piece(0, 1024, 2048, 1024),
                piece(1, 1024, 3072, 28),
            ]
        );
        assert_eq!(layout.pieces(5, 0).count(), 0);
        assert!(layout.within_one_chunk(1024, 1024));
        assert!(!layout.within_one_chunk(1000, 25));
        assert_eq!(layout.members_touched(1000, 25), 2);
        assert_eq!(layout.members_touched(0, 1 << 20), 2);
    }

    /// The span of each member is exactly the union of its pieces, for every small
    /// range on a few geometries (checked against the piece list).
    #[test]
    fn member_spans_are_the_union_of_their_pieces() {
        for members in 1..=4 {
            let layout = Layout::new(members, 8).unwrap();
            for offset in 0..40 {
                for len in 0..60 {
                    for member in 0..members {
                        let mine: Vec<Piece> = layout
                            .pieces(offset, len)
                            .filter(|p| p.member == member)
                            .collect();
                        let expect = mine.first().map(|first| {
                            let last = mine.last().unwrap();
                            for pair in mine.windows(2) {
                                assert_eq!(
                                    pair[0].member_offset + pair[0].len,
                                    pair[1].member_offset,
                                    "pieces of member {member} are not contiguous"
                                );
                            }
                            (
                                first.member_offset,
                                last.member_offset + last.len - first.member_offset,
                            )
                        });
                        assert_eq!(
                            layout.member_span(member, offset, len),
                            expect,
                            "{members} members, {offset}+{len}, member {member}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn zero_sized_geometries_are_refused() {
        assert_eq!(Layout::new(0, 4096), None);
        assert_eq!(Layout::new(2, 0), None);
    }
}
