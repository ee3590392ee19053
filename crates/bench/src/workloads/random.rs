//! 4 KiB random reads, then random writes, at each queue depth, each point for a
//! fixed time. A device with its own request queue (an initiator: nbd://) is driven
//! as fio drives it, one thread keeping that many requests in flight; others get one
//! thread per request in flight.

use std::sync::atomic::Ordering;
use std::time::Instant;

use blockwire_blockdev::{IoBuf, QueuedOp, RequestQueue, Submission, WriteFlags};

use super::{fill_pattern, parallel, Ctx, Deadline, Rng, Unit};
use crate::error::{Error, Result};
use crate::meter::{PhaseSpec, Recorder, Totals};
use crate::progress::Progress;

pub const NAME: &str = "random";
/// The request size: a page, what databases and file systems issue.
pub const BLOCK: u64 = 4096;

pub fn run(ctx: &Ctx) -> Result<()> {
    let block = BLOCK.max(ctx.align());
    let blocks = ctx.region / block;
    if blocks == 0 {
        return Err(Error::target(format!(
            "the data set ({} bytes) is smaller than one {block}-byte block",
            ctx.region
        )));
    }
    // Reading holes of a fresh sparse file would measure nothing.
    ctx.ensure_written()?;
    for (op, writes) in [("randread", false), ("randwrite", true)] {
        for &depth in &ctx.config.random_depths {
            point(ctx, op, writes, block, blocks, depth.max(1))?;
        }
    }
    Ok(())
}

fn point(ctx: &Ctx, op: &str, writes: bool, block: u64, blocks: u64, depth: u32) -> Result<()> {
    let time = ctx.config.phase_time;
    let phase = format!("random {op} qd{depth}");
    let spec = PhaseSpec::new(NAME, op, block, depth);
    ctx.phase(spec, Deadline::millis(time), Unit::Millis, |progress| {
        let deadline = Deadline::after(time);
        if let Some(mut queue) = ctx.device.queue() {
            let shape = Shape {
                writes,
                block,
                blocks,
                depth,
            };
            let totals = queued(queue.as_mut(), shape, &deadline, progress)
                .map_err(|e| Error::device(phase.as_str(), e))?;
            drop(queue);
            if writes {
                ctx.flush(&phase)?;
            }
            return Ok(totals);
        }
        let totals = parallel(depth, |index, latency, stop| {
            let mut rng = Rng::new(u64::from(depth) << 32 | u64::from(index));
            let mut buf = IoBuf::new(block as usize);
            fill_pattern(&mut buf, u64::from(index) + 99);
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) && !deadline.passed() {
                let offset = rng.below(blocks) * block;
                let outcome = if writes {
                    buf[..8].copy_from_slice(&ops.to_le_bytes());
                    latency.time(|| ctx.device.write(&buf, offset, WriteFlags::NONE))
                } else {
                    latency.time(|| ctx.device.read(&mut buf, offset))
                };
                outcome.map_err(|e| Error::device(phase.as_str(), e))?;
                ops += 1;
                if index == 0 && ops.is_multiple_of(64) {
                    deadline.report(progress);
                }
            }
            Ok((ops * block, ops))
        })?;
        if writes {
            ctx.flush(&phase)?;
        }
        Ok(totals)
    })?;
    Ok(())
}

/// What one point of the random workload does.
#[derive(Debug, Clone, Copy)]
struct Shape {
    writes: bool,
    block: u64,
    blocks: u64,
    depth: u32,
}

/// Keeps `depth` requests in flight through the device's queue until the deadline,
/// from this one thread; each completion is timed from its submission.
fn queued(
    queue: &mut dyn RequestQueue,
    shape: Shape,
    deadline: &Deadline,
    progress: &Progress,
) -> blockwire_blockdev::Result<Totals> {
    let mut rng = Rng::new(u64::from(shape.depth) << 32 | 0xffff_ffff);
    let mut submitted = vec![Instant::now(); shape.depth as usize];
    let mut ops = 0u64;
    let mut next = |queue: &mut dyn RequestQueue, tag: u64, mut buf: IoBuf, count: u64| {
        let op = if shape.writes {
            buf[..8].copy_from_slice(&count.to_le_bytes());
            QueuedOp::Write(WriteFlags::NONE)
        } else {
            QueuedOp::Read
        };
        let offset = rng.below(shape.blocks) * shape.block;
        queue.submit(Submission {
            tag,
            op,
            buf,
            offset,
        });
    };
    for tag in 0..u64::from(shape.depth) {
        let mut buf = IoBuf::new(shape.block as usize);
        fill_pattern(&mut buf, tag + 99);
        submitted[tag as usize] = Instant::now();
        next(queue, tag, buf, 0);
    }
    let mut latency = Recorder::new();
    let mut failure = None;
    let mut done = Vec::with_capacity(shape.depth as usize);
    while queue.in_flight() > 0 {
        queue.complete(1, &mut done);
        let now = Instant::now();
        for completion in done.drain(..) {
            latency.record(now.saturating_duration_since(submitted[completion.tag as usize]));
            if let Err(error) = completion.result {
                failure.get_or_insert(error);
                continue;
            }
            ops += 1;
            if ops.is_multiple_of(64) {
                deadline.report(progress);
            }
            if failure.is_none() && !deadline.passed() {
                submitted[completion.tag as usize] = Instant::now();
                next(queue, completion.tag, completion.buf, ops);
            }
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(Totals {
            bytes: ops * shape.block,
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
    fn reads_and_writes_at_each_depth_for_the_given_time() {
        let device = memory(4 << 20);
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 1 << 20, None, false);
        run(&ctx).unwrap();
        let results = ctx.into_results();
        let points: Vec<(&str, u32)> = results
            .iter()
            .map(|r| (r.op.as_str(), r.queue_depth))
            .collect();
        assert_eq!(
            points,
            [
                ("randread", 1),
                ("randread", 4),
                ("randwrite", 1),
                ("randwrite", 4)
            ]
        );
        for result in &results {
            assert!(result.ops > 0);
            assert!(result.seconds >= 0.03, "{result:?}");
            assert_eq!(result.block_size, 4096);
        }
        // The region was filled before reading it.
        assert!(
            device.extents(0, 1 << 20).unwrap()[0].state == blockwire_blockdev::ExtentState::Data
        );
    }

    #[test]
    fn a_device_with_a_queue_is_driven_through_it() {
        let queued = Queued::new(4 << 20);
        let device = blockwire_blockdev::Device::new(queued.clone());
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 1 << 20, None, false);
        run(&ctx).unwrap();
        let results = ctx.into_results();
        let queued_ops: u64 = results.iter().map(|r| r.ops).sum();
        assert!(queued_ops > 0);
        // Every measured request went through the queue (the region's fill did not).
        assert!(queued.submitted.load(Ordering::Relaxed) >= queued_ops);
        for result in &results {
            assert!(result.ops > 0 && result.iops > 0.0, "{result:?}");
            assert!(result.latency_us.max >= result.latency_us.p50);
        }
    }
}
