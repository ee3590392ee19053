//! Write-behind: start writeback of data that sequential writers have left in the page
//! cache, in the background, as soon as a stream has dirtied enough of it.
//!
//! Buffered writes only dirty the page cache; the kernel writes them back seconds
//! later, or all at once when a client flushes. A client that writes a gigabyte and
//! then flushes (a copy, `dd conv=fsync`, an installer, any AoE or NBD initiator
//! before it reports success) then waits for the whole gigabyte to reach the disk. With
//! write-behind the disk works while the data still arrives, and the flush finds only
//! the last few megabytes to write. RocksDB's `bytes_per_sync` does the same.
//!
//! Only sequential streams are written behind: a write that continues one of the
//! recently seen streams extends it, and once a stream has [`WriteBehind::threshold`]
//! bytes not yet handed over, that range goes to a background thread that calls
//! `sync_file_range(SYNC_FILE_RANGE_WRITE)`. Random writes start streams that never
//! grow, so they are left to the kernel, which may still merge rewrites of hot blocks.
//!
//! Errors: `SYNC_FILE_RANGE_WRITE` without the wait flags only starts writeback and
//! reports nothing; a failed writeback is recorded on the file and reported by the
//! next `fdatasync`, i.e. by the flush a client is waiting for. (The wait flags would
//! consume that error on this thread, and the flush would then miss it.)

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Streams remembered at once: enough for a target's many sequential writers (an
/// initiator streaming with 16 requests in flight, several clients).
const STREAMS: usize = 32;

/// The default [`WriteBehind::threshold`]: 0, off. Measured with
/// `bench/write-behind.sh` (2 cores, 23 GiB; figures in docs/blockdev.md): 2 GiB
/// written at 1 MiB QD16 reached the client at 0.22-0.30x and the disk at 0.48-0.62x
/// the rate without it, for 4-5x the server's CPU, to shorten the flush after it from
/// 0.6 s to 0.03 s; beyond the kernel's dirty limit (8 GiB) both were level and the
/// flush 0.7 s against under 0.1 s. So it is for exports whose clients need short
/// flushes after long writes, not the default.
pub const DEFAULT_WRITE_BEHIND: u64 = 0;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug, Clone, Copy)]
struct Stream {
    /// Start of the part not yet handed to writeback.
    unsent: u64,
    /// Where the next write continues the stream.
    end: u64,
    /// When the stream was last written, in writes noted: the oldest is replaced.
    used: u64,
}

#[derive(Default)]
struct Streams {
    streams: Vec<Stream>,
    writes: u64,
}

#[derive(Default)]
struct Queue {
    ranges: VecDeque<Range<u64>>,
    closing: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// Tracks sequential write streams to one file and writes them behind.
pub struct WriteBehind {
    threshold: u64,
    streams: Mutex<Streams>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for WriteBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBehind")
            .field("threshold", &self.threshold)
            .finish_non_exhaustive()
    }
}

impl WriteBehind {
    /// Writes behind on `file` (a duplicate of the device's descriptor) in pieces of
    /// `threshold` bytes per stream.
    pub fn start(file: File, threshold: u64) -> std::io::Result<WriteBehind> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("write-behind".into())
            .spawn(move || run(&file, &worker))?;
        Ok(WriteBehind {
            threshold: threshold.max(1),
            streams: Mutex::new(Streams::default()),
            shared,
            thread: Some(thread),
        })
    }

    /// Bytes a stream gathers before they are handed to writeback.
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// Notes a buffered write of `len` bytes at `offset` (after it was done).
    pub fn wrote(&self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        if let Some(range) = self.extend(offset, len) {
            let mut queue = lock(&self.shared.queue);
            match queue.ranges.back_mut() {
                Some(last) if last.end == range.start => last.end = range.end,
                _ => queue.ranges.push_back(range),
            }
            drop(queue);
            self.shared.wake.notify_one();
        }
    }

    /// Extends the stream this write continues, or starts one; returns a range to
    /// write behind when the stream has gathered enough.
    ///
    /// Requests spread over several connections arrive a little out of order, so a
    /// write may also fill the gap just before a stream (it overtook its
    /// predecessor), and two streams that come to touch become one.
    fn extend(&self, offset: u64, len: u64) -> Option<Range<u64>> {
        let mut table = lock(&self.streams);
        table.writes += 1;
        let now = table.writes;
        let end = offset.saturating_add(len);
        let streams = &mut table.streams;
        let index = if let Some(mut i) = streams.iter().position(|s| s.end == offset) {
            streams[i].end = end;
            // A stream that starts where this one now ends joins it.
            if let Some(j) = streams.iter().position(|s| s.unsent == end) {
                let joined = streams.swap_remove(j);
                if i == streams.len() {
                    // swap_remove moved the last stream, this one, into `j`.
                    i = j;
                }
                streams[i].end = streams[i].end.max(joined.end);
            }
            Some(i)
        } else if let Some(i) = streams.iter().position(|s| s.unsent == end) {
            streams[i].unsent = offset;
            Some(i)
        } else {
            None
        };
        if let Some(i) = index {
            let stream = &mut streams[i];
            stream.used = now;
            if stream.end - stream.unsent >= self.threshold {
                let range = stream.unsent..stream.end;
                stream.unsent = stream.end;
                return Some(range);
            }
            return None;
        }
        let fresh = Stream {
            unsent: offset,
            end,
            used: now,
        };
        if streams.len() < STREAMS {
            streams.push(fresh);
        } else if let Some(oldest) = streams.iter_mut().min_by_key(|s| s.used) {
            *oldest = fresh;
        }
        None
    }

    /// Ranges handed over but not yet taken by the background thread (tests).
    #[cfg(test)]
    fn queued(&self) -> Vec<Range<u64>> {
        lock(&self.shared.queue).ranges.iter().cloned().collect()
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        lock(&self.shared.queue).closing = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(file: &File, shared: &Shared) {
    loop {
        let range = {
            let mut queue = lock(&shared.queue);
            loop {
                if let Some(range) = queue.ranges.pop_front() {
                    break range;
                }
                if queue.closing {
                    return;
                }
                queue = shared.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        };
        start_writeback(file, range);
    }
}

/// Starts writeback of `range` without waiting for it (see the module documentation
/// for why no wait flag).
fn start_writeback(file: &File, range: Range<u64>) {
    // SAFETY: plain syscall on a descriptor this thread's `file` keeps open.
    let rc = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            range.start as libc::off64_t,
            (range.end - range.start) as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "write-behind of {}..{} not started: {}",
            range.start,
            range.end,
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const MIB: u64 = 1 << 20;

    /// A write-behind whose thread never sees work: ranges stay queued for the test.
    fn parked(threshold: u64) -> WriteBehind {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        WriteBehind {
            threshold,
            streams: Mutex::new(Streams::default()),
            shared,
            thread: None,
        }
    }

    #[test]
    fn a_sequential_stream_is_handed_over_in_threshold_pieces() {
        let behind = parked(4 * MIB);
        for n in 0..10 {
            behind.wrote(n * MIB, MIB);
        }
        // Two pieces of 4 MiB, adjacent, merged while queued; 2 MiB still gathering.
        assert_eq!(behind.queued(), vec![0..8 * MIB]);
    }

    #[test]
    fn a_stream_arriving_slightly_out_of_order_is_still_written_behind() {
        // Pairs swapped, as from requests spread over several connections: each odd
        // block overtakes the even one before it.
        let behind = parked(4 * MIB);
        for pair in 0..8 {
            behind.wrote((2 * pair + 1) * MIB, MIB);
            behind.wrote(2 * pair * MIB, MIB);
        }
        assert_eq!(behind.queued(), vec![0..16 * MIB]);
    }

    #[test]
    fn interleaved_streams_are_told_apart() {
        let behind = parked(2 * MIB);
        let starts = [0, 100 * MIB, 200 * MIB];
        for n in 0..2 {
            for start in starts {
                behind.wrote(start + n * MIB, MIB);
            }
        }
        let mut queued = behind.queued();
        queued.sort_by_key(|r| r.start);
        assert_eq!(
            queued,
            vec![0..2 * MIB, 100 * MIB..102 * MIB, 200 * MIB..202 * MIB]
        );
    }

    #[test]
    fn random_writes_are_left_to_the_kernel() {
        let behind = parked(MIB);
        let mut offset = 12345u64;
        for _ in 0..10_000 {
            offset = offset
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            behind.wrote((offset % (1 << 30)) & !4095, 4096);
        }
        assert!(behind.queued().is_empty());
        assert!(lock(&behind.streams).streams.len() <= STREAMS);
    }

    /// Drop drains the queue and joins the thread (the test hangs otherwise); that
    /// writeback really starts is tested through the file device (file.rs).
    #[test]
    fn drop_drains_the_queue_and_joins_the_thread() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 8 << 20]).unwrap();
        let behind = WriteBehind::start(file.try_clone().unwrap(), MIB).unwrap();
        for n in 0..8 {
            behind.wrote(n * MIB, MIB);
        }
        drop(behind);
    }
}
