//! The figures one benchmark run produces, as written to `--json` and read back by
//! `--compare`. Every report (terminal table, bonnie++ CSV, HTML) is made from these.

use serde::{Deserialize, Serialize};

/// A whole run: configuration, machine, and one entry per measured phase.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunReport {
    /// What was measured, as given (path or URI).
    pub target: String,
    /// A short label for comparisons (defaults to the target).
    pub label: String,
    pub config: RunConfig,
    pub machine: Machine,
    /// Bare network throughput to and from the target host, when measured (MB/s):
    /// the slower direction. The `network` phases hold each direction (`send`,
    /// `receive`; `tcp` in reports from before both were measured).
    pub network_mb_per_s: Option<f64>,
    pub results: Vec<PhaseResult>,
    /// Warnings shown to the user (e.g. data set smaller than twice the RAM).
    pub warnings: Vec<String>,
}

/// How the run was configured.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunConfig {
    pub workloads: Vec<String>,
    /// Data set size in bytes.
    pub size: u64,
    pub block_size: u64,
    pub queue_depth: u32,
    pub direct: bool,
}

/// The machine the benchmark ran on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    pub hostname: String,
    pub cpus: u32,
    pub memory_bytes: u64,
    pub kernel: String,
}

/// One measured phase: a workload's operation at one block size and queue depth.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PhaseResult {
    /// sequential, bonnie, sweep, random, network
    pub workload: String,
    /// read, write, rewrite, randread, randwrite, reread, backread, strideread,
    /// putc, getc, seeks, create, stat, delete, ...; send and receive for the
    /// network.
    pub op: String,
    /// Bytes per operation.
    pub block_size: u64,
    pub queue_depth: u32,
    /// Bytes moved.
    pub bytes: u64,
    /// Operations completed.
    pub ops: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub iops: f64,
    pub latency_us: Latency,
    /// How the latencies spread: a log-bucketed histogram, four buckets per doubling
    /// ([`crate::meter::BUCKETS_PER_OCTAVE`]), empty buckets left out, in increasing
    /// order. Empty for phases without per-request latencies (network) and in
    /// reports from before it was recorded, which still load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency_histogram: Vec<HistogramBucket>,
    /// CPU% of the benchmark process (user + system; 100 = one core).
    pub cpu_percent: f64,
    /// CPU% of the target process, when it could be seen.
    pub target_cpu_percent: Option<f64>,
    /// Throughput per CPU% of the benchmark process (seed 003's efficiency figure).
    pub mb_per_s_per_cpu_percent: Option<f64>,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// One bucket of a latency histogram: the operations whose latency was above the
/// bucket below's bound and at most `le_us`. Bounds are 2^(k/4) µs for whole k,
/// rounded to three significant figures (…, 1, 1.19, 1.41, 1.68, 2, 2.38, …), so a
/// bucket's lower bound is the bound of the bucket below
/// ([`crate::meter::bucket_low_us`]) even when that one was empty and is not listed.
/// Counts are per bucket, not cumulative.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct HistogramBucket {
    /// Upper bound of the bucket in microseconds (inclusive).
    pub le_us: f64,
    /// Operations in the bucket.
    pub count: u64,
}
