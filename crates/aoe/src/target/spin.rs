//! When a receive thread polls its ring without sleeping, and when it sleeps.
//!
//! Polling spares a wake-up per batch: the sender's kernel need not wake a sleeping
//! receiver (an inter-processor interrupt, dear in a VM), and the receiver starts
//! on a frame at once. But a poll that waits is a core burnt: on a link slower
//! than the host — a gigabit link, a shaped veth — frames come tens of
//! microseconds apart, a poll always finds the next one after the whole gap, and
//! the thread spent every microsecond of it on the CPU (seed 003's bed, issue 25: a
//! whole core at 48 MB/s). So the thread polls only while the time it waited for
//! each of the recent batches is shorter than a wake-up costs: at saturation
//! (frames queue up while a batch is handled) it polls, on a slower stream it
//! sleeps, and one wake-up then serves whatever arrived meanwhile.

use std::time::{Duration, Instant};

/// Polling pays while batches come closer than this: about what a sleeping
/// receiver's wake-up costs the two ends together on a VM.
pub(super) const WORTH_POLLING: Duration = Duration::from_micros(10);
/// Longest poll after the last frame, even while polling pays.
pub(super) const MAX_POLL: Duration = Duration::from_micros(50);
/// How much each new wait moves the average (1/2^SHIFT).
const SHIFT: u32 = 3;
/// Longer waits count as this long, so that after a pause (or at the start) a
/// stream that comes back at full speed is polled for again within a few dozen
/// batches.
const LONGEST_WAIT: Duration = Duration::from_millis(1);

/// The recent waits of one receive thread.
#[derive(Debug, Clone)]
pub(super) struct SpinPolicy {
    /// Moving average of how long a batch was waited for, in nanoseconds.
    average_wait_ns: u64,
    /// When the thread last got frames.
    last_frame: Instant,
}

impl SpinPolicy {
    /// A thread that has not received yet: it sleeps until frames come fast.
    pub fn new(now: Instant) -> SpinPolicy {
        SpinPolicy {
            average_wait_ns: LONGEST_WAIT.as_nanos() as u64,
            last_frame: now,
        }
    }

    /// Frames arrived at `now`, after the thread waited since `waiting_since` (the
    /// end of its previous batch's work).
    pub fn received(&mut self, waiting_since: Instant, now: Instant) {
        let waited = now
            .saturating_duration_since(waiting_since)
            .min(LONGEST_WAIT)
            .as_nanos() as u64;
        self.average_wait_ns =
            self.average_wait_ns - (self.average_wait_ns >> SHIFT) + (waited >> SHIFT);
        self.last_frame = now;
    }

    /// Whether to look at the ring again without sleeping.
    pub fn poll(&self, now: Instant) -> bool {
        self.average_wait_ns < WORTH_POLLING.as_nanos() as u64
            && now.saturating_duration_since(self.last_frame) < MAX_POLL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batches that each waited `wait`, one after another.
    fn after_batches(wait: Duration, count: usize) -> (SpinPolicy, Instant) {
        let start = Instant::now();
        let mut policy = SpinPolicy::new(start);
        let mut now = start;
        for _ in 0..count {
            let waiting_since = now + Duration::from_micros(3);
            now = waiting_since + wait;
            policy.received(waiting_since, now);
        }
        (policy, now)
    }

    #[test]
    fn a_fresh_thread_sleeps() {
        let now = Instant::now();
        assert!(!SpinPolicy::new(now).poll(now));
    }

    #[test]
    fn a_stream_back_after_a_long_pause_is_polled_for_again_soon() {
        let (mut policy, mut now) = after_batches(Duration::from_micros(2), 64);
        let since = now;
        now += Duration::from_secs(5);
        policy.received(since, now);
        assert!(!policy.poll(now));
        for _ in 0..48 {
            let since = now;
            now += Duration::from_micros(2);
            policy.received(since, now);
        }
        assert!(policy.poll(now));
    }

    #[test]
    fn frames_that_queue_up_are_polled_for() {
        let (policy, now) = after_batches(Duration::from_micros(2), 64);
        assert!(policy.poll(now));
        assert!(policy.poll(now + Duration::from_micros(40)));
        // Not for ever after the last one.
        assert!(!policy.poll(now + MAX_POLL));
    }

    #[test]
    fn a_link_speed_stream_sleeps() {
        // 1500-byte frames at 400 Mbit/s: one every 30 µs.
        let (policy, now) = after_batches(Duration::from_micros(30), 64);
        assert!(!policy.poll(now));
        // At 1 Gbit/s, one every 12 µs: a wake-up each is still cheaper.
        let (policy, now) = after_batches(Duration::from_micros(12), 64);
        assert!(!policy.poll(now));
    }

    #[test]
    fn the_average_follows_a_change_of_pace() {
        let (mut policy, mut now) = after_batches(Duration::from_micros(30), 64);
        for _ in 0..32 {
            let since = now;
            now += Duration::from_micros(1);
            policy.received(since, now);
        }
        assert!(policy.poll(now));
        for _ in 0..32 {
            let since = now;
            now += Duration::from_micros(200);
            policy.received(since, now);
        }
        assert!(!policy.poll(now));
    }
}
