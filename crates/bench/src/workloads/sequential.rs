//! dd-style sequential throughput: write the region in `block_size` requests, flush
//! (counted in the write time, like `dd conv=fdatasync`), then read it back. With a
//! queue depth of N, N threads each stream through their own contiguous part, so N
//! requests are in flight.

use std::sync::atomic::Ordering;

use blockwire_blockdev::{IoBuf, WriteFlags};

use super::{fill_pattern, parallel, share, Ctx, Unit};
use crate::error::{Error, Result};
use crate::meter::PhaseSpec;

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

    ctx.phase(
        PhaseSpec::new(NAME, "write", block, depth),
        total,
        Unit::Bytes,
        |progress| {
            let totals = parallel(depth, |index, latency, stop| {
                let (first, count) = share(blocks, depth, index);
                let mut buf = IoBuf::new(block as usize);
                fill_pattern(&mut buf, u64::from(index) + 1);
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
            parallel(depth, |index, latency, stop| {
                let (first, count) = share(blocks, depth, index);
                let mut buf = IoBuf::new(block as usize);
                for n in first..first + count {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    latency
                        .time(|| ctx.device.read(&mut buf, n * block))
                        .map_err(|e| Error::device("sequential read", e))?;
                    progress.inc(block);
                }
                Ok((count * block, count))
            })
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::test_support::{memory, tiny_config};

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
}
