//! `iscsi://[user[%password]@]host[:port]/IQN/LUN[?key=value&...]`, as libiscsi spells
//! it (libiscsi's `iscsi_parse_full_url`), and `iscsi://host[:port]` for discovery.
//!
//! A password on the command line shows up in `ps` and shell history, so it may also
//! come from the environment (`BLOCKWIRE_CHAP_SECRET`) or a file (`?secret-file=PATH`);
//! the URI's own `%password` is accepted for compatibility with libiscsi's tools.
//! Query keys: `digest=crc32c|none`, `secret-file=PATH`, `target-user=NAME` and
//! `target-secret-file=PATH` (mutual CHAP), `initiator=IQN`, `sessions=N`,
//! `reconnect=SECS`.

use std::fmt;
use std::str::FromStr;

/// The well-known iSCSI port (RFC 7143 §13.2 of the IANA considerations).
pub const DEFAULT_PORT: u16 = 3260;
/// Environment variable holding the CHAP secret when the URI names a user.
pub const SECRET_ENV: &str = "BLOCKWIRE_CHAP_SECRET";
/// Environment variable holding the target's secret for mutual CHAP.
pub const TARGET_SECRET_ENV: &str = "BLOCKWIRE_CHAP_TARGET_SECRET";

/// Why a URI does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error("'{0}': an iSCSI URI starts with iscsi://")]
    Scheme(String),
    #[error("'{0}': no host")]
    NoHost(String),
    #[error("'{uri}': bad port '{port}'")]
    Port { uri: String, port: String },
    #[error("'{uri}': bad LUN '{lun}' (expected a number)")]
    Lun { uri: String, lun: String },
    #[error("'{0}': expected iscsi://HOST[:PORT]/IQN/LUN")]
    Path(String),
    #[error("'{uri}': unknown or malformed option '{option}'")]
    Option { uri: String, option: String },
}

/// A parsed iSCSI URI. `Debug` and `Display` never show the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUri {
    pub host: String,
    pub port: u16,
    /// The target's name; `None` for a discovery URI (`iscsi://host[:port]`).
    pub target: Option<String>,
    pub lun: u64,
    /// CHAP user name (`user@` in the URI).
    pub user: Option<String>,
    /// CHAP secret given in the URI itself (`user%secret@`).
    pub password: Option<String>,
    /// `?secret-file=PATH`.
    pub secret_file: Option<String>,
    /// Mutual CHAP: the name the target must answer with (`?target-user=`).
    pub target_user: Option<String>,
    /// Mutual CHAP: where the target's secret is (`?target-secret-file=`).
    pub target_secret_file: Option<String>,
    /// `?digest=crc32c`: ask for CRC32C header and data digests.
    pub digest: bool,
    /// `?initiator=IQN`: our name instead of the default.
    pub initiator: Option<String>,
    /// `?sessions=N`: sessions to open to the target.
    pub sessions: usize,
    /// `?reconnect=SECS`: how long to keep reconnecting after a connection drops
    /// (0: fail at once); `None` leaves it to the caller's options.
    pub reconnect: Option<u64>,
}

impl fmt::Debug for IscsiUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IscsiUri({self})")
    }
}

impl fmt::Display for IscsiUri {
    /// The URI without any secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("iscsi://")?;
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        if self.port != DEFAULT_PORT {
            write!(f, ":{}", self.port)?;
        }
        if let Some(target) = &self.target {
            write!(f, "/{target}/{}", self.lun)?;
        }
        Ok(())
    }
}

impl IscsiUri {
    /// A URI for `target`'s `lun` at `host:port`, without authentication.
    pub fn new(host: &str, port: u16, target: &str, lun: u64) -> IscsiUri {
        IscsiUri {
            host: host.to_string(),
            port,
            target: Some(target.to_string()),
            lun,
            user: None,
            password: None,
            secret_file: None,
            target_user: None,
            target_secret_file: None,
            digest: false,
            initiator: None,
            sessions: 1,
            reconnect: None,
        }
    }

    /// `host:port` as a socket address string (IPv6 in brackets).
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for IscsiUri {
    type Err = UriError;

    fn from_str(text: &str) -> Result<IscsiUri, UriError> {
        let uri = || text.to_string();
        let rest = text
            .strip_prefix("iscsi://")
            .ok_or_else(|| UriError::Scheme(uri()))?;
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((authority, path)) => (authority, path),
            None => (rest, ""),
        };
        // The user part ends at the last '@': a password may hold one.
        let (user, password, hostport) = match authority.rsplit_once('@') {
            Some((credentials, hostport)) => match credentials.split_once('%') {
                Some((user, password)) => {
                    (Some(user.to_string()), Some(password.to_string()), hostport)
                }
                None => (Some(credentials.to_string()), None, hostport),
            },
            None => (None, None, authority),
        };
        let (host, port) = split_host_port(hostport).ok_or_else(|| UriError::NoHost(uri()))?;
        let port = match port {
            None => DEFAULT_PORT,
            Some(port) => port
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| UriError::Port {
                    uri: uri(),
                    port: port.to_string(),
                })?,
        };
        let path = path.trim_end_matches('/');
        let (target, lun) = if path.is_empty() {
            (None, 0)
        } else {
            let (target, lun) = path.split_once('/').ok_or_else(|| UriError::Path(uri()))?;
            if target.is_empty() || lun.contains('/') {
                return Err(UriError::Path(uri()));
            }
            let lun = lun.parse::<u64>().map_err(|_| UriError::Lun {
                uri: uri(),
                lun: lun.to_string(),
            })?;
            (Some(target.to_string()), lun)
        };
        let mut parsed = IscsiUri {
            host: host.to_string(),
            port,
            target,
            lun,
            user: user.filter(|u| !u.is_empty()),
            password,
            secret_file: None,
            target_user: None,
            target_secret_file: None,
            digest: false,
            initiator: None,
            sessions: 1,
            reconnect: None,
        };
        for option in query.into_iter().flat_map(|q| q.split('&')) {
            if option.is_empty() {
                continue;
            }
            let bad = || UriError::Option {
                uri: uri(),
                option: option.to_string(),
            };
            let (key, value) = option.split_once('=').ok_or_else(bad)?;
            match key {
                "digest" | "header-digest" => {
                    parsed.digest = match value.to_ascii_lowercase().as_str() {
                        "crc32c" => true,
                        "none" => false,
                        _ => return Err(bad()),
                    }
                }
                "secret-file" if !value.is_empty() => parsed.secret_file = Some(value.into()),
                "target-user" if !value.is_empty() => parsed.target_user = Some(value.into()),
                "target-secret-file" if !value.is_empty() => {
                    parsed.target_secret_file = Some(value.into())
                }
                "initiator" | "initiator-name" if !value.is_empty() => {
                    parsed.initiator = Some(value.into())
                }
                "reconnect" => parsed.reconnect = Some(value.parse::<u64>().map_err(|_| bad())?),
                "sessions" => {
                    parsed.sessions = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=64).contains(n))
                        .ok_or_else(bad)?
                }
                _ => return Err(bad()),
            }
        }
        Ok(parsed)
    }
}

/// Splits `host[:port]` or `[v6]:port`.
fn split_host_port(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        return (!host.is_empty()).then_some((host, port));
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    };
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libiscsi_forms_parse() {
        let uri: IscsiUri = "iscsi://127.0.0.1:3261/iqn.2026-11.dev.blockwire:disk/1"
            .parse()
            .unwrap();
        assert_eq!(uri.host, "127.0.0.1");
        assert_eq!(uri.port, 3261);
        assert_eq!(
            uri.target.as_deref(),
            Some("iqn.2026-11.dev.blockwire:disk")
        );
        assert_eq!(uri.lun, 1);
        assert_eq!(uri.address(), "127.0.0.1:3261");

        let uri: IscsiUri = "iscsi://alice%s3cr%40t@[::1]/iqn.x:y/0?digest=crc32c"
            .parse()
            .unwrap();
        assert_eq!(uri.user.as_deref(), Some("alice"));
        assert_eq!(uri.password.as_deref(), Some("s3cr%40t"));
        assert_eq!(uri.host, "::1");
        assert_eq!(uri.port, DEFAULT_PORT);
        assert!(uri.digest);
        assert_eq!(uri.address(), "[::1]:3260");
        // Display and Debug hide the secret.
        assert_eq!(uri.to_string(), "iscsi://alice@[::1]/iqn.x:y/0");
        assert!(!format!("{uri:?}").contains("s3cr"));
    }

    #[test]
    fn discovery_and_options() {
        let uri: IscsiUri = "iscsi://host:3260".parse().unwrap();
        assert_eq!(uri.target, None);
        let uri: IscsiUri = "iscsi://host/".parse().unwrap();
        assert_eq!(uri.target, None);
        let uri: IscsiUri = "iscsi://bob@host/iqn.a:b/2?secret-file=/run/s&sessions=4&reconnect=0"
            .parse()
            .unwrap();
        assert_eq!(uri.secret_file.as_deref(), Some("/run/s"));
        assert_eq!(uri.sessions, 4);
        assert_eq!(uri.reconnect, Some(0));
        assert_eq!(uri.password, None);
    }

    #[test]
    fn bad_uris_are_refused() {
        for bad in [
            "nbd://host/x",
            "iscsi://",
            "iscsi://host:0/iqn.a/0",
            "iscsi://host:99999/iqn.a/0",
            "iscsi://host/iqn.a",
            "iscsi://host/iqn.a/x",
            "iscsi://host/iqn.a/0/1",
            "iscsi://host/iqn.a/0?digest=md5",
            "iscsi://host/iqn.a/0?bogus=1",
            "iscsi://host/iqn.a/0?sessions=0",
        ] {
            assert!(bad.parse::<IscsiUri>().is_err(), "{bad} parsed");
        }
    }
}
