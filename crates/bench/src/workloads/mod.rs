//! The workloads, and what they share: the context of a run, a deterministic random
//! generator, data patterns and a helper that runs N synchronous workers so that N
//! requests stay in flight.

pub mod bonnie;
pub mod files;
pub mod network;
pub mod random;
pub mod sequential;
pub mod sweep;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use blockwire_blockdev::{Device, IoBuf, WriteFlags};

use crate::config::BenchConfig;
use crate::error::{Error, Result};
use crate::meter::{Meter, PhaseSpec, Recorder, Totals};
use crate::progress::Progress;
use crate::results::PhaseResult;

/// What a phase's progress bar counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Ops,
    Millis,
}

/// Everything a workload needs: the device, the configuration, the region it may use
/// (the first `region` bytes), and where results go.
pub struct Ctx<'a> {
    pub device: &'a Device,
    pub config: &'a BenchConfig,
    /// Bytes measured, from offset 0; a multiple of [`Ctx::align`].
    pub region: u64,
    /// The file behind the device on a directory target (bonnie's per-character
    /// tests go through a buffered stream on it).
    pub test_file: Option<&'a Path>,
    /// Whether the region holds data (not holes): read phases on a freshly created
    /// file fill it first so that they measure reads, not holes.
    written: AtomicBool,
    results: std::sync::Mutex<Vec<PhaseResult>>,
}

impl<'a> Ctx<'a> {
    pub fn new(
        device: &'a Device,
        config: &'a BenchConfig,
        region: u64,
        test_file: Option<&'a Path>,
        written: bool,
    ) -> Ctx<'a> {
        Ctx {
            device,
            config,
            region,
            test_file,
            written: AtomicBool::new(written),
            results: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The smallest request the device takes (O_DIRECT: 4 KiB).
    pub fn align(&self) -> u64 {
        u64::from(self.device.info().block_sizes.minimum).max(1)
    }

    /// Runs one measured phase: starts the meter and a progress bar of `total`
    /// `unit`s, runs `body`, stores the result.
    pub fn phase(
        &self,
        spec: PhaseSpec,
        total: u64,
        unit: Unit,
        body: impl FnOnce(&Progress) -> Result<Totals>,
    ) -> Result<PhaseResult> {
        let label = spec.label();
        let progress = match unit {
            Unit::Bytes => Progress::bytes(self.config.progress, &label, total),
            Unit::Ops => Progress::count(self.config.progress, &label, total),
            Unit::Millis => Progress::millis(self.config.progress, &label, total),
        };
        let meter = Meter::start(self.config.target_cpu.as_ref());
        let outcome = body(&progress);
        progress.finish();
        let totals = outcome?;
        let result = meter.finish(&spec, &totals);
        tracing::debug!(
            "{label}: {:.1} MB/s, {:.0} IOPS",
            result.mb_per_s,
            result.iops
        );
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(result.clone());
        Ok(result)
    }

    pub fn mark_written(&self) {
        self.written.store(true, Ordering::Relaxed);
    }

    /// Fills the region with data (unmeasured) unless it already holds some.
    pub fn ensure_written(&self) -> Result<()> {
        if self.written.load(Ordering::Relaxed) {
            return Ok(());
        }
        let chunk = (1u64 << 20).min(self.region) / self.align() * self.align();
        let progress = Progress::bytes(self.config.progress, "preparing data", self.region);
        let mut buf = IoBuf::new(chunk as usize);
        fill_pattern(&mut buf, 0x5eed);
        let mut offset = 0;
        while offset < self.region {
            let len = chunk.min(self.region - offset) as usize;
            self.device
                .write(&buf[..len], offset, WriteFlags::NONE)
                .map_err(|e| Error::device("preparing data", e))?;
            offset += len as u64;
            progress.inc(len as u64);
        }
        self.device
            .flush()
            .map_err(|e| Error::device("preparing data", e))?;
        progress.finish();
        self.mark_written();
        Ok(())
    }

    /// Makes completed writes durable, if the device can; counted in a write phase.
    pub fn flush(&self, phase: &str) -> Result<()> {
        if self.device.info().capabilities.flush.available() {
            self.device.flush().map_err(|e| Error::device(phase, e))?;
        }
        Ok(())
    }

    pub fn into_results(self) -> Vec<PhaseResult> {
        self.results.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

/// xorshift64*: fast, deterministic, good enough to pick offsets and fill buffers.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // Scramble so that small seeds (thread numbers) give unrelated streams.
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Fills `buf` with incompressible bytes, so that no layer can cheat on zeroes or
/// repeats.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let mut rng = Rng::new(seed);
    for chunk in buf.chunks_mut(8) {
        let word = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// The share of `count` items worker `index` of `workers` gets: (first, how many).
pub fn share(count: u64, workers: u32, index: u32) -> (u64, u64) {
    let workers = u64::from(workers.max(1));
    let index = u64::from(index);
    let base = count / workers;
    let extra = count % workers;
    let first = index * base + index.min(extra);
    (first, base + u64::from(index < extra))
}

/// Runs `workers` threads of `body(index, recorder)`, each returning (bytes, ops),
/// and adds up what they did. The first error wins; the others stop soon after
/// because `stop` is raised.
pub fn parallel<F>(workers: u32, body: F) -> Result<Totals>
where
    F: Fn(u32, &mut Recorder, &AtomicBool) -> Result<(u64, u64)> + Sync,
{
    let stop = AtomicBool::new(false);
    let outcomes: Vec<Result<Totals>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.max(1))
            .map(|index| {
                let body = &body;
                let stop = &stop;
                scope.spawn(move || {
                    let mut latency = Recorder::new();
                    let outcome = body(index, &mut latency, stop);
                    if outcome.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    outcome.map(|(bytes, ops)| Totals {
                        bytes,
                        ops,
                        latency,
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("benchmark worker panicked"))
            .collect()
    });
    let mut totals = Totals::default();
    for outcome in outcomes {
        totals.add(outcome?);
    }
    Ok(totals)
}

/// When a timed phase ends; also reports elapsed time to a progress bar in ms.
pub struct Deadline {
    started: Instant,
    length: Duration,
}

impl Deadline {
    pub fn after(length: Duration) -> Deadline {
        Deadline {
            started: Instant::now(),
            length,
        }
    }

    pub fn passed(&self) -> bool {
        self.started.elapsed() >= self.length
    }

    pub fn millis(length: Duration) -> u64 {
        length.as_millis().max(1) as u64
    }

    pub fn report(&self, progress: &Progress) {
        progress.set_at_least(self.started.elapsed().as_millis() as u64);
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use blockwire_blockdev::queue::InlineQueue;
    use blockwire_blockdev::{
        BlockDevice, Completion, Device, DeviceInfo, MemoryDevice, RequestQueue, Result,
        Submission, WriteFlags,
    };

    use crate::config::BenchConfig;

    /// A loopback port nothing listens on (it was free a moment ago).
    pub fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port()
    }

    /// Held by tests that look for an iperf3 on its default port of 127.0.0.1, and
    /// by the one test that starts one there: the others would find it.
    pub static IPERF3_DEFAULT_PORT: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Takes [`IPERF3_DEFAULT_PORT`], also after a test holding it failed.
    pub fn iperf3_default_port() -> std::sync::MutexGuard<'static, ()> {
        IPERF3_DEFAULT_PORT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub fn memory(size: u64) -> Device {
        Device::from_device(MemoryDevice::new(size))
    }

    /// A configuration small and quick enough for unit tests.
    pub fn tiny_config() -> BenchConfig {
        BenchConfig {
            size: 4 << 20,
            block_size: 256 << 10,
            queue_depth: 2,
            direct: false,
            phase_time: Duration::from_millis(30),
            sweep_time: Duration::from_millis(30),
            sweep_records: vec![4096, 64 << 10, 1 << 20],
            random_depths: vec![1, 4],
            seeks: 500,
            files_k: 1,
            ..BenchConfig::default()
        }
    }

    /// A memory device with a request queue that runs each request at once (the
    /// checked handle's [`InlineQueue`]), counting them: the queued path, without a
    /// network.
    pub struct Queued {
        inner: Arc<MemoryDevice>,
        handle: Device,
        pub submitted: AtomicU64,
    }

    struct CountingQueue<'a> {
        inner: InlineQueue<'a>,
        submitted: &'a AtomicU64,
    }

    impl Queued {
        pub fn new(size: u64) -> Arc<Queued> {
            let inner = Arc::new(MemoryDevice::new(size));
            Arc::new(Queued {
                handle: Device::new(inner.clone()),
                inner,
                submitted: AtomicU64::new(0),
            })
        }
    }

    impl RequestQueue for CountingQueue<'_> {
        fn submit(&mut self, submission: Submission) {
            self.submitted.fetch_add(1, Ordering::Relaxed);
            self.inner.submit(submission);
        }

        fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
            self.inner.complete(min, out);
        }

        fn in_flight(&self) -> usize {
            self.inner.in_flight()
        }
    }

    impl BlockDevice for Queued {
        fn info(&self) -> DeviceInfo {
            self.inner.info()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.inner.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
            self.inner.write_at(buf, offset, flags)
        }
        fn flush(&self) -> Result<()> {
            self.inner.flush()
        }
        fn fast_path(&self) -> Option<&dyn blockwire_blockdev::FastPath> {
            Some(self)
        }
    }

    impl blockwire_blockdev::FastPath for Queued {
        fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
            Some(Box::new(CountingQueue {
                inner: InlineQueue::new(&self.handle),
                submitted: &self.submitted,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything_once() {
        for (count, workers) in [(10u64, 3u32), (2, 4), (0, 2), (64, 1)] {
            let mut next = 0;
            for index in 0..workers {
                let (first, n) = share(count, workers, index);
                assert_eq!(first, next);
                next += n;
            }
            assert_eq!(next, count);
        }
    }

    #[test]
    fn random_numbers_stay_below_the_bound() {
        let mut rng = Rng::new(1);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let n = rng.below(7);
            assert!(n < 7);
            seen[n as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn patterns_are_not_zero_and_differ_by_seed() {
        let mut a = [0u8; 100];
        let mut b = [0u8; 100];
        fill_pattern(&mut a, 1);
        fill_pattern(&mut b, 2);
        assert_ne!(a, b);
        assert!(a.iter().filter(|&&x| x == 0).count() < 10);
    }
}
