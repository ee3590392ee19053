//! What `blockwire serve` will run, before anything is bound: each protocol's
//! exports and settings, built from a configuration file (here) or from the flags
//! (by the CLI, from the same pieces). A start turns a plan into running targets
//! ([`crate::serve_start`]); a reload starts from the [`Loaded`] file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use blockwire_aoe::target::TargetConfig;
use blockwire_blockdev::Device;
use blockwire_nbd::tls::TargetTlsSettings;
use blockwire_nbd::{ExportSet, NbdConfig};

use crate::config::Config;
use crate::created_files::CreatedFiles;
use crate::serve_aoe::aoe_config;
use crate::serve_export::export_from_section;
use crate::serve_iscsi::{self, IscsiPlan};
use crate::serve_nbd;
use crate::serve_nvme::{self, NvmePlan};
use crate::volumes::Volumes;

/// A configuration and the devices opened for it.
pub struct Loaded {
    pub config: Config,
    /// Each export's device by name, before metering.
    pub devices: HashMap<String, Device>,
    /// Each volume opened, and whether read-only.
    pub volumes: HashMap<String, (Device, bool)>,
}

/// What `serve` runs: NBD exports with their listeners, AoE targets and the iSCSI
/// target.
pub struct Plan {
    pub nbd: Option<(ExportSet, NbdConfig, Vec<PathBuf>)>,
    pub aoe: Vec<(String, Device, TargetConfig)>,
    pub iscsi: Option<IscsiPlan>,
    pub nvme: Option<NvmePlan>,
    /// Where to answer Prometheus (`[metrics] listen`).
    pub metrics: Option<String>,
    /// With `--config`: the file as loaded and the devices opened for it, which a
    /// reload starts from.
    pub file: Option<Loaded>,
}

/// Loads the file at `path` (the one validation) and plans what it serves.
pub fn plan_from_file(
    path: &Path,
    workers: usize,
    tls_flags: Option<TargetTlsSettings>,
    created: &CreatedFiles,
) -> Result<Plan> {
    plan_from_config(Config::load(path)?, workers, tls_flags, created)
}

/// Opens (or creates) every export's device of a validated configuration and
/// plans each protocol's target; `workers` applies where `[server]` names none.
pub fn plan_from_config(
    file: Config,
    workers: usize,
    tls_flags: Option<TargetTlsSettings>,
    created: &CreatedFiles,
) -> Result<Plan> {
    let mut volumes = Volumes::new(&file.volumes, &file.exports);
    let mut opened = Vec::new();
    let mut exports = ExportSet::new();
    let mut aoe = Vec::new();
    for section in &file.exports {
        let export = export_from_section(section, &mut volumes, created)?;
        opened.push((export.name.clone(), export.device.clone()));
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
    let iscsi = serve_iscsi::plan_from_file(&file, &opened, workers)?;
    let nvme = serve_nvme::plan_from_file(&file, &opened, workers)?;
    let nbd = if exports.iter().next().is_none() {
        None
    } else {
        let config = serve_nbd::config_from_file(&file, &mut exports, workers, tls_flags)?;
        Some((exports, config, file.server.socket.clone()))
    };
    let volumes = volumes.opened();
    Ok(Plan {
        nbd,
        aoe,
        iscsi,
        nvme,
        metrics: file.metrics.listen.clone(),
        file: Some(Loaded {
            volumes,
            devices: opened.into_iter().collect(),
            config: file,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(text: &str) -> Result<Plan> {
        let config: Config = toml::from_str(text).unwrap();
        config.validate().unwrap();
        plan_from_config(config, 2, None, &CreatedFiles::default())
    }

    #[test]
    fn each_export_goes_to_the_protocols_its_table_names() {
        let plan = plan(
            "[server]\nlisten = \"127.0.0.1:0\"\n\
             [iscsi]\nlisten = \"127.0.0.1:0\"\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n\
             [[export]]\nname = \"a\"\nmemory = \"1M\"\n\
             [[export]]\nname = \"b\"\nmemory = \"2M\"\nnbd = false\niscsi = true\n",
        )
        .unwrap();
        let (exports, config, sockets) = plan.nbd.unwrap();
        let names: Vec<String> = exports.iter().map(|e| e.name.clone()).collect();
        assert_eq!(names, ["a"]);
        assert_eq!(config.workers, 2);
        assert!(sockets.is_empty());
        let iscsi = plan.iscsi.unwrap();
        assert_eq!(iscsi.exports.len(), 1);
        assert_eq!(iscsi.exports[0].iqn, "iqn.2026-11.dev.blockwire:b");
        assert_eq!(iscsi.exports[0].device.size(), 2 << 20);
        assert!(plan.aoe.is_empty());
        assert_eq!(plan.metrics.as_deref(), Some("127.0.0.1:0"));
        let loaded = plan.file.unwrap();
        assert_eq!(loaded.devices.len(), 2);
    }

    #[test]
    fn an_nvme_export_is_a_subsystem_with_its_default_ports() {
        let plan = plan(
            "[[export]]\nname = \"a\"\nmemory = \"1M\"\nnbd = false\nnvme = true\n\
             [[export]]\nname = \"b\"\nmemory = \"1M\"\n\
             nvme = { nqn = \"nqn.2026-11.com.example:b\", hosts = [\"nqn.2026-11.com.example:h\"] }\n",
        )
        .unwrap();
        let nvme = plan.nvme.unwrap();
        let nqns: Vec<&str> = nvme.exports.iter().map(|e| e.nqn.as_str()).collect();
        assert_eq!(
            nqns,
            ["nqn.2026-11.dev.blockwire:a", "nqn.2026-11.com.example:b"]
        );
        assert_eq!(nvme.exports[1].hosts, ["nqn.2026-11.com.example:h"]);
        assert_eq!(nvme.listen, ["127.0.0.1:4420".parse().unwrap()]);
        assert_eq!(nvme.discovery_listen, ["127.0.0.1:8009".parse().unwrap()]);
        let (exports, _, _) = plan.nbd.unwrap();
        assert_eq!(exports.iter().count(), 1);
    }

    #[test]
    fn no_nbd_export_means_no_nbd_target() {
        let plan =
            plan("[[export]]\nname = \"b\"\nmemory = \"1M\"\nnbd = false\niscsi = true\n").unwrap();
        assert!(plan.nbd.is_none());
        assert!(plan.iscsi.is_some());
    }
}
