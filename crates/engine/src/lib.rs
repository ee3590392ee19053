//! The one request engine every blockwire target submits to.
//!
//! A protocol target brings its codec and its session: it decodes a request,
//! validates it, and asks the engine which **route** the request takes. The engine
//! decides in one place, by one measured policy, whether the request runs on the
//! connection's own thread, on the shared worker pool, or in the device's own
//! request queue; it runs the worker hand-off with its in-flight bound and the
//! queue thread with its budget, and hands completions back to the protocol, out of
//! order, to encode and send. Nothing here knows a wire format.
//!
//! # The routes
//!
//! Every request a target receives leaves by one of these routes. The first is the
//! protocol's own; the others are the engine's ([`Route`]) and their fall-backs.
//!
//! 1. **answered** — the protocol answers without touching the device: an invalid
//!    request (out of range, unknown flags, a write to a read-only export), a
//!    management command (AoE's config query, iSCSI's INQUIRY), a disconnect. The
//!    engine is not asked: there is nothing to wait for.
//!
//! 2. **inline** ([`Route::Inline`]) — run on the thread that read the request, its
//!    answer batched with the other inline answers of the same burst into one
//!    vectored write (NBD, iSCSI) or one `sendmmsg` (AoE). For requests that finish
//!    without waiting for hardware — a read the page cache holds, a buffered write,
//!    a device in memory — this saves the hand-off to another thread (a wake costs a
//!    few microseconds, more than such a request) and keeps answers batched. The
//!    protocol runs it through [`Engine::inline`], which measures large reads and
//!    writes for the policy.
//!
//! 3. **blocked** (inline, then [`Engine::offload`]) — the inline attempt found that
//!    the request would wait for hardware: a cache miss, direct I/O, a flush, a FUA
//!    write. It goes to a worker, so the connection keeps reading the network while
//!    the hardware works, and its answer leaves from the worker, out of order.
//!
//! 4. **offloaded** ([`Route::Worker`] by measurement, under
//!    [`Policy::Measured`]) — a large read or write (at least [`OFFLOAD_MIN`],
//!    64 KiB) whose measured cost per byte predicts more than [`INLINE_BUDGET`]
//!    (20 µs) of the connection thread's time, while the client has more requests
//!    outstanding. Inline, a stream of large requests keeps one thread copying while
//!    the other cores idle: each request waits for the copy of the one before it,
//!    and then for its send. On workers several threads copy at once while the
//!    connection thread reads the next requests. Costs are measured per connection
//!    and per direction, inline and on workers alike (a moving average over about
//!    eight requests), starting from a guess of 200 ns/KiB (about 5 GB/s).
//!
//! 5. **kept inline** ([`Route::Inline`] for a large request) — the policy declines
//!    to offload a large request in two cases, each for a measured reason: a client
//!    with one request at a time (nothing to overlap with: the hand-off would only
//!    add latency), and a connection that already has [`OFFLOAD_BYTES`] (64 MiB) of
//!    payload on the workers (running the next one here slows the client down
//!    instead of letting its payloads pile up in server memory).
//!
//! 6. **by device** ([`Route::Inline`] or [`Route::Worker`] under
//!    [`Policy::ByDevice`]) — a protocol that must know the route before it starts
//!    gathering a request (AoE gathers consecutive frames into one device I/O, a
//!    "run": straight from the received frames when it runs inline, copied into one
//!    buffer that outlives them when it goes to a worker) routes by the device
//!    alone: inline when the device completes inline (page cache, memory), the
//!    workers otherwise (direct I/O).
//!
//! 7. **queued** ([`Route::Queue`]) — a read, write, flush, trim or write-zeroes to
//!    a device with its own request queue that wakes its owner (an RBD image). One
//!    queue thread per connection ([`QueueDriver`]) submits without waiting and
//!    hands each completion back when it comes, out of order: one connection keeps
//!    many requests in flight in the device without a blocked thread per request.
//!    It holds at most [`MAX_QUEUED`] requests and [`MAX_QUEUED_BYTES`] of buffers,
//!    released only when their answers have left; it also collects every
//!    [`COLLECT_INTERVAL`] unwoken, because a queue hands back a request it gave up
//!    on (past its deadline) without a wake. Other requests to such a device (NBD's
//!    block status and cache) take the routes above.
//!
//! 8. **refused by the queue** ([`Outcome::Refused`]) — a flush, trim or
//!    write-zeroes the queue does not take natively comes back to the protocol on
//!    the queue thread, which runs it the synchronous way (the device handle may
//!    emulate it); it stays behind the requests queued before it.
//!
//! 9. **queue gone** ([`Engine::submit`] gives the request back) — the queue thread
//!    has ended (or does not serve that device): the request takes the inline and
//!    worker routes as on any other device.
//!
//! A protocol may add routes of its own around these, outside the engine: NBD
//! streams a read or write larger than its advertised maximum, from a client that
//! never learned the maximum, piece by piece on the connection thread rather than
//! buffering it whole (`blockwire_nbd`'s `large` module).
//!
//! # Using it
//!
//! ```
//! use blockwire_engine::{Engine, EngineConfig, Request, Route, WorkerPool};
//!
//! let pool = WorkerPool::new("doc-worker", 2);
//! let engine: Engine = Engine::new(EngineConfig::default());
//! let request = Request::read(4096);
//! match engine.route(request, || false) {
//!     Route::Inline => {
//!         // Run it here; what would block is handed on.
//!         let ran: Result<u32, ()> = engine.inline(request, || Ok(7));
//!         assert_eq!(ran, Ok(7));
//!     }
//!     Route::Worker => engine.offload(&pool, request, |slot| {
//!         let _answer = slot.run(|| 7);
//!         // Send the answer, then drop the slot.
//!         drop(slot);
//!     }),
//!     Route::Queue => unreachable!("no queue was started"),
//! }
//! engine.wait_idle();
//! ```
//!
//! A connection with a device queue starts a [`QueueDriver`] with its
//! [`QueueSink`] (where answers go) and gives it to [`Engine::with_queue`];
//! [`Route::Queue`] requests then go in with [`Engine::submit`].

pub mod policy;
pub mod queue;
pub mod workers;

use std::sync::Arc;

pub use blockwire_blockdev::channel_waker::ChannelWaker;
pub use blockwire_blockdev::workers::{InFlight, WorkerPool};
pub use policy::{OffloadPolicy, Transfer, INLINE_BUDGET, OFFLOAD_BYTES, OFFLOAD_MIN};
pub use queue::{
    Done, Outcome, QueueDriver, QueueLimits, QueueSink, QueueWork, Release, COLLECT_INTERVAL,
    MAX_QUEUED, MAX_QUEUED_BYTES,
};
pub use workers::Slot;

/// Requests one connection may have on workers at once, by default.
pub const MAX_IN_FLIGHT: usize = 128;

/// What a request does, as far as routing is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    /// Anything else that touches the device (NBD's block status and cache, SCSI's
    /// read-modify-write commands): never queued, never measured.
    Other,
}

impl Op {
    /// Whether a device's request queue takes it.
    pub fn queueable(self) -> bool {
        !matches!(self, Op::Other)
    }
}

/// A request as the engine sees it: what it does, the bytes it holds in memory
/// (its payload or its read buffer), and which device it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub bytes: usize,
    /// The device's key: 0 for a protocol with one device per connection, the LUN
    /// for iSCSI (as given to [`QueueDriver::start`]).
    pub key: u64,
}

impl Request {
    pub fn new(op: Op, bytes: usize) -> Request {
        Request { op, bytes, key: 0 }
    }

    /// A read of `len` bytes.
    pub fn read(len: usize) -> Request {
        Request::new(Op::Read, len)
    }

    /// A write of `len` bytes of payload.
    pub fn write(len: usize) -> Request {
        Request::new(Op::Write, len)
    }

    pub fn flush() -> Request {
        Request::new(Op::Flush, 0)
    }

    pub fn trim() -> Request {
        Request::new(Op::Trim, 0)
    }

    pub fn write_zeroes() -> Request {
        Request::new(Op::WriteZeroes, 0)
    }

    /// Any other device request (never queued, never measured).
    pub fn other() -> Request {
        Request::new(Op::Other, 0)
    }

    /// The same request for device `key`.
    pub fn on(self, key: u64) -> Request {
        Request { key, ..self }
    }

    /// The direction and length of a read or write large enough to be measured and
    /// perhaps offloaded; `None` for every other request.
    pub fn measured(&self) -> Option<(Transfer, usize)> {
        let transfer = match self.op {
            Op::Read => Transfer::Read,
            Op::Write => Transfer::Write,
            _ => return None,
        };
        (self.bytes >= OFFLOAD_MIN).then_some((transfer, self.bytes))
    }
}

/// Where a request goes (see the crate documentation for why each exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Run it on this thread ([`Engine::inline`]); what would block goes to
    /// [`Engine::offload`].
    Inline,
    /// Hand it to a worker ([`Engine::offload`]).
    Worker,
    /// Hand it to the device's request queue ([`Engine::submit`]).
    Queue,
}

/// How requests that need no queue are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Inline, unless the measured cost of a large read or write says offload
    /// (routes 2 to 5). NBD and iSCSI.
    Measured,
    /// Inline when the device completes inline, on workers otherwise (route 6).
    ByDevice { completes_inline: bool },
}

/// How an engine is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Requests on workers at once; the next [`Engine::offload`] waits.
    pub max_in_flight: usize,
    pub policy: Policy,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_in_flight: MAX_IN_FLIGHT,
            policy: Policy::Measured,
        }
    }
}

/// The engine of one connection (or, shared, of one target): its routing policy,
/// its requests on workers, and its queue thread if the device has a queue.
///
/// `P` is what a queued request keeps for its answer (see [`QueueDriver`]); `()`
/// for a protocol that queues nothing.
pub struct Engine<P: Send + 'static = ()> {
    shared: Arc<workers::Shared>,
    policy: Policy,
    queue: Option<QueueDriver<P>>,
}

impl<P: Send + 'static> Engine<P> {
    pub fn new(config: EngineConfig) -> Engine<P> {
        Engine {
            shared: Arc::new(workers::Shared {
                in_flight: InFlight::new(config.max_in_flight),
                policy: OffloadPolicy::default(),
            }),
            policy: config.policy,
            queue: None,
        }
    }

    /// The engine with `queue` (if any) for [`Route::Queue`].
    pub fn with_queue(mut self, queue: Option<QueueDriver<P>>) -> Engine<P> {
        self.queue = queue;
        self
    }

    /// The queue thread, if the engine has one.
    pub fn queue(&self) -> Option<&QueueDriver<P>> {
        self.queue.as_ref()
    }

    /// The measurements behind [`Policy::Measured`].
    pub fn offload_policy(&self) -> &OffloadPolicy {
        &self.shared.policy
    }

    /// Where `request` goes. `more_waiting` says whether the client has already
    /// sent more requests behind this one; it is asked only when it matters (it
    /// may cost a system call).
    pub fn route(&self, request: Request, more_waiting: impl FnOnce() -> bool) -> Route {
        if request.op.queueable()
            && self
                .queue
                .as_ref()
                .is_some_and(|queue| queue.serves(request.key))
        {
            return Route::Queue;
        }
        match self.policy {
            Policy::ByDevice { completes_inline } if completes_inline => Route::Inline,
            Policy::ByDevice { .. } => Route::Worker,
            Policy::Measured => match request.measured() {
                Some((transfer, len))
                    if self
                        .shared
                        .policy
                        .should_offload(transfer, len, more_waiting) =>
                {
                    Route::Worker
                }
                _ => Route::Inline,
            },
        }
    }

    /// Runs an inline attempt of `request`: `run` answers it (`Ok`) or hands it back
    /// because it would block (`Err`, for [`offload`](Self::offload)). A large read
    /// or write that ran is measured.
    pub fn inline<R, J>(
        &self,
        request: Request,
        run: impl FnOnce() -> Result<R, J>,
    ) -> Result<R, J> {
        let Some((transfer, len)) = request.measured() else {
            return run();
        };
        let started = std::time::Instant::now();
        let result = run();
        if result.is_ok() {
            self.shared.policy.record(transfer, len, started.elapsed());
        }
        result
    }

    /// Hands `request` to a worker of `pool`, waiting first while the engine has
    /// [`EngineConfig::max_in_flight`] there (see [`workers_full`](Self::workers_full)).
    /// `task` runs on the worker with the request's [`Slot`]: it runs the device
    /// work through [`Slot::run`], sends the answer, and drops the slot once the
    /// answer has left.
    pub fn offload(
        &self,
        pool: &WorkerPool,
        request: Request,
        task: impl FnOnce(Slot) + Send + 'static,
    ) {
        let measured = match self.policy {
            Policy::Measured => request.measured(),
            Policy::ByDevice { .. } => None,
        };
        workers::offload(&self.shared, pool, measured, task);
    }

    /// Whether [`offload`](Self::offload) would wait now: a protocol with answers
    /// batched sends them first.
    pub fn workers_full(&self) -> bool {
        self.shared.in_flight.is_full()
    }

    /// Hands a [`Route::Queue`] request to the queue thread (waiting while its
    /// budget is full: see [`queue_full`](Self::queue_full)). Gives the work back
    /// when there is no queue for `request.key` or its thread has gone (route 9).
    pub fn submit(
        &self,
        request: Request,
        work: QueueWork,
        pending: P,
    ) -> Result<(), (QueueWork, P)> {
        match &self.queue {
            Some(queue) => queue.submit(request.key, work, pending),
            None => Err((work, pending)),
        }
    }

    /// Whether [`submit`](Self::submit) would wait now.
    pub fn queue_full(&self) -> bool {
        self.queue.as_ref().is_some_and(QueueDriver::is_full)
    }

    /// Waits until every request on workers and in the queue has been answered
    /// and its slot or budget given back.
    pub fn wait_idle(&self) {
        self.shared.in_flight.wait_idle();
        if let Some(queue) = &self.queue {
            queue.wait_idle();
        }
    }
}

#[cfg(test)]
mod tests;
