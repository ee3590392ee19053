//! What `serve --config` serves right now, and applying a new configuration to it
//! while clients stay connected (SIGHUP).
//!
//! Everything the new configuration needs is built first (devices opened, targets
//! defined); a failure there refuses the reload and nothing changes. Then each
//! target gets its new set: NBD and iSCSI drain what they lose, AoE targets of
//! removed exports stop and new ones start. Unchanged exports keep their device and
//! their target objects, so their clients see nothing. Listeners are not moved: a
//! change to them is reported as needing a restart.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use blockwire_blockdev::Device;
use blockwire_iscsi::TargetDefinition;
use blockwire_nbd::{Export, ExportSet};

use crate::config::Config;
use crate::created_files::CreatedFiles;
use crate::defaults::DEFAULT_IQN_PREFIX;
use crate::metrics::Protocol;
use crate::reload_diff::{self, Change, ExportChange};
use crate::serve_aoe::{aoe_config, ServedAoe};
use crate::serve_export::export_from_section;
use crate::serve_iscsi::{self, iscsi_export};
use crate::serve_metrics::Meters;
use crate::serve_nvme::{self, nvme_export};
use crate::serve_plan::Loaded;
use crate::volumes::Volumes;

/// The running targets and what they serve.
pub struct Live {
    config: Config,
    devices: HashMap<String, Device>,
    volumes: HashMap<String, (Device, bool)>,
    nbd: Option<blockwire_nbd::ReloadHandle>,
    iscsi: Option<blockwire_iscsi::ReloadHandle>,
    nvme: Option<blockwire_nvme::ReloadHandle>,
    aoe: HashMap<String, ServedAoe>,
    meters: Option<Meters>,
    /// Shutting down: a late SIGHUP changes nothing.
    stopping: bool,
}

/// What a reload did, for the log and systemd's status line.
#[derive(Debug, Default)]
pub struct Applied {
    /// Exports added, removed or changed, per protocol.
    pub changed: usize,
    pub unchanged: usize,
}

/// The new sets, built before any target is touched.
struct Prepared {
    devices: HashMap<String, Device>,
    volumes: HashMap<String, (Device, bool)>,
    nbd: Option<ExportSet>,
    iscsi: Option<Vec<TargetDefinition>>,
    nvme: Option<Vec<Arc<blockwire_nvme::Subsystem>>>,
}

impl Live {
    pub fn new(
        loaded: Loaded,
        nbd: Option<blockwire_nbd::ReloadHandle>,
        iscsi: Option<blockwire_iscsi::ReloadHandle>,
        aoe: Vec<(String, ServedAoe)>,
        meters: Option<Meters>,
    ) -> Live {
        Live {
            config: loaded.config,
            devices: loaded.devices,
            volumes: loaded.volumes,
            nbd,
            iscsi,
            nvme: None,
            aoe: aoe.into_iter().collect(),
            meters,
            stopping: false,
        }
    }

    /// The same, with the NVMe/TCP target's reload handle (if it runs).
    pub fn with_nvme(mut self, nvme: Option<blockwire_nvme::ReloadHandle>) -> Live {
        self.nvme = nvme;
        self
    }

    /// The devices served over NVMe/TCP now (flushed by the caller on the way
    /// out).
    pub fn nvme_devices(&self) -> Vec<Device> {
        self.config
            .exports
            .iter()
            .filter(|s| s.nvme_settings().is_some())
            .filter_map(|s| self.devices.get(&s.name).cloned())
            .collect()
    }

    /// Shutting down: returns the AoE targets to stop and the devices served over
    /// iSCSI now (the final flush is the caller's); reloads are refused from now on.
    /// AoE targets serving now.
    pub fn aoe_targets(&self) -> usize {
        self.aoe.len()
    }

    pub fn shut_down(&mut self) -> (Vec<ServedAoe>, Vec<Device>) {
        self.stopping = true;
        let iscsi = self
            .config
            .exports
            .iter()
            .filter(|s| s.iscsi.as_ref().and_then(|i| i.settings()).is_some())
            .filter_map(|s| self.devices.get(&s.name).cloned())
            .collect();
        let aoe = self.aoe.drain().map(|(_, target)| target).collect();
        (aoe, iscsi)
    }

    /// Serves `next` from now on, or refuses it (the error says why) and serves
    /// what it served before.
    pub fn apply(&mut self, next: Config) -> Result<Applied> {
        if self.stopping {
            anyhow::bail!("the server is shutting down");
        }
        let changes = reload_diff::diff(&self.config, &next);
        for setting in reload_diff::restart_needed(&self.config, &next) {
            tracing::warn!("reload: {setting} changed; restart the service to apply it (the running value stays)");
        }
        // Files created for added exports go again if the reload is refused.
        let created = CreatedFiles::default();
        let prepared = match self.prepare(&next, &changes, &created) {
            Ok(prepared) => {
                created.keep();
                prepared
            }
            Err(e) => {
                created.remove_all();
                return Err(e);
            }
        };
        let mut applied = Applied::default();
        for change in &changes {
            if !self.can_serve(change.protocol) && change.change != Change::Removed {
                tracing::warn!(
                    "reload: export '{}' not served over {}: that target was not started; restart the service to serve it",
                    change.name,
                    change.protocol.label()
                );
                continue;
            }
            let name = &change.name;
            let protocol = change.protocol.label();
            match change.change {
                Change::Unchanged => applied.unchanged += 1,
                Change::Added => tracing::info!("reload: export '{name}' added ({protocol})"),
                Change::Removed => tracing::info!("reload: export '{name}' removed ({protocol})"),
                Change::Changed => tracing::info!(
                    "reload: export '{name}' changed ({protocol}): removed and added again"
                ),
            }
            if change.change != Change::Unchanged {
                applied.changed += 1;
            }
        }
        if let (Some(handle), Some(exports)) = (&self.nbd, prepared.nbd) {
            handle.replace(exports);
        }
        if let (Some(handle), Some(targets)) = (&self.iscsi, prepared.iscsi) {
            handle.replace(targets);
        }
        if let (Some(handle), Some(subsystems)) = (&self.nvme, prepared.nvme) {
            // Hosts of removed subsystems are let go after a grace period, on the
            // drain thread; nothing here waits for them.
            let (removed, _drain) = handle.replace(subsystems);
            for nqn in removed {
                tracing::info!("reload: NVMe subsystem {nqn} removed");
            }
        }
        self.apply_aoe(&next, &changes, &prepared.devices);
        tracing::info!("reload: unchanged {}", applied.unchanged);
        self.config = next;
        self.devices = prepared.devices;
        self.volumes = prepared.volumes;
        Ok(applied)
    }

    fn can_serve(&self, protocol: Protocol) -> bool {
        match protocol {
            Protocol::Nbd => self.nbd.is_some(),
            Protocol::Iscsi => self.iscsi.is_some(),
            Protocol::Nvme => self.nvme.is_some(),
            Protocol::Aoe => true,
        }
    }

    /// Opens the devices `next` needs anew and builds the NBD and iSCSI sets.
    fn prepare(
        &self,
        next: &Config,
        changes: &[ExportChange],
        created: &CreatedFiles,
    ) -> Result<Prepared> {
        let mut volumes = Volumes::new(&next.volumes, &next.exports);
        for (name, (device, read_only)) in &self.volumes {
            let section =
                |config: &Config| config.volumes.iter().find(|v| &v.name == name).cloned();
            if section(&self.config).is_some() && section(&self.config) == section(next) {
                volumes.keep(name, device.clone(), *read_only);
            }
        }
        let mut devices = HashMap::new();
        for section in &next.exports {
            let kept = self
                .devices
                .get(&section.name)
                .filter(|_| reload_diff::same_device(&self.config, next, &section.name));
            let device = match kept {
                Some(device) => device.clone(),
                None => export_from_section(section, &mut volumes, created)?.device,
            };
            devices.insert(section.name.clone(), device);
        }
        let unchanged = |name: &str, protocol: Protocol| {
            changes
                .iter()
                .any(|c| c.name == name && c.protocol == protocol && c.change == Change::Unchanged)
        };
        let nbd = match &self.nbd {
            Some(handle) => {
                let current = handle.exports();
                let mut set = ExportSet::new();
                for section in next.exports.iter().filter(|s| s.nbd) {
                    let name = &section.name;
                    let kept = current.iter().find(|e| &e.name == name);
                    match kept.filter(|_| unchanged(name, Protocol::Nbd)) {
                        Some(export) => set.add_shared(export.clone()),
                        None => {
                            let device = self.metered(&devices[name], name, Protocol::Nbd);
                            set.add(Export::new(name, &section.description, device))
                        }
                    }
                    .map_err(|e| anyhow!(e))?;
                }
                if let Some(name) = &next.server.default_export {
                    set.set_default(name).map_err(|e| anyhow!(e))?;
                }
                Some(set)
            }
            None => None,
        };
        let iscsi = match &self.iscsi {
            Some(handle) => Some(self.iscsi_targets(handle, next, &devices, &unchanged)?),
            None => None,
        };
        let nvme = match &self.nvme {
            Some(handle) => Some(self.nvme_subsystems(handle, next, &devices, &unchanged)?),
            None => None,
        };
        // Volumes no export names any more are let go.
        let volumes = volumes
            .opened()
            .into_iter()
            .filter(|(name, _)| next.exports.iter().any(|e| e.volume.as_ref() == Some(name)))
            .collect();
        Ok(Prepared {
            devices,
            volumes,
            nbd,
            iscsi,
            nvme,
        })
    }

    /// The subsystems `next` serves: unchanged ones kept as they are (their
    /// controllers see nothing), the others built anew.
    fn nvme_subsystems(
        &self,
        handle: &blockwire_nvme::ReloadHandle,
        next: &Config,
        devices: &HashMap<String, Device>,
        unchanged: &dyn Fn(&str, Protocol) -> bool,
    ) -> Result<Vec<Arc<blockwire_nvme::Subsystem>>> {
        let current = handle.subsystems();
        let mut subsystems = Vec::new();
        for section in &next.exports {
            let name = &section.name;
            let Some(mut export) = nvme_export(section, &devices[name]) else {
                continue;
            };
            let kept = current.iter().find(|s| s.nqn == export.nqn);
            match kept.filter(|_| unchanged(name, Protocol::Nvme)) {
                Some(subsystem) => subsystems.push(subsystem.clone()),
                None => {
                    export.device = self.metered(&export.device, name, Protocol::Nvme);
                    if let Some(sessions) = self.meters.as_ref().and_then(|m| m.nvme.as_ref()) {
                        sessions.serve_export(name);
                    }
                    subsystems.push(serve_nvme::subsystem(export));
                }
            }
        }
        serve_nvme::check_unique(&subsystems)?;
        Ok(subsystems)
    }

    fn iscsi_targets(
        &self,
        handle: &blockwire_iscsi::ReloadHandle,
        next: &Config,
        devices: &HashMap<String, Device>,
        unchanged: &dyn Fn(&str, Protocol) -> bool,
    ) -> Result<Vec<TargetDefinition>> {
        let current = handle.targets();
        let prefix = next
            .iscsi
            .iqn_prefix
            .as_deref()
            .unwrap_or(DEFAULT_IQN_PREFIX);
        let chap = serve_iscsi::section_chap(&next.iscsi)?;
        let mut targets = Vec::new();
        for section in &next.exports {
            let name = &section.name;
            let Some(mut export) = iscsi_export(prefix, section, &devices[name]) else {
                continue;
            };
            let kept = current.iter().find(|t| t.name == export.iqn);
            match kept.filter(|_| unchanged(name, Protocol::Iscsi)) {
                Some(target) => targets.push(target.clone()),
                None => {
                    export.device = self.metered(&export.device, name, Protocol::Iscsi);
                    if let Some(sessions) = self.meters.as_ref().and_then(|m| m.iscsi.as_ref()) {
                        sessions.serve_target(&export.iqn, name);
                    }
                    targets.push(serve_iscsi::definition(export, chap.clone())?);
                }
            }
        }
        serve_iscsi::check_unique(&targets)?;
        Ok(targets)
    }

    /// `device` counted as `name` over `protocol` when metrics are on.
    fn metered(&self, device: &Device, name: &str, protocol: Protocol) -> Device {
        match &self.meters {
            Some(meters) => {
                if let (Protocol::Nbd, Some(sessions)) = (protocol, &meters.nbd) {
                    sessions.serve_export(name);
                }
                meters.metrics.metered(device, name, protocol)
            }
            None => device.clone(),
        }
    }

    /// Stops the AoE targets of removed and changed exports, then starts the added
    /// and changed ones. A target that cannot start is logged; the rest go on.
    fn apply_aoe(
        &mut self,
        next: &Config,
        changes: &[ExportChange],
        devices: &HashMap<String, Device>,
    ) {
        let aoe = changes.iter().filter(|c| c.protocol == Protocol::Aoe);
        for change in aoe.clone() {
            if matches!(change.change, Change::Removed | Change::Changed) {
                if let Some(target) = self.aoe.remove(&change.name) {
                    if let Err(e) = target.stop() {
                        tracing::error!(
                            "reload: export '{}' (aoe): final flush failed: {e}",
                            change.name
                        );
                    }
                }
            }
        }
        for change in aoe {
            if !matches!(change.change, Change::Added | Change::Changed) {
                continue;
            }
            let name = &change.name;
            let Some(section) = next.exports.iter().find(|s| &s.name == name) else {
                continue;
            };
            let Some(settings) = &section.aoe else {
                continue;
            };
            let device = self.metered(&devices[name], name, Protocol::Aoe);
            match ServedAoe::start(name, device, aoe_config(settings)) {
                Ok(target) => {
                    target.announce(name);
                    self.aoe.insert(name.clone(), target);
                }
                Err(e) => tracing::error!(
                    "reload: {:#}",
                    e.context("the export is not served over AoE")
                ),
            }
        }
    }
}

/// Reads and checks the file as `serve` and `check-config` do: one validation,
/// one line naming the place at fault.
pub fn load(path: &std::path::Path) -> Result<Config> {
    Config::load(path)
}

/// Shared between the serving thread and the reload thread.
pub type Shared = Arc<std::sync::Mutex<Live>>;

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use blockwire_nbd::{NbdConfig, NbdTarget};

    use super::*;

    fn config(text: &str) -> Config {
        let config: Config = toml::from_str(text).unwrap();
        config.validate().unwrap();
        config
    }

    /// A live state serving `text` over an NBD server that is bound, not run.
    fn live(text: &str) -> (Live, NbdTarget) {
        let config = config(text);
        let mut volumes = Volumes::new(&config.volumes, &config.exports);
        let mut devices = HashMap::new();
        let mut set = ExportSet::new();
        for section in &config.exports {
            let export =
                export_from_section(section, &mut volumes, &CreatedFiles::default()).unwrap();
            devices.insert(section.name.clone(), export.device.clone());
            set.add(export).unwrap();
        }
        let listen = NbdConfig {
            tcp: vec!["127.0.0.1:0".parse().unwrap()],
            ..NbdConfig::default()
        };
        let server = NbdTarget::bind(set, listen).unwrap();
        let loaded = Loaded {
            config,
            devices,
            volumes: HashMap::new(),
        };
        let live = Live::new(loaded, Some(server.reload_handle()), None, Vec::new(), None);
        (live, server)
    }

    const OLD: &str = "[[export]]\nname = \"a\"\nmemory = \"1M\"\n\
                       [[export]]\nname = \"b\"\nmemory = \"1M\"\n";

    fn find(server: &NbdTarget, name: &str) -> Option<Arc<Export>> {
        server.exports().iter().find(|e| e.name == name).cloned()
    }

    #[test]
    fn unchanged_exports_stay_the_same_and_changed_ones_retire() {
        let (mut live, server) = live(OLD);
        let (a, b) = (find(&server, "a").unwrap(), find(&server, "b").unwrap());
        let new = "[[export]]\nname = \"a\"\nmemory = \"1M\"\n\
                   [[export]]\nname = \"b\"\nmemory = \"1M\"\nread_only = true\n\
                   [[export]]\nname = \"c\"\nmemory = \"2M\"\n";
        let applied = live.apply(config(new)).unwrap();
        assert_eq!((applied.changed, applied.unchanged), (2, 1));
        assert!(Arc::ptr_eq(&a, &find(&server, "a").unwrap()));
        assert!(!a.is_retired());
        let new_b = find(&server, "b").unwrap();
        assert!(!Arc::ptr_eq(&b, &new_b));
        assert!(b.is_retired());
        assert!(new_b.device.info().read_only);
        assert_eq!(find(&server, "c").unwrap().device.size(), 2 << 20);
    }

    #[test]
    fn an_export_that_cannot_open_refuses_the_whole_reload() {
        let (mut live, server) = live(OLD);
        let a = find(&server, "a").unwrap();
        let new = "[[export]]\nname = \"a\"\nmemory = \"1M\"\n\
                   [[export]]\nname = \"d\"\npath = \"/nonexistent/d.img\"\n";
        let error = live.apply(config(new)).unwrap_err();
        assert!(
            format!("{error:#}").contains("/nonexistent/d.img"),
            "{error:#}"
        );
        // Nothing changed: b is still served, a is the same export.
        assert!(find(&server, "b").is_some_and(|b| !b.is_retired()));
        assert!(Arc::ptr_eq(&a, &find(&server, "a").unwrap()));
        assert!(find(&server, "d").is_none());
    }

    #[test]
    fn no_reload_is_applied_once_shutting_down() {
        let (mut live, server) = live(OLD);
        let (aoe, iscsi) = live.shut_down();
        assert!(aoe.is_empty() && iscsi.is_empty());
        let new = "[[export]]\nname = \"c\"\nmemory = \"1M\"\n";
        assert!(live.apply(config(new)).is_err());
        assert!(find(&server, "a").is_some() && find(&server, "c").is_none());
    }
}
