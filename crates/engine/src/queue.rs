//! The queue route: requests to a device with its own request queue (an RBD image)
//! go to one queue thread per connection, which submits them without waiting and
//! hands each completion back to the protocol when it comes, out of order. One
//! connection so keeps many requests in flight in the device without a blocked
//! thread per request.
//!
//! Only a queue that can wake its owner ([`RequestQueue::set_waker`]) is driven so;
//! every other device keeps the inline and worker routes. The queue is asked for on
//! the queue thread, and only of devices whose info says it wakes
//! ([`DeviceInfo::queue_wakes`](blockwire_blockdev::DeviceInfo)): an NBD initiator's
//! queue takes over its connections' replies while it lives.
//!
//! The connection holds a [`QueueDriver`]; it turns a request into [`QueueWork`]
//! plus whatever its answer needs (`P`, the *pending* part) and calls
//! [`QueueDriver::submit`]. The queue thread hands finished requests, a batch at a
//! time, to the protocol's [`QueueSink`] together with a [`Release`]: the budget the
//! batch held comes back when the `Release` is dropped, which the protocol does once
//! the answers have left, so a client that stops reading its answers stops the
//! connection reading its requests.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::thread::JoinHandle;
use std::time::Duration;

use blockwire_blockdev::channel_waker::ChannelWaker;
use blockwire_blockdev::{
    Completion, Device, IoBuf, QueuedCommand, QueuedOp, RequestQueue, Submission,
};

/// Requests one connection may have in its queue at once (as on the workers).
pub const MAX_QUEUED: usize = 128;
/// Bytes of payloads and read buffers one connection may have in its queue, so a
/// client sending large writes cannot make the server hold more than this.
pub const MAX_QUEUED_BYTES: usize = 64 << 20;
/// How often the queue thread collects without being woken: a queue hands back a
/// request it gave up on (past its deadline) without waking anyone.
pub const COLLECT_INTERVAL: Duration = Duration::from_millis(500);

/// The bounds of one queue thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Requests submitted and not yet released.
    pub requests: usize,
    /// Bytes (payloads and read buffers) submitted and not yet released. One request
    /// of any size always fits when nothing else is held.
    pub bytes: usize,
    /// How often the thread collects while requests are in flight, woken or not.
    pub collect_interval: Duration,
}

impl Default for QueueLimits {
    fn default() -> Self {
        QueueLimits {
            requests: MAX_QUEUED,
            bytes: MAX_QUEUED_BYTES,
            collect_interval: COLLECT_INTERVAL,
        }
    }
}

/// What a request asks of a device's queue.
#[derive(Debug)]
pub enum QueueWork {
    /// A read into `buf` (its length is the request's) or a write of `buf`.
    Data {
        op: QueuedOp,
        buf: IoBuf,
        offset: u64,
    },
    /// A flush, trim or write-zeroes. A queue that does not take it natively hands
    /// it back: it then comes to the sink as [`Outcome::Refused`], for the protocol
    /// to run the synchronous way.
    Command(QueuedCommand),
}

impl QueueWork {
    /// A read of `len` bytes at `offset`.
    pub fn read(offset: u64, len: usize) -> QueueWork {
        QueueWork::Data {
            op: QueuedOp::Read,
            buf: IoBuf::new(len),
            offset,
        }
    }

    /// The bytes the work holds while queued: its payload or its read buffer.
    pub fn bytes(&self) -> usize {
        match self {
            QueueWork::Data { buf, .. } => buf.len(),
            QueueWork::Command(_) => 0,
        }
    }
}

/// How a queued request ended.
#[derive(Debug)]
pub enum Outcome {
    /// The device finished it: its buffer back (read data in it) and its result.
    Completed {
        buf: IoBuf,
        result: blockwire_blockdev::Result<()>,
    },
    /// The queue does not take this command natively (the device handle would
    /// emulate it): run it the synchronous way. It is on the queue thread, which
    /// may block on it.
    Refused(QueuedCommand),
}

/// A finished request: what its answer needs, and how it ended.
#[derive(Debug)]
pub struct Done<P> {
    /// The device key it was submitted for.
    pub key: u64,
    pub pending: P,
    pub outcome: Outcome,
}

/// Where the queue thread hands finished requests: called on the queue thread with
/// every request finished in one collection (any order; the vector is cleared
/// afterwards). Drop `release` once their answers have left (or failed to).
pub trait QueueSink<P>: Send + 'static {
    fn answer(&mut self, done: &mut Vec<Done<P>>, release: Release);
}

impl<P, F> QueueSink<P> for F
where
    F: FnMut(&mut Vec<Done<P>>, Release) + Send + 'static,
{
    fn answer(&mut self, done: &mut Vec<Done<P>>, release: Release) {
        self(done, release)
    }
}

/// The budget a batch of finished requests held: given back when dropped.
#[must_use = "dropping a Release gives the budget back at once"]
pub struct Release {
    budget: Arc<Budget>,
    requests: usize,
    bytes: usize,
}

impl Release {
    /// Requests it gives back.
    pub fn requests(&self) -> usize {
        self.requests
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.budget.release(self.requests, self.bytes);
    }
}

/// Requests and bytes a connection has in its queue, bounded.
struct Budget {
    /// Requests and bytes.
    used: Mutex<(usize, usize)>,
    changed: Condvar,
    limits: QueueLimits,
}

impl Budget {
    fn new(limits: QueueLimits) -> Budget {
        Budget {
            used: Mutex::new((0, 0)),
            changed: Condvar::new(),
            limits,
        }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, usize)> {
        self.used.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes room for a request of `bytes`, waiting while the queue is full (one
    /// request of any size always fits in an empty queue).
    fn acquire(&self, bytes: usize) {
        let limits = self.limits;
        let mut used = self.lock();
        while used.0 >= limits.requests || (used.1 > 0 && used.1 + bytes > limits.bytes) {
            used = self.changed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        used.0 += 1;
        used.1 += bytes;
    }

    /// Gives back the room of `requests` requests holding `bytes` in all.
    fn release(&self, requests: usize, bytes: usize) {
        if requests == 0 && bytes == 0 {
            return;
        }
        let mut used = self.lock();
        used.0 -= requests;
        used.1 -= bytes;
        self.changed.notify_all();
    }

    fn is_full(&self) -> bool {
        let used = self.lock();
        used.0 >= self.limits.requests || used.1 >= self.limits.bytes
    }

    fn wait_idle(&self) {
        let mut used = self.lock();
        while used.0 > 0 {
            used = self.changed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
    }
}

enum Message<P> {
    Work {
        key: u64,
        work: QueueWork,
        pending: P,
        bytes: usize,
    },
    /// A completion is ready to collect.
    Wake,
    /// No more work comes: stop once every request was handed back.
    Stop,
}

/// The queue route of one connection: its queue thread, which owns the request
/// queue of every device it was started with. Stops the thread (after every
/// request was answered) when dropped.
pub struct QueueDriver<P: Send + 'static> {
    to: Sender<Message<P>>,
    budget: Arc<Budget>,
    /// Device keys whose queue the thread drives.
    keys: Vec<u64>,
    thread: Option<JoinHandle<()>>,
}

impl<P: Send + 'static> QueueDriver<P> {
    /// Starts a queue thread named `name` for `devices` (each with the key its
    /// requests are submitted under: 0 for a protocol with one device, the LUN for
    /// iSCSI). Only devices whose queue wakes its owner are taken; `None` when none
    /// is (then nothing was started).
    pub fn start(
        name: &str,
        devices: Vec<(u64, Device)>,
        limits: QueueLimits,
        sink: impl QueueSink<P>,
    ) -> Option<QueueDriver<P>> {
        let devices: Vec<(u64, Device)> = devices
            .into_iter()
            .filter(|(_, device)| device.info().queue_wakes)
            .collect();
        if devices.is_empty() {
            return None;
        }
        let (to, from) = mpsc::channel();
        let (ready_to, ready) = mpsc::channel();
        let budget = Arc::new(Budget::new(limits));
        let waker = Arc::new(ChannelWaker::new(to.clone(), || Message::Wake));
        let counted = budget.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut queues: HashMap<u64, Box<dyn RequestQueue + '_>> = HashMap::new();
                for (key, device) in &devices {
                    let Some(mut queue) = device.queue() else {
                        continue;
                    };
                    if queue.set_waker(Waker::from(waker.clone())) {
                        queues.insert(*key, queue);
                    }
                }
                let keys: Vec<u64> = queues.keys().copied().collect();
                let _ = ready_to.send(keys);
                if queues.is_empty() {
                    return;
                }
                let mut driver = Driver {
                    queues,
                    jobs: HashMap::new(),
                    next_tag: 0,
                    sink,
                    budget: counted,
                    interval: limits.collect_interval,
                };
                driver.run(&from, &waker);
            })
            .ok()?;
        let keys = match ready.recv() {
            Ok(keys) if !keys.is_empty() => keys,
            _ => {
                let _ = thread.join();
                return None;
            }
        };
        Some(QueueDriver {
            to,
            budget,
            keys,
            thread: Some(thread),
        })
    }

    /// Whether requests for device `key` go to this queue.
    pub fn serves(&self, key: u64) -> bool {
        self.keys.contains(&key)
    }

    /// Hands a request to the queue thread, taking its room in the budget first
    /// (waiting while the queue is full: see [`is_full`](Self::is_full)). Gives it
    /// back when the queue does not serve `key` or the thread is gone; the caller
    /// then runs it another way.
    pub fn submit(&self, key: u64, work: QueueWork, pending: P) -> Result<(), (QueueWork, P)> {
        if !self.serves(key) {
            return Err((work, pending));
        }
        let bytes = work.bytes();
        self.budget.acquire(bytes);
        let message = Message::Work {
            key,
            work,
            pending,
            bytes,
        };
        match self.to.send(message) {
            Ok(()) => Ok(()),
            Err(mpsc::SendError(Message::Work { work, pending, .. })) => {
                // The queue thread is gone (it cannot start twice).
                self.budget.release(1, bytes);
                Err((work, pending))
            }
            Err(_) => unreachable!("work was sent"),
        }
    }

    /// Whether submitting now would wait for answers to leave first: a protocol
    /// with answers of its own batched sends them before it submits.
    pub fn is_full(&self) -> bool {
        self.budget.is_full()
    }

    /// Waits until every request handed over has been answered and released.
    pub fn wait_idle(&self) {
        self.budget.wait_idle();
    }
}

impl<P: Send + 'static> Drop for QueueDriver<P> {
    /// Stops the thread once what it has is answered (its waker keeps the channel
    /// open, so it is told rather than left to notice).
    fn drop(&mut self) {
        let _ = self.to.send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the queue thread remembers of a request in flight, by queue tag.
struct Queued<P> {
    key: u64,
    pending: P,
    /// What it holds of the budget.
    bytes: usize,
}

struct Driver<'q, P, S> {
    queues: HashMap<u64, Box<dyn RequestQueue + 'q>>,
    jobs: HashMap<u64, Queued<P>>,
    next_tag: u64,
    sink: S,
    budget: Arc<Budget>,
    interval: Duration,
}

impl<P: Send + 'static, S: QueueSink<P>> Driver<'_, P, S> {
    fn run(&mut self, from: &Receiver<Message<P>>, waker: &ChannelWaker<Message<P>>) {
        let mut completions = Vec::new();
        let mut done: Vec<Done<P>> = Vec::new();
        let mut bytes = 0usize;
        let mut stopping = false;
        loop {
            let first = if self.jobs.is_empty() {
                from.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                from.recv_timeout(self.interval)
            };
            let mut next = match first {
                Ok(message) => Some(message),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // Everything already sent to us, then what is ready.
            while let Some(message) = next.take() {
                match message {
                    Message::Work {
                        key,
                        work,
                        pending,
                        bytes: held,
                    } => {
                        if let Some(refused) = self.submit(key, work, pending, held) {
                            bytes += held;
                            done.push(refused);
                        }
                    }
                    Message::Wake => {}
                    Message::Stop => stopping = true,
                }
                next = from.try_recv().ok();
            }
            waker.collecting();
            for queue in self.queues.values_mut() {
                queue.complete(0, &mut completions);
            }
            for Completion { tag, buf, result } in completions.drain(..) {
                let Some(job) = self.jobs.remove(&tag) else {
                    continue;
                };
                bytes += job.bytes;
                done.push(Done {
                    key: job.key,
                    pending: job.pending,
                    outcome: Outcome::Completed { buf, result },
                });
            }
            if !done.is_empty() {
                let release = Release {
                    budget: self.budget.clone(),
                    requests: done.len(),
                    bytes,
                };
                bytes = 0;
                self.sink.answer(&mut done, release);
                done.clear();
            }
            if stopping && self.jobs.is_empty() {
                return;
            }
        }
    }

    /// Starts one request; a command the queue does not take comes back as done.
    fn submit(&mut self, key: u64, work: QueueWork, pending: P, bytes: usize) -> Option<Done<P>> {
        let queue = self
            .queues
            .get_mut(&key)
            .expect("the driver only takes keys it serves");
        let tag = self.next_tag;
        self.next_tag += 1;
        match work {
            QueueWork::Data { op, buf, offset } => {
                self.jobs.insert(
                    tag,
                    Queued {
                        key,
                        pending,
                        bytes,
                    },
                );
                queue.submit(Submission {
                    tag,
                    op,
                    buf,
                    offset,
                });
                None
            }
            QueueWork::Command(command) => match queue.submit_command(tag, command) {
                Ok(()) => {
                    self.jobs.insert(
                        tag,
                        Queued {
                            key,
                            pending,
                            bytes,
                        },
                    );
                    None
                }
                Err(command) => Some(Done {
                    key,
                    pending,
                    outcome: Outcome::Refused(command),
                }),
            },
        }
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
