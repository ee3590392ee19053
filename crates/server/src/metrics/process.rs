//! The process's own figures, read from /proc at each scrape: resident memory,
//! threads, open files, start time and uptime. The names are the ones Prometheus's
//! client libraries use for every process (`process_*`), so existing dashboards
//! and alerts work unchanged.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Reads the process figures when scraped.
#[derive(Debug)]
pub struct ProcessCollector {
    started: Instant,
    start_time: f64,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        ProcessCollector::new()
    }
}

impl ProcessCollector {
    /// Figures for this process; its start is taken to be now (`serve` makes the
    /// collector as it starts).
    pub fn new() -> ProcessCollector {
        let start_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        ProcessCollector {
            started: Instant::now(),
            start_time,
        }
    }
}

/// Resident set size in bytes (/proc/self/statm counts pages).
pub fn resident_bytes() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * i64::from(page_size as i32))
}

pub fn threads() -> Option<i64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

pub fn open_fds() -> Option<i64> {
    // The directory's own descriptor is open while it is read: not counted.
    let count = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    Some(count - 1)
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: Option<impl prometheus_client::encoding::EncodeGaugeValue>,
) -> Result<(), std::fmt::Error> {
    let Some(value) = value else {
        return Ok(());
    };
    let gauge = ConstGauge::new(value);
    let metric = encoder.encode_descriptor(name, help, unit, gauge.metric_type())?;
    gauge.encode(metric)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        gauge(
            &mut encoder,
            "process_resident_memory",
            "Resident memory size",
            Some(&Unit::Bytes),
            resident_bytes(),
        )?;
        gauge(
            &mut encoder,
            "process_threads",
            "Threads in the process",
            None,
            threads(),
        )?;
        gauge(
            &mut encoder,
            "process_open_fds",
            "Open file descriptors (files, sockets, devices)",
            None,
            open_fds(),
        )?;
        gauge(
            &mut encoder,
            "process_start_time",
            "Start time of the process since the Unix epoch",
            Some(&Unit::Seconds),
            Some(self.start_time),
        )?;
        // A counter: it only goes up, and rate() over it is 1 while serving.
        let uptime = ConstCounter::new(self.started.elapsed().as_secs_f64());
        let metric = encoder.encode_descriptor(
            "blockwire_uptime",
            "Time since blockwire serve started",
            Some(&Unit::Seconds),
            uptime.metric_type(),
        )?;
        uptime.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        assert!(resident_bytes().unwrap() > 0);
        assert!(threads().unwrap() >= 1);
        // Other tests of this process open and close files meanwhile (the count
        // was once off by one under CI), so open many and allow for a few.
        let before = open_fds().unwrap();
        let files: Vec<_> = (0..64)
            .map(|_| std::fs::File::open("/proc/self/statm").unwrap())
            .collect();
        let during = open_fds().unwrap();
        assert!(
            (during - before - 64).abs() <= 16,
            "{before} descriptors, then {during} with 64 more open"
        );
        drop(files);
    }
}
