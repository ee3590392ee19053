//! Measuring: workloads that drive any [`blockwire_blockdev::Device`] (or a file system
//! directory), meters for throughput, latency and CPU, and reports.

pub mod results;
