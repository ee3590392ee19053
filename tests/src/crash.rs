//! Crash trials: a client writes through a real initiator — blocks stamped with their
//! write's sequence number, overwrites included, FUA on some, a flush every few —
//! logging each write as issued and as acknowledged, while the target is killed
//! (SIGKILL) at a random moment. Then the target's file is checked against the
//! client's log with [`check_log`] under [`Loss::Process`]: the page cache survives
//! a killed process, so *every* acknowledged write must be there (FUA or not), and a
//! block may otherwise only hold what it held before or what a write in flight at
//! the kill carried — never bytes nobody wrote.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use blockwire_blockdev::write_log::{check_log, Change, Record};
use blockwire_blockdev::{Device, Loss, WriteFlags};

/// How one trial writes.
#[derive(Debug, Clone, Copy)]
pub struct CrashTrial {
    /// Writers at once (their writes in flight together).
    pub threads: usize,
    /// Bytes per write.
    pub block: usize,
    /// Blocks the writes land on (fewer than the writes: blocks are overwritten).
    pub blocks: u64,
    /// Every this many writes of a thread is FUA.
    pub fua_every: u64,
    /// A thread flushes after every this many writes.
    pub flush_every: u64,
}

impl Default for CrashTrial {
    fn default() -> CrashTrial {
        CrashTrial {
            threads: 4,
            block: 4096,
            blocks: 1024,
            fua_every: 7,
            flush_every: 16,
        }
    }
}

/// What one trial saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CrashOutcome {
    /// Writes the target acknowledged before it died.
    pub acknowledged: usize,
    /// Bytes of the file that the client's log cannot explain (a lost acknowledged
    /// write, or data nobody wrote); at most 16 are counted.
    pub violations: usize,
    /// The first of them, for the message.
    pub first: Option<String>,
}

/// The bytes of write number `sequence` at `offset`: its number and place stamped
/// in every 16 bytes, so no two writes carry the same block.
pub fn stamp(sequence: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let at = offset + out.len() as u64;
        out.extend_from_slice(&sequence.to_le_bytes());
        out.extend_from_slice(&at.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Runs one trial: writes through `device` until it fails, calls `kill` after
/// `kill_after`, then checks `read_image()` (the file, read after the kill) against
/// `initial` (its contents before). `seed` varies the blocks written.
pub fn run_trial(
    device: &Device,
    trial: CrashTrial,
    seed: u64,
    kill_after: Duration,
    kill: impl FnOnce(),
    initial: &[u8],
    read_image: impl FnOnce() -> Vec<u8>,
) -> CrashOutcome {
    let log: Mutex<Vec<Record>> = Mutex::new(Vec::new());
    let next_id = Mutex::new(0usize);
    let stop = AtomicBool::new(false);
    let acknowledged = Mutex::new(0usize);
    thread::scope(|scope| {
        for t in 0..trial.threads {
            let (log, next_id, stop, acknowledged) = (&log, &next_id, &stop, &acknowledged);
            scope.spawn(move || {
                let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 1);
                for n in 1u64.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let offset = (state % trial.blocks) * trial.block as u64;
                    let fua = n.is_multiple_of(trial.fua_every);
                    let id = {
                        let mut next = next_id.lock().unwrap();
                        let id = *next;
                        *next += 1;
                        id
                    };
                    let data: Arc<[u8]> = stamp(id as u64 + 1, offset, trial.block).into();
                    log.lock().unwrap().push(Record::Issued {
                        id,
                        offset,
                        change: Change::Write(data.clone()),
                        fua,
                    });
                    let flags = if fua {
                        WriteFlags::FUA
                    } else {
                        WriteFlags::NONE
                    };
                    if device.write(&data, offset, flags).is_err() {
                        return;
                    }
                    log.lock().unwrap().push(Record::Completed { id });
                    *acknowledged.lock().unwrap() += 1;
                    if n.is_multiple_of(trial.flush_every) {
                        let covers = log.lock().unwrap().len();
                        if device.flush().is_err() {
                            return;
                        }
                        log.lock().unwrap().push(Record::Flushed { covers });
                    }
                }
            });
        }
        thread::sleep(kill_after);
        kill();
        // The writers stop at their next failure; this stops any that never fail.
        thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
    });
    let image = read_image();
    let log = log.into_inner().unwrap();
    let violations = check_log(&log, initial, &image, Loss::Process, 16);
    CrashOutcome {
        acknowledged: acknowledged.into_inner().unwrap(),
        violations: violations.len(),
        first: violations.first().map(|v| {
            format!(
                "byte {} holds {:#04x}; the last acknowledged write there left {:#04x}",
                v.offset, v.found, v.expected
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use blockwire_blockdev::{BlockDevice, DeviceInfo, MemoryDevice, Result as DevResult};

    use super::*;

    const SIZE: u64 = 4 << 20;

    /// A memory disk that acknowledges every write but, with `drop_every`, throws
    /// every so many away: the bug a trial must catch.
    struct Forgetful {
        memory: Device,
        drop_every: Option<u64>,
        writes: AtomicU64,
    }

    impl BlockDevice for Forgetful {
        fn info(&self) -> DeviceInfo {
            *self.memory.info()
        }

        fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
            self.memory.read(buf, offset)
        }

        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> DevResult<()> {
            let n = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
            if self.drop_every.is_some_and(|every| n.is_multiple_of(every)) {
                return Ok(());
            }
            self.memory.write(buf, offset, flags)
        }

        fn flush(&self) -> DevResult<()> {
            Ok(())
        }
    }

    fn trial_on(drop_every: Option<u64>) -> CrashOutcome {
        let memory = Device::from_device(MemoryDevice::new(SIZE));
        let disk = Device::new(Arc::new(Forgetful {
            memory: memory.clone(),
            drop_every,
            writes: AtomicU64::new(0),
        }));
        let trial = CrashTrial {
            blocks: SIZE / 4096,
            ..CrashTrial::default()
        };
        let initial = vec![0u8; SIZE as usize];
        // Nothing to kill: the writers run until the trial stops them.
        run_trial(
            &disk,
            trial,
            1,
            Duration::from_millis(100),
            || {},
            &initial,
            || {
                let mut image = vec![0u8; SIZE as usize];
                memory.read(&mut image, 0).unwrap();
                image
            },
        )
    }

    #[test]
    fn a_disk_that_keeps_every_write_passes() {
        let outcome = trial_on(None);
        assert!(outcome.acknowledged > 100, "{outcome:?}");
        assert_eq!(outcome.violations, 0, "{outcome:?}");
    }

    #[test]
    fn a_disk_that_forgets_acknowledged_writes_is_caught() {
        let outcome = trial_on(Some(50));
        assert!(outcome.violations > 0, "{outcome:?}");
        assert!(outcome.first.unwrap().contains("last acknowledged write"));
    }

    #[test]
    fn stamps_differ_by_write_and_place() {
        assert_ne!(stamp(1, 0, 64), stamp(2, 0, 64));
        assert_ne!(stamp(1, 0, 64), stamp(1, 4096, 64));
        assert_eq!(stamp(3, 0, 20).len(), 20);
    }
}
