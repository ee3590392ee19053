//! A shared pool of threads for requests that may block on hardware (flush, FUA
//! writes, cache misses, direct I/O), so a target keeps reading the network while
//! they wait. Every protocol target uses it.

use std::sync::{Condvar, Mutex};
use std::thread::{self, JoinHandle};

use crossbeam_channel::{unbounded, Sender};

type Task = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of worker threads fed from one queue.
pub struct WorkerPool {
    queue: Option<Sender<Task>>,
    threads: Vec<JoinHandle<()>>,
}

impl WorkerPool {
    /// Starts `threads` workers (at least one), named `{name}-{i}`.
    pub fn new(name: &str, threads: usize) -> WorkerPool {
        let (queue, tasks) = unbounded::<Task>();
        let threads = (0..threads.max(1))
            .map(|i| {
                let tasks = tasks.clone();
                thread::Builder::new()
                    .name(format!("{name}-{i}"))
                    .spawn(move || {
                        for task in tasks {
                            task();
                        }
                    })
                    .expect("spawn worker thread")
            })
            .collect();
        WorkerPool {
            queue: Some(queue),
            threads,
        }
    }

    /// Queues a task.
    pub fn submit(&self, task: impl FnOnce() + Send + 'static) {
        if let Some(queue) = &self.queue {
            // Sending only fails once every worker has exited, which happens only
            // after `drop` closed the queue.
            let _ = queue.send(Box::new(task));
        }
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        self.queue.take();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Counts requests in flight on workers, bounding them and letting their submitter
/// wait until all have answered.
pub struct InFlight {
    count: Mutex<usize>,
    changed: Condvar,
    limit: usize,
}

impl InFlight {
    /// A counter allowing `limit` (at least one) requests in flight.
    pub fn new(limit: usize) -> InFlight {
        InFlight {
            count: Mutex::new(0),
            changed: Condvar::new(),
            limit: limit.max(1),
        }
    }

    /// Takes a slot, waiting while at the limit.
    pub fn acquire(&self) {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *count >= self.limit {
            count = self.changed.wait(count).unwrap_or_else(|e| e.into_inner());
        }
        *count += 1;
    }

    /// Gives a slot back.
    pub fn release(&self) {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        *count -= 1;
        self.changed.notify_all();
    }

    /// Whether taking a slot now would wait.
    pub fn is_full(&self) -> bool {
        *self.count.lock().unwrap_or_else(|e| e.into_inner()) >= self.limit
    }

    /// Waits until nothing is in flight.
    pub fn wait_idle(&self) {
        let mut count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        while *count > 0 {
            count = self.changed.wait(count).unwrap_or_else(|e| e.into_inner());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

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
}
