//! `serve PATH` with flags is checked by the same validation as a config file: its
//! flags become a one-export configuration, and mistakes are said with the flag
//! that set the key (`--shelf: 65535 is AoE's broadcast shelf (0-65534)`).

use anyhow::{anyhow, Result};

use crate::serve_args::ServeArgs;
use blockwire_server::config::{
    AoeSection, Config, ExportSection, IscsiExport, IscsiExportSettings, IscsiSection,
    MetricsSection, NvmeExport, NvmeExportSettings, NvmeSection, ServerSection,
};
use blockwire_server::config_error::{ConfigError, Table};
use blockwire_server::config_validate::{check_environment, validate};
use blockwire_server::device_spec::remote_target;

/// Checks `serve`'s flags; an error is one line naming the flag at fault.
pub fn check(args: &ServeArgs) -> Result<()> {
    let config = as_config(args).map_err(|e| anyhow!(e.on_command_line(flag_of)))?;
    validate(&config)
        .and_then(|()| check_environment(&config))
        .map_err(|e| anyhow!(e.on_command_line(flag_of)))
}

/// The flag that sets a key of the one-export configuration.
fn flag_of(table: Option<Table>, key: &str) -> Option<&'static str> {
    Some(match (table, key) {
        (Some(Table::Export(_)), "path") => "PATH",
        (Some(Table::Export(_)), "size") => "--size",
        (Some(Table::Export(_)), "name") => "--name",
        (Some(Table::Export(_)), "read_only") => "--read-only",
        (Some(Table::Export(_)), "write_behind") => "--write-behind",
        (Some(Table::Export(_)), "aoe") => "--aoe",
        (Some(Table::Export(_)), "aoe.interfaces") => "--aoe",
        (Some(Table::Export(_)), "aoe.shelf") => "--shelf",
        (Some(Table::Export(_)), "aoe.slot") => "--slot",
        (Some(Table::Export(_)), "aoe.buffer_count") => "--buffer-count",
        (Some(Table::Export(_)), "iscsi" | "iscsi.iqn") => "--iqn",
        (Some(Table::Export(_)), "iscsi.block_size") => "--block-size",
        (Some(Table::Export(_)), "nvme" | "nvme.nqn") => "--nqn",
        (Some(Table::Export(_)), "nvme.hosts") => "--nvme-host",
        (Some(Table::Export(_)), "disk_rate") => "--disk-rate",
        (Some(Table::Export(_)), "disk_latency") => "--disk-latency",
        (Some(Table::Server), "listen") => "--listen",
        (Some(Table::Server), "socket") => "--socket",
        (Some(Table::Server), "workers") => "--workers",
        (Some(Table::Server), "tls") => "--tls",
        (Some(Table::Server), "tls_psk") => "--tls-psk",
        (Some(Table::Server), "tls_certificates") => "--tls-certificates",
        (Some(Table::Server), "tls_verify_peer") => "--tls-verify-peer",
        (Some(Table::Iscsi), "listen") => "--iscsi",
        (Some(Table::Iscsi), "chap_user") => "--chap-user",
        (Some(Table::Iscsi), "chap_secret_file") => "--chap-secret-file",
        (Some(Table::Iscsi), "mutual_chap_user") => "--mutual-chap-user",
        (Some(Table::Iscsi), "mutual_chap_secret_file") => "--mutual-chap-secret-file",
        (Some(Table::Nvme), "listen") => "--nvme",
        (Some(Table::Nvme), "discovery_listen") => "--nvme-discovery",
        (Some(Table::Metrics), "listen") => "--metrics",
        _ => return None,
    })
}

/// Whether `serve` with these flags serves NBD: unless only AoE, iSCSI or NVMe/TCP
/// is asked for without an NBD listener.
pub fn serves_nbd(args: &ServeArgs) -> bool {
    let other_protocols = !args.aoe.is_empty() || !args.iscsi.is_empty() || !args.nvme.is_empty();
    !other_protocols || !args.listen.is_empty() || !args.socket.is_empty()
}

/// The configuration file that would serve what the flags ask for.
fn as_config(args: &ServeArgs) -> Result<Config, ConfigError> {
    let export_table = Some(Table::Export(0));
    let aoe = if args.aoe.is_empty() {
        None
    } else {
        let (Some(shelf), Some(slot)) = (args.shelf, args.slot) else {
            return Err(ConfigError::new(
                export_table,
                Some("aoe"),
                "needs --shelf and --slot (the target's address, eSHELF.SLOT)".into(),
            ));
        };
        Some(AoeSection {
            interfaces: args.aoe.clone(),
            shelf,
            slot,
            buffer_count: args.buffer_count,
            config_string: String::new(),
            xdp: args.aoe_xdp,
        })
    };
    let iscsi = (!args.iscsi.is_empty()).then(|| {
        IscsiExport::Settings(IscsiExportSettings {
            iqn: args.iqn.clone(),
            block_size: Some(args.block_size),
            initiators: Vec::new(),
            alias: None,
        })
    });
    let nvme = (!args.nvme.is_empty()).then(|| {
        NvmeExport::Settings(NvmeExportSettings {
            nqn: args.nqn.clone(),
            hosts: args.nvme_host.clone(),
        })
    });
    let remote = args
        .path
        .as_deref()
        .is_some_and(|path| matches!(remote_target(path), Ok(Some(_))));
    let name = match (&args.name, &args.path) {
        (Some(name), _) => name.clone(),
        (None, None) => "demo".into(),
        (None, Some(_)) if remote => "remote".into(),
        (None, Some(path)) => path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let export = ExportSection {
        name,
        description: args.description.clone(),
        path: args.path.clone(),
        memory: args.path.is_none().then(|| "1G".to_string()),
        volume: None,
        size: args.size.map(|size| size.to_string()),
        read_only: args.read_only,
        direct: args.direct,
        write_behind: Some(args.write_behind.to_string()),
        nbd: serves_nbd(args),
        aoe,
        iscsi,
        nvme,
        rbd: None,
        disk_rate: args.disk_rate.map(|bytes| bytes as f64 / 1e6),
        disk_latency: args.disk_latency.map(|d| d.as_secs_f64() * 1000.0),
    };
    Ok(Config {
        server: ServerSection {
            listen: args.listen.clone(),
            socket: args.socket.clone(),
            workers: Some(args.workers),
            tls_certificates: args.tls.tls_certificates.clone(),
            tls_psk: args.tls.tls_psk.clone(),
            tls_verify_peer: args.tls.tls_verify_peer,
            ..ServerSection::default()
        },
        exports: vec![export],
        volumes: Vec::new(),
        iscsi: IscsiSection {
            listen: args.iscsi.clone(),
            chap_user: args.chap_user.clone(),
            chap_secret_file: args.chap_secret_file.clone(),
            mutual_chap_user: args.mutual_chap_user.clone(),
            mutual_chap_secret_file: args.mutual_chap_secret_file.clone(),
            ..IscsiSection::default()
        },
        metrics: MetricsSection {
            listen: args.metrics.clone(),
        },
        nvme: nvme_section(args),
    })
}

/// The `[nvme]` section the flags describe.
pub fn nvme_section(args: &ServeArgs) -> NvmeSection {
    NvmeSection {
        listen: args.nvme.clone(),
        discovery_listen: args.nvme_discovery.clone(),
        discovery: args.no_nvme_discovery.then_some(false),
    }
}
