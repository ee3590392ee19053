//! `blockwire serve`: builds exports from arguments or a config file and runs the
//! NBD target until SIGINT or SIGTERM.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use blockwire_aoe::target::TargetConfig;
use blockwire_blockdev::size::parse_size;
use blockwire_blockdev::{Device, FileOptions, MemoryDevice, ThrottleConfig};
use blockwire_nbd::{Export, ExportSet};
use blockwire_server::config::XdpChoice;
use blockwire_server::created_files::CreatedFiles;
use blockwire_server::defaults::{default_iqn, DEFAULT_IQN_PREFIX};
use blockwire_server::device_spec::{remote_target, Target};
use blockwire_server::factory::{open, open_or_create, parse_reconnect, reconnect_setting, Remote};
use blockwire_server::serve_export::throttled;
use blockwire_server::serve_iscsi::{self, ChapSources, IscsiExport, IscsiPlan};
use blockwire_server::serve_plan::{plan_from_file, Plan};
use blockwire_server::serve_start::{start, Started};
use blockwire_server::{serve_nbd, serve_run, serve_tls, throttle};
use clap::Args;

use crate::tls_args::TlsArgs;

/// Size of the in-memory demo export.
const DEMO_SIZE: u64 = 1 << 30;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// File or block device to export, or a remote device (nbd://, aoe://, iscsi://)
    /// or a striped volume (stripe:CHUNK:MEMBER,MEMBER,...) to serve again as a
    /// gateway. Without it (and without --config), serves a 1 GiB in-memory demo
    /// export. Served over NBD unless --aoe or --iscsi alone is given.
    pub path: Option<PathBuf>,

    /// Create PATH as a sparse file of this size if it does not exist (e.g. 4G).
    /// An existing file is never resized.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,

    /// Export name clients ask for (default: the file name, or "demo").
    #[arg(long)]
    pub name: Option<String>,

    /// Text shown to clients that list exports.
    #[arg(long, default_value = "")]
    pub description: String,

    /// NBD: TCP address to listen on; repeatable. Default 127.0.0.1:10809 (loopback
    /// only).
    #[arg(help_heading = "NBD", long, value_name = "HOST:PORT")]
    pub listen: Vec<String>,

    /// NBD: Unix socket to listen on; repeatable. With only --socket, no TCP listener.
    #[arg(help_heading = "NBD", long, value_name = "PATH")]
    pub socket: Vec<PathBuf>,

    /// Refuse every write.
    #[arg(long)]
    pub read_only: bool,

    /// For an rbd: image: take librbd's exclusive lock and keep it, so a second
    /// gateway cannot write the image (it fails in one line); same as :exclusive=true.
    #[arg(long)]
    pub exclusive: bool,

    /// Bypass the page cache (O_DIRECT); requests must then be aligned as the file
    /// system says (512 B or 4 KiB; advertised to NBD clients).
    #[arg(long)]
    pub direct: bool,

    /// Start writeback of each sequential stream of buffered writes every SIZE bytes
    /// (16M, say), so a flush after a long write waits only for the last piece, at a
    /// cost in throughput and CPU while data fits in the page cache; 0 (the default)
    /// leaves writeback to the kernel.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "0")]
    pub write_behind: u64,

    /// For a remote PATH (a gateway): keep reconnecting this many seconds when an
    /// NBD or iSCSI connection drops, then send again what had no answer; 0 fails
    /// at once. Default 30.
    #[arg(long, value_name = "SECS", value_parser = parse_reconnect)]
    pub reconnect: Option<Duration>,

    /// Threads for requests that may block (flush, FUA, cache misses), for every
    /// protocol.
    #[arg(help_heading = "Limits", long, default_value_t = 16)]
    pub workers: usize,

    /// AoE: serve on these interfaces (comma-separated), as eSHELF.SLOT. Without
    /// --listen or --socket, NBD is then not served.
    #[arg(
        help_heading = "AoE",
        long,
        value_name = "IFACE[,IFACE...]",
        value_delimiter = ','
    )]
    pub aoe: Vec<String>,

    /// AoE: the shelf (major address, 0-65534) for --aoe.
    #[arg(help_heading = "AoE", long, requires = "aoe")]
    pub shelf: Option<u16>,

    /// AoE: the slot (minor address, 0-254) for --aoe.
    #[arg(help_heading = "AoE", long, requires = "aoe")]
    pub slot: Option<u8>,

    /// AoE: the buffer count, the frames an initiator may have outstanding at once (its
    /// window), 1-65535; default 256.
    #[arg(help_heading = "AoE", long, requires = "aoe", value_parser = clap::value_parser!(u16).range(1..))]
    pub buffer_count: Option<u16>,

    /// AoE: send and receive through AF_XDP; an XDP program on each --aoe interface
    /// hands AoE frames to the target (faster per frame at MTU 1500; MTU up to
    /// 3822; tcpdump no longer sees those frames). HOOK is generic (any interface,
    /// the faster on veth; the default) or driver (native XDP).
    #[arg(help_heading = "AoE", long, requires = "aoe", value_name = "HOOK", num_args = 0..=1, default_missing_value = "generic", value_parser = xdp_parser())]
    pub aoe_xdp: Option<XdpChoice>,

    /// iSCSI: serve on this TCP address (repeatable), e.g. 127.0.0.1:3260 or
    /// 0.0.0.0:3260; port 0 takes a free port. The export is LUN 0 of one target.
    /// Without --listen or --socket, NBD is then not served.
    #[arg(help_heading = "iSCSI", long, value_name = "HOST:PORT")]
    pub iscsi: Vec<String>,

    /// iSCSI: the target name (default iqn.2026-11.dev.blockwire:NAME).
    #[arg(help_heading = "iSCSI", long, requires = "iscsi")]
    pub iqn: Option<String>,

    /// iSCSI: the logical block size of the LUN: 512 or 4096.
    #[arg(
        help_heading = "iSCSI",
        long,
        requires = "iscsi",
        default_value_t = 512
    )]
    pub block_size: u32,

    /// iSCSI: require one-way CHAP with this user name for logins; the secret comes
    /// from --chap-secret-file or the BLOCKWIRE_CHAP_SECRET environment variable.
    #[arg(help_heading = "iSCSI", long, requires = "iscsi")]
    pub chap_user: Option<String>,

    /// iSCSI: the file whose first line is the CHAP secret.
    #[arg(
        help_heading = "iSCSI",
        long,
        requires = "chap_user",
        value_name = "FILE"
    )]
    pub chap_secret_file: Option<PathBuf>,

    /// iSCSI: mutual CHAP, the name the target answers the initiator's challenge with; the
    /// secret comes from --mutual-chap-secret-file or BLOCKWIRE_MUTUAL_CHAP_SECRET.
    #[arg(help_heading = "iSCSI", long, requires = "chap_user")]
    pub mutual_chap_user: Option<String>,

    /// iSCSI: the file whose first line is the mutual CHAP secret.
    #[arg(
        help_heading = "iSCSI",
        long,
        requires = "mutual_chap_user",
        value_name = "FILE"
    )]
    pub mutual_chap_secret_file: Option<PathBuf>,

    /// Also answer the bench's network test (`blockwire bench --netserve-port`) on
    /// this TCP address, e.g. 0.0.0.0:10810; see `blockwire netserve`.
    #[arg(help_heading = "Service", long, value_name = "HOST:PORT")]
    pub netserve: Option<String>,

    /// Limit the export's reads and writes together to this many MB/s (10^6 bytes),
    /// to stand in for a disk (the lab's 70 MB/s disk, say).
    #[arg(help_heading = "Limits", long, value_name = "MB/s", value_parser = throttle::parse_rate, conflicts_with = "config")]
    pub disk_rate: Option<u64>,

    /// Add this many milliseconds to every request of the export, like a disk.
    #[arg(help_heading = "Limits", long, value_name = "MS", value_parser = throttle::parse_latency, conflicts_with = "config")]
    pub disk_latency: Option<std::time::Duration>,

    /// Answer Prometheus scrapes at http://HOST:PORT/metrics (overrides the config
    /// file's [metrics] listen); port 0 takes a free port.
    #[arg(help_heading = "Service", long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Serve the exports of this TOML file instead of PATH.
    #[arg(help_heading = "Service", long, value_name = "FILE", conflicts_with_all = ["path", "size", "name", "read_only", "direct", "aoe", "iscsi"])]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub tls: TlsArgs,
}

/// `--aoe-xdp HOOK`: its values listed with their meaning, for help, manual pages and
/// shell completions.
fn xdp_parser() -> impl clap::builder::TypedValueParser<Value = XdpChoice> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    let values = XdpChoice::NAMES.map(|(name, help)| PossibleValue::new(name).help(help));
    PossibleValuesParser::new(values)
        .map(|name| XdpChoice::from_name(&name).expect("one of the listed hooks"))
}

fn export_from_args(args: &ServeArgs, created: &CreatedFiles) -> Result<Export> {
    let export = plain_export_from_args(args, created)?;
    let throttle = ThrottleConfig {
        rate: args.disk_rate,
        latency: args.disk_latency.unwrap_or_default(),
    };
    let device = throttled(&export.name, export.device.clone(), throttle);
    Ok(Export::new(export.name, export.description, device))
}

fn plain_export_from_args(args: &ServeArgs, created: &CreatedFiles) -> Result<Export> {
    Ok(match &args.path {
        None => {
            let device = Device::from_device(MemoryDevice::new(DEMO_SIZE));
            let device = if args.read_only {
                device.read_only()
            } else {
                device
            };
            let name = args.name.clone().unwrap_or_else(|| "demo".into());
            let description = if args.description.is_empty() {
                "blockwire in-memory demo export (contents vanish on exit)".to_string()
            } else {
                args.description.clone()
            };
            Export::new(name, description, device)
        }
        Some(path) if remote_target(path)?.is_some() => {
            // A gateway: a remote device (through our initiator) served again.
            let mut target = remote_target(path)?.expect("checked above");
            match &mut target {
                Target::Rbd(spec) => spec.exclusive |= args.exclusive,
                _ if args.exclusive => bail!("--exclusive applies to rbd: images"),
                _ => {}
            }
            if args.size.is_some() || args.direct {
                bail!(
                    "--size and --direct apply to files, not to {}",
                    path.display()
                );
            }
            let remote = Remote {
                reconnect: reconnect_setting(args.reconnect),
                ..Remote::default()
            };
            let device = open(&target, args.read_only, remote)?;
            let device = if args.read_only {
                device.read_only()
            } else {
                device
            };
            let default = match &target {
                Target::Stripe(_) => "volume".to_string(),
                Target::Rbd(spec) => spec.image.clone(),
                _ => "remote".to_string(),
            };
            let name = args.name.clone().unwrap_or(default);
            Export::new(name, args.description.clone(), device)
        }
        Some(path) => {
            let options = FileOptions {
                read_only: args.read_only,
                direct: args.direct,
                write_behind: args.write_behind,
            };
            let device = open_or_create(path, args.size, options, created)?;
            let name = match &args.name {
                Some(name) => name.clone(),
                None => path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            };
            Export::new(name, args.description.clone(), device)
        }
    })
}

fn plan_from_args(args: &ServeArgs, created: &CreatedFiles) -> Result<Plan> {
    crate::serve_args_check::check(args)?;
    let export = export_from_args(args, created)?;
    let mut aoe = Vec::new();
    if !args.aoe.is_empty() {
        let (Some(shelf), Some(slot)) = (args.shelf, args.slot) else {
            bail!("--aoe needs --shelf and --slot (the target's address, eSHELF.SLOT)");
        };
        let mut config = TargetConfig::new(shelf, slot, args.aoe.clone());
        config.workers = args.workers;
        if let Some(count) = args.buffer_count {
            config.buffer_count = count;
        }
        config.xdp = args.aoe_xdp.map(XdpChoice::hook);
        aoe.push((export.name.clone(), export.device.clone(), config));
    }
    let iscsi = if args.iscsi.is_empty() {
        None
    } else {
        let chap = serve_iscsi::chap_config(&ChapSources {
            user: args.chap_user.as_deref(),
            secret_file: args.chap_secret_file.as_deref(),
            mutual_user: args.mutual_chap_user.as_deref(),
            mutual_secret_file: args.mutual_chap_secret_file.as_deref(),
        })?;
        Some(IscsiPlan {
            listen: serve_iscsi::listen_addrs(&args.iscsi)?,
            exports: vec![IscsiExport {
                name: export.name.clone(),
                device: export.device.clone(),
                iqn: args
                    .iqn
                    .clone()
                    .unwrap_or_else(|| default_iqn(DEFAULT_IQN_PREFIX, &export.name)),
                block_size: args.block_size,
                initiators: Vec::new(),
                alias: None,
            }],
            chap,
            discovery_chap: false,
            workers: args.workers,
            sessions: None,
        })
    };
    let nbd = if crate::serve_args_check::serves_nbd(args) {
        let mut config = serve_nbd::listen_config(&args.listen, &args.socket, args.workers)?;
        config.tls = serve_tls::target_tls(args.tls.settings(), None)?;
        let mut exports = ExportSet::new();
        exports.add(export).map_err(|e| anyhow!(e))?;
        Some((exports, config, args.socket.clone()))
    } else {
        None
    };
    Ok(Plan {
        nbd,
        aoe,
        iscsi,
        metrics: None,
        file: None,
    })
}

/// Plans from the config file or the flags, then starts it all or nothing: what
/// it created goes again if any part fails.
fn start_from_args(args: &ServeArgs) -> Result<Started> {
    let created = CreatedFiles::default();
    let started = match &args.config {
        Some(path) => plan_from_file(path, args.workers, args.tls.settings(), &created),
        None => plan_from_args(args, &created),
    }
    .and_then(|plan| start(plan, args.metrics.as_deref(), args.netserve.as_deref()));
    match started {
        Ok(started) => {
            created.keep();
            Ok(started)
        }
        Err(e) => {
            created.remove_all();
            Err(e)
        }
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    // Nothing is announced before every part is up.
    let started = start_from_args(&args)?;
    serve_run::run(started, args.config.clone())
}
