//! `blockwire lab`: builds the seeds' test beds on this host (network namespaces
//! joined by veth channels) and measures the protocol × MTU × rate × channels
//! matrix through our targets and initiators; prints tables while it runs and
//! writes JSON, CSV and HTML.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use blockwire_blockdev::size::parse_size;
use blockwire_lab::matrix::parse_list;
use blockwire_lab::report::{self, csv, html, json, table};
use blockwire_lab::{
    preset, Backing, Disk, Event, LabOptions, LabWorkload, Layouts, Matrix, Protocol, Rate, Seed,
};
use clap::Args;

#[derive(Args, Debug)]
pub struct LabArgs {
    /// Rebuild a seed's bed: 003 (four 1 Gbit channels striped, MTU 1500/9000, AoE
    /// vs iSCSI, NBD and NVMe/TCP, 210 MB/s disks, bonnie++ on ext4 over the four
    /// striped channels), 000 (one link at 1 and 10 Gbit, MTU
    /// 1500/4132/4608/9000, AoE vs NBD, bonnie, a 256 MB/s disk), 001 (one 1 Gbit
    /// link, MTU 1500/9000, AoE vs iSCSI, dd-style 4 MiB direct writes, target CPU),
    /// 002 (10 Gbit, NFS vs iSCSI, NBD and AoE, record sizes 4K-16M) or 004 (10 and 1
    /// Gbit, NFS vs the block protocols on the same storage, dd and bonnie). The
    /// flags below change the preset's matrix and quick defaults.
    #[arg(long, value_name = "SEED", value_parser = Seed::parse)]
    pub seed: Option<Seed>,

    /// Protocols, comma-separated: nbd, aoe, iscsi, nvme, nfs (nfs-ganesha and our
    /// libnfs client) [default: nbd, aoe, iscsi, nvme].
    #[arg(long, value_name = "LIST", value_parser = |t: &str| parse_list(t, str::parse::<Protocol>).map(List))]
    pub protocols: Option<List<Protocol>>,

    /// MTUs of the channels, comma-separated [default: 1500,9000].
    #[arg(long, value_name = "LIST", value_parser = |t: &str| parse_list(t, |m| m.parse::<u32>().map_err(|_| format!("'{m}' is not an MTU"))).map(List))]
    pub mtu: Option<List<u32>>,

    /// Link rates in bits, comma-separated: 1g, 10g, 200m, none [default: 1g].
    #[arg(long, value_name = "LIST", value_parser = |t: &str| parse_list(t, str::parse::<Rate>).map(List))]
    pub rate: Option<List<Rate>>,

    /// Channel counts, comma-separated, e.g. 1,2,4 [default: 1].
    #[arg(long, value_name = "LIST", value_parser = |t: &str| parse_list(t, |c| c.parse::<u32>().map_err(|_| format!("'{c}' is not a channel count"))).map(List))]
    pub channels: Option<List<u32>>,

    /// On several channels: yes (one export per channel, striped on the
    /// initiator), no (one export over every channel: AoE only), both [default: yes].
    #[arg(long, value_name = "yes|no|both", value_parser = str::parse::<Layouts>)]
    pub striped: Option<Layouts>,

    /// Workloads, comma-separated: sequential, bonnie, random, sweep (record sizes
    /// 4K to 16M, iozone-style) [default: sequential].
    #[arg(long, value_name = "LIST", value_parser = |t: &str| parse_list(t, str::parse::<LabWorkload>).map(List))]
    pub workloads: Option<List<LabWorkload>>,

    /// Throttle each export to this many MB/s (10^6 bytes), reads and writes together.
    #[arg(long, value_name = "MB/s")]
    pub disk_rate: Option<f64>,

    /// Add this many milliseconds to every request of each export.
    #[arg(long, value_name = "MS")]
    pub disk_latency: Option<f64>,

    /// Also measure every cell served from memory with no disk throttle and no link
    /// shaping: what the host itself can do.
    #[arg(long)]
    pub baseline: bool,

    /// Move AoE frames through AF_XDP on both sides (`serve --aoe-xdp`,
    /// `aoe://...?xdp`) in cells whose MTU allows it (up to 3822) on unshaped links
    /// (--rate none, --baseline): tc cannot shape AF_XDP's frames.
    #[arg(long)]
    pub aoe_xdp: bool,

    /// Data set per cell (split over a stripe's exports) [default: the preset's, or
    /// 256M; 128M when bonnie runs, whose 8 KiB requests one at a time take longer
    /// per byte].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,

    /// Seconds per timed phase: each random-I/O point, bonnie's seeks, each sweep
    /// measurement's cap. (The network baseline moves the cell's data set each way,
    /// as the storage does.) [default: the preset's, or 1]
    #[arg(long, value_name = "SECS")]
    pub time: Option<f64>,

    /// Request size of the sequential workload [default: the preset's (001: 4M, as
    /// dd bs=4M), or the bench's 1M].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub block_size: Option<u64>,

    /// Chunk size of the initiator's stripe.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "256K")]
    pub chunk: u64,

    /// Requests in flight for the sequential workload [default: the preset's (001:
    /// 1, as dd oflag=direct), or the bench's 16].
    #[arg(long, value_name = "N")]
    pub queue_depth: Option<u32>,

    /// Queue depths of the random workload, comma-separated [default: 1,4,16,64].
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',')]
    pub random_depths: Vec<u32>,

    /// Where the exports' bytes live: memory or file (a sparse file per export in
    /// the run's temporary directory) [default: the preset's (002, 004: file, the
    /// storage NFS serves too), or memory].
    #[arg(long, value_name = "memory|file", value_parser = str::parse::<Backing>)]
    pub backing: Option<Backing>,

    /// Stop a cell whose bench runs longer than this many seconds [default: 120 +
    /// 1 s per 2 MB of data set].
    #[arg(long, value_name = "SECS")]
    pub cell_timeout: Option<u64>,

    /// Write the results as JSON (a `cells` array, one object per measured operation
    /// of each cell).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Write the results as CSV, one line per measured operation of each cell.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,

    /// Write a self-contained HTML page with the matrix and charts.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// A comma-separated list given to one flag (a newtype: clap would take a bare Vec
/// for a repeated flag).
#[derive(Debug, Clone)]
pub struct List<T>(pub Vec<T>);

/// The matrix the flags ask for: the preset's (or the defaults) with each given
/// flag replacing its dimension.
fn matrix(args: &LabArgs) -> Matrix {
    let mut matrix = args.seed.map(preset::matrix).unwrap_or_default();
    if let Some(protocols) = &args.protocols {
        matrix.protocols = protocols.0.clone();
    }
    if let Some(mtus) = &args.mtu {
        matrix.mtus = mtus.0.clone();
    }
    if let Some(rates) = &args.rate {
        matrix.rates = rates.0.clone();
    }
    if let Some(channels) = &args.channels {
        matrix.channels = channels.0.clone();
    }
    if let Some(layouts) = args.striped {
        matrix.layouts = layouts;
    }
    if let Some(workloads) = &args.workloads {
        matrix.workloads = workloads.0.clone();
    }
    if args.disk_rate.is_some() || args.disk_latency.is_some() {
        matrix.disk = Disk {
            rate_mb_per_s: args.disk_rate.or(matrix.disk.rate_mb_per_s),
            latency_ms: args.disk_latency.or(matrix.disk.latency_ms),
        };
    }
    matrix.baseline = args.baseline;
    matrix.aoe_xdp = args.aoe_xdp;
    matrix
}

fn options(args: &LabArgs) -> Result<LabOptions> {
    let defaults = args.seed.map(preset::defaults);
    let time = args
        .time
        .unwrap_or_else(|| defaults.map_or(1.0, |d| d.time.as_secs_f64()));
    if !(time > 0.0 && time <= 3600.0) {
        bail!("--time: give between 0 and 3600 seconds");
    }
    if args.chunk < 4096 || !args.chunk.is_power_of_two() {
        bail!("--chunk must be a power of two of at least 4K");
    }
    let matrix = matrix(args);
    let size = args.size.or(defaults.map(|d| d.size)).unwrap_or(
        if matrix.workloads.contains(&LabWorkload::Bonnie) {
            128 << 20
        } else {
            256 << 20
        },
    );
    if size < (16 << 20) {
        bail!("--size must be at least 16M");
    }
    let binary = std::env::current_exe().context("cannot find the blockwire binary")?;
    Ok(LabOptions {
        binary,
        matrix,
        seed: args.seed,
        size,
        time: Duration::from_secs_f64(time),
        chunk: args.chunk,
        queue_depth: args.queue_depth.or(defaults.and_then(|d| d.queue_depth)),
        block_size: args.block_size.or(defaults.and_then(|d| d.block_size)),
        random_depths: args.random_depths.clone(),
        backing: args
            .backing
            .or(defaults.map(|d| d.backing))
            .unwrap_or(Backing::Memory),
        cell_timeout: Duration::from_secs(args.cell_timeout.unwrap_or(120 + size / 2_000_000)),
    })
}

pub fn run(args: LabArgs) -> Result<()> {
    let options = options(&args)?;
    options
        .matrix
        .validate()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    blockwire_lab::run::preflight()?;
    // Before anything is built: Ctrl-C or SIGTERM then tears down what exists.
    blockwire_lab::cleanup::install_signal_handler().context("cannot install signal handlers")?;
    if let Some(seed) = args.seed {
        println!("rebuilding {}", seed.title());
    }
    let expansion = options.matrix.expand();
    println!(
        "{} cells on {} beds; {} per cell, {} s per timed phase",
        expansion.cell_count(),
        expansion.beds.len(),
        blockwire_blockdev::size::format_size(options.size),
        options.time.as_secs_f64()
    );
    let report = blockwire_lab::run(&options, &mut |event| match event {
        Event::Note(text) => eprintln!("note: {text}"),
        Event::Bed { bed } => println!(
            "bed: {} (namespaces {} and {})",
            bed.spec,
            bed.target_ns(),
            bed.initiator_ns()
        ),
        Event::CellStart { index, total, spec } => {
            println!("[{index}/{total}] {} ...", spec.label())
        }
        Event::Network { baseline } => println!("{}", table::network_line(baseline)),
        Event::CellDone { index, total, rows } => {
            let label = rows.first().map_or(String::new(), |r| {
                format!("{} {} MTU {}", report::protocol(r), r.workload, r.mtu)
            });
            println!("{}", table::progress_line(index, total, &label, rows));
        }
    })?;
    println!();
    print!("{}", table::matrix(&report));
    if let Some(seed) = args.seed {
        println!();
        print!("{}", table::seed_tables(&report, seed));
    } else {
        print!("{}", table::scaling(&report));
    }
    if let Some(path) = &args.json {
        json::write(&report, path).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, csv::render(&report))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if let Some(path) = &args.html {
        html::write(&report, path).with_context(|| format!("cannot write {}", path.display()))?;
    }
    if report.cells.is_empty() {
        bail!("no cell was measured (see the notes above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_lab::target::serve_config;
    use blockwire_server::config::Config;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lab: LabArgs,
    }

    const ALL_SEEDS: [Seed; 5] = [Seed::S000, Seed::S001, Seed::S002, Seed::S003, Seed::S004];

    fn parse(args: &[&str]) -> LabArgs {
        Cli::try_parse_from(std::iter::once("lab").chain(args.iter().copied()))
            .unwrap()
            .lab
    }

    #[test]
    fn flags_replace_the_presets_dimensions() {
        let args = parse(&["--seed", "003", "--mtu", "9000", "--protocols", "aoe"]);
        let seed = matrix(&args);
        assert_eq!(seed.mtus, [9000]);
        assert_eq!(seed.protocols, [Protocol::Aoe]);
        assert_eq!(seed.channels, [1, 4], "kept from the preset");
        assert_eq!(seed.disk.rate_mb_per_s, Some(210.0));

        let args = parse(&[
            "--channels",
            "2",
            "--rate",
            "200m",
            "--disk-rate",
            "50",
            "--baseline",
            "--striped",
            "both",
        ]);
        let custom = matrix(&args);
        assert_eq!(custom.rates, [Rate(Some(200))]);
        assert_eq!(custom.channels, [2]);
        assert_eq!(custom.disk.rate_mb_per_s, Some(50.0));
        assert!(custom.baseline);
        assert_eq!(custom.layouts, Layouts::Both);
        assert!(Cli::try_parse_from(["lab", "--protocols", "fc"]).is_err());
        assert!(Cli::try_parse_from(["lab", "--seed", "005"]).is_err());
    }

    #[test]
    fn presets_bring_their_quick_defaults_and_flags_override_them() {
        let dd = options(&parse(&["--seed", "001"])).unwrap();
        assert_eq!((dd.block_size, dd.queue_depth), (Some(4 << 20), Some(1)));
        assert_eq!(dd.matrix.protocols, [Protocol::Aoe, Protocol::Iscsi]);
        let sweep = options(&parse(&["--seed", "002", "--time", "2"])).unwrap();
        assert_eq!(sweep.time, Duration::from_secs(2));
        assert_eq!(sweep.backing, Backing::File);
        assert_eq!(sweep.matrix.workloads, [LabWorkload::Sweep]);
        let nfs = options(&parse(&["--seed", "004", "--backing", "memory"])).unwrap();
        assert_eq!(nfs.backing, Backing::Memory);
        assert_eq!(nfs.size, 128 << 20);
        assert_eq!(nfs.matrix.protocols[0], Protocol::Nfs);
        let plain = options(&parse(&["--protocols", "nfs,nbd"])).unwrap();
        assert_eq!((plain.block_size, plain.queue_depth), (None, None));
        assert_eq!(plain.time, Duration::from_secs(1));
        assert_eq!(plain.matrix.protocols, [Protocol::Nfs, Protocol::Nbd]);
    }

    #[test]
    fn every_cell_of_a_preset_makes_a_config_serve_accepts() {
        let dir = tempfile::tempdir().unwrap();
        for seed in ALL_SEEDS {
            let mut matrix = preset::matrix(seed);
            matrix.layouts = Layouts::Both;
            matrix.channels.push(2);
            matrix.baseline = true;
            for plan in matrix.expand().beds {
                // ganesha serves NFS cells: they have no serve config.
                for cell in plan
                    .cells
                    .into_iter()
                    .filter(|c| c.protocol != Protocol::Nfs)
                {
                    for backing in [Backing::Memory, Backing::File] {
                        let text = serve_config(&cell, 256 << 20, 256 << 10, backing, dir.path());
                        // The cell's interfaces live in the lab's namespace: the
                        // file itself must be valid.
                        let config: Config =
                            toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
                        if let Err(e) = config.validate() {
                            panic!("{e}\n{text}");
                        }
                        assert_eq!(config.exports.len() as u32, cell.exports());
                    }
                }
            }
        }
    }

    #[test]
    fn initiator_uris_of_every_layout_parse() {
        for seed in ALL_SEEDS {
            let mut matrix = preset::matrix(seed);
            matrix.layouts = Layouts::Both;
            matrix.channels.push(3);
            for plan in matrix.expand().beds {
                for cell in plan.cells {
                    let uri = blockwire_lab::target::initiator_uri(&cell, 64 << 10);
                    let target = blockwire_server::device_spec::Target::parse(&uri)
                        .unwrap_or_else(|e| panic!("{uri}: {e:#}"));
                    assert!(target.is_remote(), "{uri}");
                }
            }
        }
    }
}
