//! What a reload changes: two configurations compared export by export and
//! protocol by protocol. An export whose definition differs in anything its
//! protocol uses (the device, the description, the iSCSI or AoE settings) is
//! changed, which the target treats as removed and added again.

use std::collections::BTreeMap;

use crate::config::{Config, ExportSection, IscsiSection, VolumeSection};
use crate::metrics::Protocol;

/// What happened to one export over one protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added,
    Removed,
    /// Served before and after, defined differently: removed and added again.
    Changed,
    Unchanged,
}

/// One line of a diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportChange {
    pub name: String,
    pub protocol: Protocol,
    pub change: Change,
}

/// Where the bytes of an export come from: its section without what only the
/// protocols use, and the volume it names.
#[derive(Debug, PartialEq)]
struct DeviceDefinition {
    section: ExportSection,
    volume: Option<VolumeSection>,
}

fn device_definition(config: &Config, section: &ExportSection) -> DeviceDefinition {
    let mut plain = section.clone();
    plain.description.clear();
    plain.nbd = true;
    plain.aoe = None;
    plain.iscsi = None;
    plain.nvme = None;
    let volume = section
        .volume
        .as_ref()
        .and_then(|name| config.volumes.iter().find(|v| &v.name == name).cloned());
    DeviceDefinition {
        section: plain,
        volume,
    }
}

/// Everything one protocol serves an export with, compared as a whole.
#[derive(Debug, PartialEq)]
enum Definition {
    Nbd(DeviceDefinition, String),
    Iscsi(
        DeviceDefinition,
        crate::config::IscsiExportSettings,
        IscsiSection,
    ),
    Aoe(DeviceDefinition, crate::config::AoeSection),
    Nvme(DeviceDefinition, crate::config::NvmeExportSettings),
}

/// The definition of `section` over `protocol`, if it is served over it.
fn definition(config: &Config, section: &ExportSection, protocol: Protocol) -> Option<Definition> {
    let device = || device_definition(config, section);
    match protocol {
        Protocol::Nbd => section
            .nbd
            .then(|| Definition::Nbd(device(), section.description.clone())),
        Protocol::Iscsi => {
            let settings = section.iscsi.as_ref()?.settings()?;
            // The listeners need a restart; names and secrets apply per target.
            let shared = IscsiSection {
                listen: Vec::new(),
                ..config.iscsi.clone()
            };
            Some(Definition::Iscsi(device(), settings, shared))
        }
        Protocol::Aoe => section
            .aoe
            .clone()
            .map(|aoe| Definition::Aoe(device(), aoe)),
        // The listeners need a restart; the NQN and hosts apply per subsystem.
        Protocol::Nvme => section
            .nvme_settings()
            .map(|nvme| Definition::Nvme(device(), nvme)),
    }
}

const PROTOCOLS: [Protocol; 4] = [
    Protocol::Nbd,
    Protocol::Iscsi,
    Protocol::Aoe,
    Protocol::Nvme,
];

/// Every export of either configuration, over every protocol either serves it
/// with, in name order.
pub fn diff(old: &Config, new: &Config) -> Vec<ExportChange> {
    let mut names: BTreeMap<&str, (Option<&ExportSection>, Option<&ExportSection>)> =
        BTreeMap::new();
    for section in &old.exports {
        names.entry(&section.name).or_default().0 = Some(section);
    }
    for section in &new.exports {
        names.entry(&section.name).or_default().1 = Some(section);
    }
    let mut changes = Vec::new();
    for (name, (before, after)) in names {
        for protocol in PROTOCOLS {
            let before = before.and_then(|s| definition(old, s, protocol));
            let after = after.and_then(|s| definition(new, s, protocol));
            let change = match (before, after) {
                (None, None) => continue,
                (None, Some(_)) => Change::Added,
                (Some(_), None) => Change::Removed,
                (Some(a), Some(b)) if a == b => Change::Unchanged,
                (Some(_), Some(_)) => Change::Changed,
            };
            changes.push(ExportChange {
                name: name.to_string(),
                protocol,
                change,
            });
        }
    }
    changes
}

/// Whether the export `name` reads and writes the same device in both.
pub fn same_device(old: &Config, new: &Config, name: &str) -> bool {
    let find = |config: &Config| {
        config
            .exports
            .iter()
            .find(|s| s.name == name)
            .map(|s| device_definition(config, s))
    };
    matches!((find(old), find(new)), (Some(a), Some(b)) if a == b)
}

/// The settings that differ and take a restart to apply: listeners, limits and
/// TLS of the NBD server, the iSCSI listeners, the metrics endpoint.
pub fn restart_needed(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut needed = Vec::new();
    let server = |config: &Config| crate::config::ServerSection {
        // Which export the empty name selects changes live.
        default_export: None,
        ..config.server.clone()
    };
    if server(old) != server(new) {
        needed.push("[server]");
    }
    if old.iscsi.listen != new.iscsi.listen {
        needed.push("[iscsi] listen");
    }
    if old.nvme != new.nvme {
        needed.push("[nvme]");
    }
    if old.metrics != new.metrics {
        needed.push("[metrics]");
    }
    needed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        let config: Config = toml::from_str(text).unwrap();
        config.validate().unwrap();
        config
    }

    fn changes(old: &str, new: &str) -> Vec<(String, &'static str, Change)> {
        diff(&config(old), &config(new))
            .into_iter()
            .map(|c| (c.name, c.protocol.label(), c.change))
            .collect()
    }

    const BASE: &str = r#"
        [[export]]
        name = "a"
        memory = "1M"
        [[export]]
        name = "b"
        path = "/srv/b.img"
        iscsi = true
    "#;

    #[test]
    fn identical_files_change_nothing() {
        assert_eq!(
            changes(BASE, BASE),
            vec![
                ("a".into(), "nbd", Change::Unchanged),
                ("b".into(), "nbd", Change::Unchanged),
                ("b".into(), "iscsi", Change::Unchanged),
            ]
        );
    }

    #[test]
    fn added_removed_and_changed_exports_are_told_apart() {
        let new = r#"
            [[export]]
            name = "b"
            path = "/srv/b.img"
            read_only = true
            iscsi = true
            [[export]]
            name = "c"
            memory = "1M"
            aoe = { interfaces = ["eth0"], shelf = 1, slot = 2 }
        "#;
        assert_eq!(
            changes(BASE, new),
            vec![
                ("a".into(), "nbd", Change::Removed),
                ("b".into(), "nbd", Change::Changed),
                ("b".into(), "iscsi", Change::Changed),
                ("c".into(), "nbd", Change::Added),
                ("c".into(), "aoe", Change::Added),
            ]
        );
    }

    #[test]
    fn a_protocol_setting_changes_only_that_protocol() {
        let new = r#"
            [[export]]
            name = "a"
            memory = "1M"
            description = "now described"
            [[export]]
            name = "b"
            path = "/srv/b.img"
            iscsi = { block_size = 4096 }
            aoe = { interfaces = ["eth0"], shelf = 1, slot = 2 }
        "#;
        assert_eq!(
            changes(BASE, new),
            vec![
                ("a".into(), "nbd", Change::Changed),
                ("b".into(), "nbd", Change::Unchanged),
                ("b".into(), "iscsi", Change::Changed),
                ("b".into(), "aoe", Change::Added),
            ]
        );
        assert!(same_device(&config(BASE), &config(new), "b"));
    }

    #[test]
    fn a_changed_volume_changes_the_exports_on_it() {
        let volume = |chunk: &str| {
            format!(
                "[[volume]]\nname = \"v\"\nchunk = \"{chunk}\"\nmembers = [\"/a\", \"/b\"]\n\
                 [[export]]\nname = \"s\"\nvolume = \"v\"\n"
            )
        };
        let (old, new) = (config(&volume("64K")), config(&volume("1M")));
        assert!(!same_device(&old, &new, "s"));
        assert_eq!(diff(&old, &new)[0].change, Change::Changed);
    }

    #[test]
    fn listeners_need_a_restart_but_the_default_export_does_not() {
        let old = config(BASE);
        let moved = config(&format!("[server]\nlisten = [\"0.0.0.0:10809\"]\n{BASE}"));
        assert_eq!(restart_needed(&old, &moved), vec!["[server]"]);
        let defaulted = config(&format!("[server]\ndefault_export = \"b\"\n{BASE}"));
        assert!(restart_needed(&old, &defaulted).is_empty());
        let iscsi = config(&format!("{BASE}\n[iscsi]\nlisten = [\"0.0.0.0:3260\"]\n"));
        assert_eq!(restart_needed(&old, &iscsi), vec!["[iscsi] listen"]);
        let nvme = config(&format!("{BASE}\n[nvme]\nlisten = \"0.0.0.0\"\n"));
        assert_eq!(restart_needed(&old, &nvme), vec!["[nvme]"]);
    }

    #[test]
    fn an_nvme_subsystem_is_added_changed_and_removed_on_its_own() {
        let with = |nvme: &str| format!("{BASE}{nvme}");
        let added = config(&with("nvme = true\n"));
        let named = config(&with("nvme = { nqn = \"nqn.2026-11.com.example:b\" }\n"));
        let nvme_of = |old: &Config, new: &Config| {
            diff(old, new)
                .into_iter()
                .filter(|c| c.protocol == Protocol::Nvme)
                .map(|c| (c.name, c.change))
                .collect::<Vec<_>>()
        };
        let base = config(BASE);
        assert_eq!(nvme_of(&base, &added), [("b".to_string(), Change::Added)]);
        assert_eq!(
            nvme_of(&added, &named),
            [("b".to_string(), Change::Changed)]
        );
        assert_eq!(nvme_of(&named, &base), [("b".to_string(), Change::Removed)]);
        assert_eq!(
            nvme_of(&added, &added),
            [("b".to_string(), Change::Unchanged)]
        );
    }
}
