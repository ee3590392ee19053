//! Block status of a striped volume: each member's extents, mapped back to volume
//! offsets and merged in volume order.
//!
//! Each member is asked once for its whole contiguous span of the range (not once
//! per chunk), and asked again only when its answer stopped short; neighbouring
//! pieces of one state merge into one extent, so an unwritten volume is one hole.

use super::layout::Layout;
use crate::device::Extent;
use crate::error::Error;
use crate::handle::Device;

/// Chunk pieces one call walks before returning what it has: the caller asks again
/// from where the list stops (the trait allows a short answer).
const MAX_PIECES: usize = 1 << 20;
/// Extents one call returns at most.
const MAX_EXTENTS: usize = 1 << 16;

/// One member's answer so far.
#[derive(Default)]
struct Cursor {
    list: Vec<Extent>,
    pos: usize,
}

/// Appends the extents of `offset..offset+len` to `out`, in order, without gaps,
/// starting at `offset`. On failure returns the index of the member that failed.
pub(super) fn collect(
    members: &[Device],
    layout: &Layout,
    offset: u64,
    len: u64,
    out: &mut Vec<Extent>,
) -> Result<(), (usize, Error)> {
    let mut cursors: Vec<Cursor> = (0..members.len()).map(|_| Cursor::default()).collect();
    let spans: Vec<Option<(u64, u64)>> = (0..members.len())
        .map(|m| layout.member_span(m, offset, len))
        .collect();
    for piece in layout.pieces(offset, len).take(MAX_PIECES) {
        let cursor = &mut cursors[piece.member];
        let member = &members[piece.member];
        let span_end = spans[piece.member].map_or(0, |(start, len)| start + len);
        let mut done = 0;
        while done < piece.len {
            let at = piece.member_offset + done;
            while cursor.pos < cursor.list.len() && cursor.list[cursor.pos].end() <= at {
                cursor.pos += 1;
            }
            if cursor.pos == cursor.list.len() || cursor.list[cursor.pos].offset > at {
                cursor.list = member
                    .extents(at, span_end - at)
                    .map_err(|e| (piece.member, e))?;
                cursor.pos = 0;
                if cursor.list.is_empty() {
                    // The handle always answers at least one extent; be safe anyway.
                    return Ok(());
                }
            }
            let extent = cursor.list[cursor.pos];
            let take = extent.end().min(piece.member_offset + piece.len) - at;
            push(out, piece.offset + done, take, extent.state);
            done += take;
        }
        if out.len() >= MAX_EXTENTS {
            break;
        }
    }
    Ok(())
}

/// Appends an extent, merged into the last one when it continues it in the same
/// state.
fn push(out: &mut Vec<Extent>, offset: u64, len: u64, state: crate::device::ExtentState) {
    match out.last_mut() {
        Some(last) if last.state == state && last.end() == offset => last.len += len,
        _ => out.push(Extent { offset, len, state }),
    }
}
