//! What to run and how: the workloads, the data set, block sizes, queue depths, times.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::target_cpu::TargetCpu;

/// One family of measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// Bare TCP throughput to the target host (seed 002 measures the link first).
    Network,
    /// dd-style: write then read the data set in large blocks.
    Sequential,
    /// bonnie++'s set: per-character, block, rewrite, seeks, file create/stat/delete.
    Bonnie,
    /// iozone-style record-size sweep.
    Sweep,
    /// 4 KiB random reads and writes at several queue depths.
    Random,
}

impl Workload {
    /// Every workload, in the order they run.
    pub const ALL: [Workload; 5] = [
        Workload::Network,
        Workload::Sequential,
        Workload::Bonnie,
        Workload::Sweep,
        Workload::Random,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Network => "network",
            Workload::Sequential => "sequential",
            Workload::Bonnie => "bonnie",
            Workload::Sweep => "sweep",
            Workload::Random => "random",
        }
    }

    /// Whether the workload writes to the target.
    pub fn writes(self) -> bool {
        self != Workload::Network
    }

    /// Parses a comma-separated list (`all` for every workload; `dd`, `seq`, `iozone`
    /// accepted as aliases). The result is sorted into run order without duplicates.
    pub fn parse_list(text: &str) -> Result<Vec<Workload>, String> {
        let mut out = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word.eq_ignore_ascii_case("all") {
                out.extend(Workload::ALL);
            } else {
                out.push(word.parse()?);
            }
        }
        if out.is_empty() {
            return Err(
                "no workload named (choose from network, sequential, bonnie, sweep, random, all)"
                    .into(),
            );
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

impl FromStr for Workload {
    type Err = String;

    fn from_str(text: &str) -> Result<Workload, String> {
        match text.to_ascii_lowercase().as_str() {
            "network" | "net" => Ok(Workload::Network),
            "sequential" | "seq" | "dd" => Ok(Workload::Sequential),
            "bonnie" | "bonnie++" => Ok(Workload::Bonnie),
            "sweep" | "iozone" => Ok(Workload::Sweep),
            "random" | "rand" => Ok(Workload::Random),
            _ => Err(format!(
                "unknown workload '{text}' (choose from network, sequential, bonnie, sweep, random, all)"
            )),
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// bonnie++'s own I/O chunk size, used for its block tests and seeks.
pub const BONNIE_CHUNK: u64 = 8192;

/// The sweep's record sizes: every power of two from 4 KiB to 16 MiB (13 sizes), as
/// iozone's automatic mode (`-a`) steps them and as seed 002's sweep ran.
pub fn sweep_records() -> Vec<u64> {
    (12..=24).map(|shift| 1u64 << shift).collect()
}

/// The sum of the default sweep's per-measurement caps, whatever the record sizes:
/// 112 s, what it came to when it stepped through 7 record sizes (powers of 4) × 8
/// operations × 2 s. A measurement ends at its cap at the latest, so the
/// measurements together take at most this long (the work between them, such as
/// opening the test file, comes on top). Every power of two makes 13 × 8 = 104
/// measurements; at 2 s each the sweep would nearly double, so by default the
/// budget is shared out instead ([`default_sweep_time`]) and each measurement is
/// capped at about 1.08 s. Small records on slow storage are what hit the cap, and
/// iozone's point is the shape of the curve over record sizes, which a second per
/// point still draws; a run that wants longer points passes `--time`, which caps
/// each measurement as given.
pub const SWEEP_BUDGET: Duration = Duration::from_secs(112);

/// The cap of each sweep measurement that keeps a sweep over `records` record sizes
/// within [`SWEEP_BUDGET`].
pub fn default_sweep_time(records: usize) -> Duration {
    let measurements = (records * crate::workloads::sweep::OPS.len()).max(1);
    SWEEP_BUDGET / u32::try_from(measurements).unwrap_or(u32::MAX)
}

/// How a run is configured. [`BenchConfig::default`] holds the defaults the CLI uses;
/// tests shrink sizes and times.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Workloads to run; empty means every one that fits the target.
    pub workloads: Vec<Workload>,
    /// Data set in bytes (filled in from the target when opened through a path).
    pub size: u64,
    /// Block size of the sequential workload.
    pub block_size: u64,
    /// Requests in flight for the sequential workload (one thread each).
    pub queue_depth: u32,
    /// Whether the page cache is bypassed (recorded in the report).
    pub direct: bool,
    /// Time per random-I/O point.
    pub phase_time: Duration,
    /// Time cap of each sweep measurement (each is also capped at `size` bytes); by
    /// default [`SWEEP_BUDGET`] shared out over the measurements.
    pub sweep_time: Duration,
    /// Record sizes of the sweep.
    pub sweep_records: Vec<u64>,
    /// Queue depths of the random workload.
    pub random_depths: Vec<u32>,
    /// Block size of bonnie's block tests and seeks.
    pub bonnie_chunk: u64,
    /// Total random seeks (bonnie++: 8192), also stopped after `phase_time`.
    pub seeks: u64,
    /// Concurrent seekers (bonnie++: 3).
    pub seekers: u32,
    /// Files for the create/stat/delete tests, in units of 1024 (bonnie++'s `-n`).
    pub files_k: u32,
    /// CPU of this process is always measured; the target's too, when it can be
    /// seen (`--target-pid`, or found by [`run`](crate::run): see [`TargetCpu`]).
    pub target_cpu: Option<TargetCpu>,
    /// Show a progress bar per phase on stderr (hidden when it is not a terminal).
    pub progress: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        let sweep_records = sweep_records();
        BenchConfig {
            workloads: Vec::new(),
            size: 1 << 30,
            block_size: 1 << 20,
            queue_depth: 1,
            direct: true,
            phase_time: Duration::from_secs(3),
            sweep_time: default_sweep_time(sweep_records.len()),
            sweep_records,
            random_depths: vec![1, 4, 16, 64],
            bonnie_chunk: BONNIE_CHUNK,
            seeks: 8192,
            seekers: 3,
            files_k: 16,
            target_cpu: None,
            progress: false,
        }
    }
}

impl BenchConfig {
    /// Whether `workload` was asked for (an empty list asks for all).
    pub fn wants(&self, workload: Workload) -> bool {
        self.workloads.is_empty() || self.workloads.contains(&workload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_lists_parse_in_run_order() {
        let list = Workload::parse_list("random, dd,bonnie,random").unwrap();
        assert_eq!(
            list,
            vec![Workload::Sequential, Workload::Bonnie, Workload::Random]
        );
        assert_eq!(Workload::parse_list("all").unwrap(), Workload::ALL.to_vec());
        assert!(Workload::parse_list("fast").unwrap_err().contains("fast"));
        assert!(Workload::parse_list("").is_err());
    }

    #[test]
    fn default_sweep_steps_every_power_of_two_from_4k_to_16m() {
        let config = BenchConfig::default();
        let kib = [
            4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
        ];
        let expected: Vec<u64> = kib.iter().map(|k| k << 10).collect();
        assert_eq!(config.sweep_records, expected);
    }

    #[test]
    fn default_sweep_keeps_the_old_time_budget() {
        let config = BenchConfig::default();
        let measurements = config.sweep_records.len() * crate::workloads::sweep::OPS.len();
        assert_eq!(measurements, 104);
        let total = config.sweep_time * measurements as u32;
        // The 7 × 8 × 2 s of the powers-of-4 sweep, to the nanosecond rounding.
        assert!(total <= SWEEP_BUDGET, "{total:?}");
        assert!(SWEEP_BUDGET - total < Duration::from_micros(1), "{total:?}");
        assert!(config.sweep_time > Duration::from_secs(1), "{config:?}");
    }
}
