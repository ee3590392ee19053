//! `blockwire serve`: builds exports from arguments or a config file and runs the
//! NBD target until SIGINT or SIGTERM.

use anyhow::{anyhow, bail, Result};
use blockwire_aoe::target::TargetConfig;
use blockwire_blockdev::{FileOptions, ThrottleConfig};
use blockwire_nbd::{Export, ExportSet};
use blockwire_server::config::XdpChoice;
use blockwire_server::created_files::CreatedFiles;
use blockwire_server::defaults::{default_iqn, default_nqn, DEFAULT_IQN_PREFIX};
use blockwire_server::device_spec::{remote_target, Target};
use blockwire_server::factory::{open_source, reconnect_setting, Remote, Source};
use blockwire_server::serve_export::throttled;
use blockwire_server::serve_iscsi::{self, ChapSources, IscsiExport, IscsiPlan};
use blockwire_server::serve_nvme::{self, NvmeExport, NvmePlan};
use blockwire_server::serve_plan::{plan_from_file, Plan};
use blockwire_server::serve_start::{start, Started};
use blockwire_server::{serve_nbd, serve_run, serve_tls};

use crate::serve_args::ServeArgs;

/// Size of the in-memory demo export.
const DEMO_SIZE: u64 = 1 << 30;

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
            let device = open_source(&Source::Memory(DEMO_SIZE), args.read_only, created)?;
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
            let default = match &target {
                Target::Stripe(_) => "volume".to_string(),
                Target::Rbd(spec) => spec.image.clone(),
                _ => "remote".to_string(),
            };
            let device = open_source(
                &Source::Remote(Box::new(target), remote),
                args.read_only,
                created,
            )?;
            let name = args.name.clone().unwrap_or(default);
            Export::new(name, args.description.clone(), device)
        }
        Some(path) => {
            let options = FileOptions {
                read_only: args.read_only,
                direct: args.direct,
                write_behind: args.write_behind,
            };
            let file = Source::File {
                path: path.clone(),
                size: args.size,
                options,
            };
            let device = open_source(&file, args.read_only, created)?;
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
    let nvme = if args.nvme.is_empty() {
        None
    } else {
        let (listen, discovery_listen) =
            serve_nvme::listen_addrs(&crate::serve_args_check::nvme_section(args))?;
        Some(NvmePlan {
            listen,
            discovery_listen,
            exports: vec![NvmeExport {
                name: export.name.clone(),
                device: export.device.clone(),
                nqn: args
                    .nqn
                    .clone()
                    .unwrap_or_else(|| default_nqn(&export.name)),
                hosts: args.nvme_host.clone(),
            }],
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
        nvme,
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
