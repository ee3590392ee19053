//! One thread per image collects finished requests: librbd bumps an eventfd
//! (`rbd_set_image_notification`), the poller takes the completions
//! (`rbd_poll_io_events`) and hands each result to whoever waits for it — a request
//! queue's channel or a blocked caller. A FUA write's flush is started here, when
//! its write finishes, so neither step blocks a submitter.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::thread::JoinHandle;

use blockwire_blockdev::{Completion, Error, IoBuf, Op, Result};
use crossbeam_channel::Sender;

use crate::errors::request_error;
use crate::ffi::{AioKind, AioRequest, EventFd, Image};

/// Who receives a finished request.
pub enum Reply {
    /// A request queue's submission: its tag, the queue's channel, and whom to
    /// wake when the completion is there.
    Queued {
        tag: u64,
        to: Sender<Completion>,
        wake: Option<Waker>,
    },
    /// A blocked caller of a synchronous method.
    Waiter(Sender<(Result<()>, Option<IoBuf>)>),
}

/// What we attach to each librbd request.
pub struct Pending {
    /// The operation and range, for error context.
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    /// A write with FUA: flush once the write finished, then reply.
    pub then_flush: bool,
    pub reply: Reply,
}

/// A request as librbd carries it.
pub type Request = AioRequest<Pending>;

/// The image shared by the device, its queues and the poller.
pub struct Shared {
    pub image: Image<Pending>,
    /// `POOL/IMAGE[@SNAP]`, for errors.
    pub name: String,
    pub events: EventFd,
    stop: AtomicBool,
}

impl Shared {
    pub fn new(image: Image<Pending>, name: String, events: EventFd) -> Shared {
        Shared {
            image,
            name,
            events,
            stop: AtomicBool::new(false),
        }
    }

    /// Tells the poller thread to stop, and wakes it to notice.
    fn stop_polling(&self) {
        self.stop.store(true, Ordering::Release);
        self.events.wake();
    }

    /// Stops the poller and closes the image now (see [`Image::close`]).
    pub fn close(&self) {
        self.stop_polling();
        self.image.close();
    }

    /// Starts `request`; if librbd refuses it, it is answered at once with the error.
    pub fn submit(&self, request: Box<Request>) {
        if let Err((call, request)) = self.image.submit(request) {
            let state = &request.state;
            let error = request_error(call, &self.name, state.op, state.offset, state.len);
            reply(*request, Err(error));
        }
    }

    /// Finishes one request that librbd handed back.
    fn finished(&self, mut request: Box<Request>, ret: isize) {
        if ret >= 0 && request.state.then_flush {
            request.state.then_flush = false;
            request.kind = AioKind::Flush;
            self.submit(request);
            return;
        }
        let result = if ret < 0 {
            let state = &request.state;
            let call = crate::ffi::CallError {
                function: request.kind.function(),
                errno: (-ret) as i32,
            };
            Err(request_error(
                call,
                &self.name,
                state.op,
                state.offset,
                state.len,
            ))
        } else {
            Ok(())
        };
        reply(*request, result);
    }
}

fn reply(request: Request, result: Result<()>) {
    match request.state.reply {
        Reply::Queued { tag, to, wake } => {
            let buf = request.buf.unwrap_or_else(|| IoBuf::new(0));
            // The queue may be gone (its owner gave up): nothing to tell then.
            if to.send(Completion { tag, buf, result }).is_ok() {
                if let Some(wake) = wake {
                    wake.wake();
                }
            }
        }
        Reply::Waiter(to) => {
            let _ = to.send((result, request.buf));
        }
    }
}

/// The poller thread; stopped and joined when dropped.
pub struct Poller {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    /// Registers the eventfd with librbd and starts polling.
    pub fn start(shared: Arc<Shared>) -> std::io::Result<Poller> {
        shared
            .image
            .notify_eventfd(shared.events.raw())
            .map_err(|e| std::io::Error::other(format!("{}: {e}", shared.name)))?;
        let polled = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("rbd-poll {}", shared.name))
            .spawn(move || run(&polled))?;
        Ok(Poller {
            shared,
            thread: Some(thread),
        })
    }
}

fn run(shared: &Shared) {
    let mut done = Vec::new();
    loop {
        // The timeout only bounds how long a stop request may go unnoticed.
        shared.events.wait(500);
        shared.image.poll(&mut done);
        for (request, ret) in done.drain(..) {
            shared.finished(request, ret);
        }
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.shared.stop_polling();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An error for a request whose answer did not come within our own deadline.
pub fn overdue(op: Op, offset: u64, len: u64, name: &str, secs: f64) -> Error {
    Error::new(blockwire_blockdev::ErrorKind::TimedOut, op, offset, len).with_detail(format!(
        "rbd image {name}: no answer from the cluster within {secs:.0} s"
    ))
}
