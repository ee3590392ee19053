//! 4 KiB random reads, then random writes, at each queue depth (one thread per
//! request in flight), each point for a fixed time.

use std::sync::atomic::Ordering;

use blockwire_blockdev::{IoBuf, WriteFlags};

use super::{fill_pattern, parallel, Ctx, Deadline, Rng, Unit};
use crate::error::{Error, Result};
use crate::meter::PhaseSpec;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::test_support::{memory, tiny_config};

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
}
