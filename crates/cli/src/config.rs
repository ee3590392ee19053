//! The TOML configuration for `blockwire serve --config FILE`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// A whole configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportSection>,
    /// `[[volume]]`: striped volumes that exports name with `volume = "NAME"`.
    #[serde(default, rename = "volume")]
    pub volumes: Vec<VolumeSection>,
    /// `[iscsi]`: the iSCSI target's listeners, names and secrets.
    #[serde(default)]
    pub iscsi: IscsiSection,
}

/// `[iscsi]`: settings shared by every export served over iSCSI.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiSection {
    /// TCP addresses; default 127.0.0.1:3260.
    #[serde(default)]
    pub listen: Vec<String>,
    /// Target names are this, ':' and the export name (default
    /// iqn.2026-11.dev.blockwire).
    pub iqn_prefix: Option<String>,
    /// One-way CHAP: the name initiators log in with...
    pub chap_user: Option<String>,
    /// ...and a file holding the secret (first line).
    pub chap_secret_file: Option<PathBuf>,
    /// Mutual CHAP: the name the target answers with...
    pub mutual_chap_user: Option<String>,
    /// ...and a file holding its secret.
    pub mutual_chap_secret_file: Option<PathBuf>,
    /// Require the same CHAP for discovery sessions (default false).
    #[serde(default)]
    pub discovery_chap: bool,
}

/// `iscsi = true`, or `iscsi = { iqn = "...", block_size = 4096, initiators = [...] }`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum IscsiExport {
    Enabled(bool),
    Settings(IscsiExportSettings),
}

/// The per-export iSCSI settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiExportSettings {
    /// The target name (default: the `[iscsi]` prefix, ':' and the export name).
    pub iqn: Option<String>,
    /// Logical block size: 512 (default) or 4096.
    pub block_size: Option<u32>,
    /// Initiator names allowed to log in (default: all).
    #[serde(default)]
    pub initiators: Vec<String>,
    /// TargetAlias shown to initiators.
    pub alias: Option<String>,
}

impl IscsiExport {
    /// The settings, if the export is served over iSCSI at all.
    pub fn settings(&self) -> Option<IscsiExportSettings> {
        match self {
            IscsiExport::Enabled(false) => None,
            IscsiExport::Enabled(true) => Some(IscsiExportSettings::default()),
            IscsiExport::Settings(settings) => Some(settings.clone()),
        }
    }
}

/// `[server]`: where to listen and how many threads to use.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// TCP addresses; default 127.0.0.1:10809 unless only a socket is given.
    #[serde(default)]
    pub listen: Vec<String>,
    /// Unix socket paths.
    #[serde(default)]
    pub socket: Vec<PathBuf>,
    pub workers: Option<usize>,
    pub max_connections: Option<usize>,
    /// Connections from one client address still in the handshake beyond this are
    /// closed at once (default 16).
    pub max_handshakes_per_address: Option<usize>,
    /// Seconds a client may leave replies unread (its socket taking nothing) before
    /// it is cut off (default 30).
    pub send_timeout: Option<f64>,
    /// The export an empty name selects (default: the first).
    pub default_export: Option<String>,
    /// NBD TLS: "off", "on" or "require" (default "on" when credentials are
    /// given, else "off").
    pub tls: Option<String>,
    /// Directory with server-cert.pem, server-key.pem and ca-cert.pem.
    pub tls_certificates: Option<PathBuf>,
    /// File of USERNAME:HEXKEY pre-shared keys.
    pub tls_psk: Option<PathBuf>,
    /// Require client certificates signed by tls_certificates/ca-cert.pem.
    #[serde(default)]
    pub tls_verify_peer: bool,
}

/// `[[export]]`: one export.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSection {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A file or block device...
    pub path: Option<PathBuf>,
    /// ...or an in-memory device of this size ("1G")...
    pub memory: Option<String>,
    /// ...or the `[[volume]]` of this name.
    pub volume: Option<String>,
    /// Create `path` as a sparse file of this size if it does not exist.
    pub size: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub direct: bool,
    /// Start writeback of sequential buffered writes every this many bytes per stream
    /// ("16M", the default; "0" leaves writeback to the kernel).
    pub write_behind: Option<String>,
    /// Serve this export over NBD (default true).
    #[serde(default = "yes")]
    pub nbd: bool,
    /// Also serve this export over AoE.
    pub aoe: Option<AoeSection>,
    /// Also serve this export over iSCSI, as LUN 0 of its own target.
    pub iscsi: Option<IscsiExport>,
    /// Limit reads and writes together to this many MB/s (10^6 bytes), like a disk.
    pub disk_rate: Option<f64>,
    /// Add this many milliseconds to every request, like a disk.
    pub disk_latency: Option<f64>,
}

/// `[[volume]]`: a striped volume (RAID-0) over member devices.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSection {
    pub name: String,
    /// Chunk size ("64K", "1M").
    pub chunk: String,
    /// Paths or URIs (nbd://, aoe://, iscsi://), in stripe order.
    pub members: Vec<String>,
}

fn yes() -> bool {
    true
}

/// `aoe = { interfaces = ["eth0"], shelf = 1, slot = 2 }`: an export over AoE.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AoeSection {
    pub interfaces: Vec<String>,
    pub shelf: u16,
    pub slot: u8,
    /// Frames the target advertises it can queue (default 256).
    pub buffer_count: Option<u16>,
    /// Initial config string.
    #[serde(default)]
    pub config_string: String,
    /// `xdp = "generic"` or `"driver"`: the AF_XDP path (`serve --aoe-xdp`).
    pub xdp: Option<XdpChoice>,
}

/// Where the AF_XDP path's program runs (`--aoe-xdp HOOK`, `xdp = "HOOK"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum XdpChoice {
    /// The generic receive path: any interface.
    Generic,
    /// The driver's native XDP.
    Driver,
}

impl XdpChoice {
    pub fn hook(self) -> blockwire_aoe::rawsock::XdpHook {
        match self {
            XdpChoice::Generic => blockwire_aoe::rawsock::XdpHook::Generic,
            XdpChoice::Driver => blockwire_aoe::rawsock::XdpHook::Driver,
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let config: Config = toml::from_str(&text)
            .with_context(|| format!("config file {} is not valid", path.display()))?;
        if config.exports.is_empty() {
            bail!("config file {} defines no [[export]]", path.display());
        }
        for export in &config.exports {
            let iscsi = export
                .iscsi
                .as_ref()
                .and_then(IscsiExport::settings)
                .is_some();
            if !export.nbd && export.aoe.is_none() && !iscsi {
                bail!(
                    "export '{}' is served by no protocol (nbd = false, no aoe, no iscsi)",
                    export.name
                );
            }
            let sources = [
                export.path.is_some(),
                export.memory.is_some(),
                export.volume.is_some(),
            ];
            if sources.iter().filter(|&&given| given).count() != 1 {
                bail!(
                    "export '{}': give exactly one of `path`, `memory` or `volume`",
                    export.name
                );
            }
            if let Some(volume) = &export.volume {
                if !config.volumes.iter().any(|v| &v.name == volume) {
                    bail!("export '{}': no [[volume]] named '{volume}'", export.name);
                }
            }
        }
        for (i, volume) in config.volumes.iter().enumerate() {
            if config.volumes[..i].iter().any(|v| v.name == volume.name) {
                bail!("two [[volume]] tables are named '{}'", volume.name);
            }
            if volume.members.is_empty() {
                bail!("volume '{}' has no members", volume.name);
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_config() {
        let text = r#"
            [server]
            listen = ["127.0.0.1:10809", "[::1]:10810"]
            socket = ["/tmp/bw.sock"]
            workers = 8
            default_export = "b"

            [[export]]
            name = "a"
            path = "/tmp/a.img"
            size = "1G"
            read_only = true
            write_behind = "0"

            [[export]]
            name = "b"
            memory = "64M"
            description = "scratch"
        "#;
        let config: Config = toml::from_str(text).unwrap();
        assert_eq!(config.server.listen.len(), 2);
        assert_eq!(config.exports.len(), 2);
        assert!(config.exports[0].read_only);
        assert_eq!(config.exports[0].write_behind.as_deref(), Some("0"));
        assert_eq!(config.exports[1].write_behind, None);
        assert_eq!(config.exports[1].memory.as_deref(), Some("64M"));
    }

    #[test]
    fn parses_an_aoe_export() {
        let text = r#"
            [[export]]
            name = "a"
            path = "/tmp/a.img"
            nbd = false
            aoe = { interfaces = ["eth0", "eth1"], shelf = 3, slot = 4 }
        "#;
        let config: Config = toml::from_str(text).unwrap();
        let aoe = config.exports[0].aoe.as_ref().unwrap();
        assert_eq!(aoe.interfaces, ["eth0", "eth1"]);
        assert_eq!((aoe.shelf, aoe.slot), (3, 4));
        assert!(!config.exports[0].nbd);
    }

    #[test]
    fn parses_iscsi_settings() {
        let text = r#"
            [iscsi]
            listen = ["127.0.0.1:3260"]
            iqn_prefix = "iqn.2026-11.test"
            chap_user = "alice"
            chap_secret_file = "/etc/blockwire/chap"

            [[export]]
            name = "a"
            path = "/tmp/a.img"
            nbd = false
            iscsi = true

            [[export]]
            name = "b"
            memory = "64M"
            iscsi = { iqn = "iqn.2026-11.test:bee", block_size = 4096, initiators = ["iqn.x"] }

            [[export]]
            name = "c"
            memory = "64M"
            iscsi = false
        "#;
        let config: Config = toml::from_str(text).unwrap();
        assert_eq!(config.iscsi.listen, ["127.0.0.1:3260"]);
        assert_eq!(config.iscsi.chap_user.as_deref(), Some("alice"));
        let a = config.exports[0]
            .iscsi
            .as_ref()
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(a.iqn, None);
        let b = config.exports[1]
            .iscsi
            .as_ref()
            .unwrap()
            .settings()
            .unwrap();
        assert_eq!(b.iqn.as_deref(), Some("iqn.2026-11.test:bee"));
        assert_eq!(b.block_size, Some(4096));
        assert_eq!(b.initiators, ["iqn.x"]);
        assert!(config.exports[2]
            .iscsi
            .as_ref()
            .unwrap()
            .settings()
            .is_none());
    }

    #[test]
    fn parses_the_af_xdp_choice_of_an_aoe_export() {
        let export = |xdp: &str| {
            format!(
                "[[export]]\nname = \"a\"\npath = \"/x\"\n\
                 aoe = {{ interfaces = [\"eth0\"], shelf = 1, slot = 2{xdp} }}\n"
            )
        };
        let aoe = |text: String| {
            toml::from_str::<Config>(&text).map(|c| c.exports[0].aoe.as_ref().unwrap().xdp)
        };
        assert_eq!(aoe(export("")).unwrap(), None);
        assert_eq!(
            aoe(export(", xdp = \"generic\"")).unwrap(),
            Some(XdpChoice::Generic)
        );
        assert_eq!(
            aoe(export(", xdp = \"driver\"")).unwrap(),
            Some(XdpChoice::Driver)
        );
        assert!(aoe(export(", xdp = \"fast\"")).is_err());
    }

    #[test]
    fn parses_volumes_and_throttles() {
        let text = r#"
            [[volume]]
            name = "wide"
            chunk = "64K"
            members = ["nbd://10.0.1.2/a", "aoe://eth1,eth2/e1.2", "/srv/c.img"]

            [[export]]
            name = "striped"
            volume = "wide"
            disk_rate = 70
            disk_latency = 0.5
        "#;
        let config: Config = toml::from_str(text).unwrap();
        assert_eq!(config.volumes[0].members.len(), 3);
        assert_eq!(config.exports[0].volume.as_deref(), Some("wide"));
        assert_eq!(config.exports[0].disk_rate, Some(70.0));
        assert_eq!(config.exports[0].disk_latency, Some(0.5));
    }

    #[test]
    fn an_export_names_an_existing_volume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            Config::load(&path).map_err(|e| format!("{e:#}"))
        };
        let err = load("[[export]]\nname = \"a\"\nvolume = \"nope\"\n").unwrap_err();
        assert!(err.contains("no [[volume]] named 'nope'"), "{err}");
        let err = load(
            "[[volume]]\nname = \"v\"\nchunk = \"4K\"\nmembers = []\n\
             [[export]]\nname = \"a\"\nvolume = \"v\"\n",
        )
        .unwrap_err();
        assert!(err.contains("volume 'v' has no members"), "{err}");
        let err = load("[[export]]\nname = \"a\"\nmemory = \"1M\"\nvolume = \"v\"\n").unwrap_err();
        assert!(err.contains("exactly one of"), "{err}");
    }

    #[test]
    fn parses_tls_keys() {
        let text = r#"
            [server]
            tls = "require"
            tls_certificates = "/etc/pki/blockwire"
            tls_psk = "/etc/blockwire/keys.psk"
            tls_verify_peer = true

            [[export]]
            name = "a"
            memory = "1M"
        "#;
        let config: Config = toml::from_str(text).unwrap();
        assert_eq!(config.server.tls.as_deref(), Some("require"));
        assert_eq!(
            config.server.tls_psk.as_deref(),
            Some(Path::new("/etc/blockwire/keys.psk"))
        );
        assert!(config.server.tls_verify_peer);
        let plain: Config = toml::from_str("[[export]]\nname = \"a\"\nmemory = \"1M\"\n").unwrap();
        assert!(plain.server.tls.is_none() && !plain.server.tls_verify_peer);
    }

    #[test]
    fn rejects_unknown_keys() {
        let text = "[[export]]\nname = \"a\"\npath = \"/x\"\nreadonly = true\n";
        assert!(toml::from_str::<Config>(text).is_err());
    }

    /// The TOML blocks of a Markdown page.
    fn toml_blocks(markdown: &str) -> Vec<String> {
        let mut blocks = Vec::new();
        let mut lines = markdown.lines();
        while let Some(line) = lines.next() {
            if line.trim() == "```toml" {
                let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
                blocks.push(block.join("\n"));
            }
        }
        blocks
    }

    /// The examples users copy must be configurations the server takes.
    #[test]
    fn documented_examples_are_valid() {
        let pages = [
            ("README.md", include_str!("../../../README.md")),
            (
                "docs/configuration.md",
                include_str!("../../../docs/configuration.md"),
            ),
        ];
        for (page, text) in pages {
            let blocks = toml_blocks(text);
            assert!(!blocks.is_empty(), "{page} has no TOML example");
            for block in blocks {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("blockwire.toml");
                std::fs::write(&path, &block).unwrap();
                if let Err(e) = Config::load(&path) {
                    panic!("{page}: the example does not load: {e:#}\n{block}");
                }
            }
        }
    }
}
