//! The NVMe/TCP side of `blockwire serve`: one NVM subsystem per export, the export
//! as its namespace 1, with its NQN and allowed hosts from flags or the config, an
//! I/O port (4420) and a discovery port (8009) of its own.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::{Device, SessionMeter};
use blockwire_nvme::target::DiscoveryInUse;
use blockwire_nvme::{NvmeConfig, NvmeTarget, Subsystem};

use crate::config::{Config, ExportSection, NvmeSection};
use crate::config_validate::{nvme_discovery_listen, nvme_listen, resolve};
use crate::defaults::default_nqn;

/// One export served over NVMe/TCP.
pub struct NvmeExport {
    pub name: String,
    pub device: Device,
    pub nqn: String,
    /// Host NQNs allowed to connect (empty: every host).
    pub hosts: Vec<String>,
}

/// Everything the NVMe/TCP target needs from the command line or the config.
pub struct NvmePlan {
    pub listen: Vec<SocketAddr>,
    /// Discovery-only listeners (none: discovery on the I/O port only).
    pub discovery_listen: Vec<SocketAddr>,
    pub exports: Vec<NvmeExport>,
    pub workers: usize,
    /// Counts the target's connections per export (metrics on).
    pub sessions: Option<Arc<dyn SessionMeter>>,
}

/// How an export is served over NVMe/TCP, if its table asks for it.
pub fn nvme_export(section: &ExportSection, device: &Device) -> Option<NvmeExport> {
    let settings = section.nvme_settings()?;
    Some(NvmeExport {
        name: section.name.clone(),
        device: device.clone(),
        nqn: settings.nqn.unwrap_or_else(|| default_nqn(&section.name)),
        hosts: settings.hosts,
    })
}

/// Resolves each `HOST:PORT` (ports already defaulted).
fn resolve_all(texts: &[String]) -> Result<Vec<SocketAddr>> {
    let mut addrs = Vec::new();
    for text in texts {
        addrs.extend(resolve(text).map_err(|e| anyhow!(e))?);
    }
    Ok(addrs)
}

/// The I/O and discovery listeners of an `[nvme]` section, defaults applied.
pub fn listen_addrs(section: &NvmeSection) -> Result<(Vec<SocketAddr>, Vec<SocketAddr>)> {
    Ok((
        resolve_all(&nvme_listen(section))?,
        resolve_all(&nvme_discovery_listen(section))?,
    ))
}

/// The NVMe/TCP target a configuration asks for: its exports with an `nvme` key
/// and the `[nvme]` listeners; `None` when no export is served over NVMe/TCP.
pub fn plan_from_file(
    file: &Config,
    devices: &[(String, Device)],
    workers: usize,
) -> Result<Option<NvmePlan>> {
    let exports: Vec<NvmeExport> = file
        .exports
        .iter()
        .zip(devices)
        .filter_map(|(section, (_, device))| nvme_export(section, device))
        .collect();
    if exports.is_empty() {
        return Ok(None);
    }
    let (listen, discovery_listen) = listen_addrs(&file.nvme)?;
    Ok(Some(NvmePlan {
        listen,
        discovery_listen,
        exports,
        workers: file.server.workers.unwrap_or(workers),
        sessions: None,
    }))
}

/// The subsystem of one export.
pub fn subsystem(export: NvmeExport) -> Arc<Subsystem> {
    Arc::new(
        Subsystem::new(&export.name, export.device)
            .with_nqn(export.nqn)
            .with_allowed_hosts(export.hosts),
    )
}

/// Refuses two exports served as one subsystem NQN.
pub fn check_unique(subsystems: &[Arc<Subsystem>]) -> Result<()> {
    for (index, subsystem) in subsystems.iter().enumerate() {
        if subsystems[..index].iter().any(|s| s.nqn == subsystem.nqn) {
            bail!("two exports are served as NVMe subsystem {}", subsystem.nqn);
        }
    }
    Ok(())
}

/// Binds the NVMe/TCP target for a plan.
pub fn bind(plan: NvmePlan) -> Result<NvmeTarget> {
    let subsystems: Vec<Arc<Subsystem>> = plan.exports.into_iter().map(subsystem).collect();
    check_unique(&subsystems)?;
    let mut config = NvmeConfig::new(plan.listen);
    config.discovery_listen = plan.discovery_listen;
    config.workers = plan.workers;
    config.sessions = plan.sessions;
    NvmeTarget::bind(config, subsystems).map_err(|e| match discovery_in_use(&e) {
        Some(busy) => anyhow!("{}", discovery_hint(busy)),
        None => anyhow!(e).context("cannot start the NVMe/TCP target"),
    })
}

fn discovery_in_use(error: &std::io::Error) -> Option<DiscoveryInUse> {
    error.get_ref()?.downcast_ref::<DiscoveryInUse>().copied()
}

/// One line for a discovery address in use. Hosts look for discovery on 8009
/// (`nvme discover` without --trsvcid), so the target does not move to a free
/// port behind the user's back: a second target chooses another port or none
/// (its I/O port answers discovery too). Not an `AddrInUse` io::Error any more,
/// so the I/O listeners' hint (--nvme) is not added to it.
fn discovery_hint(busy: DiscoveryInUse) -> String {
    format!(
        "{busy}: give this target's discovery controller another address with \
         --nvme-discovery HOST:PORT, or none with --no-nvme-discovery \
         ([nvme] discovery_listen or discovery = false in a config file)"
    )
}

/// `HOST:PORT`, bracketing an IPv6 address.
fn host_port(addr: &SocketAddr) -> String {
    match addr {
        SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
    }
}

/// The lines [`announce`] prints: each subsystem's URI on each I/O address, then
/// the discovery addresses.
pub fn announcement(
    nqns: &[String],
    local: &[SocketAddr],
    discovery: &[SocketAddr],
) -> Vec<String> {
    let mut lines = Vec::new();
    for nqn in nqns {
        for addr in local {
            lines.push(format!("nvme+tcp://{}/{nqn}", host_port(addr)));
        }
    }
    for addr in discovery {
        lines.push(format!("nvme discovery: nvme+tcp://{}", host_port(addr)));
    }
    lines
}

/// Prints where each subsystem and the discovery controller are reachable.
pub fn announce(target: &NvmeTarget) {
    let lines = announcement(
        &target.subsystem_nqns(),
        &target.local_addrs(),
        &target.discovery_addrs(),
    );
    for line in lines {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::MemoryDevice;

    #[test]
    fn each_subsystem_is_announced_on_each_address_then_discovery() {
        let lines = announcement(
            &["nqn.2026-11.dev.blockwire:a".into()],
            &["127.0.0.1:4420".parse().unwrap()],
            &["127.0.0.1:8009".parse().unwrap()],
        );
        assert_eq!(
            lines,
            [
                "nvme+tcp://127.0.0.1:4420/nqn.2026-11.dev.blockwire:a",
                "nvme discovery: nvme+tcp://127.0.0.1:8009",
            ]
        );
    }

    #[test]
    fn a_discovery_address_in_use_says_how_to_choose_another() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let busy = holder.local_addr().unwrap();
        let plan = NvmePlan {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            discovery_listen: vec![busy],
            exports: vec![NvmeExport {
                name: "a".into(),
                device: Device::from_device(MemoryDevice::new(1 << 20)),
                nqn: default_nqn("a"),
                hosts: Vec::new(),
            }],
            workers: 1,
            sessions: None,
        };
        // As serve reports it, through the I/O listeners' hint, which must not
        // apply: the flag to change is --nvme-discovery, not --nvme.
        let error = crate::serve_start::busy_hint(
            bind(plan).err().unwrap(),
            "NVMe/TCP",
            "--nvme",
            "[nvme] listen",
        );
        let error = format!("{error:#}");
        assert!(error.contains(&format!("discovery on {busy}")), "{error}");
        assert!(error.contains("--nvme-discovery HOST:PORT"), "{error}");
        assert!(error.contains("--no-nvme-discovery"), "{error}");
        assert!(!error.contains("--nvme HOST:PORT"), "{error}");
        assert!(!error.contains('\n'), "{error}");
    }

    #[test]
    fn a_plan_binds_and_names_its_subsystems() {
        let device = Device::from_device(MemoryDevice::new(1 << 20));
        let plan = NvmePlan {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            discovery_listen: vec!["127.0.0.1:0".parse().unwrap()],
            exports: vec![NvmeExport {
                name: "a".into(),
                device: device.clone(),
                nqn: default_nqn("a"),
                hosts: Vec::new(),
            }],
            workers: 2,
            sessions: None,
        };
        let target = bind(plan).unwrap();
        assert_eq!(target.subsystem_nqns(), ["nqn.2026-11.dev.blockwire:a"]);
        assert_ne!(target.local_addrs()[0].port(), 0);
        assert_eq!(target.discovery_addrs().len(), 1);
        let twice = NvmePlan {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            discovery_listen: Vec::new(),
            exports: ["a", "b"]
                .map(|name| NvmeExport {
                    name: name.into(),
                    device: device.clone(),
                    nqn: "nqn.2026-11.com.example:same".into(),
                    hosts: Vec::new(),
                })
                .into(),
            workers: 2,
            sessions: None,
        };
        let error = bind(twice).err().unwrap();
        assert!(format!("{error:#}").contains("two exports"), "{error:#}");
    }
}
