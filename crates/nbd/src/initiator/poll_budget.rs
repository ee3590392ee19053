//! How long the queue's thread polls for completions before it sleeps.
//!
//! A queue's thread that sleeps until a reply arrives pays a wake-up per round
//! trip, and on a VM that costs an inter-processor interrupt. With small requests
//! at a moderate queue depth that is most of the latency (measured at 4 KiB random
//! reads, queue depth 16, target in memory on loopback, when each reply still woke
//! a reader thread and then the queue's: the initiator at 50% of a core, the target
//! at 54%, a quarter of the two cores idle). Polling the sockets for the next reply
//! spares the wake-up when replies come close together, as fio does with libnbd.
//!
//! Polling pays only while completions come within the poll, so the queue keeps
//! score: each window of [`WINDOW`] polls that saw fewer than a quarter of them
//! succeed turns polling off for the next [`PAUSE`] sleeps. Streams of large
//! requests, whose replies come hundreds of microseconds apart, thus stop polling
//! after a window and spend next to no CPU on it.

use std::time::Duration;

/// How long one poll lasts at most.
const POLL: Duration = Duration::from_micros(100);
/// Polls per scoring window.
const WINDOW: u32 = 32;
/// Polls in a window that must succeed for polling to go on.
const ENOUGH: u32 = WINDOW / 4;
/// Sleeps without polling after a window that did not pay.
const PAUSE: u32 = 256;

/// The adaptive poll budget of one queue (used by its thread only).
#[derive(Debug, Default)]
pub(crate) struct PollBudget {
    polls: u32,
    hits: u32,
    /// Sleeps left before polling is tried again.
    paused: u32,
}

impl PollBudget {
    /// How long to poll before sleeping this time (zero: sleep at once).
    pub fn next(&mut self) -> Duration {
        if self.paused > 0 {
            self.paused -= 1;
            return Duration::ZERO;
        }
        POLL
    }

    /// The poll [`next`](Self::next) allowed saw what it waited for (`true`) or not.
    pub fn record(&mut self, hit: bool) {
        self.polls += 1;
        self.hits += u32::from(hit);
        if self.polls == WINDOW {
            if self.hits < ENOUGH {
                self.paused = PAUSE;
            }
            self.polls = 0;
            self.hits = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_goes_on_while_it_pays() {
        let mut budget = PollBudget::default();
        for i in 0..10 * WINDOW {
            assert_eq!(budget.next(), POLL);
            // Exactly a quarter succeed: enough.
            budget.record(i % 4 == 0);
        }
    }

    #[test]
    fn a_window_that_does_not_pay_pauses_polling() {
        let mut budget = PollBudget::default();
        for i in 0..WINDOW {
            assert_eq!(budget.next(), POLL);
            budget.record(i < ENOUGH - 1);
        }
        for _ in 0..PAUSE {
            assert_eq!(budget.next(), Duration::ZERO);
        }
        // Then it tries again, with a fresh score.
        assert_eq!(budget.next(), POLL);
        budget.record(true);
        assert_eq!((budget.polls, budget.hits), (1, 1));
    }
}
