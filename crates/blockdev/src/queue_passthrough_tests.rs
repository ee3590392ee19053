//! Queued requests through the checked handle and the metrics layer: commands are
//! checked (and handed back when the device lacks them natively), refusals wake the
//! owner, and every queued request is counted once.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Duration;

use crate::device::{BlockDevice, WriteFlags, ZeroFlags};
use crate::error::{ErrorKind, Op, Result};
use crate::info::{DeviceInfo, Support};
use crate::meter::IoMeter;
use crate::queue::{Completion, QueuedCommand, QueuedOp, RequestQueue, Submission};
use crate::{Device, FastPath, IoBuf, MemoryDevice, Metered};

/// A memory device with a queue of its own that takes every command, runs each
/// request at once and wakes its owner; zeroing is not fast on it.
struct Queued(MemoryDevice);

impl BlockDevice for Queued {
    fn info(&self) -> DeviceInfo {
        let mut info = self.0.info();
        info.capabilities.fast_zero = Support::None;
        info.queue_wakes = true;
        info
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.0.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.0.flush()
    }
    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.0.trim(offset, len, flags)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.0.write_zeroes(offset, len, flags)
    }
    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl FastPath for Queued {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(RunAtOnce {
            device: &self.0,
            ready: Vec::new(),
            waker: None,
        }))
    }
}

struct RunAtOnce<'a> {
    device: &'a MemoryDevice,
    ready: Vec<Completion>,
    waker: Option<Waker>,
}

impl RunAtOnce<'_> {
    fn done(&mut self, tag: u64, buf: IoBuf, result: Result<()>) {
        self.ready.push(Completion { tag, buf, result });
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }
}

impl RequestQueue for RunAtOnce<'_> {
    fn submit(&mut self, mut submission: Submission) {
        let result = match submission.op {
            QueuedOp::Read => self.device.read_at(&mut submission.buf, submission.offset),
            QueuedOp::Write(flags) => {
                self.device
                    .write_at(&submission.buf, submission.offset, flags)
            }
        };
        self.done(submission.tag, submission.buf, result);
    }

    fn complete(&mut self, _min: usize, out: &mut Vec<Completion>) {
        out.append(&mut self.ready);
    }

    fn in_flight(&self) -> usize {
        self.ready.len()
    }

    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        let result = match command {
            QueuedCommand::Flush => self.device.flush(),
            QueuedCommand::Trim { offset, len, flags } => self.device.trim(offset, len, flags),
            QueuedCommand::WriteZeroes { offset, len, flags } => {
                self.device.write_zeroes(offset, len, flags)
            }
        };
        self.done(tag, IoBuf::new(0), result);
        Ok(())
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        self.waker = Some(waker);
        true
    }
}

#[derive(Default)]
struct CountWakes(AtomicUsize);

impl Wake for CountWakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

const SIZE: u64 = 1 << 20;

#[test]
fn the_checked_queue_checks_commands_and_hands_back_what_it_would_emulate() {
    let device = Device::from_device(Queued(MemoryDevice::new(SIZE)));
    assert!(device.info().queue_wakes);
    device.write(&[7u8; 8192], 0, WriteFlags::NONE).unwrap();
    let mut queue = device.queue().unwrap();
    let wakes = Arc::new(CountWakes::default());
    assert!(queue.set_waker(Waker::from(wakes.clone())));
    let zeroes = |offset, len, fast| QueuedCommand::WriteZeroes {
        offset,
        len,
        flags: ZeroFlags {
            fast,
            ..ZeroFlags::default()
        },
    };
    // Within range and native: to the device's queue.
    assert!(queue.submit_command(1, zeroes(0, 4096, false)).is_ok());
    assert!(queue.submit_command(2, QueuedCommand::Flush).is_ok());
    // Beyond the end: refused here, as a completion, and the owner is woken.
    assert!(queue.submit_command(3, zeroes(SIZE, 4096, false)).is_ok());
    // A fast zero the device cannot do fast: handed back for the handle to answer.
    assert_eq!(
        queue.submit_command(4, zeroes(0, 4096, true)),
        Err(zeroes(0, 4096, true))
    );
    let mut done = Vec::new();
    queue.complete(0, &mut done);
    done.sort_by_key(|c| c.tag);
    assert_eq!(done.iter().map(|c| c.tag).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(done[0].result.is_ok() && done[1].result.is_ok());
    let refused = done[2].result.as_ref().unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::OutOfRange);
    assert_eq!(wakes.0.load(Ordering::Relaxed), 3);
    drop(queue);
    let mut back = vec![1u8; 8192];
    device.read(&mut back, 0).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert!(back[4096..].iter().all(|&b| b == 7));
}

#[test]
fn a_read_only_view_keeps_the_queue_for_reads_and_refuses_writes_before_the_device() {
    let writable = Device::from_device(Queued(MemoryDevice::new(SIZE)));
    writable.write(&[7u8; 4096], 0, WriteFlags::NONE).unwrap();
    let device = writable.read_only();
    assert!(device.info().queue_wakes);
    let mut queue = device.queue().expect("the read-only view keeps the queue");
    queue.submit(Submission {
        tag: 1,
        op: QueuedOp::Read,
        buf: IoBuf::new(4096),
        offset: 0,
    });
    queue.submit(Submission {
        tag: 2,
        op: QueuedOp::Write(WriteFlags::NONE),
        buf: IoBuf::from_slice(&[9u8; 4096]),
        offset: 0,
    });
    let trim = QueuedCommand::Trim {
        offset: 0,
        len: 4096,
        flags: WriteFlags::NONE,
    };
    assert!(queue.submit_command(3, trim).is_ok());
    let zeroes = QueuedCommand::WriteZeroes {
        offset: 0,
        len: 4096,
        flags: ZeroFlags::default(),
    };
    assert!(queue.submit_command(4, zeroes).is_ok());
    let mut done = Vec::new();
    queue.complete(0, &mut done);
    done.sort_by_key(|c| c.tag);
    assert_eq!(done.iter().map(|c| c.tag).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(done[0].result.is_ok());
    assert!(done[0].buf.iter().all(|&b| b == 7));
    for refused in &done[1..] {
        let error = refused.result.as_ref().unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ReadOnly, "{error}");
    }
    drop(queue);
    let mut back = vec![0u8; 4096];
    writable.read(&mut back, 0).unwrap();
    assert!(
        back.iter().all(|&b| b == 7),
        "a refused request reached the device"
    );
}

/// Counts requests and bytes (atomics: the meter contract).
#[derive(Default)]
struct Tally {
    started: AtomicUsize,
    finished: AtomicUsize,
    failed: AtomicUsize,
    bytes: AtomicU64,
    flushes: AtomicUsize,
}

impl IoMeter for Arc<Tally> {
    fn started(&self) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }
    fn finished(&self, op: Op, bytes: u64, _elapsed: Duration, error: Option<ErrorKind>) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if error.is_some() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        if op == Op::Flush {
            self.flushes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn a_metered_device_passes_its_queue_through_and_counts_each_request_once() {
    let tally = Arc::new(Tally::default());
    let inner = Device::from_device(Queued(MemoryDevice::new(SIZE)));
    let device = Metered::wrap(inner, tally.clone());
    assert!(device.info().queue_wakes);
    let mut queue = device
        .queue()
        .expect("the metered device passes the queue on");
    assert!(queue.set_waker(Waker::from(Arc::new(CountWakes::default()))));
    queue.submit(Submission {
        tag: 5,
        op: QueuedOp::Write(WriteFlags::FUA),
        buf: IoBuf::from_slice(&[3u8; 4096]),
        offset: 4096,
    });
    queue.submit(Submission {
        tag: 5,
        op: QueuedOp::Read,
        buf: IoBuf::new(4096),
        offset: 4096,
    });
    assert!(queue.submit_command(6, QueuedCommand::Flush).is_ok());
    // Out of range: refused by the handle in front, before the meter, so not
    // counted (as for the synchronous methods).
    queue.submit(Submission {
        tag: 7,
        op: QueuedOp::Read,
        buf: IoBuf::new(4096),
        offset: SIZE,
    });
    let mut done = Vec::new();
    queue.complete(0, &mut done);
    assert_eq!(done.len(), 4);
    let read = done
        .iter()
        .find(|c| c.tag == 5 && c.buf.iter().all(|&b| b == 3));
    assert!(read.is_some(), "the read back, under the submitter's tag");
    assert!(done.iter().any(|c| c.tag == 7 && c.result.is_err()));
    assert_eq!(tally.started.load(Ordering::Relaxed), 3);
    assert_eq!(tally.finished.load(Ordering::Relaxed), 3);
    assert_eq!(tally.failed.load(Ordering::Relaxed), 0);
    assert_eq!(tally.flushes.load(Ordering::Relaxed), 1);
    assert_eq!(tally.bytes.load(Ordering::Relaxed), 8192);
}
