//! The measured offload policy: which reads and writes a connection thread runs
//! itself and which it hands to the workers.
//!
//! Running a cached read or a buffered write on the connection's own thread saves a
//! hand-off and keeps replies batched. That is right for small requests. A stream of
//! large ones, though, keeps that one thread copying while the other cores idle: each
//! request waits for the copy of the one before it, and then for its send. So every
//! connection measures how long its large reads and writes take per byte. While the
//! client has more requests outstanding, a request whose predicted time is above
//! [`INLINE_BUDGET`] goes to the workers. Several threads then copy at once while the
//! connection thread reads the next requests. A client with one request at a time
//! keeps the inline path and its lower latency.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// A request predicted to keep the connection thread busy longer than this is worth
/// a hand-off (waking a worker costs a few microseconds).
pub const INLINE_BUDGET: Duration = Duration::from_micros(20);
/// Smaller requests always run inline: their cost is the system call, not the copy.
pub const OFFLOAD_MIN: usize = 64 * 1024;
/// Bytes of offloaded requests one connection may have on workers at once, so a
/// client streaming writes cannot make the server hold more than this of payload.
pub const OFFLOAD_BYTES: usize = 64 << 20;
/// First guess of the copy cost until the connection has measured its own, in
/// nanoseconds per KiB (about 5 GB/s).
const INITIAL_NS_PER_KIB: u64 = 200;

/// Whether a request moves data, and which way: the two costs measured apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transfer {
    Read,
    Write,
}

/// The per-connection decision and the measurements behind it. Shared with the
/// workers, which report how long the requests they ran took.
#[derive(Debug)]
pub struct OffloadPolicy {
    read_ns_per_kib: AtomicU64,
    write_ns_per_kib: AtomicU64,
    offloaded_bytes: AtomicUsize,
}

impl Default for OffloadPolicy {
    fn default() -> Self {
        OffloadPolicy {
            read_ns_per_kib: AtomicU64::new(INITIAL_NS_PER_KIB),
            write_ns_per_kib: AtomicU64::new(INITIAL_NS_PER_KIB),
            offloaded_bytes: AtomicUsize::new(0),
        }
    }
}

impl OffloadPolicy {
    fn estimate(&self, transfer: Transfer) -> &AtomicU64 {
        match transfer {
            Transfer::Read => &self.read_ns_per_kib,
            Transfer::Write => &self.write_ns_per_kib,
        }
    }

    /// Whether this request should run on a worker. `more_waiting` says whether the
    /// client has already sent more behind it (asked only when it matters: it may
    /// cost a system call).
    pub fn should_offload(
        &self,
        transfer: Transfer,
        len: usize,
        more_waiting: impl FnOnce() -> bool,
    ) -> bool {
        if len < OFFLOAD_MIN {
            return false;
        }
        let offloaded = self.offloaded_bytes.load(Ordering::Relaxed);
        if offloaded == 0 && !more_waiting() {
            // Nothing to overlap with: the hand-off would only add latency.
            return false;
        }
        if offloaded + len > OFFLOAD_BYTES {
            // Enough is on the workers already; running this one here slows the
            // client down instead of letting its payloads pile up in memory.
            return false;
        }
        let ns_per_kib = self.estimate(transfer).load(Ordering::Relaxed);
        let predicted = Duration::from_nanos(ns_per_kib.saturating_mul(len as u64) / 1024);
        predicted > INLINE_BUDGET
    }

    /// Records how long a request of `len` bytes took to run, on whichever thread.
    pub fn record(&self, transfer: Transfer, len: usize, took: Duration) {
        if len < OFFLOAD_MIN {
            return;
        }
        let sample = (took.as_nanos() as u64).saturating_mul(1024) / len as u64;
        let estimate = self.estimate(transfer);
        // A moving average over about eight requests; a lost update between racing
        // workers only delays the estimate by one sample.
        let old = estimate.load(Ordering::Relaxed);
        estimate.store((old * 7 + sample) / 8, Ordering::Relaxed);
    }

    /// The current estimate of a transfer's cost, in nanoseconds per KiB.
    pub fn ns_per_kib(&self, transfer: Transfer) -> u64 {
        self.estimate(transfer).load(Ordering::Relaxed)
    }

    /// Counts `len` bytes as handed to a worker.
    pub fn start(&self, len: usize) {
        self.offloaded_bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// Counts `len` bytes as answered by a worker.
    pub fn finish(&self, len: usize) {
        self.offloaded_bytes.fetch_sub(len, Ordering::Relaxed);
    }

    /// Bytes of measured requests on workers now.
    pub fn offloaded_bytes(&self) -> usize {
        self.offloaded_bytes.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn small_requests_stay_inline() {
        let policy = OffloadPolicy::default();
        assert!(!policy.should_offload(Transfer::Read, 4096, || true));
        assert!(!policy.should_offload(Transfer::Write, OFFLOAD_MIN - 1, || true));
    }

    #[test]
    fn a_lone_request_stays_inline() {
        let policy = OffloadPolicy::default();
        assert!(!policy.should_offload(Transfer::Read, MIB, || false));
        assert!(policy.should_offload(Transfer::Read, MIB, || true));
        // Once something is on the workers, the next large one joins it.
        policy.start(MIB);
        assert!(policy.should_offload(Transfer::Read, MIB, || false));
        policy.finish(MIB);
        assert!(!policy.should_offload(Transfer::Read, MIB, || false));
    }

    #[test]
    fn measured_cost_decides() {
        let policy = OffloadPolicy::default();
        // A device that copies 1 MiB in 10 µs: even large requests are cheap.
        for _ in 0..64 {
            policy.record(Transfer::Write, MIB, Duration::from_micros(10));
        }
        assert!(!policy.should_offload(Transfer::Write, MIB, || true));
        // Reads were not measured cheap, so they still go.
        assert!(policy.should_offload(Transfer::Read, MIB, || true));
        // The writes become slow: after a few samples they are offloaded too.
        for _ in 0..16 {
            policy.record(Transfer::Write, MIB, Duration::from_micros(300));
        }
        assert!(policy.should_offload(Transfer::Write, MIB, || true));
    }

    #[test]
    fn offloaded_bytes_are_bounded() {
        let policy = OffloadPolicy::default();
        let requests = OFFLOAD_BYTES / MIB;
        for _ in 0..requests {
            assert!(policy.should_offload(Transfer::Write, MIB, || true));
            policy.start(MIB);
        }
        assert!(!policy.should_offload(Transfer::Write, MIB, || true));
        policy.finish(MIB);
        assert!(policy.should_offload(Transfer::Write, MIB, || true));
    }
}
