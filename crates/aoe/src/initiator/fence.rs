//! Sectors new writes must keep off for a while: AoE has no sequence numbers, so a
//! copy of a write frame still on its way (its answer beaten by a retransmission's,
//! or its request failed) could reach the target after a later write to the same
//! sectors and put the old data back. The session fences such a frame's sectors
//! for [`FENCE_LIFETIME`] and holds back a new write that overlaps them.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::rtt::RTO_MAX;

/// How long the sectors of a write frame with copies unaccounted for stay fenced:
/// the longest the retransmission timer ever waits for an answer ([`RTO_MAX`]),
/// past which a copy is presumed lost everywhere else in the session too.
pub const FENCE_LIFETIME: Duration = RTO_MAX;

/// The fences standing, each sectors and when it lapses.
#[derive(Debug, Default)]
pub(crate) struct Fences(Vec<(Range<u64>, Instant)>);

impl Fences {
    /// Fences `sectors` from `now` for [`FENCE_LIFETIME`].
    pub(crate) fn add(&mut self, sectors: Range<u64>, now: Instant) {
        self.0.push((sectors, now + FENCE_LIFETIME));
    }

    /// When a write of `sectors` may go, if a fence standing at `now` overlaps it;
    /// lapsed fences are dropped on the way.
    pub(crate) fn blocking(&mut self, sectors: &Range<u64>, now: Instant) -> Option<Instant> {
        if self.0.is_empty() {
            return None;
        }
        self.0.retain(|(_, until)| *until > now);
        self.0
            .iter()
            .filter(|(fenced, _)| fenced.start < sectors.end && sectors.start < fenced.end)
            .map(|(_, until)| *until)
            .max()
    }

    /// When the next fence standing at `now` lapses (a held write may go then).
    pub(crate) fn next_lapse(&mut self, now: Instant) -> Option<Instant> {
        self.0.retain(|(_, until)| *until > now);
        self.0.iter().map(|(_, until)| *until).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_writes_wait_for_the_latest_fence_and_lapsed_ones_go() {
        let start = Instant::now();
        let mut fences = Fences::default();
        fences.add(10..14, start);
        fences.add(12..20, start + FENCE_LIFETIME / 2);
        let late = start + FENCE_LIFETIME / 2 + FENCE_LIFETIME;
        assert_eq!(fences.blocking(&(13..14), start), Some(late));
        assert_eq!(
            fences.blocking(&(8..11), start),
            Some(start + FENCE_LIFETIME)
        );
        // Touching is not overlapping.
        assert_eq!(fences.blocking(&(20..30), start), None);
        assert_eq!(fences.blocking(&(0..10), start), None);
        assert_eq!(fences.next_lapse(start), Some(start + FENCE_LIFETIME));
        // Once the first lapsed, only the second stands.
        let after = start + FENCE_LIFETIME;
        assert_eq!(fences.blocking(&(10..12), after), None);
        assert_eq!(fences.next_lapse(after), Some(late));
        assert_eq!(fences.blocking(&(0..100), late), None);
        assert_eq!(fences.next_lapse(late), None);
    }
}
