//! The TOML configuration for `blockwire serve --config FILE`.

use std::path::PathBuf;

use blockwire_blockdev::size::{format_size, parse_size};
use blockwire_blockdev::DeviceInfo;
use schemars::JsonSchema;
use serde::Deserialize;

/// A whole configuration file.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[server]`: the NBD target's listeners and limits.
    #[serde(default)]
    pub server: ServerSection,
    /// `[[export]]`: the exports, one table each.
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportSection>,
    /// `[[volume]]`: striped volumes that exports name with `volume = "NAME"`.
    #[serde(default, rename = "volume")]
    pub volumes: Vec<VolumeSection>,
    /// `[iscsi]`: the iSCSI target's listeners, names and secrets.
    #[serde(default)]
    pub iscsi: IscsiSection,
    /// `[metrics]`: the Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsSection,
    /// `[nvme]`: the NVMe/TCP target's listeners.
    #[serde(default)]
    pub nvme: NvmeSection,
}

/// `[nvme]`: settings shared by every export served over NVMe/TCP.
#[derive(Debug, Default, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvmeSection {
    /// I/O controller addresses ("HOST[:PORT]" or a list of them; port 4420 when
    /// none is given); default 127.0.0.1:4420.
    #[serde(default, deserialize_with = "one_or_many")]
    pub listen: Vec<String>,
    /// Discovery controller addresses ("HOST[:PORT]", port 8009 when none is
    /// given); default port 8009 on each listen address's host.
    #[serde(default, deserialize_with = "one_or_many")]
    pub discovery_listen: Vec<String>,
    /// Answer discovery on its own port (default true; the I/O port answers it
    /// too).
    pub discovery: Option<bool>,
}

impl NvmeSection {
    /// Whether a discovery controller listens on a port of its own.
    pub fn discovery_on(&self) -> bool {
        self.discovery.unwrap_or(true)
    }
}

/// `nvme = true`, or `nvme = { nqn = "...", hosts = ["nqn...."] }`.
#[derive(Debug, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(untagged)]
pub enum NvmeExport {
    /// `true`: serve with the default settings.
    Enabled(bool),
    /// The settings, in an inline table.
    Settings(NvmeExportSettings),
}

/// The per-export NVMe/TCP settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NvmeExportSettings {
    /// The subsystem NQN (default nqn.2026-11.dev.blockwire:NAME).
    pub nqn: Option<String>,
    /// Host NQNs allowed to connect (default: all).
    #[serde(default)]
    pub hosts: Vec<String>,
}

impl NvmeExport {
    /// The settings, if the export is served over NVMe/TCP at all.
    pub fn settings(&self) -> Option<NvmeExportSettings> {
        match self {
            NvmeExport::Enabled(false) => None,
            NvmeExport::Enabled(true) => Some(NvmeExportSettings::default()),
            NvmeExport::Settings(settings) => Some(settings.clone()),
        }
    }
}

/// `[metrics]`: where Prometheus scrapes `serve`.
#[derive(Debug, Default, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// `HOST:PORT` of the HTTP endpoint (`/metrics`); none: no metrics.
    pub listen: Option<String>,
}

/// `[iscsi]`: settings shared by every export served over iSCSI.
#[derive(Debug, Default, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IscsiSection {
    /// TCP addresses ("HOST:PORT" or a list of them); default 127.0.0.1:3260.
    #[serde(default, deserialize_with = "one_or_many")]
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
#[derive(Debug, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(untagged)]
pub enum IscsiExport {
    /// `true`: serve with the default settings.
    Enabled(bool),
    /// The settings, in an inline table.
    Settings(IscsiExportSettings),
}

/// The per-export iSCSI settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
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
#[derive(Debug, Default, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// TCP addresses ("HOST:PORT" or a list of them); default 127.0.0.1:10809
    /// unless only a socket is given.
    #[serde(default, deserialize_with = "one_or_many")]
    pub listen: Vec<String>,
    /// Unix socket paths.
    #[serde(default)]
    pub socket: Vec<PathBuf>,
    /// Threads for requests that may block (flush, FUA, cache misses); default 16.
    pub workers: Option<usize>,
    /// NBD connections at most (default 256): at the cap, a new connection closes
    /// the oldest unfinished handshake of the address holding the most, or is
    /// closed itself when none is unfinished.
    pub max_connections: Option<usize>,
    /// Unfinished handshakes one client address may hold (default 16); a new one
    /// closes that address's oldest.
    pub max_handshakes_per_address: Option<usize>,
    /// NBD connections one client address may hold (default 128); at the cap its
    /// oldest unfinished handshake makes room, else the new one is closed.
    pub max_connections_per_address: Option<usize>,
    /// Seconds a client may leave replies unread (its socket taking nothing) before
    /// it is cut off (default 30).
    pub send_timeout: Option<f64>,
    /// The largest NBD read or write served to a client that never learned the
    /// advertised 32 MiB maximum ("64M" by default; up to "1G"), streamed through
    /// bounded buffers.
    pub unnegotiated_payload_limit: Option<String>,
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
#[derive(Debug, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExportSection {
    /// The name clients ask for (NBD export name; the iSCSI target name's end).
    pub name: String,
    /// Text shown to clients that list exports.
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
    /// Refuse every write.
    #[serde(default)]
    pub read_only: bool,
    /// Bypass the page cache (O_DIRECT).
    #[serde(default)]
    pub direct: bool,
    /// Start writeback of sequential buffered writes every this many bytes per stream
    /// ("16M", say: shorter flushes after long writes, less throughput while they fit
    /// in the page cache); "0", the default, leaves writeback to the kernel.
    pub write_behind: Option<String>,
    /// Serve this export over NBD (default true).
    #[serde(default = "yes")]
    pub nbd: bool,
    /// Also serve this export over AoE.
    pub aoe: Option<AoeSection>,
    /// Also serve this export over iSCSI, as LUN 0 of its own target.
    pub iscsi: Option<IscsiExport>,
    /// Also serve this export over NVMe/TCP, as namespace 1 of its own subsystem.
    pub nvme: Option<NvmeExport>,
    /// For a `path` of `rbd:POOL/IMAGE`: how to reach the cluster, as the spec's
    /// `:KEY=VALUE` options (each key in one place only).
    pub rbd: Option<RbdSection>,
    /// Limit reads and writes together to this many MB/s (10^6 bytes), like a disk.
    pub disk_rate: Option<f64>,
    /// Add this many milliseconds to every request, like a disk.
    pub disk_latency: Option<f64>,
}

impl ExportSection {
    /// The NVMe/TCP settings, if the export is served over NVMe/TCP.
    pub fn nvme_settings(&self) -> Option<NvmeExportSettings> {
        self.nvme.as_ref().and_then(NvmeExport::settings)
    }

    /// The Ceph image of an export whose `path` is `rbd:...`, with the options of
    /// its `rbd` table; `None` for any other export.
    pub fn rbd_spec(&self) -> Option<Result<blockwire_rbd::RbdSpec, String>> {
        let path = self.path.as_ref()?.to_str()?;
        if !path.starts_with(blockwire_rbd::PREFIX) {
            return None;
        }
        let options = self.rbd.as_ref().map(RbdSection::options);
        Some(
            blockwire_rbd::RbdSpec::parse_with(path, options.as_deref().unwrap_or_default())
                .map_err(|e| format!("export '{}': {e}", self.name)),
        )
    }
}

/// `rbd = { id = "gateway", conf = "/etc/ceph/ceph.conf" }`: the options of an
/// export's `rbd:` path, kept out of the path.
#[derive(Debug, Deserialize, JsonSchema, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct RbdSection {
    /// The cephx user, without `client.` (default "admin").
    pub id: Option<String>,
    /// The cluster's configuration file (default: Ceph's own search, $CEPH_CONF first).
    pub conf: Option<PathBuf>,
    /// The user's keyring (default: what the configuration file says).
    pub keyring: Option<PathBuf>,
    /// Seconds a cluster operation may take before the request fails (default 30;
    /// 0 waits forever).
    pub timeout: Option<f64>,
    /// Take librbd's exclusive lock and keep it, so no other client can write.
    pub exclusive: Option<bool>,
}

impl RbdSection {
    /// The table as the spec's `KEY`, `VALUE` pairs.
    pub fn options(&self) -> Vec<(&'static str, String)> {
        let path = |p: &PathBuf| p.to_string_lossy().into_owned();
        let mut options = Vec::new();
        if let Some(id) = &self.id {
            options.push(("id", id.clone()));
        }
        if let Some(conf) = &self.conf {
            options.push(("conf", path(conf)));
        }
        if let Some(keyring) = &self.keyring {
            options.push(("keyring", path(keyring)));
        }
        if let Some(timeout) = self.timeout {
            options.push(("timeout", timeout.to_string()));
        }
        if let Some(exclusive) = self.exclusive {
            options.push(("exclusive", exclusive.to_string()));
        }
        options
    }
}

/// `[[volume]]`: a striped volume (RAID-0) over member devices.
#[derive(Debug, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VolumeSection {
    /// The name exports use in `volume = "NAME"`.
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
#[derive(Debug, Deserialize, JsonSchema, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AoeSection {
    /// Network interfaces to answer on (`["eth0", "eth1"]`).
    pub interfaces: Vec<String>,
    /// Shelf (major address, 0-65534): the target is eSHELF.SLOT.
    pub shelf: u16,
    /// Slot (minor address, 0-254).
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum XdpChoice {
    /// The generic receive path: any interface.
    Generic,
    /// The driver's native XDP.
    Driver,
}

impl XdpChoice {
    /// The values `xdp` and `--aoe-xdp` take, with what each means.
    pub const NAMES: [(&'static str, &'static str); 2] = [
        ("generic", "The generic receive path: any interface"),
        ("driver", "The driver's native XDP"),
    ];

    /// The choice one of [`XdpChoice::NAMES`] names.
    pub fn from_name(name: &str) -> Option<XdpChoice> {
        match name {
            "generic" => Some(XdpChoice::Generic),
            "driver" => Some(XdpChoice::Driver),
            _ => None,
        }
    }

    /// The AoE target's hook for this choice.
    pub fn hook(self) -> blockwire_aoe::rawsock::XdpHook {
        match self {
            XdpChoice::Generic => blockwire_aoe::rawsock::XdpHook::Generic,
            XdpChoice::Driver => blockwire_aoe::rawsock::XdpHook::Driver,
        }
    }
}

impl ServerSection {
    /// `unnegotiated_payload_limit` in bytes: from the advertised 32 MiB maximum
    /// (below it the key would refuse what any client may send) to 1 GiB (a reply
    /// chunk's 32-bit length must hold it, and more only invites a denial of
    /// service).
    pub fn unnegotiated_payload_limit(&self) -> Result<Option<u32>, String> {
        let Some(text) = &self.unnegotiated_payload_limit else {
            return Ok(None);
        };
        let bytes = parse_size(text)?;
        let (min, max) = (u64::from(DeviceInfo::DEFAULT_MAX_TRANSFER), 1u64 << 30);
        if !(min..=max).contains(&bytes) {
            return Err(format!(
                "{text} ({} to {})",
                format_size(min),
                format_size(max)
            ));
        }
        Ok(Some(bytes as u32))
    }
}

/// A list of strings, or one string for a list of one (`listen = "host:port"`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    match OneOrMany::deserialize(deserializer) {
        Ok(OneOrMany::One(one)) => Ok(vec![one]),
        Ok(OneOrMany::Many(many)) => Ok(many),
        Err(_) => Err(serde::de::Error::custom(
            "expected an address \"HOST:PORT\" or a list of them",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

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
    fn the_unnegotiated_payload_limit_is_a_size_within_bounds() {
        let limit = |text: &str| {
            let config: Config = toml::from_str(&format!("[server]\n{text}")).unwrap();
            config.server.unnegotiated_payload_limit()
        };
        assert_eq!(limit("").unwrap(), None);
        assert_eq!(
            limit("unnegotiated_payload_limit = \"64M\"").unwrap(),
            Some(64 << 20)
        );
        assert_eq!(
            limit("unnegotiated_payload_limit = \"1G\"").unwrap(),
            Some(1 << 30)
        );
        for refused in ["\"16M\"", "\"2G\"", "\"lots\""] {
            assert!(limit(&format!("unnegotiated_payload_limit = {refused}")).is_err());
            // The validation names the key.
            let text = format!(
                "[server]\nunnegotiated_payload_limit = {refused}\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n"
            );
            let err = toml::from_str::<Config>(&text)
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(
                err.to_string().contains("unnegotiated_payload_limit"),
                "{err}"
            );
        }
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
        assert!(
            err.contains("volume 'v': members: the volume has no members"),
            "{err}"
        );
        let err = load("[[export]]\nname = \"a\"\nmemory = \"1M\"\nvolume = \"v\"\n").unwrap_err();
        assert!(err.contains("exactly one of"), "{err}");
    }

    #[test]
    fn an_rbd_table_gives_the_options_of_an_rbd_path() {
        let text = r#"
            [[export]]
            name = "vm"
            path = "rbd:rbd/vm"
            rbd = { id = "gateway", conf = "/etc/ceph/ceph.conf", keyring = "/k", timeout = 2.5, exclusive = true }
        "#;
        let config: Config = toml::from_str(text).unwrap();
        config.validate().unwrap();
        let options = config.exports[0].rbd.as_ref().unwrap().options();
        let options: Vec<(&str, &str)> = options.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            options,
            [
                ("id", "gateway"),
                ("conf", "/etc/ceph/ceph.conf"),
                ("keyring", "/k"),
                ("timeout", "2.5"),
                ("exclusive", "true"),
            ]
        );
        let spec = blockwire_rbd::RbdSpec::parse_with(
            "rbd:rbd/vm",
            &config.exports[0].rbd.as_ref().unwrap().options(),
        )
        .unwrap();
        assert_eq!((spec.id.as_str(), spec.exclusive), ("gateway", true));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[[export]]\nname = \"a\"\npath = \"/srv/a.img\"\nrbd = { id = \"x\" }\n",
        )
        .unwrap();
        let err = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(
            err.contains("export 'a': rbd: an rbd table needs a path of rbd:"),
            "{err}"
        );
        let unknown = "[[export]]\nname = \"a\"\npath = \"rbd:p/i\"\nrbd = { user = \"x\" }\n";
        assert!(toml::from_str::<Config>(unknown).is_err());
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
            ("docs/ceph.md", include_str!("../../../docs/ceph.md")),
        ];
        for (page, text) in pages {
            let blocks = toml_blocks(text);
            assert!(!blocks.is_empty(), "{page} has no TOML example");
            for block in blocks {
                // The files and interfaces they name are the reader's: the
                // configuration itself must be valid.
                let parsed = toml::from_str::<Config>(&block)
                    .map_err(|e| e.to_string())
                    .and_then(|config| config.validate().map_err(|e| e.to_string()));
                if let Err(e) = parsed {
                    panic!("{page}: the example is not valid: {e}\n{block}");
                }
            }
        }
    }
}
