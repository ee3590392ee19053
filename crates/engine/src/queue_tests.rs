//! The queue thread against a device whose queue completes on a thread of its own,
//! out of order, and wakes its owner.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, Completion, Device, DeviceInfo, FastPath, IoBuf, MemoryDevice, QueuedCommand,
    QueuedOp, RequestQueue, Result, Submission, WriteFlags,
};

use super::*;
use crate::{Engine, EngineConfig, Request, Route};

const SIZE: u64 = 4 << 20;

/// A memory device with a queue that completes in batches, last first.
struct Queued {
    memory: Arc<MemoryDevice>,
    wakes: bool,
    /// Whether its queue takes flush, trim and write-zeroes natively.
    commands: bool,
    synchronous: AtomicUsize,
}

impl Queued {
    fn device(wakes: bool, commands: bool) -> Device {
        Device::from_device(Queued {
            memory: Arc::new(MemoryDevice::new(SIZE)),
            wakes,
            commands,
            synchronous: AtomicUsize::new(0),
        })
    }
}

impl BlockDevice for Queued {
    fn info(&self) -> DeviceInfo {
        let mut info = self.memory.info();
        info.completes_inline = false;
        info.queue_wakes = true;
        info
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.synchronous.fetch_add(1, Ordering::Relaxed);
        self.memory.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.synchronous.fetch_add(1, Ordering::Relaxed);
        self.memory.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.memory.flush()
    }
    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl FastPath for Queued {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(Backwards {
            memory: &self.memory,
            wakes: self.wakes,
            commands: self.commands,
            waiting: Vec::new(),
            ready: Arc::default(),
            waker: None,
            in_flight: 0,
        }))
    }
}

/// Runs each request at submission; completions come back in reverse order, from
/// another thread's wake.
struct Backwards<'a> {
    memory: &'a MemoryDevice,
    wakes: bool,
    commands: bool,
    waiting: Vec<Completion>,
    ready: Arc<Mutex<Vec<Completion>>>,
    waker: Option<Waker>,
    in_flight: usize,
}

impl Backwards<'_> {
    fn finish(&mut self, completion: Completion) {
        self.in_flight += 1;
        self.waiting.push(completion);
        if self.waiting.len() >= 3 {
            let mut batch: Vec<Completion> = self.waiting.drain(..).rev().collect();
            self.ready.lock().unwrap().append(&mut batch);
            let waker = self.waker.clone().expect("a waker was set");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1));
                waker.wake();
            });
        }
    }
}

impl RequestQueue for Backwards<'_> {
    fn submit(&mut self, s: Submission) {
        let mut buf = s.buf;
        let result = match s.op {
            QueuedOp::Read => self.memory.read_at(&mut buf, s.offset),
            QueuedOp::Write(flags) => self.memory.write_at(&buf, s.offset, flags),
        };
        self.finish(Completion {
            tag: s.tag,
            buf,
            result,
        });
    }

    fn complete(&mut self, _min: usize, out: &mut Vec<Completion>) {
        let mut ready = self.ready.lock().unwrap();
        self.in_flight -= ready.len();
        out.append(&mut ready);
        // What waits for a batch to fill is handed back at the periodic collection.
        if !self.waiting.is_empty() {
            self.in_flight -= self.waiting.len();
            out.append(&mut self.waiting);
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        if !self.commands {
            return Err(command);
        }
        let result = match command {
            QueuedCommand::Flush => Ok(()),
            QueuedCommand::Trim { offset, len, flags } => self.memory.trim(offset, len, flags),
            QueuedCommand::WriteZeroes { offset, len, flags } => {
                self.memory.write_zeroes(offset, len, flags)
            }
        };
        self.finish(Completion {
            tag,
            buf: IoBuf::new(0),
            result,
        });
        Ok(())
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        self.waker = Some(waker);
        self.wakes
    }
}

/// What the sink saw: per pending id, how it ended.
type Seen = Arc<Mutex<Vec<(u32, std::result::Result<IoBuf, QueuedCommand>)>>>;

fn sink(seen: &Seen, keep: Option<mpsc::Sender<Release>>) -> impl QueueSink<u32> {
    let seen = seen.clone();
    move |done: &mut Vec<Done<u32>>, release: Release| {
        assert_eq!(release.requests(), done.len());
        let mut seen = seen.lock().unwrap();
        for Done {
            pending, outcome, ..
        } in done.drain(..)
        {
            seen.push((
                pending,
                match outcome {
                    Outcome::Completed { buf, result } => {
                        result.unwrap();
                        Ok(buf)
                    }
                    Outcome::Refused(command) => Err(command),
                },
            ));
        }
        if let Some(keep) = &keep {
            let _ = keep.send(release);
        }
    }
}

#[test]
fn every_request_is_answered_once_with_its_data() {
    let device = Queued::device(true, true);
    let seen = Seen::default();
    let driver = QueueDriver::start(
        "queue-test",
        vec![(0, device.clone())],
        QueueLimits::default(),
        sink(&seen, None),
    )
    .expect("the queue wakes");
    let engine: Engine<u32> = Engine::new(EngineConfig::default()).with_queue(Some(driver));
    for i in 0..16u32 {
        let request = Request::write(4096);
        assert_eq!(engine.route(request, || false), Route::Queue);
        let work = QueueWork::Data {
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&[i as u8 + 1; 4096]),
            offset: u64::from(i) * 4096,
        };
        engine.submit(request, work, i).unwrap();
    }
    engine.wait_idle();
    for i in 0..16u32 {
        let work = QueueWork::read(u64::from(i) * 4096, 4096);
        engine.submit(Request::read(4096), work, 100 + i).unwrap();
    }
    let zeroes = QueuedCommand::WriteZeroes {
        offset: 0,
        len: 4096,
        flags: Default::default(),
    };
    assert_eq!(
        engine.route(Request::write_zeroes(), || false),
        Route::Queue
    );
    engine
        .submit(Request::write_zeroes(), QueueWork::Command(zeroes), 200)
        .unwrap();
    engine.wait_idle();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(seen.len(), 33);
    // Each once, in whatever order the queue finished them.
    let mut ids: Vec<u32> = seen.iter().map(|(id, _)| *id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 33);
    for (id, outcome) in seen {
        if (100..116).contains(&id) {
            let buf = outcome.unwrap();
            assert!(buf.iter().all(|&b| b == (id - 100) as u8 + 1), "read {id}");
        }
    }
    drop(engine);
}

#[test]
fn a_command_the_queue_refuses_comes_back_to_run_synchronously() {
    let device = Queued::device(true, false);
    let seen = Seen::default();
    let driver = QueueDriver::start(
        "queue-test",
        vec![(0, device)],
        QueueLimits::default(),
        sink(&seen, None),
    )
    .unwrap();
    driver
        .submit(0, QueueWork::Command(QueuedCommand::Flush), 1)
        .unwrap();
    driver.wait_idle();
    let seen = seen.lock().unwrap();
    assert!(matches!(seen[..], [(1, Err(QueuedCommand::Flush))]));
}

#[test]
fn no_driver_without_a_waking_queue() {
    let seen = Seen::default();
    let plain = Device::from_device(MemoryDevice::new(SIZE));
    assert!(QueueDriver::start(
        "queue-test",
        vec![(0, plain)],
        QueueLimits::default(),
        sink(&seen, None)
    )
    .is_none());
    // Its info says it wakes, but its queue cannot.
    let silent = Queued::device(false, true);
    assert!(QueueDriver::start(
        "queue-test",
        vec![(0, silent)],
        QueueLimits::default(),
        sink(&seen, None)
    )
    .is_none());
}

#[test]
fn only_the_keys_of_waking_queues_are_served() {
    let seen = Seen::default();
    let devices = vec![
        (3, Device::from_device(MemoryDevice::new(SIZE))),
        (5, Queued::device(true, true)),
    ];
    let driver = QueueDriver::start(
        "queue-test",
        devices,
        QueueLimits::default(),
        sink(&seen, None),
    )
    .unwrap();
    let engine: Engine<u32> = Engine::new(EngineConfig::default()).with_queue(Some(driver));
    assert!(engine.queue().unwrap().serves(5));
    assert!(!engine.queue().unwrap().serves(3));
    assert_eq!(
        engine.route(Request::read(4096).on(5), || false),
        Route::Queue
    );
    assert_eq!(
        engine.route(Request::read(4096).on(3), || false),
        Route::Inline
    );
    assert_eq!(
        engine.route(Request::other().on(5), || false),
        Route::Inline
    );
    let back = engine.submit(Request::read(4096).on(3), QueueWork::read(0, 4096), 9);
    assert!(matches!(back, Err((_, 9))));
}

#[test]
fn the_budget_comes_back_only_when_the_answers_have_left() {
    let seen = Seen::default();
    let (keep_to, kept) = mpsc::channel();
    let limits = QueueLimits {
        requests: 4,
        bytes: 1 << 20,
        collect_interval: Duration::from_millis(20),
    };
    let driver = QueueDriver::start(
        "queue-test",
        vec![(0, Queued::device(true, true))],
        limits,
        sink(&seen, Some(keep_to)),
    )
    .unwrap();
    for i in 0..4 {
        driver.submit(0, QueueWork::read(0, 4096), i).unwrap();
    }
    assert!(driver.is_full());
    // Answered, but the answers have not left: still full.
    let mut releases = Vec::new();
    while releases.iter().map(Release::requests).sum::<usize>() < 4 {
        releases.push(kept.recv_timeout(Duration::from_secs(5)).unwrap());
    }
    assert!(driver.is_full());
    drop(releases);
    assert!(!driver.is_full());
    // Bytes bound too: one large read fills it, and fits alone.
    driver.submit(0, QueueWork::read(0, 2 << 20), 9).unwrap();
    assert!(driver.is_full());
    drop(kept);
    driver.wait_idle();
}
