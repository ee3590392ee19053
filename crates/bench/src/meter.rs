//! Meters: wall clock, a latency histogram per thread (merged at the end of a phase),
//! and CPU time (user + system) of this process and, when given, of the target's
//! process before and after the phase (see [`crate::target_cpu`]). A target process
//! on this host is read from /proc/PID/stat (utime + stime, in clock ticks); ours
//! from CLOCK_PROCESS_CPUTIME_ID, the same sum for all our threads at nanosecond
//! resolution, because a 10 ms tick turns the short phases of a quick run into 0% or
//! 150%. /proc/self/stat is the fallback.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::results::{HistogramBucket, Latency, PhaseResult};
use crate::target_cpu::TargetCpu;

/// Bytes in a megabyte as the reports count them (SI, like dd and fio's MB/s).
pub const MB: f64 = 1_000_000.0;

/// Buckets per doubling of latency in [`Recorder::buckets`]: bounds 19% apart, fine
/// enough to show a distribution's shape and its modes, while a phase whose
/// latencies span 1 µs to 1 s still needs at most 80 buckets (usually a dozen or
/// two, as empty ones are left out).
pub const BUCKETS_PER_OCTAVE: i32 = 4;

/// Upper bound in microseconds of log bucket `k`: 2^(k / [`BUCKETS_PER_OCTAVE`]),
/// rounded to three significant figures so that the JSON reads 1.19 rather than
/// 1.189207115002721. Adjacent bounds are 19% apart, so the rounding (at most
/// 0.5%) keeps them increasing.
pub fn bucket_bound_us(k: i32) -> f64 {
    let exact = 2f64.powf(f64::from(k) / f64::from(BUCKETS_PER_OCTAVE));
    let digits = 2 - exact.log10().floor() as i32;
    // Scaling by a whole power of ten in the direction that keeps it exact.
    if digits >= 0 {
        let scale = 10f64.powi(digits);
        (exact * scale).round() / scale
    } else {
        let scale = 10f64.powi(-digits);
        (exact / scale).round() * scale
    }
}

/// Lower bound in microseconds of the bucket whose upper bound is `le_us`: exactly
/// the bound of the bucket below, listed or not (the rounding of the bounds makes
/// `le_us` / 2^(1/4) miss it by up to 0.6%).
pub fn bucket_low_us(le_us: f64) -> f64 {
    bucket_bound_us(bucket_of(le_us) - 1)
}

/// The bucket [`bucket_bound_us`] whose range (the bound below, this bound] holds
/// `us` microseconds. Zero counts as a nanosecond, the clock's resolution.
fn bucket_of(us: f64) -> i32 {
    let us = us.max(0.001);
    let mut k = (us.log2() * f64::from(BUCKETS_PER_OCTAVE)).ceil() as i32;
    // The rounded bounds can move a value right at a bound by one bucket.
    while bucket_bound_us(k) < us {
        k += 1;
    }
    while bucket_bound_us(k - 1) >= us {
        k -= 1;
    }
    k
}

/// Latencies of one thread; recorded in nanoseconds so that memory-speed operations
/// do not all land in one bucket, reported in microseconds.
pub struct Recorder {
    histogram: Histogram<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            // Three significant figures, growing as needed: 0.1% error at any value.
            histogram: Histogram::new(3).expect("3 significant figures are valid"),
        }
    }

    pub fn record(&mut self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        // The histogram grows to fit; only a failed allocation makes it clamp.
        if self.histogram.record(nanos).is_err() {
            self.histogram.saturating_record(nanos);
        }
    }

    /// Runs `f` and records how long it took.
    pub fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        self.record(started.elapsed());
        out
    }

    pub fn merge(&mut self, other: &Recorder) {
        // Both histograms auto-resize, so adding cannot fail on range.
        let _ = self.histogram.add(&other.histogram);
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// p50, p99, p99.9 and max in microseconds (zeroes when nothing was recorded).
    pub fn latency(&self) -> Latency {
        if self.histogram.is_empty() {
            return Latency::default();
        }
        let us = |nanos: u64| nanos as f64 / 1000.0;
        Latency {
            p50: us(self.histogram.value_at_quantile(0.5)),
            p99: us(self.histogram.value_at_quantile(0.99)),
            p999: us(self.histogram.value_at_quantile(0.999)),
            max: us(self.histogram.max()),
        }
    }

    /// The latencies as a compact log-bucketed histogram, in microseconds: for each
    /// non-empty bucket its upper bound ([`bucket_bound_us`]) and count, bounds
    /// increasing, counts adding up to [`Recorder::count`]. Values are taken at
    /// the top of their hdrhistogram bin (as the percentiles are), 0.1% at most
    /// above what was recorded.
    pub fn buckets(&self) -> Vec<HistogramBucket> {
        let mut out: Vec<HistogramBucket> = Vec::new();
        let mut last: Option<i32> = None;
        for value in self.histogram.iter_recorded() {
            let k = bucket_of(value.value_iterated_to() as f64 / 1000.0);
            let count = value.count_at_value();
            match out.last_mut() {
                // Recorded values come in increasing order, so a bucket's values
                // arrive together.
                Some(bucket) if last == Some(k) => bucket.count += count,
                _ => {
                    out.push(HistogramBucket {
                        le_us: bucket_bound_us(k),
                        count,
                    });
                    last = Some(k);
                }
            }
        }
        out
    }
}

/// What a phase did: bytes and operations, and the latency of each operation.
#[derive(Default)]
pub struct Totals {
    pub bytes: u64,
    pub ops: u64,
    pub latency: Recorder,
}

impl Totals {
    pub fn add(&mut self, other: Totals) {
        self.bytes += other.bytes;
        self.ops += other.ops;
        self.latency.merge(&other.latency);
    }
}

/// Names a phase: which workload, which operation, at what block size and depth.
#[derive(Debug, Clone)]
pub struct PhaseSpec {
    pub workload: String,
    pub op: String,
    pub block_size: u64,
    pub queue_depth: u32,
}

impl PhaseSpec {
    pub fn new(workload: &str, op: &str, block_size: u64, queue_depth: u32) -> PhaseSpec {
        PhaseSpec {
            workload: workload.to_string(),
            op: op.to_string(),
            block_size,
            queue_depth,
        }
    }

    /// A short label for progress bars: "sweep write 64K".
    pub fn label(&self) -> String {
        let mut label = format!("{} {}", self.workload, self.op);
        if self.block_size > 1 {
            label.push(' ');
            label.push_str(&blockwire_blockdev::size::format_size(self.block_size));
        }
        if self.queue_depth > 1 {
            label.push_str(&format!(" qd{}", self.queue_depth));
        }
        label
    }
}

/// Wall clock and CPU time since a phase started.
pub struct Meter {
    started: Instant,
    own: Option<Duration>,
    target: Option<(TargetCpu, Option<Duration>)>,
}

impl Meter {
    pub fn start(target: Option<&TargetCpu>) -> Meter {
        // The target first: sampling it through a netserve is a round trip, whose
        // CPU must not count as the phase's.
        let target = target.map(|source| (source.clone(), source.sample()));
        Meter {
            own: own_cpu_time(),
            target,
            started: Instant::now(),
        }
    }

    /// Stops the meter and turns `totals` into a result.
    pub fn finish(self, spec: &PhaseSpec, totals: &Totals) -> PhaseResult {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        let cpu_percent = own_cpu_time()
            .zip(self.own)
            .and_then(|(after, before)| after.checked_sub(before))
            .map_or(0.0, |used| used.as_secs_f64() / seconds * 100.0);
        let target_cpu_percent = self.target.and_then(|(source, before)| {
            let used = source.sample()?.checked_sub(before?)?;
            Some(used.as_secs_f64() / seconds * 100.0)
        });
        let mb_per_s = totals.bytes as f64 / MB / seconds;
        PhaseResult {
            workload: spec.workload.clone(),
            op: spec.op.clone(),
            block_size: spec.block_size,
            queue_depth: spec.queue_depth,
            bytes: totals.bytes,
            ops: totals.ops,
            seconds,
            mb_per_s,
            iops: totals.ops as f64 / seconds,
            latency_us: totals.latency.latency(),
            latency_histogram: totals.latency.buckets(),
            cpu_percent,
            target_cpu_percent,
            mb_per_s_per_cpu_percent: (cpu_percent > 0.0 && totals.bytes > 0)
                .then(|| mb_per_s / cpu_percent),
        }
    }
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// User + system CPU time of all threads of this process.
pub fn own_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    if rc == 0 {
        Some(Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
    } else {
        proc_cpu_time("self")
    }
}

/// User + system CPU time of process `pid` (all threads), from /proc.
pub fn process_cpu_time(pid: u32) -> Option<Duration> {
    proc_cpu_time(&pid.to_string())
}

/// utime + stime of a process, from /proc/`who`/stat (10 ms clock ticks).
fn proc_cpu_time(who: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{who}/stat")).ok()?;
    let ticks = parse_stat_ticks(&stat)?;
    Some(Duration::from_secs_f64(
        ticks as f64 / clock_ticks_per_second(),
    ))
}

/// utime + stime from the text of a /proc/PID/stat file. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last ')'.
fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = "1234 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 37 0 0 20 0 1 0 100";
        assert_eq!(parse_stat_ticks(line), Some(287));
        assert_eq!(parse_stat_ticks("garbage"), None);
        assert!(proc_cpu_time("self").is_some());
    }

    #[test]
    fn latency_percentiles_come_out_in_microseconds() {
        let mut recorder = Recorder::new();
        for us in 1..=1000u64 {
            recorder.record(Duration::from_micros(us));
        }
        let latency = recorder.latency();
        assert!((latency.p50 - 500.0).abs() < 2.0, "{latency:?}");
        assert!((latency.p99 - 990.0).abs() < 2.0, "{latency:?}");
        assert!((latency.max - 1000.0).abs() < 2.0, "{latency:?}");
        assert_eq!(Recorder::new().latency(), Latency::default());
    }

    #[test]
    fn a_buckets_lower_bound_is_the_bound_below() {
        for k in -12..100 {
            assert_eq!(bucket_low_us(bucket_bound_us(k)), bucket_bound_us(k - 1));
        }
        assert_eq!(bucket_low_us(1220.0), 1020.0);
    }

    #[test]
    fn bucket_bounds_are_rounded_powers_of_two_that_increase() {
        assert_eq!(bucket_bound_us(0), 1.0);
        assert_eq!(bucket_bound_us(1), 1.19);
        assert_eq!(bucket_bound_us(2), 1.41);
        assert_eq!(bucket_bound_us(4), 2.0);
        assert_eq!(bucket_bound_us(40), 1020.0);
        assert_eq!(bucket_bound_us(-16), 0.0625);
        // From 1 ns (bucket -39 holds (0.000977, 0.00116] µs) up to about 35 s.
        for k in -39..100 {
            assert!(bucket_bound_us(k) < bucket_bound_us(k + 1), "{k}");
            let us = bucket_bound_us(k);
            assert_eq!(bucket_of(us), k, "a bound belongs to its own bucket");
            assert_eq!(bucket_of(us * 1.001), k + 1);
        }
        assert_eq!(bucket_of(0.0), bucket_of(0.001));
    }

    #[test]
    fn histogram_buckets_hold_every_operation_in_increasing_order() {
        let mut recorder = Recorder::new();
        assert!(recorder.buckets().is_empty());
        // Two modes, 3 µs and about 2 ms, and a zero and a one-second outlier.
        for _ in 0..900 {
            recorder.record(Duration::from_micros(3));
        }
        for us in 1900..2000u64 {
            recorder.record(Duration::from_micros(us));
        }
        recorder.record(Duration::ZERO);
        recorder.record(Duration::from_secs(1));
        let buckets = recorder.buckets();
        let total: u64 = buckets.iter().map(|b| b.count).sum();
        assert_eq!(total, recorder.count());
        assert_eq!(total, 1002);
        assert!(
            buckets.windows(2).all(|w| w[0].le_us < w[1].le_us),
            "{buckets:?}"
        );
        assert!(buckets.iter().all(|b| b.count > 0));
        // The 3 µs mode sits in (2.83, 3.36]; 1.9-2.0 ms in (1720, 2050].
        let at = |le: f64| buckets.iter().find(|b| b.le_us == le).map(|b| b.count);
        assert_eq!(at(3.36), Some(900));
        assert_eq!(at(2050.0), Some(100));
        assert_eq!(buckets.first().unwrap().count, 1);
        assert!(buckets.first().unwrap().le_us < 0.002);
        let last = buckets.last().unwrap();
        assert_eq!(last.count, 1);
        assert!(
            last.le_us >= 1_000_000.0 && last.le_us < 1_200_000.0,
            "{last:?}"
        );
        // The histogram merges with the rest of the recorder.
        let mut merged = Recorder::new();
        merged.merge(&recorder);
        merged.merge(&recorder);
        assert_eq!(merged.buckets().iter().map(|b| b.count).sum::<u64>(), 2004);
    }

    #[test]
    fn a_busy_phase_uses_cpu() {
        let meter = Meter::start(Some(&TargetCpu::Process(std::process::id())));
        let started = Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(150) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let totals = Totals {
            bytes: 1_000_000,
            ops: 1,
            latency: Recorder::new(),
        };
        let result = meter.finish(&PhaseSpec::new("test", "spin", 1, 1), &totals);
        assert!(result.cpu_percent > 20.0, "{result:?}");
        assert!(result.target_cpu_percent.unwrap() > 20.0);
        assert!(result.mb_per_s > 0.0 && result.mb_per_s < 10.0);
    }
}
