//! A connection to a device whose request queue completes on a thread of its own
//! and wakes its owner: every request goes through the queue (none through the
//! device's synchronous methods), and each is answered once, with the right data.

use std::io::{self, Cursor, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::Waker;

use blockwire_blockdev::workers::WorkerPool;
use blockwire_blockdev::{
    BlockDevice, Completion, Device, DeviceInfo, FastPath, IoBuf, MemoryDevice, QueuedCommand,
    QueuedOp, RequestQueue, Result, Submission, WriteFlags, ZeroFlags,
};

use crate::target::connection::{transmit, Ending};
use crate::target::export::Export;
use crate::target::session::Session;
use crate::target::writer::{ReplySink, ReplyWriter};
use crate::wire::*;

const SIZE: u64 = 4 << 20;

/// A memory device with a queue whose requests run on a thread of their own.
struct Threaded {
    memory: Arc<MemoryDevice>,
    /// Requests through the queue, and through the synchronous methods.
    queued: Arc<AtomicUsize>,
    synchronous: AtomicUsize,
}

impl BlockDevice for Threaded {
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
        self.synchronous.fetch_add(1, Ordering::Relaxed);
        self.memory.flush()
    }
    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.synchronous.fetch_add(1, Ordering::Relaxed);
        self.memory.trim(offset, len, flags)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.synchronous.fetch_add(1, Ordering::Relaxed);
        self.memory.write_zeroes(offset, len, flags)
    }
    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl FastPath for Threaded {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(ThreadQueue::new(
            self.memory.clone(),
            self.queued.clone(),
        )))
    }
}

enum Work {
    Data(Submission),
    Command(u64, QueuedCommand),
}

/// Runs requests in order on its thread; completions wait in `done` for the owner.
struct ThreadQueue {
    to: Option<mpsc::Sender<Work>>,
    done: Arc<Mutex<Vec<Completion>>>,
    waker: Arc<Mutex<Option<Waker>>>,
    in_flight: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ThreadQueue {
    fn new(memory: Arc<MemoryDevice>, queued: Arc<AtomicUsize>) -> ThreadQueue {
        let (to, from) = mpsc::channel::<Work>();
        let done = Arc::new(Mutex::new(Vec::new()));
        let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
        let (finished, wake) = (done.clone(), waker.clone());
        let thread = std::thread::spawn(move || {
            for work in from {
                queued.fetch_add(1, Ordering::Relaxed);
                let completion = match work {
                    Work::Data(mut s) => {
                        let result = match s.op {
                            QueuedOp::Read => memory.read_at(&mut s.buf, s.offset),
                            QueuedOp::Write(flags) => memory.write_at(&s.buf, s.offset, flags),
                        };
                        Completion {
                            tag: s.tag,
                            buf: s.buf,
                            result,
                        }
                    }
                    Work::Command(tag, command) => {
                        let result = match command {
                            QueuedCommand::Flush => memory.flush(),
                            QueuedCommand::Trim { offset, len, flags } => {
                                memory.trim(offset, len, flags)
                            }
                            QueuedCommand::WriteZeroes { offset, len, flags } => {
                                memory.write_zeroes(offset, len, flags)
                            }
                        };
                        Completion {
                            tag,
                            buf: IoBuf::new(0),
                            result,
                        }
                    }
                };
                finished.lock().unwrap().push(completion);
                if let Some(waker) = wake.lock().unwrap().as_ref() {
                    waker.wake_by_ref();
                }
            }
        });
        ThreadQueue {
            to: Some(to),
            done,
            waker,
            in_flight: 0,
            thread: Some(thread),
        }
    }
}

impl RequestQueue for ThreadQueue {
    fn submit(&mut self, submission: Submission) {
        self.in_flight += 1;
        let _ = self.to.as_ref().unwrap().send(Work::Data(submission));
    }

    fn complete(&mut self, _min: usize, out: &mut Vec<Completion>) {
        let mut done = self.done.lock().unwrap();
        self.in_flight -= done.len();
        out.append(&mut done);
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        self.in_flight += 1;
        let _ = self.to.as_ref().unwrap().send(Work::Command(tag, command));
        Ok(())
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        *self.waker.lock().unwrap() = Some(waker);
        true
    }
}

impl Drop for ThreadQueue {
    fn drop(&mut self) {
        self.to.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[derive(Clone, Default)]
struct SharedSink(Arc<Mutex<Vec<u8>>>);

impl Write for SharedSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ReplySink for SharedSink {}

fn push(input: &mut Vec<u8>, command: u16, cookie: u64, offset: u64, len: u32) {
    Request {
        flags: 0,
        command,
        cookie,
        offset,
        len: len.into(),
    }
    .encode(input);
}

#[test]
fn a_device_with_a_waking_queue_gets_every_request_through_it() {
    let device = Arc::new(Threaded {
        memory: Arc::new(MemoryDevice::new(SIZE)),
        queued: Arc::default(),
        synchronous: AtomicUsize::new(0),
    });
    let handle = Device::new(device.clone());
    let export = Arc::new(Export::new("disk", "", handle.clone()));
    let flags = crate::target::negotiation::transmission_flags(export.device.info(), false);
    let session = Arc::new(Session::new(export, Framing::Simple, None, flags));

    // 16 writes, a flush, a write-zeroes over the last write, a trim elsewhere,
    // then 16 reads; simple replies, so each read's data follows its header.
    let mut input = Vec::new();
    for i in 0..16u64 {
        push(&mut input, NBD_CMD_WRITE, i, i * 4096, 4096);
        input.extend(std::iter::repeat_n(i as u8 + 1, 4096));
    }
    push(&mut input, NBD_CMD_FLUSH, 100, 0, 0);
    push(&mut input, NBD_CMD_WRITE_ZEROES, 101, 15 * 4096, 4096);
    push(&mut input, NBD_CMD_TRIM, 102, 1 << 20, 4096);
    push(&mut input, NBD_CMD_DISC, 103, 0, 0);
    let writer = Arc::new(ReplyWriter::new(SharedSink::default()));
    let pool = WorkerPool::new("test-worker", 1);
    let ending = transmit(session.clone(), Cursor::new(input), writer, &pool);
    assert!(matches!(ending, Ending::Disconnect), "{ending:?}");

    // The reads in a second stream, after every write was answered.
    let mut input = Vec::new();
    for i in 0..16u64 {
        push(&mut input, NBD_CMD_READ, 200 + i, i * 4096, 4096);
    }
    let sink = SharedSink::default();
    let writer = Arc::new(ReplyWriter::new(sink.clone()));
    let ending = transmit(session, Cursor::new(input), writer, &pool);
    assert!(matches!(ending, Ending::Closed), "{ending:?}");

    let output = sink.0.lock().unwrap().clone();
    let mut bytes = &output[..];
    let mut seen = Vec::new();
    while !bytes.is_empty() {
        let (header, used) = ReplyHeader::decode(bytes).unwrap().unwrap();
        bytes = &bytes[used..];
        let ReplyHeader::Simple { error, cookie } = header else {
            panic!("a simple reply was expected");
        };
        assert_eq!(error, 0, "cookie {cookie}");
        let data = &bytes[..4096];
        bytes = &bytes[4096..];
        let i = cookie - 200;
        let expected = if i == 15 { 0 } else { i as u8 + 1 };
        assert!(data.iter().all(|&b| b == expected), "read {i}");
        seen.push(cookie);
    }
    seen.sort_unstable();
    assert_eq!(seen, (200..216).collect::<Vec<_>>());
    // 16 writes + flush + zeroes + trim + 16 reads, all through the queue.
    assert_eq!(device.queued.load(Ordering::Relaxed), 35);
    assert_eq!(device.synchronous.load(Ordering::Relaxed), 0);
}
