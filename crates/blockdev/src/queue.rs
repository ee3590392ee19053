//! Request queues: many reads and writes in flight from one thread, as fio or an
//! io_uring program keeps them, instead of one blocked thread per request.
//!
//! A device that can pipeline requests itself (an initiator with a connection that
//! takes many requests at once) offers a [`RequestQueue`] through
//! [`BlockDevice::queue`](crate::BlockDevice::queue). The queue owns each request's
//! buffer ([`IoBuf`]) from submission to completion, so nothing borrowed can be
//! touched after its owner gave up on it, and hands the buffer back with the result.
//! Devices without one are driven by threads, as before.

use crate::buffer::IoBuf;
use crate::device::WriteFlags;
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
}
