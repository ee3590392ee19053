//! A latency histogram whose every observation is two atomic adds.
//!
//! prometheus-client's own `Histogram` takes a mutex on each `observe`; on the data
//! path of a storage target that is a lock per request, shared by every connection
//! of an export. This one keeps a counter per bucket and the sum in nanoseconds as
//! atomics. prometheus-client's encoder takes the buckets as they are stored (one
//! count per bucket, not cumulative) and adds them up itself into the cumulative
//! `le` series Prometheus wants; handing it cumulative counts would add them up
//! twice (issue 31: `le="+Inf"` far above `_count`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// Upper bounds of the latency buckets, in seconds: 10 µs (a page-cache hit) to
/// 10 s (a remote device reconnecting), about three buckets per decade.
pub const LATENCY_BOUNDS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

struct Buckets {
    /// `LATENCY_BOUNDS` in nanoseconds, for comparing without floating point.
    bounds_ns: [u64; LATENCY_BOUNDS.len()],
    /// Observations per bucket (not cumulative); the last one is +Inf.
    counts: [AtomicU64; LATENCY_BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

/// A histogram of durations with the `LATENCY_BOUNDS` buckets. Clones share their
/// counts (as prometheus-client's metrics do).
#[derive(Clone)]
pub struct LatencyHistogram(Arc<Buckets>);

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count())
            .finish()
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram(Arc::new(Buckets {
            bounds_ns: LATENCY_BOUNDS.map(|seconds| (seconds * 1e9).round() as u64),
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }))
    }
}

impl LatencyHistogram {
    /// Records one duration.
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let buckets = &self.0;
        let index = buckets.bounds_ns.partition_point(|&bound| bound < ns);
        buckets.counts[index].fetch_add(1, Ordering::Relaxed);
        buckets.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.0
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// The buckets as stored (upper bound, observations in it and above the bound
    /// before it), +Inf last: the form prometheus-client's encoder cumulates.
    fn per_bucket(&self) -> Vec<(f64, u64)> {
        LATENCY_BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.0.counts)
            .map(|(bound, count)| (bound, count.load(Ordering::Relaxed)))
            .collect()
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let buckets = self.per_bucket();
        // The count is the sum of the buckets read, so it equals the encoded +Inf
        // bucket even while requests finish during the scrape.
        let count = buckets.iter().map(|&(_, n)| n).sum();
        let sum = self.0.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let histogram = LatencyHistogram::default();
        histogram.observe(Duration::from_micros(10)); // on the bound: le="1e-05"
        histogram.observe(Duration::from_micros(11));
        histogram.observe(Duration::from_secs(60)); // beyond every bound
        let buckets = histogram.per_bucket();
        assert_eq!(buckets[0], (0.000_01, 1));
        assert_eq!(buckets[1], (0.000_025, 1));
        assert!(buckets[2..LATENCY_BOUNDS.len()]
            .iter()
            .all(|&(_, n)| n == 0));
        assert_eq!(*buckets.last().unwrap(), (f64::INFINITY, 1));
        assert_eq!(histogram.count(), 3);
    }

    /// The `le` series of the exposition: (bound, cumulative count) in order.
    fn encoded_buckets(text: &str) -> Vec<(String, u64)> {
        text.lines()
            .filter_map(|l| l.strip_prefix("latency_seconds_bucket{le=\""))
            .map(|rest| {
                let (bound, value) = rest.split_once("\"} ").unwrap();
                (bound.to_string(), value.parse().unwrap())
            })
            .collect()
    }

    fn encoded_value(text: &str, series: &str) -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {series} in {text}"));
        line[series.len() + 1..].parse().unwrap()
    }

    #[test]
    fn the_exposition_cumulates_once_and_ends_at_the_count() {
        let histogram = LatencyHistogram::default();
        // Spread over several buckets, as real requests are (issue 31: 288 writes
        // were exposed with le="+Inf" at 5176).
        for (micros, times) in [(5, 3), (20, 30), (40, 232), (200, 17), (3_000, 6)] {
            for _ in 0..times {
                histogram.observe(Duration::from_micros(micros));
            }
        }
        histogram.observe(Duration::from_secs(60));
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_with_unit(
            "latency",
            "test",
            prometheus_client::registry::Unit::Seconds,
            histogram.clone(),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();

        let count = encoded_value(&text, "latency_seconds_count");
        assert_eq!(count, 289);
        let buckets = encoded_buckets(&text);
        assert_eq!(buckets.len(), LATENCY_BOUNDS.len() + 1);
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "buckets fall: {buckets:?}"
        );
        assert_eq!(buckets.last().unwrap(), &("+Inf".to_string(), count));
        assert_eq!(buckets[0], ("0.00001".to_string(), 3));
        // le=0.00005 holds everything up to 40 µs.
        assert_eq!(buckets[2].1, 3 + 30 + 232);
        assert_eq!(buckets[LATENCY_BOUNDS.len() - 1].1, 288);
    }

    #[test]
    fn clones_share_their_counts() {
        let histogram = LatencyHistogram::default();
        histogram.clone().observe(Duration::from_millis(3));
        assert_eq!(histogram.count(), 1);
    }
}
