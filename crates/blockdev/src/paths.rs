//! Spreading requests over several equivalent paths to one device: the connections
//! of an NBD initiator, the sessions of an iSCSI initiator.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How long an initiator keeps reconnecting after a connection to its target drops
/// (and then replays what had no answer) unless told otherwise: long enough for a
/// target's restart, short enough that a target gone for good is reported.
pub const DEFAULT_RECONNECT: Duration = Duration::from_secs(30);

/// The index of the least loaded live path among `count`. The search starts at a
/// rotating index (`next`), so paths with equal loads take turns, and stops at the
/// first idle one. `alive(i)` and `load(i)` (requests in flight) describe path `i`.
/// With none alive it returns the rotating index: that path then reports why.
pub fn least_loaded(
    count: usize,
    next: &AtomicUsize,
    alive: impl Fn(usize) -> bool,
    load: impl Fn(usize) -> usize,
) -> usize {
    if count <= 1 {
        return 0;
    }
    let start = next.fetch_add(1, Ordering::Relaxed) % count;
    let mut best: Option<(usize, usize)> = None;
    for i in 0..count {
        let index = (start + i) % count;
        if !alive(index) {
            continue;
        }
        let load = load(index);
        if best.is_none_or(|(least, _)| load < least) {
            best = Some((load, index));
            if load == 0 {
                break;
            }
        }
    }
    best.map_or(start, |(_, index)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_loaded_live_path() {
        let next = AtomicUsize::new(0);
        let loads = [3, 1, 2];
        assert_eq!(least_loaded(3, &next, |_| true, |i| loads[i]), 1);
        // A dead path is skipped however idle it is.
        let loads = [3, 0, 2];
        assert_eq!(least_loaded(3, &next, |i| i != 1, |i| loads[i]), 2);
        assert_eq!(least_loaded(1, &next, |_| false, |_| 9), 0);
    }

    #[test]
    fn idle_paths_take_turns() {
        let next = AtomicUsize::new(0);
        let picks: Vec<usize> = (0..4)
            .map(|_| least_loaded(2, &next, |_| true, |_| 0))
            .collect();
        assert_eq!(picks, [0, 1, 0, 1]);
    }

    #[test]
    fn with_none_alive_the_rotating_index_answers() {
        let next = AtomicUsize::new(5);
        assert_eq!(least_loaded(3, &next, |_| false, |_| 0), 2);
    }
}
