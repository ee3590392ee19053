//! `blockwire serve`'s flags: one file or memory exported over the protocols they
//! name, or `--config FILE`; their meaning is decided in `serve.rs` and checked
//! with the configuration's one validation (`serve_args_check.rs`).

use std::path::PathBuf;
use std::time::Duration;

use blockwire_blockdev::size::parse_size;
use blockwire_server::config::XdpChoice;
use blockwire_server::factory::parse_reconnect;
use blockwire_server::throttle;
use clap::Args;

use crate::tls_args::TlsArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// File or block device to export, or a remote device (nbd://, aoe://, iscsi://,
    /// nvme+tcp://) or a striped volume (stripe:CHUNK:MEMBER,MEMBER,...) to serve
    /// again as a gateway. Without it (and without --config), serves a 1 GiB
    /// in-memory demo export. Served over NBD unless --aoe, --iscsi or --nvme alone
    /// is given.
    pub path: Option<PathBuf>,

    /// Create PATH as a sparse file of this size if it does not exist (e.g. 4G).
    /// An existing file is never resized.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,

    /// Export name clients ask for (default: the file name, or "demo").
    #[arg(long)]
    pub name: Option<String>,

    /// Text shown to clients that list exports.
    #[arg(long, default_value = "")]
    pub description: String,

    /// NBD: TCP address to listen on; repeatable. Default 127.0.0.1:10809 (loopback
    /// only).
    #[arg(help_heading = "NBD", long, value_name = "HOST:PORT")]
    pub listen: Vec<String>,

    /// NBD: Unix socket to listen on; repeatable. With only --socket, no TCP listener.
    #[arg(help_heading = "NBD", long, value_name = "PATH")]
    pub socket: Vec<PathBuf>,

    /// Refuse every write.
    #[arg(long)]
    pub read_only: bool,

    /// For an rbd: image: take librbd's exclusive lock and keep it, so a second
    /// gateway cannot write the image (it fails in one line); same as :exclusive=true.
    #[arg(long)]
    pub exclusive: bool,

    /// Bypass the page cache (O_DIRECT); requests must then be aligned as the file
    /// system says (512 B or 4 KiB; advertised to NBD clients).
    #[arg(long)]
    pub direct: bool,

    /// Start writeback of each sequential stream of buffered writes every SIZE bytes
    /// (16M, say), so a flush after a long write waits only for the last piece, at a
    /// cost in throughput and CPU while data fits in the page cache; 0 (the default)
    /// leaves writeback to the kernel.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "0")]
    pub write_behind: u64,

    /// For a remote PATH (a gateway): keep reconnecting this many seconds when an
    /// NBD, iSCSI or NVMe/TCP connection drops, then send again what had no answer; 0 fails
    /// at once. Default 30.
    #[arg(long, value_name = "SECS", value_parser = parse_reconnect)]
    pub reconnect: Option<Duration>,

    /// Threads for requests that may block (flush, FUA, cache misses), for every
    /// protocol.
    #[arg(help_heading = "Limits", long, default_value_t = 16)]
    pub workers: usize,

    /// AoE: serve on these interfaces (comma-separated), as eSHELF.SLOT. Without
    /// --listen or --socket, NBD is then not served.
    #[arg(
        help_heading = "AoE",
        long,
        value_name = "IFACE[,IFACE...]",
        value_delimiter = ','
    )]
    pub aoe: Vec<String>,

    /// AoE: the shelf (major address, 0-65534) for --aoe.
    #[arg(help_heading = "AoE", long, requires = "aoe")]
    pub shelf: Option<u16>,

    /// AoE: the slot (minor address, 0-254) for --aoe.
    #[arg(help_heading = "AoE", long, requires = "aoe")]
    pub slot: Option<u8>,

    /// AoE: the buffer count, the frames an initiator may have outstanding at once (its
    /// window), 1-65535; default 256.
    #[arg(help_heading = "AoE", long, requires = "aoe", value_parser = clap::value_parser!(u16).range(1..))]
    pub buffer_count: Option<u16>,

    /// AoE: send and receive through AF_XDP; an XDP program on each --aoe interface
    /// hands AoE frames to the target (faster per frame at MTU 1500; MTU up to
    /// 3822; tcpdump no longer sees those frames). HOOK is generic (any interface,
    /// the faster on veth; the default) or driver (native XDP).
    #[arg(help_heading = "AoE", long, requires = "aoe", value_name = "HOOK", num_args = 0..=1, default_missing_value = "generic", value_parser = xdp_parser())]
    pub aoe_xdp: Option<XdpChoice>,

    /// iSCSI: serve on this TCP address (repeatable), e.g. 127.0.0.1:3260 or
    /// 0.0.0.0:3260; port 0 takes a free port. The export is LUN 0 of one target.
    /// Without --listen or --socket, NBD is then not served.
    #[arg(help_heading = "iSCSI", long, value_name = "HOST:PORT", value_parser = iscsi_address)]
    pub iscsi: Vec<String>,

    /// iSCSI: the target name (default iqn.2026-11.dev.blockwire:NAME).
    #[arg(help_heading = "iSCSI", long, requires = "iscsi")]
    pub iqn: Option<String>,

    /// iSCSI: the logical block size of the LUN: 512 or 4096.
    #[arg(
        help_heading = "iSCSI",
        long,
        requires = "iscsi",
        default_value_t = 512
    )]
    pub block_size: u32,

    /// iSCSI: require one-way CHAP with this user name for logins; the secret comes
    /// from --chap-secret-file or the BLOCKWIRE_CHAP_SECRET environment variable.
    #[arg(help_heading = "iSCSI", long, requires = "iscsi")]
    pub chap_user: Option<String>,

    /// iSCSI: the file whose first line is the CHAP secret.
    #[arg(
        help_heading = "iSCSI",
        long,
        requires = "chap_user",
        value_name = "FILE"
    )]
    pub chap_secret_file: Option<PathBuf>,

    /// iSCSI: mutual CHAP, the name the target answers the initiator's challenge with; the
    /// secret comes from --mutual-chap-secret-file or BLOCKWIRE_MUTUAL_CHAP_SECRET.
    #[arg(help_heading = "iSCSI", long, requires = "chap_user")]
    pub mutual_chap_user: Option<String>,

    /// iSCSI: the file whose first line is the mutual CHAP secret.
    #[arg(
        help_heading = "iSCSI",
        long,
        requires = "mutual_chap_user",
        value_name = "FILE"
    )]
    pub mutual_chap_secret_file: Option<PathBuf>,

    /// NVMe/TCP: serve on this TCP address (repeatable; port 4420 when none is
    /// given, 127.0.0.1:4420 without a value); port 0 takes a free port. The export
    /// is namespace 1 of one subsystem. Without --listen or --socket, NBD is then
    /// not served. A file's path is not an address: `serve FILE --nvme`.
    #[arg(
        help_heading = "NVMe/TCP",
        long,
        value_name = "HOST[:PORT]",
        num_args = 0..=1,
        default_missing_value = blockwire_server::defaults::NVME_LISTEN,
        value_parser = nvme_address
    )]
    pub nvme: Vec<String>,

    /// NVMe/TCP: the discovery controller's address (repeatable; port 8009 when none
    /// is given). Default: port 8009 on each --nvme host, where `nvme discover`
    /// looks; a second target on the same host needs another address or none.
    #[arg(
        help_heading = "NVMe/TCP",
        long,
        value_name = "HOST[:PORT]",
        requires = "nvme",
        value_parser = nvme_discovery_address
    )]
    pub nvme_discovery: Vec<String>,

    /// NVMe/TCP: no discovery controller on a port of its own (the --nvme ports
    /// answer discovery too): for a second target on a host whose 8009 is taken.
    #[arg(
        help_heading = "NVMe/TCP",
        long,
        requires = "nvme",
        conflicts_with = "nvme_discovery"
    )]
    pub no_nvme_discovery: bool,

    /// NVMe/TCP: the subsystem NQN (default nqn.2026-11.dev.blockwire:NAME).
    #[arg(help_heading = "NVMe/TCP", long, value_name = "NQN", requires = "nvme")]
    pub nqn: Option<String>,

    /// NVMe/TCP: a host NQN allowed to connect (repeatable; default: every host).
    #[arg(help_heading = "NVMe/TCP", long, value_name = "NQN", requires = "nvme")]
    pub nvme_host: Vec<String>,

    /// Also answer the bench's network test (`blockwire bench --netserve-port`) on
    /// this TCP address, e.g. 0.0.0.0:10810; see `blockwire netserve`.
    #[arg(help_heading = "Service", long, value_name = "HOST:PORT")]
    pub netserve: Option<String>,

    /// Limit the export's reads and writes together to this many MB/s (10^6 bytes),
    /// to stand in for a disk (the lab's 70 MB/s disk, say).
    #[arg(help_heading = "Limits", long, value_name = "MB/s", value_parser = throttle::parse_rate, conflicts_with = "config")]
    pub disk_rate: Option<u64>,

    /// Add this many milliseconds to every request of the export, like a disk.
    #[arg(help_heading = "Limits", long, value_name = "MS", value_parser = throttle::parse_latency, conflicts_with = "config")]
    pub disk_latency: Option<std::time::Duration>,

    /// Answer Prometheus scrapes at http://HOST:PORT/metrics (overrides the config
    /// file's [metrics] listen); port 0 takes a free port.
    #[arg(help_heading = "Service", long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,

    /// Serve the exports of this TOML file instead of PATH.
    #[arg(help_heading = "Service", long, value_name = "FILE", conflicts_with_all = ["path", "size", "name", "read_only", "direct", "aoe", "iscsi", "nvme"])]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub tls: TlsArgs,
}

/// `--nvme`'s value: HOST[:PORT], never a file's path (the flag's value is
/// optional, so `serve --nvme disk.img` would otherwise take the file for a host).
fn nvme_address(text: &str) -> Result<String, String> {
    address(text, "--nvme", blockwire_server::defaults::NVME_PORT)
}

/// `--nvme-discovery`'s value, checked as `--nvme`'s.
fn nvme_discovery_address(text: &str) -> Result<String, String> {
    address(
        text,
        "--nvme-discovery",
        blockwire_server::defaults::NVME_DISCOVERY_PORT,
    )
}

/// `--iscsi`'s value, checked as `--nvme`'s (`serve --iscsi disk.img` names no
/// address either).
fn iscsi_address(text: &str) -> Result<String, String> {
    address(text, "--iscsi", 3260)
}

/// `text` when it reads as HOST[:PORT] (names are resolved later, at bind time);
/// otherwise why not, with an example on the protocol's own port.
fn address(text: &str, flag: &str, port: u16) -> Result<String, String> {
    let example = format!("e.g. 127.0.0.1:{port}, [::1]:{port} or 0.0.0.0");
    if text.contains('/') || std::path::Path::new(text).exists() {
        return Err(format!(
            "'{text}' is a file's path, not an address: give the file first \
             (blockwire serve {text} {flag}) or an address to {flag} ({example})"
        ));
    }
    if is_host_port(text) {
        Ok(text.to_string())
    } else {
        Err(format!("'{text}' is not HOST[:PORT] ({example})"))
    }
}

/// Whether `text` is an IP address, `[IPv6]`, or a host name, each with an
/// optional `:PORT`.
fn is_host_port(text: &str) -> bool {
    use std::net::{IpAddr, Ipv6Addr, SocketAddr};
    if text.parse::<SocketAddr>().is_ok() || text.parse::<IpAddr>().is_ok() {
        return true;
    }
    let port_ok = |port: Option<&str>| port.is_none_or(|p| p.parse::<u16>().is_ok());
    if let Some(rest) = text.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return false;
        };
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return false,
            },
        };
        return ip.parse::<Ipv6Addr>().is_ok() && port_ok(port);
    }
    let (host, port) = match text.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    };
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    name_ok && port_ok(port)
}

/// `--aoe-xdp HOOK`: its values listed with their meaning, for help, manual pages and
/// shell completions.
fn xdp_parser() -> impl clap::builder::TypedValueParser<Value = XdpChoice> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    let values = XdpChoice::NAMES.map(|(name, help)| PossibleValue::new(name).help(help));
    PossibleValuesParser::new(values)
        .map(|name| XdpChoice::from_name(&name).expect("one of the listed hooks"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeArgs, String> {
        Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .map(|cli| cli.serve)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn addresses_with_and_without_ports_are_taken() {
        for text in [
            "127.0.0.1",
            "127.0.0.1:0",
            "0.0.0.0:4420",
            "::1",
            "[::1]",
            "[::1]:4420",
            "localhost",
            "host-a.example.com:4420",
        ] {
            assert!(is_host_port(text), "{text}");
        }
        for text in [
            "",
            ":4420",
            "a:b",
            "[::1",
            "[::1]4420",
            "x:99999",
            "a..b",
            "-a",
            "a b",
        ] {
            assert!(!is_host_port(text), "{text}");
        }
    }

    /// `serve --nvme disk.img` names a file where an address may follow: refused
    /// with how to say it, never taken for a host on NBD's port.
    #[test]
    fn a_path_after_nvme_is_refused_with_how_to_say_it() {
        let dir = std::env::temp_dir().join(format!("serve-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let disk = dir.join("disk.img");
        std::fs::write(&disk, b"").unwrap();
        let disk = disk.to_str().unwrap();
        let error = parse(&["--nvme", disk]).unwrap_err();
        assert!(
            error.contains("is a file's path, not an address"),
            "{error}"
        );
        assert!(
            error.contains(&format!("blockwire serve {disk} --nvme")),
            "{error}"
        );
        assert!(error.contains(":4420"), "{error}");
        assert!(!error.contains("10809"), "{error}");
        // A file named without a slash: tests run in the package's folder.
        let bare = parse(&["--nvme", "Cargo.toml"]).unwrap_err();
        assert!(bare.contains("is a file's path"), "{bare}");
        let iscsi = parse(&["--iscsi", disk]).unwrap_err();
        assert!(
            iscsi.contains(&format!("blockwire serve {disk} --iscsi")),
            "{iscsi}"
        );
        assert!(iscsi.contains(":3260"), "{iscsi}");
        std::fs::remove_dir_all(&dir).unwrap();

        let bad = parse(&["--nvme", "no such host"]).unwrap_err();
        assert!(bad.contains("is not HOST[:PORT]"), "{bad}");
        assert!(bad.contains("127.0.0.1:4420"), "{bad}");
        let discovery = parse(&["--nvme", "--nvme-discovery", "a:b"]).unwrap_err();
        assert!(discovery.contains("127.0.0.1:8009"), "{discovery}");
    }

    #[test]
    fn nvme_takes_an_optional_address_and_the_file_comes_first_or_last() {
        let args = parse(&["disk.img", "--nvme"]).unwrap();
        assert_eq!(args.path.as_deref(), Some(std::path::Path::new("disk.img")));
        assert_eq!(args.nvme, [blockwire_server::defaults::NVME_LISTEN]);
        let args = parse(&["--nvme", "127.0.0.1:0", "disk.img"]).unwrap();
        assert_eq!(args.nvme, ["127.0.0.1:0"]);
        assert_eq!(args.path.as_deref(), Some(std::path::Path::new("disk.img")));
        let args = parse(&["disk.img", "--nvme", "--no-nvme-discovery"]).unwrap();
        assert!(args.no_nvme_discovery);
        let both = parse(&[
            "--nvme",
            "--no-nvme-discovery",
            "--nvme-discovery",
            "127.0.0.1",
        ]);
        assert!(both.is_err());
    }
}
