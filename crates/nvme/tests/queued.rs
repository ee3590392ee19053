//! A namespace whose device has a request queue that wakes its owner (as an RBD
//! image or an initiator does): reads, writes, write-zeroes and single-range
//! deallocation go through the queue, never through the device's synchronous
//! methods, and a flush the queue does not take natively runs the synchronous way.

mod host;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::thread;

use blockwire_blockdev::{
    BlockDevice, Completion, Device, DeviceInfo, FastPath, MemoryDevice, QueuedCommand, QueuedOp,
    RequestQueue, Result, Submission, WriteFlags, ZeroFlags,
};
use blockwire_nvme::opcodes::io;
use blockwire_nvme::pdu::Digests;
use blockwire_nvme::{default_nqn, NvmeConfig, NvmeTarget, Subsystem};
use host::Host;

const SIZE: u64 = 4 << 20;

#[derive(Default)]
struct Counts {
    queued: AtomicUsize,
    queued_commands: AtomicUsize,
    synchronous_data: AtomicUsize,
    synchronous_flushes: AtomicUsize,
}

/// A memory device whose queue runs each request as it is submitted and wakes
/// its owner at once.
struct Queued {
    memory: Arc<MemoryDevice>,
    counts: Arc<Counts>,
}

impl BlockDevice for Queued {
    fn info(&self) -> DeviceInfo {
        let mut info = self.memory.info();
        info.completes_inline = false;
        info.queue_wakes = true;
        info
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.counts.synchronous_data.fetch_add(1, Ordering::Relaxed);
        self.memory.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.counts.synchronous_data.fetch_add(1, Ordering::Relaxed);
        self.memory.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.counts
            .synchronous_flushes
            .fetch_add(1, Ordering::Relaxed);
        self.memory.flush()
    }
    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.counts.synchronous_data.fetch_add(1, Ordering::Relaxed);
        self.memory.trim(offset, len, flags)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.counts.synchronous_data.fetch_add(1, Ordering::Relaxed);
        self.memory.write_zeroes(offset, len, flags)
    }
    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl FastPath for Queued {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(Immediate {
            memory: self.memory.clone(),
            counts: self.counts.clone(),
            done: Vec::new(),
            waker: None,
        }))
    }
}

struct Immediate {
    memory: Arc<MemoryDevice>,
    counts: Arc<Counts>,
    done: Vec<Completion>,
    waker: Option<Waker>,
}

impl Immediate {
    fn finished(&mut self, completion: Completion) {
        self.done.push(completion);
        if let Some(waker) = &self.waker {
            waker.wake_by_ref();
        }
    }
}

impl RequestQueue for Immediate {
    fn submit(&mut self, mut submission: Submission) {
        self.counts.queued.fetch_add(1, Ordering::Relaxed);
        let result = match submission.op {
            QueuedOp::Read => self.memory.read_at(&mut submission.buf, submission.offset),
            QueuedOp::Write(flags) => {
                self.memory
                    .write_at(&submission.buf, submission.offset, flags)
            }
        };
        self.finished(Completion {
            tag: submission.tag,
            buf: submission.buf,
            result,
        });
    }

    fn complete(&mut self, _min: usize, out: &mut Vec<Completion>) {
        out.append(&mut self.done);
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    /// Trim and write-zeroes natively; flush is handed back.
    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        let result = match command {
            QueuedCommand::Flush => return Err(command),
            QueuedCommand::Trim { offset, len, flags } => self.memory.trim(offset, len, flags),
            QueuedCommand::WriteZeroes { offset, len, flags } => {
                self.memory.write_zeroes(offset, len, flags)
            }
        };
        self.counts.queued_commands.fetch_add(1, Ordering::Relaxed);
        self.finished(Completion {
            tag,
            buf: blockwire_blockdev::IoBuf::new(0),
            result,
        });
        Ok(())
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        self.waker = Some(waker);
        true
    }
}

#[test]
fn io_goes_through_the_device_queue() {
    let counts = Arc::new(Counts::default());
    let device = Device::from_device(Queued {
        memory: Arc::new(MemoryDevice::new(SIZE)),
        counts: counts.clone(),
    });
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let target = NvmeTarget::bind(
        NvmeConfig::new(vec![loopback]),
        vec![Arc::new(Subsystem::new("q", device))],
    )
    .unwrap();
    let addr = target.local_addrs()[0];
    let stop = target.shutdown_handle();
    let running = thread::spawn(move || target.run().unwrap());

    let nqn = default_nqn("q");
    let (_admin, cntlid) = Host::admin(addr, &nqn, Digests::default());
    let mut q = Host::io_queue(addr, &nqn, cntlid, 1, Digests::default());
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
    assert!(q.write(16, &data, true).status.is_success());
    assert_eq!(q.read(16, 128).data, data);
    // Write Zeroes over the first 4 KiB of it.
    let sqe = q.rw_sqe(io::WRITE_ZEROES, 16, 8, false);
    assert!(q.run(sqe, &[], 0).cqe.status.is_success());
    let read = q.read(16, 16).data;
    assert!(read[..4096].iter().all(|&b| b == 0));
    assert_eq!(&read[4096..], &data[4096..8192]);
    assert!(q.flush().status.is_success());
    // A read past the end fails before it reaches the queue.
    assert!(!q.read(SIZE / 512, 1).cqe.status.is_success());

    assert_eq!(counts.synchronous_data.load(Ordering::Relaxed), 0);
    assert!(counts.queued.load(Ordering::Relaxed) >= 3);
    assert_eq!(counts.queued_commands.load(Ordering::Relaxed), 1);
    assert_eq!(counts.synchronous_flushes.load(Ordering::Relaxed), 1);
    stop.shutdown();
    running.join().unwrap();
}
