//! The `blockwire` binary: parses arguments and wires the library crates together.

mod bench;
mod check_config;
mod completions;
mod config_manual;
mod copy;
mod demo;
mod info;
mod info_aoe;
mod info_format;
mod info_iscsi;
mod info_nvme;
mod info_rbd;
mod info_stripe;
mod lab;
mod logging;
mod manpages;
mod mount;
mod netserve;
mod remote_args;
mod serve;
mod serve_args;
mod serve_args_check;
mod tls_args;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// blockwire: export files and devices as network block devices over NBD, AoE and
/// iSCSI, read them with its own initiators, and measure them.
#[derive(Parser)]
#[command(name = "blockwire", version, about, propagate_version = true)]
pub struct Cli {
    /// More log output (-v debug, -vv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    /// Log as lines for people (text; without timestamps under journald) or as one
    /// JSON object per line for log shippers (json).
    #[arg(long, value_enum, default_value_t, global = true)]
    log_format: logging::LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export a file, a block device or memory over NBD, AoE, iSCSI and NVMe/TCP.
    Serve(Box<serve_args::ServeArgs>),
    /// Measure a path or a remote device: throughput, IOPS, latency, CPU.
    ///
    /// A file, block device or directory, an NBD, AoE, iSCSI or NVMe/TCP target, or a
    /// striped volume; bonnie++-style, sequential, queue-depth sweeps and the network.
    Bench(bench::BenchArgs),
    /// Show what an NBD, AoE, iSCSI or NVMe/TCP target offers: size, block sizes, flags.
    ///
    /// --list the exports or targets, --map the allocation.
    Info(info::InfoArgs),
    /// Copy any path or NBD, AoE, iSCSI or NVMe/TCP device to any other: sparse, parallel.
    ///
    /// Holes stay holes; --verify reads both sides back.
    Copy(copy::CopyArgs),
    /// Serve an in-memory device over NBD on loopback and measure it both ways.
    Demo(demo::DemoArgs),
    /// Rebuild the seeds' multi-link test beds on this host and measure them (root).
    ///
    /// Network namespaces joined by veth channels with their MTU and rate limits;
    /// the protocol × MTU × rate × channels matrix.
    Lab(lab::LabArgs),
    /// Show any device as one file, DIR/disk, through FUSE until Ctrl-C.
    ///
    /// A file, nbd://, iscsi://, nvme+tcp://, aoe://, rbd: or stripe:; `losetup -f
    /// --show DIR/disk` then makes it a block device for mkfs and mount.
    Mount(mount::MountArgs),
    /// Answer the bench's network test (TCP throughput both ways) on a target host.
    Netserve(netserve::NetserveArgs),
    /// Show what `serve --config FILE` would serve and where, or the file's first
    /// error and its line, without opening or creating anything.
    CheckConfig(check_config::CheckConfigArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// Write the manual pages (blockwire(1), one per subcommand, blockwire.toml(5))
    /// into a directory.
    Manpages(manpages::ManpagesArgs),
}

fn init_logging(verbose: u8, quiet: bool, format: logging::LogFormat) {
    let level = match verbose {
        0 if quiet => "warn",
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    logging::init(level, format);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own story; the in-process target's log would interleave.
    let quiet = matches!(
        cli.command,
        Command::Demo(_) | Command::Completions(_) | Command::CheckConfig(_)
    );
    init_logging(cli.verbose, quiet, cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Bench(args) => bench::run(args),
        Command::Info(args) => info::run(args),
        Command::Copy(args) => copy::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Netserve(args) => netserve::run(args),
        Command::Lab(args) => lab::run(args),
        Command::CheckConfig(args) => check_config::run(args),
        Command::Completions(args) => completions::run(args),
        Command::Manpages(args) => manpages::run(args),
    };
    // Ceph images still held somewhere (a server's parts that outlive its run)
    // are closed before the process exits, so their lock and watch go with it.
    blockwire_rbd::close_all();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blockwire: {e:#}");
            ExitCode::FAILURE
        }
    }
}
