//! The iSCSI side of `blockwire serve`: one iSCSI target per export, the export as
//! its LUN 0, with names, block sizes and CHAP secrets from flags or the config.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use blockwire_blockdev::{Device, SessionMeter};
use blockwire_iscsi::login::ChapConfig;
use blockwire_iscsi::{IscsiConfig, IscsiTarget, TargetDefinition};
use blockwire_scsi::{LogicalUnit, LunConfig, ScsiTarget};

use crate::config::{Config, ExportSection, IscsiExport as IscsiExportConfig, IscsiSection};
use crate::defaults::{
    default_iqn, CHAP_SECRET_ENV, DEFAULT_IQN_PREFIX, ISCSI_LISTEN, MUTUAL_CHAP_SECRET_ENV,
};

/// One export served over iSCSI.
pub struct IscsiExport {
    pub name: String,
    pub device: Device,
    pub iqn: String,
    pub block_size: u32,
    pub initiators: Vec<String>,
    pub alias: Option<String>,
}

/// Everything the iSCSI target needs from the command line or the config.
pub struct IscsiPlan {
    pub listen: Vec<SocketAddr>,
    pub exports: Vec<IscsiExport>,
    pub chap: Option<ChapConfig>,
    pub discovery_chap: bool,
    pub workers: usize,
    /// Counts the target's sessions (metrics on).
    pub sessions: Option<Arc<dyn SessionMeter>>,
}

/// How an export is served over iSCSI, if its table asks for it: the target name
/// is `prefix:NAME` unless the table gives one.
pub fn iscsi_export(prefix: &str, section: &ExportSection, device: &Device) -> Option<IscsiExport> {
    let settings = section
        .iscsi
        .as_ref()
        .and_then(IscsiExportConfig::settings)?;
    Some(IscsiExport {
        name: section.name.clone(),
        device: device.clone(),
        iqn: settings
            .iqn
            .unwrap_or_else(|| default_iqn(prefix, &section.name)),
        block_size: settings.block_size.unwrap_or(512),
        initiators: settings.initiators,
        alias: settings.alias,
    })
}

/// The iSCSI target's listeners: `listen`, or loopback's iSCSI port.
pub fn listen_addrs(listen: &[String]) -> Result<Vec<SocketAddr>> {
    let defaults = [ISCSI_LISTEN.to_string()];
    let listen = if listen.is_empty() {
        &defaults[..]
    } else {
        listen
    };
    let mut addrs = Vec::new();
    for addr in listen {
        addrs.extend(crate::config_validate::resolve(addr).map_err(|e| anyhow!(e))?);
    }
    Ok(addrs)
}

/// The iSCSI target a configuration asks for: its exports with an `iscsi` table,
/// the `[iscsi]` listeners and secrets; `None` when no export is served over iSCSI.
pub fn plan_from_file(
    file: &Config,
    devices: &[(String, Device)],
    workers: usize,
) -> Result<Option<IscsiPlan>> {
    let prefix = file
        .iscsi
        .iqn_prefix
        .as_deref()
        .unwrap_or(DEFAULT_IQN_PREFIX);
    let exports: Vec<IscsiExport> = file
        .exports
        .iter()
        .zip(devices)
        .filter_map(|(section, (_, device))| iscsi_export(prefix, section, device))
        .collect();
    if exports.is_empty() {
        return Ok(None);
    }
    let section = &file.iscsi;
    let chap = section_chap(section)?;
    Ok(Some(IscsiPlan {
        listen: listen_addrs(&section.listen)?,
        exports,
        chap,
        discovery_chap: section.discovery_chap,
        workers: file.server.workers.unwrap_or(workers),
        sessions: None,
    }))
}

/// Where the CHAP secrets come from.
pub struct ChapSources<'a> {
    pub user: Option<&'a str>,
    pub secret_file: Option<&'a Path>,
    pub mutual_user: Option<&'a str>,
    pub mutual_secret_file: Option<&'a Path>,
}

/// The CHAP settings of a config file's `[iscsi]` section; see [`chap_config`].
pub fn section_chap(section: &IscsiSection) -> Result<Option<ChapConfig>> {
    chap_config(&ChapSources {
        user: section.chap_user.as_deref(),
        secret_file: section.chap_secret_file.as_deref(),
        mutual_user: section.mutual_chap_user.as_deref(),
        mutual_secret_file: section.mutual_chap_secret_file.as_deref(),
    })
}

/// The CHAP settings, reading secrets from their files or the environment (never
/// from the command line, where every user of the machine could read them).
pub fn chap_config(sources: &ChapSources<'_>) -> Result<Option<ChapConfig>> {
    let Some(user) = sources.user else {
        if sources.secret_file.is_some() || sources.mutual_user.is_some() {
            bail!("CHAP secrets need a CHAP user name (--chap-user, chap_user)");
        }
        return Ok(None);
    };
    let secret = read_secret(sources.secret_file, CHAP_SECRET_ENV)?;
    let mutual = match sources.mutual_user {
        Some(mutual_user) => Some((
            mutual_user.to_string(),
            read_secret(sources.mutual_secret_file, MUTUAL_CHAP_SECRET_ENV)?,
        )),
        None => None,
    };
    Ok(Some(ChapConfig {
        user: user.to_string(),
        secret,
        mutual,
    }))
}

fn read_secret(file: Option<&Path>, env: &str) -> Result<Vec<u8>> {
    let secret = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read CHAP secret file {}", path.display()))?;
            text.lines().next().unwrap_or("").trim_end().to_string()
        }
        None => std::env::var(env)
            .map_err(|_| anyhow!("a CHAP secret is needed: give its file, or set {env}"))?,
    };
    if secret.is_empty() {
        bail!("the CHAP secret is empty");
    }
    if secret.len() < 12 {
        // RFC 7143 §12.1.3 wants at least 96 bits for secrets that are not random.
        tracing::warn!("a CHAP secret shorter than 12 bytes is easy to guess");
    }
    Ok(secret.into_bytes())
}

/// A stable 64-bit identity for a LUN (its NAA designator and serial), from its
/// target name: FNV-1a, so the same name gives the same ID across restarts.
fn stable_id(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The iSCSI target of one export: the export as LUN 0, CHAP as given.
pub fn definition(export: IscsiExport, chap: Option<ChapConfig>) -> Result<TargetDefinition> {
    let id = stable_id(&export.iqn);
    let unit = LogicalUnit::new(
        export.device,
        LunConfig {
            block_size: export.block_size,
            vendor: "BLKWIRE".into(),
            product: "blockwire disk".into(),
            // INQUIRY has four bytes for it: "0.1" of version 0.1.0.
            revision: format!(
                "{}.{}",
                env!("CARGO_PKG_VERSION_MAJOR"),
                env!("CARGO_PKG_VERSION_MINOR")
            ),
            serial: format!("{id:016x}"),
            unique_id: id,
            target_name: export.iqn.clone(),
        },
    )
    .map_err(|e| anyhow!("export '{}': {e}", export.name))?;
    let mut scsi = ScsiTarget::new();
    scsi.add_lun(0, Arc::new(unit));
    Ok(TargetDefinition {
        name: export.iqn,
        alias: export.alias.or(Some(export.name)),
        scsi: Arc::new(scsi),
        allowed_initiators: export.initiators,
        chap,
    })
}

/// Refuses two exports served as one target name.
pub fn check_unique(targets: &[TargetDefinition]) -> Result<()> {
    for (index, target) in targets.iter().enumerate() {
        if targets[..index].iter().any(|t| t.name == target.name) {
            bail!("two exports are served as iSCSI target {}", target.name);
        }
    }
    Ok(())
}

/// Binds the iSCSI target for a plan.
pub fn bind(plan: IscsiPlan) -> Result<IscsiTarget> {
    let targets = plan
        .exports
        .into_iter()
        .map(|export| definition(export, plan.chap.clone()))
        .collect::<Result<Vec<_>>>()?;
    check_unique(&targets)?;
    let mut config = IscsiConfig::new(plan.listen, targets);
    config.workers = plan.workers;
    config.sessions = plan.sessions;
    if plan.discovery_chap {
        config.discovery_chap = plan.chap.clone();
    }
    IscsiTarget::bind(config).context("cannot start the iSCSI target")
}

/// Prints where each target is reachable.
pub fn announce(target: &IscsiTarget) {
    for name in target.target_names() {
        println!("iscsi target {name} (LUN 0):");
        for addr in target.local_addrs() {
            let host = match addr {
                SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
                SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
            };
            println!("  iscsi://{host}/{name}/0");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_ids_differ_by_name() {
        assert_eq!(stable_id("a"), stable_id("a"));
        assert_ne!(stable_id("a"), stable_id("b"));
    }

    #[test]
    fn chap_needs_a_user_for_its_secret() {
        let file = std::env::temp_dir().join(format!("bw-chap-{}", std::process::id()));
        std::fs::write(&file, "averylongsecret\n").unwrap();
        let sources = ChapSources {
            user: Some("alice"),
            secret_file: Some(&file),
            mutual_user: None,
            mutual_secret_file: None,
        };
        let chap = chap_config(&sources).unwrap().unwrap();
        assert_eq!(chap.user, "alice");
        assert_eq!(chap.secret, b"averylongsecret");
        let no_user = ChapSources {
            user: None,
            ..sources
        };
        assert!(chap_config(&no_user).is_err());
        std::fs::remove_file(&file).unwrap();
    }
}
