//! A composer that makes a device as slow as a disk: at most a given byte rate for
//! reads and writes, and a fixed latency added to every request (nbdkit's rate and
//! delay filters). The lab serves a throttled memory device to stand in for a
//! 70 MB/s disk, or seed 000's 288/256 MB/s RAID-0, without owning one.
//!
//! The rate is a token bucket shared by every thread and handle, kept as a single
//! atomic "theoretical arrival time" (GCRA, the same bucket in one word): a request
//! reserves its bytes with one compare-and-swap and sleeps until the bucket would
//! have held them. No lock on the data path.

use std::io::IoSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::device::{BlockDevice, Extent, WriteFlags, ZeroFlags};
use crate::error::Result;
use crate::fast_path::FastPath;
use crate::handle::Device;
use crate::info::DeviceInfo;

/// How much time's worth of bytes may pass at once after an idle spell (the
/// bucket's depth): enough that a 1 MiB request at 70 MB/s is not split into
/// sleeps, small enough that the rate holds over any window of a second.
const BURST: Duration = Duration::from_millis(20);

/// How slow to make a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThrottleConfig {
    /// Bytes per second read and written together; `None`: unlimited.
    pub rate: Option<u64>,
    /// Added to every read, write, trim and write-zeroes.
    pub latency: Duration,
}

impl ThrottleConfig {
    /// Whether the throttle changes anything.
    pub fn is_active(&self) -> bool {
        self.rate.is_some() || !self.latency.is_zero()
    }
}

/// A device slowed down to a byte rate and a per-request latency.
pub struct Throttle {
    inner: Device,
    config: ThrottleConfig,
    info: DeviceInfo,
    epoch: Instant,
    /// Nanoseconds after `epoch` at which the bucket has paid for every byte
    /// reserved so far.
    paid_until: AtomicU64,
}

impl Throttle {
    pub fn new(inner: Device, config: ThrottleConfig) -> Throttle {
        let mut info = *inner.info();
        // Every request may sleep: targets must not run it on a connection thread.
        info.completes_inline = false;
        Throttle {
            inner,
            config,
            info,
            epoch: Instant::now(),
            paid_until: AtomicU64::new(0),
        }
    }

    /// Wraps `inner` when `config` changes anything; otherwise returns it as is.
    pub fn wrap(inner: Device, config: ThrottleConfig) -> Device {
        if config.is_active() {
            Device::from_device(Throttle::new(inner, config))
        } else {
            inner
        }
    }

    pub fn config(&self) -> ThrottleConfig {
        self.config
    }

    /// Waits until `bytes` may pass at the configured rate, then the latency.
    fn pace(&self, bytes: u64) {
        let mut wait = Duration::ZERO;
        if let Some(rate) = self.config.rate.filter(|&r| r > 0) {
            let cost = (u128::from(bytes) * 1_000_000_000 / u128::from(rate)) as u64;
            let burst = BURST.as_nanos() as u64;
            let mut paid = self.paid_until.load(Ordering::Relaxed);
            loop {
                let now = self.epoch.elapsed().as_nanos() as u64;
                // Idle time does not pile up credit beyond the burst.
                let next = paid.max(now).saturating_add(cost);
                match self.paid_until.compare_exchange_weak(
                    paid,
                    next,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        wait = Duration::from_nanos(next.saturating_sub(burst + now));
                        break;
                    }
                    Err(current) => paid = current,
                }
            }
        }
        let wait = wait + self.config.latency;
        if !wait.is_zero() {
            thread::sleep(wait);
        }
    }
}

impl BlockDevice for Throttle {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.pace(buf.len() as u64);
        self.inner.read(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.pace(buf.len() as u64);
        self.inner.write(buf, offset, flags)
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.pace(0);
        self.inner.trim(offset, len, flags)
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.pace(0);
        self.inner.write_zeroes(offset, len, flags)
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        out.extend(self.inner.extents(offset, len)?);
        Ok(())
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.cache(offset, len)
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// Only the fast paths that still pay for every byte: a vectored write is paced like
/// a write, holes are never answered without a read, and reads from the page cache,
/// mapped or sent from the file, or queued, stay off (they would skip `pace`).
impl FastPath for Throttle {
    fn is_hole(&self, _offset: u64, _len: u64) -> Option<bool> {
        // A disk reads every byte: answering holes without a read would make reads
        // of unwritten ranges free and the stand-in faster than the disk.
        Some(false)
    }

    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        self.pace(bufs.iter().map(|b| b.len() as u64).sum());
        self.inner.write_vectored(bufs, offset, flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{conformance, MemoryDevice};
    use std::sync::Arc;

    fn throttled(rate: Option<u64>, latency: Duration) -> Device {
        let inner = Device::from_device(MemoryDevice::new(16 << 20));
        Device::from_device(Throttle::new(inner, ThrottleConfig { rate, latency }))
    }

    #[test]
    fn passes_the_conformance_suite() {
        conformance::run_all(&throttled(Some(2_000_000_000), Duration::ZERO));
    }

    #[test]
    fn the_rate_holds_over_a_window_shared_by_threads() {
        let rate = 40_000_000u64;
        let device = Arc::new(throttled(Some(rate), Duration::ZERO));
        let each = 4u64 << 20;
        let threads = 4u64;
        let started = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let device = device.clone();
                thread::spawn(move || {
                    let buf = vec![t as u8; 1 << 20];
                    for i in 0..each >> 20 {
                        device
                            .write(&buf, t * each + (i << 20), WriteFlags::NONE)
                            .unwrap();
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        let elapsed = started.elapsed();
        let bytes = each * threads;
        // Only the bucket's depth may pass without waiting.
        let least = Duration::from_secs_f64(bytes as f64 / rate as f64) - BURST;
        assert!(
            elapsed >= least,
            "{bytes} bytes at {rate} B/s took {elapsed:?}, less than {least:?}"
        );
    }

    #[test]
    fn every_request_pays_the_latency() {
        let latency = Duration::from_millis(15);
        let device = throttled(None, latency);
        let mut buf = vec![0u8; 4096];
        let started = Instant::now();
        for i in 0..6 {
            device.read(&mut buf, i * 4096).unwrap();
        }
        assert!(started.elapsed() >= latency * 6, "{:?}", started.elapsed());
        assert!(!device.info().completes_inline);
    }

    #[test]
    fn an_inactive_config_wraps_nothing() {
        let inner = Device::from_device(MemoryDevice::new(1 << 20));
        let same = Throttle::wrap(inner.clone(), ThrottleConfig::default());
        assert!(same.info().completes_inline);
    }
}
