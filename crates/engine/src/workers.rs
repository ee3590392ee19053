//! The worker route: a request handed to the shared [`WorkerPool`], bounded per
//! connection (or per target) by an [`InFlight`] count, and measured for the
//! [`OffloadPolicy`].
//!
//! A request on a worker holds a [`Slot`]: its place in the bound, and for a large
//! read or write its bytes in the policy's count. The worker runs the request,
//! sends the answer itself, and drops the slot once the answer has left, so answers
//! waiting for the socket still count: a client that stops reading them stops the
//! connection reading its requests.

use std::sync::Arc;
use std::time::Instant;

use blockwire_blockdev::workers::{InFlight, WorkerPool};

use crate::policy::{OffloadPolicy, Transfer};

/// What the connection thread and its workers share.
pub(crate) struct Shared {
    pub(crate) in_flight: InFlight,
    pub(crate) policy: OffloadPolicy,
}

/// A request's place on the workers: given back when dropped.
#[must_use = "dropping a Slot gives the place back at once"]
pub struct Slot {
    shared: Arc<Shared>,
    measured: Option<(Transfer, usize)>,
}

impl Slot {
    pub(crate) fn new(shared: Arc<Shared>, measured: Option<(Transfer, usize)>) -> Slot {
        if let Some((_, len)) = measured {
            shared.policy.start(len);
        }
        Slot { shared, measured }
    }

    /// Runs the request's device work, measuring it when it is a large read or
    /// write (how long workers take teaches the policy as inline runs do).
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        let Some((transfer, len)) = self.measured else {
            return work();
        };
        let started = Instant::now();
        let result = work();
        self.shared.policy.record(transfer, len, started.elapsed());
        result
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((_, len)) = self.measured {
            self.shared.policy.finish(len);
        }
        self.shared.in_flight.release();
    }
}

/// Hands `task` to `pool` once a place is free (waiting for one).
pub(crate) fn offload(
    shared: &Arc<Shared>,
    pool: &WorkerPool,
    measured: Option<(Transfer, usize)>,
    task: impl FnOnce(Slot) + Send + 'static,
) {
    shared.in_flight.acquire();
    let slot = Slot::new(shared.clone(), measured);
    pool.submit(move || task(slot));
}
