//! The one validation of a configuration, shared by `check-config`, `serve --config`,
//! `serve PATH` (its flags as a one-export configuration) and reload: everything that
//! can be known without binding a port or opening a device. [`validate`] reads the
//! configuration alone; [`check_environment`] also looks at the files, secrets and
//! network interfaces it names.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use blockwire_blockdev::size::{format_size, parse_size};

use anyhow::anyhow;

use crate::config::{Config, ExportSection, IscsiExport, NvmeSection};
use crate::config_error::{ConfigError, Table};
use crate::defaults::{default_iqn, DEFAULT_IQN_PREFIX};
pub use crate::defaults::{ISCSI_LISTEN, NBD_LISTEN, NVME_LISTEN};
use crate::defaults::{NVME_DISCOVERY_PORT, NVME_PORT};
/// AoE's broadcast addresses: a target may not take them.
const AOE_BROADCAST_SHELF: u16 = 0xffff;
const AOE_BROADCAST_SLOT: u8 = 0xff;

impl Config {
    /// Reads, parses and checks the file at `path`: the one validation
    /// ([`validate`] and [`check_environment`]), files and interfaces included. An error is one
    /// line, `FILE:LINE: export 'NAME': KEY: what is wrong (what is allowed)`.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow!(
                "cannot read config file {}: {}",
                path.display(),
                io_text(&e)
            )
        })?;
        Config::parse(path, &text)
    }

    /// Parses and checks `text`, the contents of the file at `path`.
    pub fn parse(path: &Path, text: &str) -> anyhow::Result<Config> {
        let config: Config = toml::from_str(text)
            .map_err(|e| anyhow!(crate::config_error::parse_error(path, text, &e)))?;
        config
            .validate()
            .and_then(|()| check_environment(&config))
            .map_err(|e| anyhow!(e.in_file(path, text)))?;
        Ok(config)
    }

    /// Checks what the types cannot, without looking outside the configuration.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate(self)
    }
}

fn error(table: Table, key: &'static str, message: String) -> ConfigError {
    ConfigError::new(Some(table), Some(key), message)
}

/// Checks what the types cannot; the first mistake found, in file order.
pub fn validate(config: &Config) -> Result<(), ConfigError> {
    if config.exports.is_empty() {
        return Err(ConfigError::new(
            None,
            None,
            "the file defines no [[export]] (add one with a name and a path, memory or volume)"
                .into(),
        ));
    }
    for (index, export) in config.exports.iter().enumerate() {
        validate_export(config, index, export)?;
    }
    validate_aoe_addresses(config)?;
    validate_iqns(config)?;
    validate_nqns(config)?;
    for (index, volume) in config.volumes.iter().enumerate() {
        let table = Table::Volume(index);
        if config.volumes[..index]
            .iter()
            .any(|v| v.name == volume.name)
        {
            return Err(error(
                table,
                "name",
                format!(
                    "two [[volume]] tables are named '{}' (names must differ)",
                    volume.name
                ),
            ));
        }
        if volume.members.is_empty() {
            return Err(error(
                table,
                "members",
                "the volume has no members (list paths or URIs)".into(),
            ));
        }
        match parse_size(&volume.chunk) {
            Ok(0) => {
                return Err(error(
                    table,
                    "chunk",
                    "must be above zero (e.g. \"64K\")".into(),
                ));
            }
            Ok(_) => {}
            Err(e) => return Err(error(table, "chunk", e)),
        }
    }
    validate_server(config)?;
    validate_iscsi_section(config)?;
    validate_nvme_section(config)?;
    validate_listeners(config)?;
    Ok(())
}

fn validate_export(
    config: &Config,
    index: usize,
    export: &ExportSection,
) -> Result<(), ConfigError> {
    let table = Table::Export(index);
    if export.name.is_empty() {
        return Err(error(
            table,
            "name",
            "is empty (give the name clients ask for)".into(),
        ));
    }
    if config.exports[..index]
        .iter()
        .any(|e| e.name == export.name)
    {
        return Err(error(
            table,
            "name",
            format!(
                "two [[export]] tables are named '{}' (names must differ)",
                export.name
            ),
        ));
    }
    let iscsi = export.iscsi.as_ref().and_then(IscsiExport::settings);
    let nvme = export.nvme_settings();
    if !export.nbd && export.aoe.is_none() && iscsi.is_none() && nvme.is_none() {
        return Err(error(
            table,
            "nbd",
            "the export is served by no protocol (nbd = true, an aoe table, iscsi = true or \
             nvme = true)"
                .into(),
        ));
    }
    let sources = [
        export.path.is_some(),
        export.memory.is_some(),
        export.volume.is_some(),
    ];
    if sources.iter().filter(|&&given| given).count() != 1 {
        return Err(ConfigError::new(
            Some(table),
            None,
            "give exactly one of path, memory or volume".into(),
        ));
    }
    if let Some(memory) = &export.memory {
        positive_size(table, "memory", memory)?;
    }
    if let Some(size) = &export.size {
        positive_size(table, "size", size)?;
        if export.path.is_none() || export.rbd_spec().is_some() {
            return Err(error(
                table,
                "size",
                "applies to a path of a file only".into(),
            ));
        }
    }
    if let Some(write_behind) = &export.write_behind {
        parse_size(write_behind).map_err(|e| error(table, "write_behind", e))?;
    }
    if export.rbd.is_some() && export.rbd_spec().is_none() {
        return Err(error(
            table,
            "rbd",
            "an rbd table needs a path of rbd:POOL/IMAGE".into(),
        ));
    }
    if let Some(Err(e)) = export.rbd_spec() {
        let message = e
            .split_once("': ")
            .map_or(e.as_str(), |(_, m)| m)
            .to_string();
        return Err(error(table, "path", message));
    }
    if let Some(path) = export.path.as_deref() {
        if let Err(e) = crate::device_spec::remote_target(path) {
            return Err(error(table, "path", format!("{e:#}")));
        }
    }
    if let Some(volume) = &export.volume {
        if !config.volumes.iter().any(|v| &v.name == volume) {
            let known: Vec<&str> = config.volumes.iter().map(|v| v.name.as_str()).collect();
            let known = if known.is_empty() {
                "there is none".to_string()
            } else {
                format!("there are {}", known.join(", "))
            };
            return Err(error(
                table,
                "volume",
                format!("no [[volume]] named '{volume}' ({known})"),
            ));
        }
    }
    if let Some(rate) = export.disk_rate {
        crate::throttle::rate_from_mb(rate).map_err(|m| error(table, "disk_rate", m))?;
    }
    if let Some(ms) = export.disk_latency {
        crate::throttle::latency_from_ms(ms).map_err(|m| error(table, "disk_latency", m))?;
    }
    if let Some(aoe) = &export.aoe {
        if aoe.interfaces.is_empty() {
            return Err(error(
                table,
                "aoe.interfaces",
                "names no interface (e.g. [\"eth0\"])".into(),
            ));
        }
        if aoe.shelf == AOE_BROADCAST_SHELF {
            return Err(error(
                table,
                "aoe.shelf",
                "65535 is AoE's broadcast shelf (0-65534)".into(),
            ));
        }
        if aoe.slot == AOE_BROADCAST_SLOT {
            return Err(error(
                table,
                "aoe.slot",
                "255 is AoE's broadcast slot (0-254)".into(),
            ));
        }
        if aoe.buffer_count == Some(0) {
            return Err(error(
                table,
                "aoe.buffer_count",
                "0 frames (1-65535)".into(),
            ));
        }
    }
    if let Some(settings) = &iscsi {
        if let Some(size) = settings.block_size {
            if size != 512 && size != 4096 {
                return Err(error(
                    table,
                    "iscsi.block_size",
                    format!("{size} (512 or 4096)"),
                ));
            }
        }
        if let Some(iqn) = &settings.iqn {
            check_iqn(iqn).map_err(|m| error(table, "iscsi.iqn", m))?;
        }
    }
    if let Some(settings) = &nvme {
        if let Some(nqn) = &settings.nqn {
            check_nqn(nqn).map_err(|m| error(table, "nvme.nqn", m))?;
        }
        for host in &settings.hosts {
            check_nqn(host).map_err(|m| error(table, "nvme.hosts", m))?;
        }
    }
    Ok(())
}

/// The NQN of the NVMe-oF discovery controller, which no subsystem may take.
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The NQN form built from a UUID (NVMe base spec, 4.5).
const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// An NVMe Qualified Name as the NVMe base specification (4.5) spells it: at most
/// 223 bytes, either `nqn.2014-08.org.nvmexpress:uuid:` and a UUID, or
/// `nqn.YYYY-MM.` a reverse domain name, `:` and a name of the owner's choosing.
pub fn check_nqn(nqn: &str) -> Result<(), String> {
    let form = "nqn.YYYY-MM.reverse.domain:name, or nqn.2014-08.org.nvmexpress:uuid:UUID";
    if nqn.len() > 223 {
        return Err(format!(
            "'{nqn}' is {} bytes (an NQN has at most 223)",
            nqn.len()
        ));
    }
    if nqn.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("'{nqn}' holds spaces ({form})"));
    }
    if nqn == DISCOVERY_NQN {
        return Err(format!(
            "'{nqn}' is the discovery controller's name ({form})"
        ));
    }
    if let Some(uuid) = nqn.strip_prefix(UUID_NQN_PREFIX) {
        let groups: Vec<&str> = uuid.split('-').collect();
        let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        let hex = groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()));
        if lengths != [8, 4, 4, 4, 12] || !hex {
            return Err(format!("'{nqn}' does not end in a UUID ({form})"));
        }
        return Ok(());
    }
    let bad = || Err(format!("'{nqn}' is not an NQN ({form})"));
    let Some(rest) = nqn.strip_prefix("nqn.") else {
        return bad();
    };
    let date = rest.get(..7).unwrap_or("");
    let year_month = date.as_bytes();
    let dated = year_month.len() == 7
        && year_month[..4].iter().all(u8::is_ascii_digit)
        && year_month[4] == b'-'
        && year_month[5..].iter().all(u8::is_ascii_digit)
        && matches!(date[5..].parse::<u8>(), Ok(1..=12));
    if !dated || rest.as_bytes().get(7) != Some(&b'.') {
        return bad();
    }
    match rest[8..].split_once(':') {
        Some((domain, name)) if !domain.is_empty() && !name.is_empty() => Ok(()),
        _ => bad(),
    }
}

/// The NQN each export's subsystem is served as, default or given.
pub fn export_nqn(export: &ExportSection) -> Option<String> {
    let settings = export.nvme_settings()?;
    Some(
        settings
            .nqn
            .unwrap_or_else(|| crate::defaults::default_nqn(&export.name)),
    )
}

fn validate_nqns(config: &Config) -> Result<(), ConfigError> {
    let mut taken: HashMap<String, &str> = HashMap::new();
    for (index, export) in config.exports.iter().enumerate() {
        let Some(nqn) = export_nqn(export) else {
            continue;
        };
        if export.nvme_settings().is_some_and(|s| s.nqn.is_none()) {
            // A default NQN is built from the name: check what it became.
            check_nqn(&nqn).map_err(|m| error(Table::Export(index), "name", m))?;
        }
        if let Some(other) = taken.insert(nqn.clone(), &export.name) {
            return Err(error(
                Table::Export(index),
                "nvme",
                format!(
                    "NVMe subsystem {nqn} is already export '{other}' (give nvme = {{ nqn = \"...\" }} a name of its own)"
                ),
            ));
        }
    }
    Ok(())
}

fn validate_nvme_section(config: &Config) -> Result<(), ConfigError> {
    let nvme = &config.nvme;
    if !nvme.discovery_on() && !nvme.discovery_listen.is_empty() {
        return Err(error(
            Table::Nvme,
            "discovery_listen",
            "is given with discovery = false (drop one of them)".into(),
        ));
    }
    Ok(())
}

/// `text` with `port` added when it names none: `host`, `[v6]` or a bare IPv6
/// address.
pub fn with_default_port(text: &str, port: u16) -> String {
    if text.parse::<SocketAddr>().is_ok() {
        return text.to_string();
    }
    if text.ends_with(']') {
        return format!("{text}:{port}");
    }
    match text.matches(':').count() {
        0 => format!("{text}:{port}"),
        1 => text.to_string(),
        _ => format!("[{text}]:{port}"),
    }
}

/// The NVMe/TCP I/O listeners `[nvme]` asks for, each with its port.
pub fn nvme_listen(section: &NvmeSection) -> Vec<String> {
    if section.listen.is_empty() {
        return vec![NVME_LISTEN.to_string()];
    }
    section
        .listen
        .iter()
        .map(|text| with_default_port(text, NVME_PORT))
        .collect()
}

/// The NVMe/TCP discovery listeners `[nvme]` asks for: `discovery_listen`, else
/// port 8009 on the host of each I/O listener; none with `discovery = false`.
pub fn nvme_discovery_listen(section: &NvmeSection) -> Vec<String> {
    if !section.discovery_on() {
        return Vec::new();
    }
    if !section.discovery_listen.is_empty() {
        return section
            .discovery_listen
            .iter()
            .map(|text| with_default_port(text, NVME_DISCOVERY_PORT))
            .collect();
    }
    let mut out: Vec<String> = Vec::new();
    for text in nvme_listen(section) {
        let host = match text.rsplit_once(':') {
            Some((host, _)) => host.to_string(),
            None => text.clone(),
        };
        let discovery = format!("{host}:{NVME_DISCOVERY_PORT}");
        if !out.contains(&discovery) {
            out.push(discovery);
        }
    }
    out
}

fn positive_size(table: Table, key: &'static str, text: &str) -> Result<u64, ConfigError> {
    match parse_size(text) {
        Ok(0) => Err(error(table, key, "must be above zero (e.g. \"1G\")".into())),
        Ok(size) => Ok(size),
        Err(e) => Err(error(table, key, e)),
    }
}

/// An iSCSI name as RFC 7143 §4.2.7.1 spells it: `iqn.`, `eui.` or `naa.` and no
/// spaces, at most 223 bytes.
fn check_iqn(iqn: &str) -> Result<(), String> {
    let lower = iqn.to_ascii_lowercase();
    if !(lower.starts_with("iqn.") || lower.starts_with("eui.") || lower.starts_with("naa.")) {
        return Err(format!(
            "'{iqn}' is not an iSCSI name (iqn.YYYY-MM.domain:name, eui. or naa.)"
        ));
    }
    if iqn.len() > 223 || iqn.contains(char::is_whitespace) {
        return Err(format!(
            "'{iqn}' is not an iSCSI name (at most 223 bytes, no spaces)"
        ));
    }
    Ok(())
}

/// Two exports on one AoE address of one interface would answer as one disk.
fn validate_aoe_addresses(config: &Config) -> Result<(), ConfigError> {
    let mut taken: HashMap<(&str, u16, u8), &str> = HashMap::new();
    for (index, export) in config.exports.iter().enumerate() {
        let Some(aoe) = &export.aoe else { continue };
        for interface in &aoe.interfaces {
            if let Some(other) = taken.insert((interface, aoe.shelf, aoe.slot), &export.name) {
                return Err(error(
                    Table::Export(index),
                    "aoe",
                    format!(
                        "e{}.{} on {interface} is already export '{other}' (one address per \
                         interface serves one disk)",
                        aoe.shelf, aoe.slot
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The iSCSI target name each export is served as, default or given.
pub fn export_iqn(config: &Config, export: &ExportSection) -> Option<String> {
    let settings = export.iscsi.as_ref().and_then(IscsiExport::settings)?;
    let prefix = config
        .iscsi
        .iqn_prefix
        .as_deref()
        .unwrap_or(DEFAULT_IQN_PREFIX);
    Some(
        settings
            .iqn
            .unwrap_or_else(|| default_iqn(prefix, &export.name)),
    )
}

fn validate_iqns(config: &Config) -> Result<(), ConfigError> {
    let mut taken: HashMap<String, &str> = HashMap::new();
    for (index, export) in config.exports.iter().enumerate() {
        let Some(iqn) = export_iqn(config, export) else {
            continue;
        };
        if let Some(other) = taken.insert(iqn.to_ascii_lowercase(), &export.name) {
            return Err(error(
                Table::Export(index),
                "iscsi",
                format!("iSCSI target {iqn} is already export '{other}' (give iscsi = {{ iqn = \"...\" }} a name of its own)"),
            ));
        }
    }
    Ok(())
}

fn validate_server(config: &Config) -> Result<(), ConfigError> {
    let server = &config.server;
    let table = Table::Server;
    let at_least_one = [
        ("workers", server.workers),
        ("max_connections", server.max_connections),
        (
            "max_connections_per_address",
            server.max_connections_per_address,
        ),
        (
            "max_handshakes_per_address",
            server.max_handshakes_per_address,
        ),
    ];
    for (key, value) in at_least_one {
        if value == Some(0) {
            return Err(error(table, key, "0 (at least 1)".into()));
        }
    }
    if let Some(secs) = server.send_timeout {
        if !(secs > 0.0 && secs.is_finite()) {
            return Err(error(
                table,
                "send_timeout",
                format!("{secs} (a number of seconds above zero)"),
            ));
        }
    }
    server
        .unnegotiated_payload_limit()
        .map_err(|m| error(table, "unnegotiated_payload_limit", m))?;
    if let Some(mode) = &server.tls {
        mode.parse::<blockwire_nbd::tls::TlsMode>()
            .map_err(|m| error(table, "tls", m))?;
    }
    if server.tls_verify_peer && server.tls_certificates.is_none() {
        return Err(error(
            table,
            "tls_verify_peer",
            "needs tls_certificates (the directory with ca-cert.pem)".into(),
        ));
    }
    if let Some(name) = &server.default_export {
        if !config.exports.iter().any(|e| &e.name == name && e.nbd) {
            return Err(error(
                table,
                "default_export",
                format!("no export named '{name}' is served over NBD"),
            ));
        }
    }
    Ok(())
}

fn validate_iscsi_section(config: &Config) -> Result<(), ConfigError> {
    let iscsi = &config.iscsi;
    let table = Table::Iscsi;
    if let Some(prefix) = &iscsi.iqn_prefix {
        check_iqn(prefix).map_err(|m| error(table, "iqn_prefix", m))?;
    }
    if iscsi.chap_user.is_none() {
        if iscsi.chap_secret_file.is_some() {
            return Err(error(table, "chap_secret_file", "needs chap_user".into()));
        }
        if iscsi.mutual_chap_user.is_some() {
            return Err(error(
                table,
                "mutual_chap_user",
                "needs chap_user (mutual CHAP is on top of one-way CHAP)".into(),
            ));
        }
        if iscsi.discovery_chap {
            return Err(error(table, "discovery_chap", "needs chap_user".into()));
        }
    }
    if iscsi.mutual_chap_secret_file.is_some() && iscsi.mutual_chap_user.is_none() {
        return Err(error(
            table,
            "mutual_chap_secret_file",
            "needs mutual_chap_user".into(),
        ));
    }
    Ok(())
}

/// One listener: which table and key, and the address as written.
struct Listener<'a> {
    table: Table,
    key: &'static str,
    what: &'static str,
    text: std::borrow::Cow<'a, str>,
}

/// Every TCP listener the configuration asks for, defaults included where they
/// apply.
fn listeners(config: &Config) -> Vec<Listener<'_>> {
    let mut out = Vec::new();
    let nbd = config.exports.iter().any(|e| e.nbd);
    if nbd {
        if config.server.listen.is_empty() && config.server.socket.is_empty() {
            out.push(Listener {
                table: Table::Server,
                key: "listen",
                what: "NBD's default",
                text: NBD_LISTEN.into(),
            });
        }
        for text in &config.server.listen {
            out.push(Listener {
                table: Table::Server,
                key: "listen",
                what: "[server] listen",
                text: text.into(),
            });
        }
    }
    let iscsi = config
        .exports
        .iter()
        .any(|e| e.iscsi.as_ref().and_then(IscsiExport::settings).is_some());
    if iscsi {
        if config.iscsi.listen.is_empty() {
            out.push(Listener {
                table: Table::Iscsi,
                key: "listen",
                what: "iSCSI's default",
                text: ISCSI_LISTEN.into(),
            });
        }
        for text in &config.iscsi.listen {
            out.push(Listener {
                table: Table::Iscsi,
                key: "listen",
                what: "[iscsi] listen",
                text: text.into(),
            });
        }
    }
    if config.exports.iter().any(|e| e.nvme_settings().is_some()) {
        let nvme = &config.nvme;
        let defaulted = nvme.listen.is_empty();
        for text in nvme_listen(nvme) {
            out.push(Listener {
                table: Table::Nvme,
                key: "listen",
                what: if defaulted {
                    "NVMe/TCP's default"
                } else {
                    "[nvme] listen"
                },
                text: text.into(),
            });
        }
        let given = !nvme.discovery_listen.is_empty();
        for text in nvme_discovery_listen(nvme) {
            out.push(Listener {
                table: Table::Nvme,
                key: if given { "discovery_listen" } else { "listen" },
                what: if given {
                    "[nvme] discovery_listen"
                } else {
                    "NVMe/TCP's default discovery port"
                },
                text: text.into(),
            });
        }
    }
    if let Some(text) = &config.metrics.listen {
        out.push(Listener {
            table: Table::Metrics,
            key: "listen",
            what: "[metrics] listen",
            text: text.into(),
        });
    }
    out
}

/// Whether two bound addresses would collide: one port, and one address or a
/// wildcard on either side.
fn collide(a: &SocketAddr, b: &SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

fn validate_listeners(config: &Config) -> Result<(), ConfigError> {
    let listeners = listeners(config);
    let mut seen: Vec<(SocketAddr, &str, &str)> = Vec::new();
    for listener in &listeners {
        let addrs = resolve(&listener.text).map_err(|m| error(listener.table, listener.key, m))?;
        for addr in addrs {
            if let Some((_, what, text)) = seen.iter().find(|(other, _, _)| collide(&addr, other)) {
                let also = if *text == listener.text {
                    what.to_string()
                } else {
                    format!("{what} ({text})")
                };
                return Err(error(
                    listener.table,
                    listener.key,
                    format!(
                        "{} is also {also} (each listener needs an address of its own)",
                        listener.text
                    ),
                ));
            }
            seen.push((addr, listener.what, &listener.text));
        }
    }
    let mut sockets: Vec<&Path> = Vec::new();
    for socket in &config.server.socket {
        if sockets.contains(&socket.as_path()) {
            return Err(error(
                Table::Server,
                "socket",
                format!("{} is given twice", socket.display()),
            ));
        }
        sockets.push(socket);
    }
    Ok(())
}

/// The addresses `HOST:PORT` names.
pub fn resolve(text: &str) -> Result<Vec<SocketAddr>, String> {
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|_| format!("'{text}' is not HOST:PORT (e.g. 127.0.0.1:10809 or [::1]:10809)"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("'{text}' resolves to no address"));
    }
    Ok(addrs)
}

/// What the configuration names outside itself: files to serve or create, secret,
/// key and certificate files, Ceph's files, network interfaces and socket folders.
pub fn check_environment(config: &Config) -> Result<(), ConfigError> {
    for (index, export) in config.exports.iter().enumerate() {
        check_export_environment(index, export)?;
    }
    let iscsi = &config.iscsi;
    let secrets = [
        ("chap_secret_file", &iscsi.chap_secret_file),
        ("mutual_chap_secret_file", &iscsi.mutual_chap_secret_file),
    ];
    for (key, file) in secrets {
        if let Some(file) = file {
            readable(file).map_err(|m| error(Table::Iscsi, key, m))?;
        }
    }
    let envs = [
        (
            iscsi.chap_user.is_some() && iscsi.chap_secret_file.is_none(),
            "chap_user",
            crate::defaults::CHAP_SECRET_ENV,
            "chap_secret_file",
        ),
        (
            iscsi.mutual_chap_user.is_some() && iscsi.mutual_chap_secret_file.is_none(),
            "mutual_chap_user",
            crate::defaults::MUTUAL_CHAP_SECRET_ENV,
            "mutual_chap_secret_file",
        ),
    ];
    for (needed, key, env, file_key) in envs {
        if needed && std::env::var_os(env).is_none_or(|v| v.is_empty()) {
            return Err(error(
                Table::Iscsi,
                key,
                format!("no secret for it (give {file_key}, or set {env})"),
            ));
        }
    }
    let server = &config.server;
    if let Some(file) = &server.tls_psk {
        readable(file).map_err(|m| error(Table::Server, "tls_psk", m))?;
    }
    if let Some(dir) = &server.tls_certificates {
        let mut needed = vec!["server-cert.pem", "server-key.pem"];
        if server.tls_verify_peer {
            needed.push("ca-cert.pem");
        }
        for name in needed {
            readable(&dir.join(name)).map_err(|m| error(Table::Server, "tls_certificates", m))?;
        }
    }
    for socket in &server.socket {
        let parent = socket
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return Err(error(
                Table::Server,
                "socket",
                format!(
                    "{}: the folder {} does not exist",
                    socket.display(),
                    parent.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `file` can be read, said as one line naming it.
fn readable(file: &Path) -> Result<(), String> {
    std::fs::File::open(file)
        .map(drop)
        .map_err(|e| format!("cannot read {}: {}", file.display(), io_text(&e)))
}

/// An I/O error's text without Rust's ` (os error N)`.
pub fn io_text(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error") {
        Some(end) => text[..end].to_string(),
        None => text,
    }
}

fn check_export_environment(index: usize, export: &ExportSection) -> Result<(), ConfigError> {
    let table = Table::Export(index);
    if let Some(aoe) = &export.aoe {
        for interface in &aoe.interfaces {
            if !Path::new("/sys/class/net").join(interface).exists() {
                return Err(error(
                    table,
                    "aoe.interfaces",
                    format!("no network interface '{interface}' here (`ip link` lists them)"),
                ));
            }
        }
    }
    if let Some(spec) = export.rbd_spec() {
        let Ok(spec) = spec else { return Ok(()) };
        for (what, file) in [("conf", &spec.conf), ("keyring", &spec.keyring)] {
            if let Some(file) = file {
                readable(Path::new(file))
                    .map_err(|m| error(table, "rbd", format!("{what}: {m}")))?;
            }
        }
        return Ok(());
    }
    let Some(path) = export.path.as_deref() else {
        return Ok(());
    };
    if matches!(crate::device_spec::remote_target(path), Ok(Some(_))) {
        return Ok(());
    }
    let size = export.size.as_deref().and_then(|s| parse_size(s).ok());
    match std::fs::metadata(path) {
        Ok(meta) => {
            if let Some(size) = size {
                if meta.is_file() && meta.len() != size {
                    return Err(error(
                        table,
                        "size",
                        format!(
                            "{} exists with {} bytes, not {} (blockwire never resizes a file; drop size or fix it)",
                            path.display(),
                            meta.len(),
                            format_size(size)
                        ),
                    ));
                }
            }
            if !export.read_only && !writable(path) {
                return Err(error(
                    table,
                    "path",
                    format!("{} cannot be written here", path.display()),
                )
                .with_fix("read_only", Some("true"), "to serve it read-only"));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if export.read_only {
                return Err(error(
                    table,
                    "path",
                    format!(
                        "{} does not exist (a read-only export is never created)",
                        path.display()
                    ),
                ));
            }
            if size.is_none() {
                return Err(
                    error(table, "path", format!("{} does not exist", path.display())).with_fix(
                        "size",
                        Some("\"SIZE\""),
                        "to create it as a sparse file",
                    ),
                );
            }
            let parent = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !parent.is_dir() {
                return Err(error(
                    table,
                    "path",
                    format!(
                        "{}: the folder {} does not exist",
                        path.display(),
                        parent.display()
                    ),
                ));
            }
            Ok(())
        }
        Err(e) => Err(error(
            table,
            "path",
            format!("{}: {}", path.display(), io_text(&e)),
        )),
    }
}

/// Whether this process may open `path` for writing (permissions, read-only mounts).
fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c_path is a valid NUL-terminated string for the call's duration.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), ConfigError> {
        let config: Config = toml::from_str(text).unwrap();
        validate(&config)
    }

    fn export(extra: &str) -> String {
        format!("[[export]]\nname = \"a\"\nmemory = \"1G\"\n{extra}\n")
    }

    #[test]
    fn two_exports_cannot_share_an_iscsi_name() {
        let text = format!(
            "{}{}",
            export("iscsi = { iqn = \"iqn.2026-11.x:t\" }"),
            "[[export]]\nname = \"b\"\nmemory = \"1G\"\niscsi = { iqn = \"iqn.2026-11.x:t\" }\n"
        );
        let e = check(&text).unwrap_err();
        assert_eq!((e.table, e.key), (Some(Table::Export(1)), Some("iscsi")));
        assert!(e.message.contains("already export 'a'"), "{e}");
        // Default names collide too: "a b" and "a-b" both become ...:a-b.
        let text = "[[export]]\nname = \"a b\"\nmemory = \"1G\"\niscsi = true\n\
                    [[export]]\nname = \"a-b\"\nmemory = \"1G\"\niscsi = true\n";
        assert!(check(text).is_err());
    }

    #[test]
    fn nqns_follow_the_nvme_base_specification() {
        for good in [
            "nqn.2026-11.dev.blockwire:disk0",
            "nqn.2014-08.com.example:a:b",
            "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
        ] {
            check_nqn(good).unwrap();
        }
        for bad in [
            "iqn.2026-11.dev.blockwire:disk0",
            "nqn.2026-13.dev.blockwire:disk0",
            "nqn.26-11.dev.blockwire:disk0",
            "nqn.2026-11.dev.blockwire",
            "nqn.2026-11.:disk",
            "nqn.2026-11.x:",
            "nqn.2026-11.x:a b",
            "nqn.2014-08.org.nvmexpress:uuid:not-a-uuid",
            "nqn.2014-08.org.nvmexpress.discovery",
        ] {
            assert!(check_nqn(bad).is_err(), "{bad}");
        }
        let long = format!("nqn.2026-11.x:{}", "a".repeat(210));
        assert!(check_nqn(&long).unwrap_err().contains("at most 223"));
        let e = check(&export("nvme = { nqn = \"nqn.bad\" }")).unwrap_err();
        assert_eq!((e.table, e.key), (Some(Table::Export(0)), Some("nvme.nqn")));
        let e = check(&export("nvme = { hosts = [\"host\"] }")).unwrap_err();
        assert_eq!(e.key, Some("nvme.hosts"));
    }

    #[test]
    fn two_exports_cannot_share_an_nvme_subsystem() {
        let text = format!(
            "{}{}",
            export("nvme = { nqn = \"nqn.2026-11.x:t\" }"),
            "[[export]]\nname = \"b\"\nmemory = \"1G\"\nnvme = { nqn = \"nqn.2026-11.x:t\" }\n"
        );
        let e = check(&text).unwrap_err();
        assert_eq!((e.table, e.key), (Some(Table::Export(1)), Some("nvme")));
        assert!(e.message.contains("already export 'a'"), "{e}");
        // An export served only over NVMe/TCP is served.
        check(&export("nbd = false\nnvme = true")).unwrap();
    }

    #[test]
    fn nvme_listeners_take_default_ports_and_clash_like_the_others() {
        let section = |text: &str| -> NvmeSection { toml::from_str(text).unwrap() };
        let given = section("listen = [\"0.0.0.0\", \"[::1]\", \"10.0.0.1:4421\"]");
        assert_eq!(
            nvme_listen(&given),
            ["0.0.0.0:4420", "[::1]:4420", "10.0.0.1:4421"]
        );
        assert_eq!(
            nvme_discovery_listen(&given),
            ["0.0.0.0:8009", "[::1]:8009", "10.0.0.1:8009"]
        );
        assert!(nvme_discovery_listen(&section("discovery = false")).is_empty());
        assert_eq!(nvme_listen(&section("")), ["127.0.0.1:4420"]);
        let e = check(&format!(
            "[metrics]\nlisten = \"127.0.0.1:8009\"\n{}",
            export("nvme = true")
        ))
        .unwrap_err();
        assert_eq!((e.table, e.key), (Some(Table::Metrics), Some("listen")));
        assert!(e.message.contains("discovery port"), "{e}");
        let e = check(&format!(
            "[nvme]\nlisten = \"127.0.0.1:3260\"\n{}",
            export("nvme = true\niscsi = true")
        ))
        .unwrap_err();
        assert_eq!((e.table, e.key), (Some(Table::Nvme), Some("listen")));
        assert!(e.message.contains("iSCSI's default"), "{e}");
        let e = check(&format!(
            "[nvme]\ndiscovery = false\ndiscovery_listen = \"127.0.0.1:1\"\n{}",
            export("nvme = true")
        ))
        .unwrap_err();
        assert_eq!(e.key, Some("discovery_listen"));
    }

    #[test]
    fn two_exports_cannot_share_an_aoe_address_on_one_interface() {
        let aoe = |iface: &str, slot: u8| {
            format!("aoe = {{ interfaces = [\"{iface}\"], shelf = 1, slot = {slot} }}")
        };
        let two = |first: String, second: String| {
            format!(
                "{}[[export]]\nname = \"b\"\nmemory = \"1G\"\n{second}\n",
                export(&first)
            )
        };
        let e = check(&two(aoe("eth0", 2), aoe("eth0", 2))).unwrap_err();
        assert_eq!(e.key, Some("aoe"));
        assert!(
            e.message.contains("e1.2 on eth0 is already export 'a'"),
            "{e}"
        );
        check(&two(aoe("eth0", 2), aoe("eth1", 2))).unwrap();
        check(&two(aoe("eth0", 2), aoe("eth0", 3))).unwrap();
    }

    #[test]
    fn aoe_broadcast_addresses_are_refused() {
        let e = check(&export(
            "aoe = { interfaces = [\"e\"], shelf = 65535, slot = 1 }",
        ))
        .unwrap_err();
        assert_eq!(e.key, Some("aoe.shelf"));
        let e = check(&export(
            "aoe = { interfaces = [\"e\"], shelf = 1, slot = 255 }",
        ))
        .unwrap_err();
        assert_eq!(e.key, Some("aoe.slot"));
        let e = check(&export("aoe = { interfaces = [], shelf = 1, slot = 1 }")).unwrap_err();
        assert_eq!(e.key, Some("aoe.interfaces"));
    }

    #[test]
    fn two_listeners_cannot_share_an_address() {
        let e = check(&format!(
            "[metrics]\nlisten = \"127.0.0.1:10809\"\n{}",
            export("")
        ))
        .unwrap_err();
        assert_eq!((e.table, e.key), (Some(Table::Metrics), Some("listen")));
        assert!(e.message.contains("NBD's default"), "{e}");
        let e = check(&format!(
            "[server]\nlisten = [\"0.0.0.0:3260\"]\n{}",
            export("iscsi = true")
        ))
        .unwrap_err();
        assert_eq!((e.table, e.key), (Some(Table::Iscsi), Some("listen")));
        // Port 0 takes a free port each time: never a collision.
        check(&format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n[metrics]\nlisten = \"127.0.0.1:0\"\n{}",
            export("")
        ))
        .unwrap();
        let e = check(&format!("[server]\nlisten = [\"nowhere\"]\n{}", export(""))).unwrap_err();
        assert!(e.message.contains("is not HOST:PORT"), "{e}");
    }

    #[test]
    fn values_outside_the_stated_ranges_are_refused() {
        for (text, key) in [
            ("[server]\nworkers = 0\n", "workers"),
            ("[server]\nmax_connections = 0\n", "max_connections"),
            ("[server]\ntls = \"maybe\"\n", "tls"),
            ("[server]\ntls_verify_peer = true\n", "tls_verify_peer"),
            ("[server]\nsend_timeout = 0\n", "send_timeout"),
            ("[server]\ndefault_export = \"zz\"\n", "default_export"),
        ] {
            let e = check(&format!("{text}{}", export(""))).unwrap_err();
            assert_eq!(e.key, Some(key), "{text}: {e}");
        }
        for (extra, key) in [
            ("iscsi = { block_size = 1024 }", "iscsi.block_size"),
            ("iscsi = { iqn = \"disk\" }", "iscsi.iqn"),
            ("disk_rate = 0", "disk_rate"),
            (
                "aoe = { interfaces = [\"e\"], shelf = 1, slot = 1, buffer_count = 0 }",
                "aoe.buffer_count",
            ),
        ] {
            let e = check(&export(extra)).unwrap_err();
            assert_eq!(e.key, Some(key), "{extra}: {e}");
        }
        let e = check("[[export]]\nname = \"a\"\nmemory = \"10Q\"\n").unwrap_err();
        assert_eq!(e.key, Some("memory"));
        assert!(e.message.contains("K, M, G"), "{e}");
    }

    #[test]
    fn missing_secret_files_are_found_before_serving() {
        let text = format!(
            "[iscsi]\nchap_user = \"u\"\nchap_secret_file = \"/nonexistent/chap\"\n{}",
            export("iscsi = true")
        );
        let config: Config = toml::from_str(&text).unwrap();
        validate(&config).unwrap();
        let e = check_environment(&config).unwrap_err();
        assert_eq!(e.key, Some("chap_secret_file"));
        assert!(e.message.contains("/nonexistent/chap"), "{e}");
        let text = format!("[server]\ntls_psk = \"/nonexistent/k.psk\"\n{}", export(""));
        let config: Config = toml::from_str(&text).unwrap();
        assert_eq!(check_environment(&config).unwrap_err().key, Some("tls_psk"));
    }

    #[test]
    fn a_missing_file_needs_a_size_and_an_existing_one_keeps_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.img");
        let text = |extra: &str| {
            format!(
                "[[export]]\nname = \"a\"\npath = \"{}\"\n{extra}\n",
                file.display()
            )
        };
        let load = |text: String| {
            let config: Config = toml::from_str(&text).unwrap();
            check_environment(&config)
        };
        let e = load(text("")).unwrap_err();
        assert_eq!(e.fix.as_ref().map(|f| f.key), Some("size"));
        load(text("size = \"1M\"")).unwrap();
        assert!(load(text("size = \"1M\"\nread_only = true")).is_err());
        std::fs::write(&file, [0u8; 4096]).unwrap();
        load(text("")).unwrap();
        assert_eq!(load(text("size = \"1M\"")).unwrap_err().key, Some("size"));
    }
}
