//! The AoE initiator's request queue: one thread keeps many reads and writes in
//! flight, each owning its buffer until its completion comes back, instead of one
//! blocked thread per request. The session and the receivers are the same as for
//! blocking calls; only who learns of the end differs (engine.rs, `Waiter`).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use blockwire_blockdev::{Completion, Error, ErrorKind, Op, QueuedOp, RequestQueue, Submission};

use super::device::AoeClient;
use super::errors::device_error;
use super::session::{Fault, Plan};

#[derive(Default)]
struct Shared {
    done: Mutex<Vec<Completion>>,
    ready: Condvar,
}

impl Shared {
    fn done(&self) -> MutexGuard<'_, Vec<Completion>> {
        self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, completion: Completion) {
        self.done().push(completion);
        self.ready.notify_one();
    }
}

/// A request queue on an [`AoeClient`].
pub(crate) struct AoeQueue<'a> {
    client: &'a AoeClient,
    shared: Arc<Shared>,
    /// The target, for error messages.
    description: Arc<str>,
    in_flight: usize,
}

impl<'a> AoeQueue<'a> {
    pub fn new(client: &'a AoeClient) -> AoeQueue<'a> {
        AoeQueue {
            client,
            shared: Arc::new(Shared::default()),
            description: client.description().into(),
            in_flight: 0,
        }
    }
}

impl RequestQueue for AoeQueue<'_> {
    fn submit(&mut self, submission: Submission) {
        let Submission {
            tag,
            op,
            mut buf,
            offset,
        } = submission;
        self.in_flight += 1;
        let (kind, fua) = match op {
            QueuedOp::Read => (Op::Read, false),
            QueuedOp::Write(flags) => (Op::Write, flags.fua),
        };
        let len = buf.len();
        let checked = self.client.check(kind, offset, len).and_then(|range| {
            if fua {
                // AoE's ATA commands have no FUA write; a blocking write emulates it.
                return Err(Error::new(ErrorKind::Unsupported, kind, offset, len as u64)
                    .with_detail("FUA on a queued AoE write"));
            }
            Ok(range)
        });
        let (lba, sectors) = match checked {
            Ok(range) => range,
            Err(error) => {
                let result = Err(error);
                self.shared.push(Completion { tag, buf, result });
                return;
            }
        };
        if sectors == 0 {
            let result = Ok(());
            self.shared.push(Completion { tag, buf, result });
            return;
        }
        let plan = match kind {
            Op::Read => Plan::read(lba, sectors),
            _ => Plan::write(lba, sectors),
        };
        let pointer = buf.as_mut_ptr();
        let shared = self.shared.clone();
        let description = self.description.clone();
        // The closure owns the buffer: it lives until the engine is done with it.
        let complete = move |fault: Option<Fault>| {
            let result = match fault {
                None => Ok(()),
                Some(fault) => Err(device_error(&fault, kind, offset, len as u64, &description)),
            };
            shared.push(Completion { tag, buf, result });
        };
        self.client
            .engine()
            .submit(plan, pointer, len, Box::new(complete));
    }

    fn complete(&mut self, min: usize, out: &mut Vec<Completion>) {
        let want = min.min(self.in_flight);
        let mut done = self.shared.done();
        while done.len() < want {
            // The session fails every request after its timeout, so this ends.
            done = self
                .shared
                .ready
                .wait(done)
                .unwrap_or_else(|e| e.into_inner());
        }
        self.in_flight -= done.len();
        out.append(&mut done);
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }
}
