//! `blockwire mount URI DIR`: any device blockwire opens, as the one file `DIR/disk`
//! (FUSE), served in the foreground until SIGINT or SIGTERM unmounts it.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use blockwire_mount::{check_directory, check_name, mount, MountOptions, UnmountError, Unmounter};
use blockwire_server::device_spec::Target;
use blockwire_server::factory::open;
use blockwire_server::stop_signals;
use clap::Args;

use crate::remote_args::RemoteArgs;

#[derive(Args, Debug)]
pub struct MountArgs {
    /// The device: a file or block device, nbd://, iscsi://, nvme+tcp://, aoe://,
    /// rbd:POOL/IMAGE or stripe:CHUNK:MEMBER,...
    pub uri: String,
    /// An existing, empty directory; the device appears in it as one file.
    pub dir: PathBuf,
    /// The file's name in DIR.
    #[arg(long, default_value = "disk")]
    pub name: String,
    /// Open the device read-only; the file is 0400 and refuses writes.
    #[arg(long)]
    pub read_only: bool,
    /// Threads serving FUSE requests: how many requests reach the device at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// Connections per NBD URI (used when the server allows several).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

pub fn run(args: MountArgs) -> Result<()> {
    // Installed first, so a signal during start-up still unmounts.
    let signals = stop_signals::install()?;
    // Everything that can be refused is refused before anything is opened.
    let target = Target::parse(&args.uri)?;
    check_name(&args.name).map_err(|e| anyhow!("{e}"))?;
    check_directory(&args.dir).map_err(|e| anyhow!("{e}"))?;
    let remote = args.remote.remote(args.connections);
    let device = open(&target, args.read_only, remote)?;
    let size = device.size();
    let options = MountOptions {
        name: args.name,
        read_only: args.read_only,
        threads: usize::from(args.threads),
    };
    let mounted = mount(device, &args.dir, &options).map_err(|e| anyhow!("{e}"))?;
    let file = mounted.file().display().to_string();
    println!(
        "{} is {file} ({size} bytes{}): `losetup -f --show {file}` makes it a block \
         device; Ctrl-C unmounts",
        args.uri,
        if options.read_only { ", read-only" } else { "" }
    );
    let unmounter = mounted.unmounter();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut signals = signals;
            if let Some(signal) = signals.forever().next() {
                tracing::info!("received signal {signal}: unmounting");
                unmount_once_free(&unmounter);
            }
        })
        .context("cannot start the signal thread")?;
    mounted.wait().context("the FUSE session failed")?;
    Ok(())
}

/// How often a busy mount is tried again.
const BUSY_RETRY: Duration = Duration::from_millis(500);

/// Unmounts; while the file is still in use (a loop device, which lets go of it a
/// moment after `losetup -d`, or later if something else holds the loop device),
/// keeps serving and tries again until it is free. Unmounting in use would cut its
/// user off from the data.
fn unmount_once_free(unmounter: &Unmounter) {
    let mut told = false;
    loop {
        match unmounter.unmount() {
            // The session ends and `wait` returns.
            Ok(()) => return,
            Err(e @ UnmountError::Busy(_)) => {
                if !told {
                    eprintln!("blockwire: {e}; still serving, unmounting once it is free");
                    told = true;
                }
                std::thread::sleep(BUSY_RETRY);
            }
            Err(e) => {
                eprintln!("blockwire: {e}");
                return;
            }
        }
    }
}
