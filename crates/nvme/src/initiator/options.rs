//! `nvme+tcp://HOST[:PORT]/SUBNQN[/NSID][?hdr_digest=1&data_digest=1&queues=N]`
//! parsed into the options a connection is made with, and the host's own names
//! (host NQN and host ID) as nvme-cli finds them.

use std::fmt;
use std::time::Duration;

use super::error::InitiatorError;
use crate::fabrics::DISCOVERY_NQN;

/// The scheme of an NVMe/TCP device URI.
pub const SCHEME: &str = "nvme+tcp://";
/// The IANA port of NVMe/TCP I/O controllers.
pub const DEFAULT_PORT: u16 = 4420;
/// The IANA port of NVMe/TCP discovery controllers.
pub const DEFAULT_DISCOVERY_PORT: u16 = 8009;
/// Most I/O queues opened by default (one per CPU up to this).
pub const DEFAULT_MAX_QUEUES: usize = 4;
/// How long requests in flight wait for a restarted target by default: the
/// same as the other initiators'.
pub use blockwire_blockdev::paths::DEFAULT_RECONNECT;

/// Everything a connection to one namespace needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeOptions {
    pub host: String,
    pub port: u16,
    /// The subsystem's NQN ([`DISCOVERY_NQN`] for a discovery controller).
    pub subnqn: String,
    pub nsid: u32,
    pub header_digest: bool,
    pub data_digest: bool,
    /// I/O queues (each its own TCP connection) to open.
    pub queues: usize,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// Keep-alive timeout asked for at Connect; a keep-alive goes out every half.
    pub keep_alive: Duration,
    /// How long to wait for the target to answer setup commands.
    pub setup_timeout: Duration,
    /// How long to keep reconnecting after the connections drop; requests in
    /// flight are then sent again. `None`: they fail at once.
    pub reconnect: Option<Duration>,
}

impl NvmeOptions {
    /// Options for subsystem `subnqn` at `host:port`, with this machine's host
    /// names and the defaults for the rest.
    pub fn new(host: impl Into<String>, port: u16, subnqn: impl Into<String>) -> NvmeOptions {
        let (hostnqn, hostid) = host_identity();
        NvmeOptions {
            host: host.into(),
            port,
            subnqn: subnqn.into(),
            nsid: 1,
            header_digest: false,
            data_digest: false,
            queues: default_queues(),
            hostnqn,
            hostid,
            keep_alive: Duration::from_secs(15),
            setup_timeout: Duration::from_secs(10),
            reconnect: Some(DEFAULT_RECONNECT),
        }
    }

    /// Parses an `nvme+tcp://` URI. Without a subsystem NQN the URI names the
    /// host's discovery controller (port 8009 unless given).
    pub fn parse(uri: &str) -> Result<NvmeOptions, InitiatorError> {
        let bad = |reason: &str| InitiatorError::Uri {
            uri: uri.to_owned(),
            reason: reason.to_owned(),
        };
        let rest = uri
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it does not start with nvme+tcp://"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = split_host_port(authority).map_err(&bad)?;
        let mut parts = path.trim_end_matches('/').splitn(2, '/');
        let subnqn = parts.next().unwrap_or("").to_owned();
        let nsid = match parts.next() {
            Some(n) => n
                .parse::<u32>()
                .ok()
                .filter(|&n| n != 0 && n != u32::MAX)
                .ok_or_else(|| bad("the namespace ID is not a number from 1 to 4294967294"))?,
            None => 1,
        };
        let discovery = subnqn.is_empty() || subnqn == DISCOVERY_NQN;
        let default_port = if discovery {
            DEFAULT_DISCOVERY_PORT
        } else {
            DEFAULT_PORT
        };
        let subnqn = if subnqn.is_empty() {
            DISCOVERY_NQN.to_owned()
        } else {
            subnqn
        };
        if subnqn.len() > 223 {
            return Err(bad("the subsystem NQN is longer than 223 bytes"));
        }
        let mut options = NvmeOptions::new(host, port.unwrap_or(default_port), subnqn);
        options.nsid = nsid;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, "1"));
            let flag = || match value {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(bad(&format!("{key}={value} is not a yes or no"))),
            };
            match key {
                "hdr_digest" => options.header_digest = flag()?,
                "data_digest" => options.data_digest = flag()?,
                "queues" => {
                    options.queues = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(|| bad("queues is not a number from 1 to 64"))?
                }
                "hostnqn" => options.hostnqn = value.to_owned(),
                _ => return Err(bad(&format!("unknown option {key}"))),
            }
        }
        Ok(options)
    }

    /// Whether these options name a discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.subnqn == DISCOVERY_NQN
    }

    /// `host:port`, bracketing an IPv6 address.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for NvmeOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{}/{}/{}",
            self.address(),
            self.subnqn,
            self.nsid
        )
    }
}

/// Splits `host[:port]` or `[v6][:port]`.
fn split_host_port(authority: &str) -> Result<(String, Option<u16>), &'static str> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("an IPv6 address lacks its ]")?;
        match after {
            "" => (host, None),
            _ => (
                host,
                Some(
                    after
                        .strip_prefix(':')
                        .ok_or("junk after the IPv6 address")?,
                ),
            ),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no host");
    }
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or("the port is not a number from 1 to 65535")?,
        ),
        None => None,
    };
    Ok((host.to_owned(), port))
}

/// One I/O queue per CPU, at most [`DEFAULT_MAX_QUEUES`].
pub fn default_queues() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, DEFAULT_MAX_QUEUES)
}

/// This host's NQN and ID: /etc/nvme/hostnqn and /etc/nvme/hostid when readable
/// (so a target's allowed-hosts list matches what nvme-cli sends), otherwise
/// both derived from /etc/machine-id, which stays the same across boots.
pub fn host_identity() -> (String, [u8; 16]) {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
    };
    let machine = read("/etc/machine-id").and_then(|m| parse_hex_id(&m));
    let hostid = read("/etc/nvme/hostid")
        .and_then(|s| parse_hex_id(&s))
        .or(machine)
        .unwrap_or_else(|| uuid_from(b"blockwire-host"));
    let hostnqn = read("/etc/nvme/hostnqn")
        .filter(|s| s.starts_with("nqn."))
        .unwrap_or_else(|| nqn_for(&hostid));
    (hostnqn, hostid)
}

/// The UUID-form host NQN (NVMe base 2.0, section 4.5) for `id`.
pub fn nqn_for(id: &[u8; 16]) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid_string(id))
}

/// 8-4-4-4-12 hex.
fn uuid_string(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// 32 hex digits (dashes ignored) as 16 bytes, made a version 4 style UUID so
/// the same machine ID always gives the same, well-formed ID.
fn parse_hex_id(text: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        id[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(uuid_from(&id))
}

/// Sets the UUID version and variant bits of 16 bytes derived from `seed`.
fn uuid_from(seed: &[u8]) -> [u8; 16] {
    let mut id = [0u8; 16];
    for (i, chunk) in id.chunks_mut(4).enumerate() {
        let mut salted = seed.to_vec();
        salted.push(i as u8);
        let word = if seed.len() == 16 {
            u32::from_be_bytes(seed[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
        } else {
            crate::pdu::digest::crc32c(&salted)
        };
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_uri() {
        let o = NvmeOptions::parse(
            "nvme+tcp://10.0.0.2:4421/nqn.2026-11.dev.blockwire:disk/3?hdr_digest=1&data_digest=1&queues=2",
        )
        .unwrap();
        assert_eq!(o.host, "10.0.0.2");
        assert_eq!(o.port, 4421);
        assert_eq!(o.subnqn, "nqn.2026-11.dev.blockwire:disk");
        assert_eq!(o.nsid, 3);
        assert!(o.header_digest && o.data_digest);
        assert_eq!(o.queues, 2);
        assert!(!o.is_discovery());
        assert_eq!(
            o.to_string(),
            "nvme+tcp://10.0.0.2:4421/nqn.2026-11.dev.blockwire:disk/3"
        );
    }

    #[test]
    fn defaults() {
        let o = NvmeOptions::parse("nvme+tcp://host/nqn.x:y").unwrap();
        assert_eq!((o.port, o.nsid), (4420, 1));
        assert!(!o.header_digest && !o.data_digest);
        assert!((1..=DEFAULT_MAX_QUEUES).contains(&o.queues));
        assert!(o.hostnqn.starts_with("nqn."));
    }

    #[test]
    fn discovery_uri() {
        let o = NvmeOptions::parse("nvme+tcp://[::1]").unwrap();
        assert_eq!(o.host, "::1");
        assert_eq!(o.port, 8009);
        assert!(o.is_discovery());
        assert_eq!(o.address(), "[::1]:8009");
        let o = NvmeOptions::parse("nvme+tcp://h:9000/").unwrap();
        assert_eq!((o.port, o.is_discovery()), (9000, true));
    }

    #[test]
    fn bad_uris() {
        for uri in [
            "nbd://h/x",
            "nvme+tcp:///nqn.x",
            "nvme+tcp://h:0/nqn.x",
            "nvme+tcp://h:99999/nqn.x",
            "nvme+tcp://h/nqn.x/0",
            "nvme+tcp://h/nqn.x/abc",
            "nvme+tcp://h/nqn.x?queues=0",
            "nvme+tcp://h/nqn.x?hdr_digest=maybe",
            "nvme+tcp://h/nqn.x?colour=blue",
            "nvme+tcp://[::1/nqn.x",
        ] {
            assert!(NvmeOptions::parse(uri).is_err(), "{uri} was accepted");
        }
    }

    #[test]
    fn host_id_from_machine_id_is_stable_and_a_uuid() {
        let a = parse_hex_id("0123456789abcdef0123456789abcdef").unwrap();
        let b = parse_hex_id("01234567-89ab-cdef-0123-456789abcdef").unwrap();
        assert_eq!(a, b);
        assert_eq!(a[6] >> 4, 4);
        assert_eq!(a[8] >> 6, 2);
        assert_eq!(
            nqn_for(&a),
            "nqn.2014-08.org.nvmexpress:uuid:01234567-89ab-4def-8123-456789abcdef"
        );
        assert!(parse_hex_id("short").is_none());
        assert_eq!(host_identity(), host_identity());
    }
}
