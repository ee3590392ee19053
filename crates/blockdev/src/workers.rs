//! A shared pool of threads for requests that may block on hardware (flush, FUA
//! writes, cache misses, direct I/O), so a target keeps reading the network while
//! they wait. Every protocol target uses it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};

type Task = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of worker threads fed from one queue.
///
/// Idle workers sleep at once rather than spinning or yielding first, and a task is
/// only signalled when a worker sleeps: the cores are few, and a waiting thread that
/// polls takes them from the one that has work.
pub struct WorkerPool {
    queue: Arc<TaskQueue>,
    threads: Vec<JoinHandle<()>>,
}

#[derive(Default)]
struct TaskQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    tasks: VecDeque<Task>,
    sleeping: usize,
    closed: bool,
}

impl TaskQueue {
    /// The next task, or `None` once the pool is closed and drained.
    fn next(&self) -> Option<Task> {
        let mut state = lock(&self.state);
        loop {
            if let Some(task) = state.tasks.pop_front() {
                return Some(task);
            }
            if state.closed {
                return None;
            }
            state.sleeping += 1;
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
            state.sleeping -= 1;
        }
    }
}

impl WorkerPool {
    /// Starts `threads` workers (at least one), named `{name}-{i}`.
    pub fn new(name: &str, threads: usize) -> WorkerPool {
        let queue = Arc::new(TaskQueue::default());
        let threads = (0..threads.max(1))
            .map(|i| {
                let queue = queue.clone();
                thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        while let Some(task) = queue.next() {
                            task();
                        }
                    })
                    .expect("spawn worker thread")
            })
            .collect();
        WorkerPool { queue, threads }
    }

    /// Queues a task.
    pub fn submit(&self, task: impl FnOnce() + Send + 'static) {
        let mut state = lock(&self.queue.state);
        state.tasks.push_back(Box::new(task));
        let wake = state.sleeping > 0;
        drop(state);
        if wake {
            self.queue.ready.notify_one();
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        lock(&self.queue.state).closed = true;
        self.queue.ready.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Counts requests in flight on workers, bounding them and letting their submitter
/// wait until all have answered. Taking and giving back a slot is one atomic
/// operation; the lock is only used when someone has to wait.
pub struct InFlight {
    count: AtomicUsize,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    changed: Condvar,
    limit: usize,
}

impl InFlight {
    /// A counter allowing `limit` (at least one) requests in flight.
    pub fn new(limit: usize) -> InFlight {
        InFlight {
            count: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            changed: Condvar::new(),
            limit: limit.max(1),
        }
    }

    /// Takes a slot, waiting while at the limit.
    pub fn acquire(&self) {
        let take = |count: usize| (count < self.limit).then_some(count + 1);
        if self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, take)
            .is_ok()
        {
            return;
        }
        self.wait_until(|| {
            self.count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, take)
                .is_ok()
        });
    }

    /// Gives a slot back.
    pub fn release(&self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
        // SeqCst pairs with the waiter's increment: either it sees our decrement
        // when it checks again, or we see it waiting and wake it.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this wake after the waiter's last check.
            drop(lock(&self.lock));
            self.changed.notify_all();
        }
    }

    /// Whether taking a slot now would wait.
    pub fn is_full(&self) -> bool {
        self.count.load(Ordering::Acquire) >= self.limit
    }

    /// Waits until nothing is in flight.
    pub fn wait_idle(&self) {
        self.wait_until(|| self.count.load(Ordering::Acquire) == 0);
    }

    fn wait_until(&self, mut done: impl FnMut() -> bool) {
        let mut guard = lock(&self.lock);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        while !done() {
            guard = self.changed.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_and_in_flight_drains() {
        let pool = WorkerPool::new("test-worker", 4);
        let done = Arc::new(AtomicUsize::new(0));
        let in_flight = Arc::new(InFlight::new(2));
        for _ in 0..20 {
            in_flight.acquire();
            let (done, in_flight) = (done.clone(), in_flight.clone());
            pool.submit(move || {
                done.fetch_add(1, Ordering::SeqCst);
                in_flight.release();
            });
        }
        in_flight.wait_idle();
        assert_eq!(done.load(Ordering::SeqCst), 20);
    }

    #[test]
    fn in_flight_never_exceeds_its_limit() {
        let pool = WorkerPool::new("test-worker", 6);
        let in_flight = Arc::new(InFlight::new(3));
        let (running, most, done) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        for _ in 0..2000 {
            in_flight.acquire();
            let (in_flight, running, most, done) = (
                in_flight.clone(),
                running.clone(),
                most.clone(),
                done.clone(),
            );
            pool.submit(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::yield_now();
                running.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
                in_flight.release();
            });
        }
        in_flight.wait_idle();
        assert_eq!(done.load(Ordering::SeqCst), 2000);
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert!(!in_flight.is_full());
    }

    #[test]
    fn dropping_the_pool_runs_what_was_queued() {
        let done = Arc::new(AtomicUsize::new(0));
        let pool = WorkerPool::new("test-worker", 2);
        for _ in 0..100 {
            let done = done.clone();
            pool.submit(move || {
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        drop(pool);
        assert_eq!(done.load(Ordering::SeqCst), 100);
    }
}
