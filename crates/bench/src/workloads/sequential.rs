//! dd-style sequential throughput: write the region in `block_size` requests, flush
//! (counted in the write time, like `dd conv=fdatasync`), then read it back. With a
//! queue depth of N, N threads each stream through their own contiguous part, so N
//! requests are in flight; a device with its own request queue (an initiator) is
//! instead given the requests in order by one thread keeping N in flight, as fio
//! does.

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use blockwire_blockdev::{IoBuf, QueuedOp, RequestQueue, Submission, WriteFlags};

use super::{fill_pattern, parallel, share, Ctx, Unit};
use crate::error::{Error, Result};
use crate::meter::{PhaseSpec, Recorder, Totals};
use crate::progress::Progress;

pub const NAME: &str = "sequential";

pub fn run(ctx: &Ctx) -> Result<()> {
    let block = ctx.config.block_size;
    let blocks = ctx.region / block;
    if blocks == 0 {
        return Err(Error::target(format!(
            "the data set ({} bytes) is smaller than one block ({block} bytes)",
            ctx.region
        )));
    }
    let depth = ctx.config.queue_depth.max(1).min(blocks as u32);
    let total = blocks * block;
    // The buffers are filled (and their pages touched) before the clock starts, as
    // fio prepares its own: a phase times the I/O alone. The read phase reuses them.
    let buffers = Mutex::new(
        (0..depth)
            .map(|index| {
                let mut buf = IoBuf::new(block as usize);
                fill_pattern(&mut buf, u64::from(index) + 1);
                buf
            })
            .collect::<Vec<_>>(),
    );

    ctx.phase(
        PhaseSpec::new(NAME, "write", block, depth),
        total,
        Unit::Bytes,
        |progress| {
            if let Some(mut queue) = ctx.device.queue() {
                let totals = in_order(
                    queue.as_mut(),
                    &mut lock(&buffers),
                    true,
                    block,
                    blocks,
                    progress,
                )
                .map_err(|e| Error::device("sequential write", e))?;
                drop(queue);
                ctx.flush("sequential write")?;
                return Ok(totals);
            }
            let totals = parallel(depth, |index, latency, stop| {
                let (first, count) = share(blocks, depth, index);
                // Taken back after the loop; a failing worker's is lost with the run.
                let mut buf = lock(&buffers).pop().expect("a prepared buffer per worker");
                for n in first..first + count {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Change the first word so that no two blocks are identical.
                    buf[..8].copy_from_slice(&n.to_le_bytes());
                    latency
                        .time(|| ctx.device.write(&buf, n * block, WriteFlags::NONE))
                        .map_err(|e| Error::device("sequential write", e))?;
                    progress.inc(block);
                }
                lock(&buffers).push(buf);
                Ok((count * block, count))
            })?;
            ctx.flush("sequential write")?;
            Ok(totals)
        },
    )?;
    ctx.mark_written();

    ctx.phase(
        PhaseSpec::new(NAME, "read", block, depth),
        total,
        Unit::Bytes,
        |progress| {
            if let Some(mut queue) = ctx.device.queue() {
                return in_order(
                    queue.as_mut(),
                    &mut lock(&buffers),
                    false,
                    block,
                    blocks,
                    progress,
                )
                .map_err(|e| Error::device("sequential read", e));
            }
            parallel(depth, |index, latency, stop| {
                let (first, count) = share(blocks, depth, index);
                // Taken back after the loop; a failing worker's is lost with the run.
                let mut buf = lock(&buffers).pop().expect("a prepared buffer per worker");
                for n in first..first + count {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    latency
                        .time(|| ctx.device.read(&mut buf, n * block))
                        .map_err(|e| Error::device("sequential read", e))?;
                    progress.inc(block);
                }
                lock(&buffers).push(buf);
                Ok((count * block, count))
            })
        },
    )?;
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes or reads blocks 0..`blocks` in order through the queue, one request in
/// flight per buffer of `buffers` (which come back when all are done); each request
/// is timed from its submission.
fn in_order(
    queue: &mut dyn RequestQueue,
    buffers: &mut Vec<IoBuf>,
    writes: bool,
    block: u64,
    blocks: u64,
    progress: &Progress,
) -> blockwire_blockdev::Result<Totals> {
    let depth = buffers.len();
    let mut next = 0u64;
    let mut submitted = vec![Instant::now(); depth];
    let submit = |queue: &mut dyn RequestQueue, tag: u64, mut buf: IoBuf, n: u64| {
        let op = if writes {
            // Change the first word so that no two blocks are identical.
            buf[..8].copy_from_slice(&n.to_le_bytes());
            QueuedOp::Write(WriteFlags::NONE)
        } else {
            QueuedOp::Read
        };
        queue.submit(Submission {
            tag,
            op,
            buf,
            offset: n * block,
        });
    };
    for (tag, buf) in buffers.drain(..).enumerate() {
        submitted[tag] = Instant::now();
        submit(queue, tag as u64, buf, next);
        next += 1;
    }
    let mut latency = Recorder::new();
    let mut failure = None;
    let mut ops = 0u64;
    let mut done = Vec::with_capacity(depth);
    while queue.in_flight() > 0 {
        queue.complete(1, &mut done);
        let now = Instant::now();
        for completion in done.drain(..) {
            let tag = completion.tag as usize;
            latency.record(now.saturating_duration_since(submitted[tag]));
            match completion.result {
                Ok(()) => {
                    ops += 1;
                    progress.inc(block);
                }
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
            if failure.is_none() && next < blocks {
                submitted[tag] = Instant::now();
                submit(queue, completion.tag, completion.buf, next);
                next += 1;
            } else {
                buffers.push(completion.buf);
            }
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(Totals {
            bytes: ops * block,
            ops,
            latency,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::test_support::{memory, tiny_config, Queued};

    #[test]
    fn writes_then_reads_the_whole_region() {
        let device = memory(8 << 20);
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 4 << 20, None, false);
        run(&ctx).unwrap();
        let results = ctx.into_results();
        let ops: Vec<&str> = results.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(ops, ["write", "read"]);
        for result in &results {
            assert_eq!(result.bytes, 4 << 20);
            assert_eq!(result.ops, 16);
            assert_eq!(result.queue_depth, 2);
            assert!(result.mb_per_s > 0.0 && result.iops > 0.0);
            assert!(result.latency_us.max >= result.latency_us.p50);
        }
        // The data really landed (a memory device keeps zero chunks unallocated).
        let mut buf = vec![0u8; 4096];
        device.read(&mut buf, (4 << 20) - 4096).unwrap();
        assert!(buf.iter().any(|&b| b != 0));
    }

    #[test]
    fn a_region_smaller_than_a_block_is_refused() {
        let device = memory(1 << 20);
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 4096, None, false);
        let err = run(&ctx).unwrap_err().to_string();
        assert!(err.contains("smaller than one block"), "{err}");
    }

    #[test]
    fn a_device_with_a_queue_gets_every_block_in_order() {
        let queued = Queued::new(8 << 20);
        let device = blockwire_blockdev::Device::new(queued.clone());
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 4 << 20, None, false);
        run(&ctx).unwrap();
        let results = ctx.into_results();
        for result in &results {
            assert_eq!(result.bytes, 4 << 20, "{result:?}");
            assert_eq!(result.ops, 16);
            assert_eq!(result.queue_depth, 2);
        }
        // 16 writes and 16 reads, all through the queue.
        assert_eq!(queued.submitted.load(Ordering::Relaxed), 32);
        // Each block carries its number in its first word.
        let mut first = [0u8; 8];
        for n in 0..16u64 {
            device.read(&mut first, n * (256 << 10)).unwrap();
            assert_eq!(u64::from_le_bytes(first), n);
        }
    }
}
