//! Request queues: many reads and writes in flight from one thread, as fio or an
//! io_uring program keeps them, instead of one blocked thread per request.
//!
//! A device that can pipeline requests itself (an initiator with a connection that
//! takes many requests at once) offers a [`RequestQueue`] through
//! [`FastPath::queue`](crate::FastPath::queue). The queue owns each request's
//! buffer ([`IoBuf`]) from submission to completion, so nothing borrowed can be
//! touched after its owner gave up on it, and hands the buffer back with the result.
//! Devices without one are driven by threads, as before.

use std::task::Waker;

use crate::buffer::IoBuf;
use crate::device::{WriteFlags, ZeroFlags};
use crate::error::Result;

/// What a queued request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuedOp {
    /// Fill the buffer from the device.
    Read,
    /// Write the buffer to the device.
    Write(WriteFlags),
}

/// One request for a queue.
#[derive(Debug)]
pub struct Submission {
    /// The submitter's name for the request, handed back in its completion.
    pub tag: u64,
    pub op: QueuedOp,
    /// The data to write, or the space to read into (its length is the request's).
    pub buf: IoBuf,
    /// Byte offset on the device.
    pub offset: u64,
}

/// A request without data for a queue that takes it natively (see
/// [`RequestQueue::submit_command`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuedCommand {
    /// Make every completed write durable.
    Flush,
    /// Discard a range (a hint, as [`BlockDevice::trim`](crate::BlockDevice::trim)).
    Trim {
        offset: u64,
        len: u64,
        flags: WriteFlags,
    },
    /// Make a range read as zeroes.
    WriteZeroes {
        offset: u64,
        len: u64,
        flags: ZeroFlags,
    },
}

/// A finished request: its tag, its buffer back (read data in it), its result.
#[derive(Debug)]
pub struct Completion {
    pub tag: u64,
    pub buf: IoBuf,
    pub result: Result<()>,
}

/// A submission queue owned by one thread. Requests go in without waiting and come
/// back in any order; every submitted request comes back exactly once, failed ones
/// with their error (also one refused at submission, at the next
/// [`complete`](RequestQueue::complete)).
pub trait RequestQueue: Send {
    /// Starts a request.
    fn submit(&mut self, submission: Submission);

    /// Waits until at least `min` requests have finished, or fewer if fewer are in
    /// flight, and appends them to `out`. Returns at once when `min` is 0.
    fn complete(&mut self, min: usize, out: &mut Vec<Completion>);

    /// Requests submitted and not yet handed back.
    fn in_flight(&self) -> usize;

    /// Starts a flush, trim or write-zeroes when the queue takes it natively; its
    /// completion comes back from [`complete`](RequestQueue::complete) with an empty
    /// buffer. Hands the command back when the queue does not take it: the caller
    /// then uses the device's synchronous method, which may emulate it.
    fn submit_command(
        &mut self,
        tag: u64,
        command: QueuedCommand,
    ) -> std::result::Result<(), QueuedCommand> {
        let _ = tag;
        Err(command)
    }

    /// Asks the queue to wake `waker` (from any thread) whenever a completion is
    /// ready, so that its owner can wait for other things too (a socket, new
    /// requests) and collect with `complete(0)`. Returns `false` when the queue
    /// cannot. A request the queue gives up on by itself (past a deadline) comes
    /// back without a wake: an owner with requests in flight also collects now and
    /// then.
    fn set_waker(&mut self, waker: Waker) -> bool {
        let _ = waker;
        false
    }
}

/// A queue over a device without one of its own: each request runs at once, on the
/// submitting thread, and its completion waits for the next `complete`. Lets code
/// written for queues (a pipelined copy) pair a local file with an initiator.
pub struct InlineQueue<'a> {
    device: &'a crate::handle::Device,
    ready: Vec<Completion>,
}

impl<'a> InlineQueue<'a> {
    pub fn new(device: &'a crate::handle::Device) -> InlineQueue<'a> {
        InlineQueue {
            device,
            ready: Vec::new(),
        }
    }
}

impl RequestQueue for InlineQueue<'_> {
    fn submit(&mut self, submission: Submission) {
        let Submission {
            tag,
            op,
            mut buf,
            offset,
        } = submission;
        let result = match op {
            QueuedOp::Read => self.device.read(&mut buf, offset),
            QueuedOp::Write(flags) => self.device.write(&buf, offset, flags),
        };
        self.ready.push(Completion { tag, buf, result });
    }

    fn complete(&mut self, _min: usize, out: &mut Vec<Completion>) {
        // Everything submitted has finished already.
        out.append(&mut self.ready);
    }

    fn in_flight(&self) -> usize {
        self.ready.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, MemoryDevice};

    #[test]
    fn an_inline_queue_runs_each_request_at_once() {
        let device = Device::from_device(MemoryDevice::new(1 << 20));
        let mut queue = InlineQueue::new(&device);
        queue.submit(Submission {
            tag: 7,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&[9u8; 4096]),
            offset: 8192,
        });
        queue.submit(Submission {
            tag: 8,
            op: QueuedOp::Read,
            buf: IoBuf::new(4096),
            offset: 1 << 20,
        });
        assert_eq!(queue.in_flight(), 2);
        let mut done = Vec::new();
        queue.complete(2, &mut done);
        assert_eq!(queue.in_flight(), 0);
        assert_eq!(done[0].tag, 7);
        assert!(done[0].result.is_ok());
        // Beyond the end: the checked handle's error, as a completion.
        assert_eq!(done[1].tag, 8);
        assert_eq!(
            done[1].result.as_ref().unwrap_err().kind(),
            crate::ErrorKind::OutOfRange
        );
        let mut back = vec![0u8; 4096];
        device.read(&mut back, 8192).unwrap();
        assert!(back.iter().all(|&b| b == 9));
    }
}
