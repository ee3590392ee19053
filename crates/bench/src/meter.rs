//! Meters: wall clock, a latency histogram per thread (merged at the end of a phase),
//! and CPU time (user + system) of this process and, when given, of the target's
//! process before and after the phase. The target's comes from /proc/PID/stat
//! (utime + stime, in clock ticks); ours from CLOCK_PROCESS_CPUTIME_ID, the same sum
//! for all our threads at nanosecond resolution, because a 10 ms tick turns the
//! short phases of a quick run into 0% or 150%. /proc/self/stat is the fallback.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::results::{Latency, PhaseResult};

/// Bytes in a megabyte as the reports count them (SI, like dd and fio's MB/s).
pub const MB: f64 = 1_000_000.0;

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
    target: Option<(u32, Option<u64>)>,
}

impl Meter {
    pub fn start(target_pid: Option<u32>) -> Meter {
        Meter {
            own: own_cpu_time(),
            target: target_pid.map(|pid| (pid, cpu_ticks(&pid.to_string()))),
            started: Instant::now(),
        }
    }

    /// Stops the meter and turns `totals` into a result.
    pub fn finish(self, spec: &PhaseSpec, totals: &Totals) -> PhaseResult {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        let percent = |before: Option<u64>, after: Option<u64>| {
            let ticks = after?.checked_sub(before?)?;
            Some(ticks as f64 / clock_ticks_per_second() / seconds * 100.0)
        };
        let cpu_percent = own_cpu_time()
            .zip(self.own)
            .and_then(|(after, before)| after.checked_sub(before))
            .map_or(0.0, |used| used.as_secs_f64() / seconds * 100.0);
        let target_cpu_percent = self
            .target
            .and_then(|(pid, before)| percent(before, cpu_ticks(&pid.to_string())));
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
        cpu_ticks("self")
            .map(|ticks| Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second()))
    }
}

/// utime + stime of a process in clock ticks, from /proc/`who`/stat.
pub fn cpu_ticks(who: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{who}/stat")).ok()?;
    parse_stat_ticks(&stat)
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
        assert!(cpu_ticks("self").is_some());
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
    fn a_busy_phase_uses_cpu() {
        let meter = Meter::start(Some(std::process::id()));
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
