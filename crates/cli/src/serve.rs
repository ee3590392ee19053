//! `blockwire serve`: builds exports from arguments or a config file and runs the
//! NBD target until SIGINT or SIGTERM.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use blockwire_aoe::target::TargetConfig;
use blockwire_blockdev::size::{format_size, parse_size};
use blockwire_blockdev::write_behind::DEFAULT_WRITE_BEHIND;
use blockwire_blockdev::{Device, FileOptions, MemoryDevice, Throttle, ThrottleConfig};
use blockwire_nbd::{Export, ExportSet, NbdConfig, NbdTarget};
use blockwire_server::defaults::NBD_LISTEN as DEFAULT_LISTEN;
use clap::Args;

use crate::serve_aoe::ServedAoe;
use crate::serve_iscsi::{self, ChapSources, IscsiExport, IscsiPlan};
use crate::serve_live::{Live, Loaded};
use crate::serve_metrics;
use crate::serve_reload;
use crate::serve_status;
use crate::serve_tls;
use crate::service;
use crate::stop_signals;
use blockwire_server::config::{
    AoeSection, Config, ExportSection, IscsiExport as IscsiExportConfig, XdpChoice,
};
use blockwire_server::created_files::CreatedFiles;
use blockwire_server::device_spec::{remote_target, Target};
use blockwire_server::factory::{open, open_or_create, parse_reconnect, reconnect_setting, Remote};
use blockwire_server::throttle;
use blockwire_server::volumes::Volumes;

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
    pub tls: serve_tls::TlsArgs,
}

/// `--aoe-xdp HOOK`: its values listed with their meaning, for help, manual pages and
/// shell completions.
fn xdp_parser() -> impl clap::builder::TypedValueParser<Value = XdpChoice> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    let values = XdpChoice::NAMES.map(|(name, help)| PossibleValue::new(name).help(help));
    PossibleValuesParser::new(values)
        .map(|name| XdpChoice::from_name(&name).expect("one of the listed hooks"))
}

/// What `serve` runs: NBD exports with their listeners, AoE targets and the iSCSI
/// target.
pub struct Plan {
    pub nbd: Option<(ExportSet, NbdConfig, Vec<PathBuf>)>,
    pub aoe: Vec<(String, Device, TargetConfig)>,
    pub iscsi: Option<IscsiPlan>,
    /// Where to answer Prometheus (`[metrics] listen`).
    pub metrics: Option<String>,
    /// With `--config`: the file as loaded and the devices opened for it, which a
    /// reload starts from.
    pub file: Option<Loaded>,
}

fn resolve(addr: &str) -> Result<Vec<SocketAddr>> {
    blockwire_server::config_validate::resolve(addr).map_err(|e| anyhow!(e))
}

fn listen_config(listen: &[String], sockets: &[PathBuf], workers: usize) -> Result<NbdConfig> {
    let mut tcp = Vec::new();
    let defaults = [DEFAULT_LISTEN.to_string()];
    let listen = if listen.is_empty() && sockets.is_empty() {
        &defaults[..]
    } else {
        listen
    };
    for addr in listen {
        tcp.extend(resolve(addr)?);
    }
    Ok(NbdConfig {
        tcp,
        unix: sockets.to_vec(),
        workers,
        ..NbdConfig::default()
    })
}

/// Wraps an export's device in the throttle its settings ask for, saying so.
fn throttled(name: &str, device: Device, config: ThrottleConfig) -> Device {
    if config.is_active() {
        tracing::info!(
            "export '{name}': throttled to {}",
            throttle::describe(&config)
        );
    }
    Throttle::wrap(device, config)
}

/// The export a `[[export]]` table describes, its device opened (or created).
pub(crate) fn export_from_section(
    section: &ExportSection,
    volumes: &mut Volumes,
    created: &CreatedFiles,
) -> Result<Export> {
    let throttle = throttle::from_config(&section.name, section.disk_rate, section.disk_latency)?;
    let device = match (&section.path, &section.memory) {
        _ if section.volume.is_some() => {
            let name = section.volume.as_deref().unwrap_or_default();
            let device = volumes
                .open(name)
                .with_context(|| format!("export '{}'", section.name))?;
            if section.read_only {
                device.read_only()
            } else {
                device
            }
        }
        // A Ceph RBD image: `path = "rbd:POOL/IMAGE[@SNAP][:conf=...]"`, and its
        // options from an `rbd` table.
        _ if section.rbd_spec().is_some() => {
            let spec = section
                .rbd_spec()
                .expect("checked above")
                .map_err(|e| anyhow!(e))?;
            let device = open(&Target::Rbd(spec), section.read_only, Remote::default())
                .with_context(|| format!("export '{}'", section.name))?;
            if section.read_only {
                device.read_only()
            } else {
                device
            }
        }
        (Some(path), _) => {
            let size = section
                .size
                .as_deref()
                .map(parse_size)
                .transpose()
                .map_err(|e| anyhow!(e))?;
            let write_behind = match section.write_behind.as_deref() {
                Some(text) => parse_size(text)
                    .map_err(|e| anyhow!("export '{}': write_behind: {e}", section.name))?,
                None => DEFAULT_WRITE_BEHIND,
            };
            let options = FileOptions {
                read_only: section.read_only,
                direct: section.direct,
                write_behind,
            };
            open_or_create(path, size, options, created)
                .with_context(|| format!("export '{}'", section.name))?
        }
        (None, Some(memory)) => {
            let size = parse_size(memory).map_err(|e| anyhow!("export '{}': {e}", section.name))?;
            let device = Device::from_device(MemoryDevice::new(size));
            if section.read_only {
                device.read_only()
            } else {
                device
            }
        }
        (None, None) => bail!("export '{}' has neither path nor memory", section.name),
    };
    let device = throttled(&section.name, device, throttle);
    Ok(Export::new(&section.name, &section.description, device))
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

/// The AoE target settings of an export's `aoe` table.
pub(crate) fn aoe_config(section: &AoeSection) -> TargetConfig {
    let mut config = TargetConfig::new(section.shelf, section.slot, section.interfaces.clone());
    if let Some(count) = section.buffer_count {
        config.buffer_count = count;
    }
    config.config_string = section.config_string.clone().into_bytes();
    config.xdp = section.xdp.map(XdpChoice::hook);
    config
}

fn plan_from_file(
    path: &Path,
    workers: usize,
    tls: &serve_tls::TlsArgs,
    created: &CreatedFiles,
) -> Result<Plan> {
    let file = Config::load(path)?;
    let mut exports = ExportSet::new();
    let mut aoe = Vec::new();
    let mut iscsi = Vec::new();
    let prefix = file
        .iscsi
        .iqn_prefix
        .as_deref()
        .unwrap_or(serve_iscsi::DEFAULT_IQN_PREFIX);
    let mut volumes = Volumes::new(&file.volumes, &file.exports);
    let mut devices = HashMap::new();
    for section in &file.exports {
        let export = export_from_section(section, &mut volumes, created)?;
        devices.insert(export.name.clone(), export.device.clone());
        if let Some(served) = iscsi_export(prefix, section, &export.device) {
            iscsi.push(served);
        }
        if let Some(target) = &section.aoe {
            aoe.push((
                export.name.clone(),
                export.device.clone(),
                aoe_config(target),
            ));
        }
        if section.nbd {
            exports.add(export).map_err(|e| anyhow!(e))?;
        }
    }
    let iscsi = if iscsi.is_empty() {
        None
    } else {
        let section = &file.iscsi;
        let chap = serve_iscsi::section_chap(section)?;
        Some(IscsiPlan {
            listen: iscsi_listen(&section.listen)?,
            exports: iscsi,
            chap,
            discovery_chap: section.discovery_chap,
            workers: file.server.workers.unwrap_or(workers),
            sessions: None,
        })
    };
    let metrics = file.metrics.listen.clone();
    if exports.iter().next().is_none() {
        return Ok(Plan {
            nbd: None,
            aoe,
            iscsi,
            metrics,
            file: Some(Loaded {
                volumes: volumes.opened(),
                config: file,
                devices,
            }),
        });
    }
    if let Some(name) = &file.server.default_export {
        exports.set_default(name).map_err(|e| anyhow!(e))?;
    }
    let mut config = listen_config(
        &file.server.listen,
        &file.server.socket,
        file.server.workers.unwrap_or(workers),
    )?;
    if let Some(max) = file.server.max_connections {
        config.max_connections = max;
    }
    // Both checked by Config::validate.
    if let Some(max) = file.server.max_connections_per_address {
        config.max_connections_per_address = max;
    }
    if let Some(max) = file.server.max_handshakes_per_address {
        config.max_handshakes_per_address = max;
    }
    if let Some(secs) = file.server.send_timeout {
        config.send_timeout = Duration::from_secs_f64(secs);
    }
    if let Some(limit) = file
        .server
        .unnegotiated_payload_limit()
        .map_err(|e| anyhow!(e))?
    {
        config.unnegotiated_payload_limit = limit;
    }
    config.tls = serve_tls::target_tls(tls, Some(&file.server))?;
    Ok(Plan {
        nbd: Some((exports, config, file.server.socket.clone())),
        aoe,
        iscsi,
        metrics,
        file: Some(Loaded {
            volumes: volumes.opened(),
            config: file,
            devices,
        }),
    })
}

/// How an export is served over iSCSI, if its table asks for it: the target name
/// is `prefix:NAME` unless the table gives one.
pub(crate) fn iscsi_export(
    prefix: &str,
    section: &ExportSection,
    device: &Device,
) -> Option<IscsiExport> {
    let settings = section
        .iscsi
        .as_ref()
        .and_then(IscsiExportConfig::settings)?;
    Some(IscsiExport {
        name: section.name.clone(),
        device: device.clone(),
        iqn: settings
            .iqn
            .unwrap_or_else(|| serve_iscsi::default_iqn(prefix, &section.name)),
        block_size: settings.block_size.unwrap_or(512),
        initiators: settings.initiators,
        alias: settings.alias,
    })
}

fn iscsi_listen(listen: &[String]) -> Result<Vec<SocketAddr>> {
    let defaults = [serve_iscsi::DEFAULT_LISTEN.to_string()];
    let listen = if listen.is_empty() {
        &defaults[..]
    } else {
        listen
    };
    let mut addrs = Vec::new();
    for addr in listen {
        addrs.extend(resolve(addr)?);
    }
    Ok(addrs)
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
            listen: iscsi_listen(&args.iscsi)?,
            exports: vec![IscsiExport {
                name: export.name.clone(),
                device: export.device.clone(),
                iqn: args.iqn.clone().unwrap_or_else(|| {
                    serve_iscsi::default_iqn(serve_iscsi::DEFAULT_IQN_PREFIX, &export.name)
                }),
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
        let mut config = listen_config(&args.listen, &args.socket, args.workers)?;
        config.tls = serve_tls::target_tls(&args.tls, None)?;
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

fn uri_host(addr: &SocketAddr) -> String {
    match addr {
        SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
    }
}

/// Prints each export's URIs: `nbds` when the target requires TLS.
fn announce_nbd(server: &NbdTarget, sockets: &[PathBuf], tls_required: bool) {
    let scheme = if tls_required { "nbds" } else { "nbd" };
    for export in server.exports().iter() {
        let info = export.device.info();
        let mode = if info.read_only {
            "read-only"
        } else {
            "read-write"
        };
        println!(
            "export '{}': {} bytes ({}), {mode}",
            export.name,
            info.size,
            format_size(info.size)
        );
        for addr in server.tcp_addrs() {
            println!("  {scheme}://{}/{}", uri_host(&addr), export.name);
        }
        for socket in sockets {
            println!(
                "  {scheme}+unix:///{}?socket={}",
                export.name,
                socket.display()
            );
        }
    }
}

/// What a start bound and opened, announced only once all of it is there.
struct Started {
    server: Option<(NbdTarget, Vec<PathBuf>, bool)>,
    tls: Option<String>,
    targets: Vec<(String, ServedAoe)>,
    iscsi: Option<blockwire_iscsi::IscsiTarget>,
    iscsi_devices: Vec<Device>,
    metrics: Option<crate::metrics::MetricsEndpoint>,
    meters: Option<serve_metrics::Meters>,
    netserve: Option<blockwire_bench::netperf::NetServer>,
    file: Option<Loaded>,
}

/// Validates, opens every device, binds every listener and starts every target,
/// printing nothing; on failure whatever was started is dropped (closed).
fn start(args: &ServeArgs, created: &CreatedFiles) -> Result<Started> {
    let plan = match &args.config {
        Some(path) => plan_from_file(path, args.workers, &args.tls, created)?,
        None => plan_from_args(args, created)?,
    };
    let (plan, metrics, meters) = match args.metrics.as_deref().or(plan.metrics.as_deref()) {
        Some(listen) => {
            let addr = resolve(listen)?[0];
            let (plan, endpoint, meters) = serve_metrics::instrument(plan, addr)?;
            (plan, Some(endpoint), Some(meters))
        }
        None => (plan, None, None),
    };
    let netserve = args
        .netserve
        .as_deref()
        .map(crate::netserve::bind)
        .transpose()?;
    let mut tls = None;
    let server = match plan.nbd {
        Some((exports, config, sockets)) => {
            let tls_required = config
                .tls
                .as_ref()
                .is_some_and(|tls| tls.mode() == blockwire_nbd::tls::TlsMode::Require);
            tls = config.tls.as_deref().map(serve_tls::describe);
            let server = NbdTarget::bind(exports, config)
                .map_err(|e| busy_hint(e, "NBD", "--listen", "[server] listen"))?;
            Some((server, sockets, tls_required))
        }
        None => None,
    };
    let iscsi_devices = plan
        .iscsi
        .iter()
        .flat_map(|p| p.exports.iter().map(|e| e.device.clone()))
        .collect();
    let iscsi = plan
        .iscsi
        .map(|plan| {
            serve_iscsi::bind(plan).map_err(|e| busy_hint(e, "iSCSI", "--iscsi", "[iscsi] listen"))
        })
        .transpose()?;
    let mut targets = Vec::new();
    for (name, device, config) in plan.aoe {
        let target = ServedAoe::start(&name, device, config)?;
        targets.push((name, target));
    }
    Ok(Started {
        server,
        tls,
        targets,
        iscsi,
        iscsi_devices,
        metrics,
        meters,
        netserve,
        file: plan.file,
    })
}

/// A listener that cannot bind because another program holds its address, with
/// how to choose another.
fn busy_hint(
    error: impl Into<anyhow::Error>,
    protocol: &str,
    flag: &str,
    key: &str,
) -> anyhow::Error {
    let error = error.into();
    let busy = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    });
    if busy {
        anyhow!("{error:#} (another program listens there: give {protocol} another address with {flag} HOST:PORT, or {key} in a config file)")
    } else {
        error
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    // A start is all or nothing: what it created goes again if any part fails, and
    // nothing is announced before every part is up.
    let created = CreatedFiles::default();
    let started = match start(&args, &created) {
        Ok(started) => {
            created.keep();
            started
        }
        Err(e) => {
            created.remove_all();
            return Err(e);
        }
    };
    let Started {
        server,
        tls,
        mut targets,
        iscsi,
        mut iscsi_devices,
        metrics,
        meters,
        netserve,
        file,
    } = started;
    // Installed before the announcement, so a client's first request and a signal
    // right after it are handled.
    let mut signals = stop_signals::install()?;
    let reloader = serve_reload::install(args.config.clone())?;
    if let Some(line) = &tls {
        println!("{line}");
    }
    let server = server.map(|(server, sockets, tls_required)| {
        announce_nbd(&server, &sockets, tls_required);
        server
    });
    for (name, target) in &targets {
        target.announce(name);
    }
    let iscsi = match iscsi {
        Some(target) => {
            serve_iscsi::announce(&target);
            let handles = (target.shutdown_handle(), target.reload_handle());
            let thread = std::thread::Builder::new()
                .name("iscsi".into())
                .spawn(move || target.run())?;
            Some((handles, thread))
        }
        None => None,
    };
    if let Some(metrics) = &metrics {
        println!("metrics: http://{}/metrics", metrics.addr());
    }
    if let Some(netserve) = &netserve {
        crate::netserve::announce(netserve)?;
    }
    let iscsi_stop = iscsi.as_ref().map(|((handle, _), _)| handle.clone());
    let live = file.map(|loaded| {
        Arc::new(Mutex::new(Live::new(
            loaded,
            server.as_ref().map(NbdTarget::reload_handle),
            iscsi.as_ref().map(|((_, reload), _)| reload.clone()),
            std::mem::take(&mut targets),
            meters,
        )))
    });
    reloader.start(live.clone())?;
    let netserve = match netserve {
        Some(server) => Some(server.spawn()?),
        None => None,
    };
    // AoE targets: those of the configuration (a reload may change them), or the
    // one of the flags.
    let aoe_count: Option<Box<dyn Fn() -> usize + Send>> = match &live {
        Some(live) => {
            let live = live.clone();
            Some(Box::new(move || {
                live.lock().unwrap_or_else(|e| e.into_inner()).aoe_targets()
            }))
        }
        None if !targets.is_empty() => {
            let count = targets.len();
            Some(Box::new(move || count))
        }
        None => None,
    };
    serve_status::watch(serve_status::Served {
        nbd: server.as_ref().map(NbdTarget::shutdown_handle),
        iscsi: iscsi_stop.clone(),
        aoe: aoe_count,
    })?;
    println!("press Ctrl-C to stop");
    service::ready();

    let result = match server {
        Some(server) => {
            let handle = server.shutdown_handle();
            stop_signals::on_first(signals, move || {
                if let Some(iscsi) = iscsi_stop {
                    iscsi.shutdown();
                }
                handle.shutdown()
            })?;
            server.run().context("server failed")
        }
        None => {
            stop_signals::wait(&mut signals);
            if let Some(iscsi) = iscsi_stop {
                iscsi.shutdown();
            }
            Ok(())
        }
    };
    service::stopping();
    let targets: Vec<ServedAoe> = match &live {
        // What is served now, after any reload; none is applied from here on.
        Some(live) => {
            let (aoe, iscsi) = live.lock().unwrap_or_else(|e| e.into_inner()).shut_down();
            iscsi_devices = iscsi;
            aoe
        }
        None => targets.into_iter().map(|(_, target)| target).collect(),
    };
    if let Some((_, thread)) = iscsi {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("iSCSI target failed: {e}"),
            Err(_) => tracing::error!("iSCSI target panicked"),
        }
        for device in &iscsi_devices {
            if !device.info().read_only && device.info().capabilities.flush.available() {
                device
                    .flush()
                    .map_err(|e| anyhow!("iSCSI export: final flush failed: {e}"))?;
            }
        }
    }
    if let Some(netserve) = netserve {
        netserve.stop().context("netserve failed")?;
    }
    if let Some(metrics) = metrics {
        metrics.stop();
    }
    for target in targets {
        target
            .stop()
            .map_err(|e| anyhow!("AoE target: final flush failed: {e}"))?;
    }
    result
}
