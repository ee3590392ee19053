//! The retransmission timer: a smoothed round-trip time and its variance, as TCP keeps
//! them (RFC 6298), clamped to what suits an Ethernet segment.
//!
//! AoE has no acknowledgements besides the answers themselves, so every frame is
//! timed. Each transmission carries its own tag, so an answer always tells which
//! transmission it belongs to and every sample is unambiguous (no need for Karn's
//! rule of discarding samples of retransmitted frames); the session only samples
//! answers to the latest transmission of a frame.

use std::time::Duration;

/// Shortest retransmission timeout: below this a busy target's scheduling jitter
/// alone would trigger retransmissions.
pub const RTO_MIN: Duration = Duration::from_micros(200);
/// Longest retransmission timeout, also the cap of the back-off.
pub const RTO_MAX: Duration = Duration::from_secs(1);
/// Timeout before the first sample (RFC 6298 says 1 s for the Internet; an Ethernet
/// segment answers in well under a millisecond).
pub const RTO_INITIAL: Duration = Duration::from_millis(100);

/// Smoothed RTT and RTT variance, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RttEstimator {
    srtt: Option<u64>,
    rttvar: u64,
}

impl Default for RttEstimator {
    fn default() -> Self {
        RttEstimator::new()
    }
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl RttEstimator {
    /// An estimator without samples: its timeout is [`RTO_INITIAL`].
    pub fn new() -> RttEstimator {
        RttEstimator {
            srtt: None,
            rttvar: 0,
        }
    }

    /// Takes one round-trip sample.
    pub fn sample(&mut self, rtt: Duration) {
        let r = nanos(rtt);
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(srtt) => {
                // RTTVAR = 3/4 RTTVAR + 1/4 |SRTT - R|; SRTT = 7/8 SRTT + 1/8 R.
                self.rttvar = (3 * self.rttvar + srtt.abs_diff(r)) / 4;
                self.srtt = Some((7 * srtt + r) / 8);
            }
        }
    }

    /// The smoothed round-trip time, if there was a sample.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt.map(Duration::from_nanos)
    }

    /// The round-trip variance.
    pub fn rttvar(&self) -> Duration {
        Duration::from_nanos(self.rttvar)
    }

    /// The retransmission timeout: SRTT + 4 RTTVAR within [`RTO_MIN`, `RTO_MAX`].
    pub fn rto(&self) -> Duration {
        match self.srtt {
            None => RTO_INITIAL,
            Some(srtt) => {
                let rto = srtt.saturating_add(self.rttvar.saturating_mul(4));
                Duration::from_nanos(rto).clamp(RTO_MIN, RTO_MAX)
            }
        }
    }

    /// The timeout of a frame sent `retries` times before: the RTO doubled per
    /// retransmission, at most [`RTO_MAX`].
    pub fn backoff(&self, retries: u32) -> Duration {
        let rto = self.rto();
        let factor = 1u32 << retries.min(20);
        rto.saturating_mul(factor).min(RTO_MAX.max(rto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn starts_at_the_initial_timeout() {
        let rtt = RttEstimator::new();
        assert_eq!(rtt.rto(), RTO_INITIAL);
        assert_eq!(rtt.srtt(), None);
    }

    #[test]
    fn first_sample_sets_srtt_and_half_variance() {
        let mut rtt = RttEstimator::new();
        rtt.sample(1000 * US);
        assert_eq!(rtt.srtt(), Some(1000 * US));
        assert_eq!(rtt.rttvar(), 500 * US);
        assert_eq!(rtt.rto(), 3000 * US);
    }

    #[test]
    fn follows_rfc_6298() {
        let mut rtt = RttEstimator::new();
        rtt.sample(800 * US);
        rtt.sample(1600 * US);
        // RTTVAR = 3/4·400 + 1/4·800 = 500; SRTT = 7/8·800 + 1/8·1600 = 900.
        assert_eq!(rtt.rttvar(), 500 * US);
        assert_eq!(rtt.srtt(), Some(900 * US));
        assert_eq!(rtt.rto(), 2900 * US);
    }

    #[test]
    fn converges_on_a_steady_link() {
        let mut rtt = RttEstimator::new();
        for _ in 0..200 {
            rtt.sample(50 * US);
        }
        assert_eq!(rtt.srtt(), Some(50 * US));
        // Variance decays to zero, so the floor holds.
        assert_eq!(rtt.rto(), RTO_MIN);
    }

    #[test]
    fn is_clamped() {
        let mut rtt = RttEstimator::new();
        rtt.sample(Duration::from_secs(5));
        assert_eq!(rtt.rto(), RTO_MAX);
        let mut rtt = RttEstimator::new();
        rtt.sample(US);
        assert_eq!(rtt.rto(), RTO_MIN);
    }

    #[test]
    fn backs_off_exponentially_up_to_the_cap() {
        let mut rtt = RttEstimator::new();
        rtt.sample(1000 * US);
        assert_eq!(rtt.backoff(0), 3 * Duration::from_millis(1));
        assert_eq!(rtt.backoff(1), 6 * Duration::from_millis(1));
        assert_eq!(rtt.backoff(3), 24 * Duration::from_millis(1));
        assert_eq!(rtt.backoff(9), RTO_MAX);
        assert_eq!(rtt.backoff(u32::MAX), RTO_MAX);
    }
}
