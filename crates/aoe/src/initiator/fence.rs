//! Sectors new writes must keep off for a while: AoE has no sequence numbers, so a
//! copy of a write frame still on its way (its answer beaten by a retransmission's,
//! or its request failed) could reach the target after a later write to the same
//! sectors and put the old data back. The session fences such a frame's sectors
//! for [`FENCE_LIFETIME`] and holds back a new write that overlaps them. A fence
//! with an owner (the frame's slot and first generation) goes earlier, once the
//! target has answered every copy of that frame: none is left on the way.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::rtt::RTO_MAX;

/// How long the sectors of a write frame with copies unaccounted for stay fenced:
/// the longest the retransmission timer ever waits for an answer ([`RTO_MAX`]),
/// past which a copy is presumed lost everywhere else in the session too.
pub const FENCE_LIFETIME: Duration = RTO_MAX;

/// Who may lift a fence before it lapses: a frame's window slot and the generation
/// of its first transmission.
pub(crate) type FenceOwner = (usize, u32);

/// The fences standing, each sectors, when it lapses and its owner.
#[derive(Debug, Default)]
pub(crate) struct Fences(Vec<(Range<u64>, Instant, Option<FenceOwner>)>);

impl Fences {
    /// Fences `sectors` from `now` for [`FENCE_LIFETIME`].
    pub(crate) fn add(&mut self, sectors: Range<u64>, now: Instant, owner: Option<FenceOwner>) {
        self.0.push((sectors, now + FENCE_LIFETIME, owner));
    }

    /// Lifts the fences `owner` put up: every copy of its frame is accounted for.
    pub(crate) fn lift(&mut self, owner: FenceOwner) {
        self.0.retain(|(_, _, o)| *o != Some(owner));
    }

    /// When a write of `sectors` may go, if a fence standing at `now` overlaps it;
    /// lapsed fences are dropped on the way.
    pub(crate) fn blocking(&mut self, sectors: &Range<u64>, now: Instant) -> Option<Instant> {
        if self.0.is_empty() {
            return None;
        }
        self.0.retain(|(_, until, _)| *until > now);
        self.0
            .iter()
            .filter(|(fenced, _, _)| fenced.start < sectors.end && sectors.start < fenced.end)
            .map(|(_, until, _)| *until)
            .max()
    }

    /// When the next fence standing at `now` lapses (a held write may go then).
    pub(crate) fn next_lapse(&mut self, now: Instant) -> Option<Instant> {
        self.0.retain(|(_, until, _)| *until > now);
        self.0.iter().map(|(_, until, _)| *until).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_writes_wait_for_the_latest_fence_and_lapsed_ones_go() {
        let start = Instant::now();
        let mut fences = Fences::default();
        fences.add(10..14, start, None);
        fences.add(12..20, start + FENCE_LIFETIME / 2, None);
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

    #[test]
    fn an_owner_lifts_only_its_own_fences() {
        let start = Instant::now();
        let mut fences = Fences::default();
        fences.add(0..8, start, Some((3, 40)));
        fences.add(4..12, start, Some((5, 40)));
        fences.add(16..20, start, None);
        fences.lift((3, 41));
        assert!(
            fences.blocking(&(0..4), start).is_some(),
            "another generation lifted it"
        );
        fences.lift((3, 40));
        assert_eq!(fences.blocking(&(0..4), start), None);
        assert!(
            fences.blocking(&(4..8), start).is_some(),
            "slot 5's fence went too"
        );
        assert!(fences.blocking(&(16..17), start).is_some());
    }
}
