//! The driver around the [`Session`]: sockets, threads, buffers.
//!
//! - A caller's thread submits its request and sends the frames the window has room
//!   for itself (one `sendmmsg` per interface), then sleeps until the request is done:
//!   no hand-off to another thread on submission.
//! - One receiver thread per interface takes answers in batches (`recvmmsg`), lets the
//!   session match them, copies read data straight into the caller's buffer, refills
//!   the window with the next frames (its own `sendmmsg`), and runs the retransmission
//!   timer when its socket is drained.
//! - A caller is woken once per request, by whichever thread finishes with it last.
//!
//! Buffers: a request lends its buffer (the caller's `&mut [u8]` or `&[u8]`) to the
//! engine until it completes. Every thread that touches the buffer first takes a hold
//! on the request, under the session lock, while the session still knows the request;
//! the request completes only when the session has finished it *and* every hold is
//! released. So no thread touches a buffer after its caller returned, even when a
//! request fails while other threads are still copying into or out of it.

use std::cell::RefCell;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use super::session::{
    encode_transmit_head, Fault, Handled, Outputs, Plan, Purpose, Session, Stats,
};
use crate::identify::Identity;
use crate::rawsock::{RawSocket, RecvBatch};

/// How long a receiver waits for frames while frames are outstanding: the timer's
/// granularity when nothing arrives.
const BUSY_TICK: Duration = Duration::from_millis(1);
/// How long a receiver waits while idle: bounds how long closing takes.
const IDLE_TICK: Duration = Duration::from_millis(20);
/// Run the timer at least this often even when every batch comes in full.
const TIMER_EVERY: Duration = Duration::from_millis(2);
/// Frames polled and sent at once: a window of hundreds goes out in several
/// `sendmmsg` calls, each stamped when it is built rather than all at the start.
const CHUNK: usize = 32;

/// Who learns that a request finished.
enum Waiter {
    /// The caller's thread, blocked in [`Engine::execute`].
    Thread(Thread),
    /// A request queue: the buffer (owned by the request) and the result go to it.
    Queue(Box<dyn FnOnce(Option<Fault>) + Send + Sync>),
}

/// One request's shared state: the lent buffer, the holds, the result, the waiter.
pub(crate) struct Request {
    buffer: *mut u8,
    len: usize,
    /// One for the session until it finishes the request, plus one per thread
    /// currently using the buffer.
    holds: AtomicUsize,
    done: AtomicBool,
    fault: Mutex<Option<Fault>>,
    waiter: Mutex<Option<Waiter>>,
}

// SAFETY: the buffer pointer is only dereferenced by threads holding the request
// (module documentation), while the lending caller waits; the rest is thread-safe.
unsafe impl Send for Request {}
// SAFETY: as above. Reads copy into disjoint frame ranges; writes only read.
unsafe impl Sync for Request {}

type Handle = Arc<Request>;

impl Request {
    fn new(buffer: *mut u8, len: usize, waiter: Waiter) -> Request {
        Request {
            buffer,
            len,
            holds: AtomicUsize::new(1),
            done: AtomicBool::new(false),
            fault: Mutex::new(None),
            waiter: Mutex::new(Some(waiter)),
        }
    }

    /// Takes a hold; only under the session lock, while the session knows the
    /// request (so the count cannot have reached zero).
    fn hold(&self) {
        self.holds.fetch_add(1, Ordering::Relaxed);
    }

    /// Releases a hold; the last one wakes the caller or completes to the queue.
    fn release(&self) {
        if self.holds.fetch_sub(1, Ordering::AcqRel) == 1 {
            let waiter = self.waiter.lock().unwrap_or_else(|e| e.into_inner()).take();
            match waiter {
                Some(Waiter::Thread(thread)) => {
                    self.done.store(true, Ordering::Release);
                    thread.unpark();
                }
                Some(Waiter::Queue(complete)) => {
                    let fault = self.fault.lock().unwrap_or_else(|e| e.into_inner()).take();
                    complete(fault);
                }
                None => {}
            }
        }
    }

    /// The lent buffer, to read write data from.
    ///
    /// # Safety
    /// The caller holds the request, and it is a write (nobody writes the buffer).
    unsafe fn source(&self) -> &[u8] {
        // SAFETY: the buffer lives while held (module documentation).
        unsafe { std::slice::from_raw_parts(self.buffer, self.len) }
    }

    /// `len` bytes of the lent buffer at `offset`, to copy read data into.
    ///
    /// # Safety
    /// The caller holds the request, and the session handed this range to it alone
    /// (each frame's range once; frames do not overlap).
    #[allow(clippy::mut_from_ref)]
    unsafe fn target(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (checked); exclusive per the contract above.
        unsafe { std::slice::from_raw_parts_mut(self.buffer.add(offset), len) }
    }

    fn wait(&self) {
        while !self.done.load(Ordering::Acquire) {
            thread::park();
        }
    }
}

/// Per-thread buffers for building frames.
#[derive(Default)]
struct Scratch {
    out: Outputs<Handle>,
    frames: Vec<u8>,
    ranges: Vec<Range<usize>>,
    tags: Vec<u32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The session, its sockets and the receivers' shared flags.
pub(crate) struct Engine {
    session: Mutex<Session<Handle>>,
    sockets: Vec<RawSocket>,
    shutdown: AtomicBool,
    /// Frames are outstanding (receivers then wake often enough to run the timer).
    busy: AtomicBool,
    /// `eSHELF.SLOT`, for messages.
    name: String,
}

impl Engine {
    /// Starts one receiver thread per socket.
    pub fn start(
        session: Session<Handle>,
        sockets: Vec<RawSocket>,
        batch: usize,
    ) -> io::Result<(Arc<Engine>, Vec<JoinHandle<()>>)> {
        let name = format!("e{}.{}", session.config().shelf, session.config().slot);
        let engine = Arc::new(Engine {
            name,
            session: Mutex::new(session),
            sockets,
            shutdown: AtomicBool::new(false),
            busy: AtomicBool::new(false),
        });
        let mut receivers = Vec::new();
        for index in 0..engine.sockets.len() {
            let interface = engine.sockets[index].interface();
            let frame_bytes = interface.mtu + 64;
            let name = format!("aoe-rx-{}", interface.name);
            let this = engine.clone();
            let spawned = thread::Builder::new()
                .name(name)
                .spawn(move || this.receive(index, RecvBatch::new(batch, frame_bytes)));
            match spawned {
                Ok(handle) => receivers.push(handle),
                Err(err) => {
                    engine.stop(receivers);
                    return Err(err);
                }
            }
        }
        Ok((engine, receivers))
    }

    fn lock(&self) -> MutexGuard<'_, Session<Handle>> {
        // A panic elsewhere never leaves the session half-updated in a way that
        // matters more than failing requests would; keep going.
        self.session.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a request to completion on the caller's thread. `buffer` must stay valid
    /// (and, for reads, unaliased) until this returns.
    pub fn execute(&self, plan: Plan, buffer: *mut u8, len: usize) -> Result<(), Fault> {
        let request = Arc::new(Request::new(buffer, len, Waiter::Thread(thread::current())));
        self.begin(plan, request.clone());
        request.wait();
        let fault = request
            .fault
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match fault {
            None => Ok(()),
            Some(fault) => Err(fault),
        }
    }

    /// Starts a request without waiting: `complete` is called once, with the fault if
    /// it failed, when no thread touches `buffer` any more. `buffer` must stay valid
    /// (and, for reads, unaliased) until then.
    pub fn submit(
        &self,
        plan: Plan,
        buffer: *mut u8,
        len: usize,
        complete: Box<dyn FnOnce(Option<Fault>) + Send + Sync>,
    ) {
        self.begin(
            plan,
            Arc::new(Request::new(buffer, len, Waiter::Queue(complete))),
        );
    }

    /// Hands a request to the session and sends what the window allows.
    fn begin(&self, plan: Plan, request: Handle) {
        SCRATCH.with(|scratch| {
            let scratch = &mut *scratch.borrow_mut();
            {
                let mut session = self.lock();
                session.submit(request, plan, &mut scratch.out);
            }
            self.fill(scratch);
        });
    }

    /// Sends frames while the window has room, in chunks of [`CHUNK`], each polled
    /// (and so timestamped) just before it goes out.
    fn fill(&self, scratch: &mut Scratch) {
        loop {
            let handed = {
                let mut session = self.lock();
                let handed = session.poll_transmits_up_to(Instant::now(), &mut scratch.out, CHUNK);
                for transmit in &scratch.out.transmits {
                    transmit.request.hold();
                }
                self.busy.store(session.in_flight() > 0, Ordering::Relaxed);
                handed
            };
            self.dispatch(scratch);
            if handed < CHUNK {
                return;
            }
        }
    }

    /// Delivers finished requests' results and sends the transmits (outside the
    /// session lock).
    fn dispatch(&self, scratch: &mut Scratch) {
        for finished in scratch.out.finished.drain(..) {
            if let Err(fault) = finished.result {
                *finished
                    .request
                    .fault
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some(fault);
            }
            finished.request.release();
        }
        self.send(scratch);
    }

    /// Sends the session's own frames (rediscovery queries, identity checks) and
    /// reports its events.
    fn send_control(&self, out: &mut Outputs<Handle>) {
        for control in out.control.drain(..) {
            let socket = &self.sockets[control.socket];
            if let Err(err) = socket.send(&control.frame) {
                // As for data frames: the session sends it again while it matters.
                tracing::debug!(
                    "sending an AoE {:?} frame on {}: {err}",
                    control.purpose,
                    socket.interface().name
                );
            } else if control.purpose == Purpose::Rediscover {
                tracing::trace!(
                    "AoE {}: config query on {}",
                    self.name,
                    socket.interface().name
                );
            }
        }
        for event in out.events.drain(..) {
            let interface = &self.sockets[event.socket()].interface().name;
            let (level, message) = event.message(&self.name, interface);
            match level {
                tracing::Level::ERROR | tracing::Level::WARN => tracing::warn!("{message}"),
                tracing::Level::INFO => tracing::info!("{message}"),
                _ => tracing::debug!("{message}"),
            }
        }
    }

    /// Encodes and sends held transmits, one batch per socket, and releases them.
    fn send(&self, scratch: &mut Scratch) {
        self.send_control(&mut scratch.out);
        let Scratch {
            out,
            frames,
            ranges,
            tags,
        } = scratch;
        let transmits = &mut out.transmits;
        if transmits.is_empty() {
            return;
        }
        tags.clear();
        tags.extend(transmits.iter().map(|t| t.header.tag));
        for (index, socket) in self.sockets.iter().enumerate() {
            frames.clear();
            ranges.clear();
            for transmit in transmits.iter().filter(|t| t.socket == index) {
                ranges.push(encode_transmit_head(transmit, frames));
            }
            if ranges.is_empty() {
                continue;
            }
            // Heads from `frames`, write data straight from the callers' buffers.
            let batch = transmits
                .iter()
                .filter(|t| t.socket == index)
                .zip(ranges.iter())
                .map(|(transmit, head)| {
                    let body = if transmit.data.is_empty() {
                        &[][..]
                    } else {
                        // SAFETY: the transmit holds its request, and only writes
                        // carry data.
                        let source = unsafe { transmit.request.source() };
                        &source[transmit.data.clone()]
                    };
                    (&frames[head.clone()], body)
                });
            if let Err(err) = socket.send_gathered(batch) {
                // The frames count as lost: the timer retransmits them, on another
                // path if there is one.
                tracing::debug!(
                    "sending {} AoE frames on {}: {err}",
                    ranges.len(),
                    socket.interface().name
                );
            }
        }
        for transmit in transmits.drain(..) {
            transmit.request.release();
        }
        // Their timers start now that they are out.
        self.lock().sent(Instant::now(), tags);
    }

    /// A receiver thread: answers in, data copied, window refilled, timer run.
    fn receive(self: Arc<Engine>, index: usize, mut batch: RecvBatch) {
        let _close_on_panic = CloseOnPanic(&self);
        let socket = &self.sockets[index];
        let mut scratch = Scratch::default();
        let mut reads: Vec<(Handle, usize, usize, Range<usize>)> = Vec::new();
        let mut last_timer = Instant::now();
        let mut failures = 0u32;
        while !self.shutdown.load(Ordering::Relaxed) {
            let wait = if self.busy.load(Ordering::Relaxed) {
                BUSY_TICK
            } else {
                IDLE_TICK
            };
            let received = match socket.recv_batch(&mut batch, Some(wait)) {
                Ok(received) => {
                    failures = 0;
                    received
                }
                Err(err) => {
                    // An interface going down, say; the timer still runs, and requests
                    // fail by timeout if no path recovers.
                    if failures == 0 {
                        tracing::warn!(
                            "receiving AoE frames on {}: {err}",
                            socket.interface().name
                        );
                    }
                    failures = failures.saturating_add(1);
                    thread::sleep(BUSY_TICK);
                    0
                }
            };
            let now = Instant::now();
            let handed;
            {
                let mut session = self.lock();
                for i in 0..received {
                    if batch.is_truncated(i) {
                        continue;
                    }
                    let handled =
                        session.handle_frame(now, index, batch.frame(i), &mut scratch.out);
                    if let Handled::Read {
                        request,
                        offset,
                        data,
                    } = handled
                    {
                        request.hold();
                        reads.push((request, offset, i, data));
                    }
                }
                if received < batch.capacity() || now >= last_timer + TIMER_EVERY {
                    session.handle_timeout(now, &mut scratch.out);
                    last_timer = now;
                }
                handed = session.poll_transmits_up_to(now, &mut scratch.out, CHUNK);
                for transmit in &scratch.out.transmits {
                    transmit.request.hold();
                }
                self.busy.store(session.in_flight() > 0, Ordering::Relaxed);
            }
            // Refill the target's queue first, then copy what it sent.
            self.send(&mut scratch);
            for (request, offset, i, data) in reads.drain(..) {
                let frame = batch.frame(i);
                // SAFETY: held since the session handed out this frame's range, which
                // no other thread writes.
                unsafe { request.target(offset, data.len()) }.copy_from_slice(&frame[data]);
                request.release();
            }
            self.dispatch(&mut scratch);
            if handed == CHUNK {
                self.fill(&mut scratch);
            }
        }
    }

    /// Fails every request with [`Fault::Closed`] and refuses new ones.
    pub fn close(&self) {
        let mut scratch = Scratch::default();
        self.lock().close(&mut scratch.out);
        self.dispatch(&mut scratch);
    }

    /// Stops and joins the receivers, then closes.
    pub fn stop(&self, receivers: Vec<JoinHandle<()>>) {
        self.shutdown.store(true, Ordering::Relaxed);
        for receiver in receivers {
            let _ = receiver.join();
        }
        self.close();
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// The smoothed round-trip time and the current retransmission timeout.
    pub fn timing(&self) -> (Option<Duration>, Duration) {
        let session = self.lock();
        (session.rtt().srtt(), session.rtt().rto())
    }

    /// Switches the commands once IDENTIFY told what the target supports.
    pub fn set_addressing(&self, lba48: bool, flush_ext: bool) {
        self.lock().set_addressing(lba48, flush_ext);
    }

    /// What a target found again after an outage must match.
    pub fn set_identity(&self, identity: Identity) {
        self.lock().set_identity(identity);
    }
}

/// Fails all requests if a receiver panics, so no caller waits forever.
struct CloseOnPanic<'a>(&'a Engine);

impl Drop for CloseOnPanic<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.close();
        }
    }
}
