//! `blockwire bench`: measures a file, block device or directory (and the network to
//! a remote target), prints a table, and writes JSON, bonnie++ CSV and HTML reports;
//! `--compare` lines up earlier JSON reports side by side.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use blockwire_bench::report::{compare, csv, html, json, table};
use blockwire_bench::{BenchConfig, RunRequest, TargetCpu, TargetSpec, Workload};
use blockwire_blockdev::size::parse_size;
use clap::Args;

use blockwire_server::device_spec::Target;
use blockwire_server::factory::open_sized;

use crate::remote_args::RemoteArgs;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to measure: a file or block device (overwritten!), a directory (a test
    /// file is created inside and removed afterwards), a remote device (nbd://,
    /// nbd+unix://, nbds://, aoe://, iscsi://, nvme+tcp://, stripe:..., rbd:...), or a host
    /// (host:port) for the network test. Other URI schemes are refused.
    #[arg(required_unless_present = "compare")]
    pub target: Option<String>,

    /// Workloads to run, comma-separated: network, sequential, bonnie, sweep,
    /// random, all. Default: all that fit the target.
    #[arg(long, value_name = "LIST", value_parser = parse_workloads)]
    pub workload: Option<Workloads>,

    /// Data set size (e.g. 8G). Default: twice the RAM with --buffered on a directory
    /// (at most 90% of the free space), else 1G (at most the target's size). A file
    /// that does not exist is created with this size.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,

    /// Block size of the sequential workload.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1M")]
    pub block_size: u64,

    /// Requests in flight for the sequential workload (one thread each); default 1
    /// on paths, 16 on URIs (nbd://, aoe://, iscsi://, nvme+tcp://).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub queue_depth: Option<u32>,

    /// NBD connections for an nbd:// target (used when the server allows several).
    #[arg(long, default_value_t = 1)]
    pub connections: usize,

    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Bypass the page cache with O_DIRECT, and fail where the file system cannot.
    /// Without it (and without --buffered) direct I/O is still used where possible,
    /// and a file system without O_DIRECT is measured buffered, with a note.
    #[arg(long, conflicts_with = "buffered")]
    pub direct: bool,

    /// Go through the page cache; warns unless the data set is twice the RAM.
    #[arg(long)]
    pub buffered: bool,

    /// Seconds per timed phase: each random-I/O point, bonnie's seeks, and the cap of
    /// each sweep measurement (default 3; the sweep shares 112 s among its 104
    /// measurements, about 1.1 s each).
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub time: Option<Duration>,

    /// Queue depths of the random workload, comma-separated [default: 1,4,16,64].
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub random_depths: Vec<u32>,

    /// Files for bonnie's create/stat/delete tests, in units of 1024 (bonnie++ -n).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub files: u32,

    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write a bonnie++ 1.98 CSV line (for bon_csv2txt, bon_csv2html).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,

    /// Write a self-contained HTML report with charts.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,

    /// Also measure the CPU use of this process (the target server, say).
    #[arg(long, value_name = "PID")]
    pub target_pid: Option<u32>,

    /// Name of this run in reports and comparisons (default: the target).
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,

    /// Write even to a device or file that holds a file system or partition table.
    #[arg(long)]
    pub force: bool,

    /// Port of a `blockwire netserve` (or `blockwire serve --netserve`) on the target
    /// host, for the network test. Without it and without --iperf-port, port 10810
    /// is tried.
    #[arg(long, value_name = "PORT")]
    pub netserve_port: Option<u16>,

    /// Port of an `iperf3 -s` on the target host, for the network test when no
    /// netserve answers.
    #[arg(long, value_name = "PORT")]
    pub iperf_port: Option<u16>,

    /// Parallel TCP streams of the network test, each way.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub network_streams: u32,

    /// Compare earlier runs: read these JSON reports and print them side by side.
    #[arg(long, value_name = "JSON", num_args = 1.., conflicts_with = "target")]
    pub compare: Vec<PathBuf>,
}

/// A parsed `--workload` list (a newtype: clap would take a bare Vec for a
/// repeated flag).
#[derive(Debug, Clone)]
pub struct Workloads(Vec<Workload>);

fn parse_workloads(text: &str) -> Result<Workloads, String> {
    Workload::parse_list(text).map(Workloads)
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if !(seconds > 0.0 && seconds <= 86_400.0) {
        return Err(format!("'{text}': give between 0 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// On SIGINT or SIGTERM, stops the run's child processes (an iperf3 client) and
/// removes the test files it created, then exits (128 + signal, as a shell reports
/// it).
fn clean_up_on_signals() -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("cannot install signal handlers")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                blockwire_bench::child::end_all(Duration::from_secs(2));
                for path in blockwire_bench::target::remove_created() {
                    eprintln!("removed {}", path.display());
                }
                eprintln!("blockwire: interrupted");
                std::process::exit(128 + signal);
            }
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

pub fn run(args: BenchArgs) -> Result<()> {
    if !args.compare.is_empty() {
        let reports = args
            .compare
            .iter()
            .map(|path| json::read(path))
            .collect::<Result<Vec<_>, _>>()?;
        print!("{}", compare::render(&reports));
        return Ok(());
    }
    let Some(target) = args.target.clone() else {
        bail!("give a TARGET to measure, or --compare with JSON reports");
    };
    if args.block_size == 0 {
        bail!("--block-size must be larger than 0");
    }
    // A scheme the bench does not speak is refused before anything is opened or
    // sent (not taken for a host whose network to measure).
    TargetSpec::parse(&target).check()?;
    let parsed = Target::parse(&target);
    let remote = parsed.as_ref().is_ok_and(|t| t.is_remote());
    let defaults = BenchConfig::default();
    let config = BenchConfig {
        workloads: args.workload.clone().map(|w| w.0).unwrap_or_default(),
        block_size: args.block_size,
        queue_depth: args.queue_depth.unwrap_or(if remote { 16 } else { 1 }),
        direct: !args.buffered,
        phase_time: args.time.unwrap_or(defaults.phase_time),
        sweep_time: args.time.unwrap_or(defaults.sweep_time),
        files_k: args.files,
        random_depths: if args.random_depths.is_empty() {
            defaults.random_depths.clone()
        } else {
            args.random_depths.clone()
        },
        target_cpu: args.target_pid.map(TargetCpu::Process),
        progress: std::io::stderr().is_terminal(),
        ..defaults
    };
    // A URI is opened through our initiator; the storage workloads run on it. The
    // network test alone needs no device (nor an export to be there).
    let wants_storage =
        config.workloads.is_empty() || config.workloads.iter().any(|&w| w != Workload::Network);
    let remote_device = match parsed {
        Ok(parsed) if remote && wants_storage => {
            let remote = args.remote.remote(args.connections);
            // --size creates a missing file on an NFS server, as it does locally.
            Some(open_sized(&parsed, false, remote, args.size)?)
        }
        // A URI of a scheme the bench speaks that does not parse (iscsi://host with
        // no IQN): the storage workloads cannot run, and the parser says why.
        Err(e) if wants_storage => return Err(e),
        _ => None,
    };
    let request = RunRequest {
        target,
        label: args.label.clone(),
        config,
        size: args.size,
        force: args.force,
        require_direct: args.direct,
        netserve_port: args.netserve_port,
        iperf_port: args.iperf_port,
        network_streams: args.network_streams,
        remote_device,
    };
    clean_up_on_signals()?;
    let report = blockwire_bench::run(&request, &mut |note| eprintln!("{note}"))?;
    print!("{}", table::render(&report));
    if report.results.is_empty() {
        // Every workload asked for was skipped (the notes above say why): a run
        // that measured nothing has failed, and writes no report.
        bail!("nothing was measured of what was asked (see the notes above)");
    }
    if let Some(path) = &args.json {
        json::write(&report, path)?;
    }
    if let Some(path) = &args.csv {
        if !report.results.iter().any(|r| r.workload == "bonnie") {
            eprintln!("note: no bonnie results; the CSV line has empty fields");
        }
        std::fs::write(path, csv::bonnie_line(&report))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.html {
        html::write(&report, path)?;
    }
    Ok(())
}
