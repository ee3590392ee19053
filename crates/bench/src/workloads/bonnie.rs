//! bonnie++'s set, in its order: per-character write (putc), block write, rewrite,
//! per-character read (getc), block read, random seeks; on a directory target the
//! file create/stat/delete tests follow ([`super::files`]).
//!
//! Per-character I/O goes through a buffered stream, as bonnie++'s stdio does: on a
//! directory target a `BufWriter`/`BufReader` on the test file, on a device an 8 KiB
//! staging buffer flushed to the device when full. Latency is timed per 8 KiB
//! (per character would cost more than the character).

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use blockwire_blockdev::{IoBuf, WriteFlags};

use super::{fill_pattern, parallel, Ctx, Deadline, Rng, Unit};
use crate::error::{Error, Result};
use crate::meter::{PhaseSpec, Recorder, Totals};
use crate::progress::Progress;

pub const NAME: &str = "bonnie";
/// The stdio buffer size bonnie++'s per-character tests run through.
const STREAM_BUFFER: usize = 8192;

pub fn run(ctx: &Ctx) -> Result<()> {
    let chunk = ctx
        .config
        .bonnie_chunk
        .max(ctx.align())
        .div_ceil(ctx.align())
        * ctx.align();
    let chunks = ctx.region / chunk;
    if chunks == 0 {
        return Err(Error::target(format!(
            "the data set ({} bytes) is smaller than bonnie's chunk ({chunk} bytes)",
            ctx.region
        )));
    }
    let staging = (STREAM_BUFFER as u64).max(ctx.align());
    let chars = ctx.region / staging * staging;

    ctx.phase(
        PhaseSpec::new(NAME, "putc", 1, 1),
        chars,
        Unit::Bytes,
        |progress| {
            let mut latency = Recorder::new();
            match ctx.test_file {
                Some(path) => putc_stream(path, chars, progress, &mut latency)?,
                None => putc_device(ctx, staging, chars, progress, &mut latency)?,
            }
            Ok(Totals {
                bytes: chars,
                ops: chars,
                latency,
            })
        },
    )?;
    ctx.mark_written();

    let total = chunks * chunk;
    ctx.phase(
        PhaseSpec::new(NAME, "write", chunk, 1),
        total,
        Unit::Bytes,
        |progress| {
            let mut latency = Recorder::new();
            let mut buf = IoBuf::new(chunk as usize);
            fill_pattern(&mut buf, 7);
            for n in 0..chunks {
                buf[..8].copy_from_slice(&n.to_le_bytes());
                latency
                    .time(|| ctx.device.write(&buf, n * chunk, WriteFlags::NONE))
                    .map_err(|e| Error::device("bonnie block write", e))?;
                progress.inc(chunk);
            }
            ctx.flush("bonnie block write")?;
            Ok(Totals {
                bytes: total,
                ops: chunks,
                latency,
            })
        },
    )?;

    ctx.phase(
        PhaseSpec::new(NAME, "rewrite", chunk, 1),
        total,
        Unit::Bytes,
        |progress| {
            let mut latency = Recorder::new();
            let mut buf = IoBuf::new(chunk as usize);
            for n in 0..chunks {
                let offset = n * chunk;
                latency
                    .time(|| {
                        ctx.device.read(&mut buf, offset)?;
                        buf[chunk as usize / 2] ^= 0x55;
                        ctx.device.write(&buf, offset, WriteFlags::NONE)
                    })
                    .map_err(|e| Error::device("bonnie rewrite", e))?;
                progress.inc(chunk);
            }
            ctx.flush("bonnie rewrite")?;
            Ok(Totals {
                bytes: total,
                ops: chunks,
                latency,
            })
        },
    )?;

    ctx.phase(
        PhaseSpec::new(NAME, "getc", 1, 1),
        chars,
        Unit::Bytes,
        |progress| {
            let mut latency = Recorder::new();
            match ctx.test_file {
                Some(path) => getc_stream(path, chars, progress, &mut latency)?,
                None => getc_device(ctx, staging, chars, progress, &mut latency)?,
            }
            Ok(Totals {
                bytes: chars,
                ops: chars,
                latency,
            })
        },
    )?;

    ctx.phase(
        PhaseSpec::new(NAME, "read", chunk, 1),
        total,
        Unit::Bytes,
        |progress| {
            let mut latency = Recorder::new();
            let mut buf = IoBuf::new(chunk as usize);
            for n in 0..chunks {
                latency
                    .time(|| ctx.device.read(&mut buf, n * chunk))
                    .map_err(|e| Error::device("bonnie block read", e))?;
                progress.inc(chunk);
            }
            Ok(Totals {
                bytes: total,
                ops: chunks,
                latency,
            })
        },
    )?;

    seeks(ctx, chunk, chunks)
}

/// bonnie++'s seek test: concurrent seekers read a chunk at a random place and, one
/// time in ten, dirty it and write it back; until `seeks` are done or time is up.
fn seeks(ctx: &Ctx, chunk: u64, chunks: u64) -> Result<()> {
    let seekers = ctx.config.seekers.max(1);
    let target = ctx.config.seeks.max(1);
    let spec = PhaseSpec::new(NAME, "seeks", chunk, seekers);
    ctx.phase(spec, target, Unit::Ops, |progress| {
        let done = AtomicU64::new(0);
        let deadline = Deadline::after(ctx.config.phase_time);
        parallel(seekers, |index, latency, stop| {
            let mut rng = Rng::new(0xb0cc1e + u64::from(index));
            let mut buf = IoBuf::new(chunk as usize);
            let (mut bytes, mut ops) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) && !deadline.passed() {
                if done.fetch_add(1, Ordering::Relaxed) >= target {
                    break;
                }
                let offset = rng.below(chunks) * chunk;
                let dirty = rng.below(10) == 0;
                latency
                    .time(|| {
                        ctx.device.read(&mut buf, offset)?;
                        if dirty {
                            buf[0] ^= 0xff;
                            ctx.device.write(&buf, offset, WriteFlags::NONE)?;
                        }
                        Ok(())
                    })
                    .map_err(|e| Error::device("bonnie seeks", e))?;
                bytes += chunk * if dirty { 2 } else { 1 };
                ops += 1;
                progress.inc(1);
            }
            Ok((bytes, ops))
        })
    })?;
    Ok(())
}

fn putc_device(
    ctx: &Ctx,
    staging: u64,
    chars: u64,
    progress: &Progress,
    latency: &mut Recorder,
) -> Result<()> {
    let mut buf = IoBuf::new(staging as usize);
    let mut fill = 0usize;
    let mut offset = 0u64;
    let mut started = Instant::now();
    for n in 0..chars {
        buf[fill] = black_box(n as u8 ^ 0xa5);
        fill += 1;
        if fill == buf.len() {
            ctx.device
                .write(&buf, offset, WriteFlags::NONE)
                .map_err(|e| Error::device("bonnie putc", e))?;
            latency.record(started.elapsed());
            started = Instant::now();
            offset += staging;
            fill = 0;
            progress.inc(staging);
        }
    }
    ctx.flush("bonnie putc")
}

fn getc_device(
    ctx: &Ctx,
    staging: u64,
    chars: u64,
    progress: &Progress,
    latency: &mut Recorder,
) -> Result<()> {
    let mut buf = IoBuf::new(staging as usize);
    let mut sum = 0u64;
    let mut offset = 0u64;
    while offset < chars {
        let started = Instant::now();
        ctx.device
            .read(&mut buf, offset)
            .map_err(|e| Error::device("bonnie getc", e))?;
        for index in 0..buf.len() {
            sum = sum.wrapping_add(u64::from(black_box(buf[index])));
        }
        latency.record(started.elapsed());
        offset += staging;
        progress.inc(staging);
    }
    black_box(sum);
    Ok(())
}

fn putc_stream(path: &Path, chars: u64, progress: &Progress, latency: &mut Recorder) -> Result<()> {
    let io = |e| Error::io_at("bonnie putc on", path, e);
    let file = OpenOptions::new().write(true).open(path).map_err(io)?;
    let mut writer = BufWriter::with_capacity(STREAM_BUFFER, file);
    let mut started = Instant::now();
    for n in 0..chars {
        let byte = black_box(n as u8 ^ 0xa5);
        writer.write_all(std::slice::from_ref(&byte)).map_err(io)?;
        if (n + 1) % STREAM_BUFFER as u64 == 0 {
            latency.record(started.elapsed());
            started = Instant::now();
            progress.inc(STREAM_BUFFER as u64);
        }
    }
    let file = writer.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_data().map_err(io)
}

fn getc_stream(path: &Path, chars: u64, progress: &Progress, latency: &mut Recorder) -> Result<()> {
    let io = |e| Error::io_at("bonnie getc on", path, e);
    let file = std::fs::File::open(path).map_err(io)?;
    let mut reader = BufReader::with_capacity(STREAM_BUFFER, file);
    let mut byte = [0u8; 1];
    let mut sum = 0u64;
    let mut started = Instant::now();
    for n in 0..chars {
        reader.read_exact(&mut byte).map_err(io)?;
        sum = sum.wrapping_add(u64::from(black_box(byte[0])));
        if (n + 1) % STREAM_BUFFER as u64 == 0 {
            latency.record(started.elapsed());
            started = Instant::now();
            progress.inc(STREAM_BUFFER as u64);
        }
    }
    black_box(sum);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::test_support::{memory, tiny_config};

    fn ops(ctx: Ctx) -> Vec<(String, u64, u64)> {
        ctx.into_results()
            .into_iter()
            .map(|r| (r.op, r.bytes, r.ops))
            .collect()
    }

    #[test]
    fn runs_bonnies_io_tests_on_a_device() {
        let device = memory(4 << 20);
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 1 << 20, None, false);
        run(&ctx).unwrap();
        let got = ops(ctx);
        let names: Vec<&str> = got.iter().map(|(op, _, _)| op.as_str()).collect();
        assert_eq!(names, ["putc", "write", "rewrite", "getc", "read", "seeks"]);
        assert_eq!(got[0], ("putc".into(), 1 << 20, 1 << 20));
        assert_eq!(got[1], ("write".into(), 1 << 20, 128));
        assert_eq!(got[2], ("rewrite".into(), 1 << 20, 128));
        let seeks = got[5].2;
        assert!(seeks > 0 && seeks <= 500, "{seeks}");
    }

    #[test]
    fn per_character_tests_use_a_stream_on_a_file() {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(1 << 20).unwrap();
        let device = blockwire_blockdev::Device::from_device(
            blockwire_blockdev::FileDevice::open(file.path(), Default::default()).unwrap(),
        );
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 1 << 20, Some(file.path()), false);
        run(&ctx).unwrap();
        let got = ops(ctx);
        assert_eq!(got[0].1, 1 << 20);
        assert_eq!(got[3].0, "getc");
        // putc wrote through the stream: the file holds the pattern, then block
        // writes replaced it.
        assert!(std::fs::read(file.path()).unwrap().iter().any(|&b| b != 0));
    }
}
