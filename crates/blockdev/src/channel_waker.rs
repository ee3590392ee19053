//! A [`Waker`](std::task::Waker) for a request queue's owner that blocks on a channel:
//! waking sends one message, and further wakes send nothing until the owner has
//! collected, so a burst of completions costs one message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::task::Wake;

/// Sends `message()` down `to` at the first wake after each [`collecting`](Self::collecting).
pub struct ChannelWaker<M> {
    to: Sender<M>,
    message: fn() -> M,
    pending: AtomicBool,
}

impl<M> ChannelWaker<M> {
    /// A waker that sends `message()` to `to`.
    pub fn new(to: Sender<M>, message: fn() -> M) -> ChannelWaker<M> {
        ChannelWaker {
            to,
            message,
            pending: AtomicBool::new(false),
        }
    }

    /// The owner is about to collect completions: the next wake sends again.
    pub fn collecting(&self) {
        self.pending.store(false, Ordering::Release);
    }
}

impl<M: Send + 'static> Wake for ChannelWaker<M> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.pending.swap(true, Ordering::AcqRel) {
            // The owner has gone when this fails; nothing is left to wake.
            let _ = self.to.send((self.message)());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::task::Waker;

    #[test]
    fn one_message_per_collection() {
        let (to, from) = mpsc::channel();
        let waker = Arc::new(ChannelWaker::new(to, || 7u8));
        let handle = Waker::from(waker.clone());
        handle.wake_by_ref();
        handle.wake_by_ref();
        assert_eq!(from.try_iter().collect::<Vec<_>>(), [7]);
        waker.collecting();
        handle.wake();
        assert_eq!(from.try_iter().collect::<Vec<_>>(), [7]);
    }
}
