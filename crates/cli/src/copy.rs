//! `blockwire copy SRC DST`: any path or NBD URI to any other, sparse-aware and
//! parallel, with progress and an optional verify pass.

use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::copy::{compare, copy, CopyOptions};
use blockwire_blockdev::size::parse_size;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use blockwire_server::device_spec::Target;
use blockwire_server::factory::{open, open_destination};

use crate::remote_args::RemoteArgs;

#[derive(Args, Debug)]
pub struct CopyArgs {
    /// What to copy: a file, a block device, a URI (nbd://, aoe://, iscsi://,
    /// nvme+tcp://) or a striped volume (stripe:CHUNK:MEMBER,...).
    pub source: String,
    /// Where to: a file (created sparse if missing), a block device, a URI or a
    /// striped volume.
    pub destination: String,
    /// Connections per NBD URI (used when the server allows several).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Requests in flight.
    #[arg(long, default_value_t = 16)]
    pub requests: usize,
    /// Bytes per request.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub request_size: u64,
    /// Read both sides back afterwards and compare them.
    #[arg(long)]
    pub verify: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn bar(total: u64, quiet: bool, what: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{prefix:>7} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
    )
    .expect("progress template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(what.to_string());
    bar
}

pub fn run(args: CopyArgs) -> Result<()> {
    let source_target = Target::parse(&args.source)?;
    let destination_target = Target::parse(&args.destination)?;
    if source_target == destination_target {
        bail!("source and destination are the same");
    }
    let remote = args.remote.remote(args.connections);
    let source = open(&source_target, true, remote)?;
    let (destination, destination_is_zero) =
        open_destination(&destination_target, source.size(), remote)?;
    let options = CopyOptions {
        request_size: args.request_size as usize,
        workers: args.requests.max(1),
        destination_is_zero,
    };
    let started = Instant::now();
    let progress = bar(source.size(), args.quiet, "copy");
    let stats = copy(&source, &destination, options, &|n| progress.inc(n))
        .map_err(|e| anyhow!("copy failed: {e}"))?;
    progress.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "copied {} bytes ({} of data, {} zero) in {:.2} s, {:.1} MB/s",
        source.size(),
        stats.data_bytes,
        stats.zero_bytes,
        seconds,
        source.size() as f64 / seconds / 1e6
    );
    if args.verify {
        let progress = bar(source.size(), args.quiet, "verify");
        let mismatch = compare(&source, &destination, options, &|n| progress.inc(n))
            .map_err(|e| anyhow!("verify failed: {e}"))?;
        progress.finish_and_clear();
        match mismatch {
            None => println!("verified: destination matches source"),
            Some(offset) => bail!("verify failed: data differs in the request at offset {offset}"),
        }
    }
    Ok(())
}
