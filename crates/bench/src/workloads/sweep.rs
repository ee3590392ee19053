//! iozone-style record-size sweep (seed 002): for each record size (by default every
//! power of two from 4 KiB to 16 MiB, as `iozone -a`), write, rewrite, read, reread,
//! random read, random write, backward read and strided read, one request at a
//! time. Each measurement stops at the data set's end or after `sweep_time`,
//! whichever comes first (by default [`crate::config::SWEEP_BUDGET`] shared out over
//! all of them); the later operations use only the records the first write reached.

use blockwire_blockdev::{IoBuf, WriteFlags};

use super::{fill_pattern, Ctx, Deadline, Rng, Unit};
use crate::error::{Error, Result};
use crate::meter::{PhaseSpec, Recorder, Totals};

pub const NAME: &str = "sweep";
/// The operations of one record size, in the order they run.
pub const OPS: [&str; 8] = [
    "write",
    "rewrite",
    "read",
    "reread",
    "randread",
    "randwrite",
    "backread",
    "strideread",
];
/// Records skipped between two reads of the strided read (iozone's -j default is a
/// stride of 17 records).
const STRIDE: u64 = 17;

pub fn run(ctx: &Ctx) -> Result<()> {
    let mut measured = 0;
    for &record in &ctx.config.sweep_records {
        let records = ctx.region / record;
        if records == 0 || !record.is_multiple_of(ctx.align()) {
            continue;
        }
        measured += 1;
        let mut reached = records;
        for op in OPS {
            reached = run_op(ctx, op, record, reached)?.max(1);
        }
    }
    if measured == 0 {
        return Err(Error::target(format!(
            "the data set ({} bytes) is smaller than every sweep record size",
            ctx.region
        )));
    }
    Ok(())
}

/// Runs one operation over at most `records` records; returns how many it did.
fn run_op(ctx: &Ctx, op: &str, record: u64, records: u64) -> Result<u64> {
    let writes = matches!(op, "write" | "rewrite" | "randwrite");
    let phase = format!("sweep {op} {record}");
    let result = ctx.phase(
        PhaseSpec::new(NAME, op, record, 1),
        records * record,
        Unit::Bytes,
        |progress| {
            let mut latency = Recorder::new();
            let mut rng = Rng::new(record ^ op.len() as u64);
            let mut buf = IoBuf::new(record as usize);
            fill_pattern(&mut buf, record);
            let deadline = Deadline::after(ctx.config.sweep_time);
            let mut done = 0u64;
            while done < records && !deadline.passed() {
                let index = match op {
                    "randread" | "randwrite" => rng.below(records),
                    "backread" => records - 1 - done,
                    "strideread" => (done * STRIDE) % records,
                    _ => done,
                };
                let offset = index * record;
                let outcome = if writes {
                    buf[..8].copy_from_slice(&done.to_le_bytes());
                    latency.time(|| ctx.device.write(&buf, offset, WriteFlags::NONE))
                } else {
                    latency.time(|| ctx.device.read(&mut buf, offset))
                };
                outcome.map_err(|e| Error::device(phase.as_str(), e))?;
                done += 1;
                progress.inc(record);
            }
            if writes {
                ctx.flush(&phase)?;
            }
            Ok(Totals {
                bytes: done * record,
                ops: done,
                latency,
            })
        },
    )?;
    if op == "write" {
        ctx.mark_written();
    }
    Ok(result.ops)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::test_support::{memory, tiny_config};

    #[test]
    fn sweeps_every_record_size_and_operation() {
        let device = memory(4 << 20);
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 2 << 20, None, false);
        run(&ctx).unwrap();
        let results = ctx.into_results();
        assert_eq!(results.len(), 3 * OPS.len());
        for (index, result) in results.iter().enumerate() {
            assert_eq!(result.op, OPS[index % OPS.len()]);
            assert_eq!(result.block_size, config.sweep_records[index / OPS.len()]);
            assert!(result.ops > 0, "{result:?}");
            assert_eq!(result.bytes, result.ops * result.block_size);
        }
    }

    #[test]
    fn record_sizes_larger_than_the_data_set_are_skipped() {
        let device = memory(1 << 20);
        let mut config = tiny_config();
        config.sweep_records = vec![4096, 16 << 20];
        let ctx = Ctx::new(&device, &config, 1 << 20, None, false);
        run(&ctx).unwrap();
        assert!(ctx.into_results().iter().all(|r| r.block_size == 4096));
    }
}
