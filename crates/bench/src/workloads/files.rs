//! bonnie++'s file tests on a directory: create, stat and delete `N` empty files,
//! first in sequential order (names start with the number; stat and delete in
//! readdir order), then in random order (names end with the number; files created in
//! a shuffled order, random files stat()ed, deleted in another shuffled order).
//! Results are operations per second.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{Ctx, Rng, Unit};
use crate::error::{Error, Result};
use crate::meter::{PhaseSpec, Recorder, Totals};
use crate::progress::Progress;

pub const NAME: &str = "bonnie";

/// Removes the scratch directory however the tests end.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        crate::target::untrack(&self.0);
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn random_suffix(rng: &mut Rng) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let len = rng.below(13) as usize;
    (0..len)
        .map(|_| ALPHABET[rng.below(ALPHABET.len() as u64) as usize] as char)
        .collect()
}

fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

/// Runs the six file tests in a fresh subdirectory of `dir`.
pub fn run(ctx: &Ctx, dir: &Path) -> Result<()> {
    let count = u64::from(ctx.config.files_k.max(1)) * 1024;
    let scratch = dir.join(format!("blockwire-bench-files.{}", std::process::id()));
    fs::create_dir(&scratch).map_err(|e| Error::io_at("creating", &scratch, e))?;
    crate::target::track(&scratch);
    let scratch = Scratch(scratch);
    let root = scratch.0.as_path();
    let mut rng = Rng::new(0xf11e5);

    let sequential: Vec<PathBuf> = (0..count)
        .map(|n| root.join(format!("{n:07}{}", random_suffix(&mut rng))))
        .collect();
    timed_each(ctx, "seq_create", &sequential, |path| {
        fs::File::create_new(path).map(drop)
    })?;
    let listed = list(root)?;
    timed_each(ctx, "seq_stat", &listed, |path| {
        fs::metadata(path).map(drop)
    })?;
    timed_each(ctx, "seq_delete", &listed, |path| fs::remove_file(path))?;

    let mut random: Vec<PathBuf> = (0..count)
        .map(|n| root.join(format!("{}{n:07}", random_suffix(&mut rng))))
        .collect();
    shuffle(&mut random, &mut rng);
    timed_each(ctx, "rand_create", &random, |path| {
        fs::File::create_new(path).map(drop)
    })?;
    let picks: Vec<PathBuf> = (0..count)
        .map(|_| random[rng.below(count) as usize].clone())
        .collect();
    timed_each(ctx, "rand_stat", &picks, |path| {
        fs::metadata(path).map(drop)
    })?;
    shuffle(&mut random, &mut rng);
    timed_each(ctx, "rand_delete", &random, |path| fs::remove_file(path))?;
    Ok(())
}

fn list(dir: &Path) -> Result<Vec<PathBuf>> {
    let io = |e| Error::io_at("listing", dir, e);
    fs::read_dir(dir)
        .map_err(io)?
        .map(|entry| entry.map(|e| e.path()).map_err(io))
        .collect()
}

fn timed_each(
    ctx: &Ctx,
    op: &str,
    paths: &[PathBuf],
    action: impl Fn(&Path) -> std::io::Result<()>,
) -> Result<()> {
    let spec = PhaseSpec::new(NAME, op, 0, 1);
    ctx.phase(
        spec,
        paths.len() as u64,
        Unit::Ops,
        |progress: &Progress| {
            let mut latency = Recorder::new();
            for path in paths {
                let started = Instant::now();
                action(path).map_err(|e| Error::io_at(&format!("bonnie {op}"), path, e))?;
                latency.record(started.elapsed());
                progress.inc(1);
            }
            Ok(Totals {
                bytes: 0,
                ops: paths.len() as u64,
                latency,
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
    fn creates_stats_and_deletes_1024_files_twice() {
        let dir = tempfile::tempdir().unwrap();
        let device = memory(1 << 20);
        let config = tiny_config();
        let ctx = Ctx::new(&device, &config, 1 << 20, None, false);
        run(&ctx, dir.path()).unwrap();
        let results = ctx.into_results();
        let names: Vec<&str> = results.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(
            names,
            [
                "seq_create",
                "seq_stat",
                "seq_delete",
                "rand_create",
                "rand_stat",
                "rand_delete"
            ]
        );
        assert!(results.iter().all(|r| r.ops == 1024 && r.iops > 0.0));
        // Nothing left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
