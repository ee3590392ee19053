//! NBD URIs as libnbd spells them (its `nbd_connect_uri` documentation):
//!
//! - `nbd://host[:port]/export` — TCP; the port defaults to 10809, the export to the
//!   empty name (`nbd://host` and `nbd://host/` both select the server's default);
//! - `nbd+unix:///export?socket=PATH` — a Unix domain socket;
//! - `nbds://[user@]host[:port]/export`, `nbds+unix://[user@]/export?socket=PATH` —
//!   the same inside TLS, with libnbd's parameters `tls-certificates=DIR`,
//!   `tls-psk-file=FILE`, `tls-username=USER` (or the user part), `tls-verify-peer=
//!   false` and `tls-hostname=NAME`.
//!
//! The export name is the path without its first `/`, percent-decoded, so
//! `nbd://host//abs` names the export `/abs`. Vsock, and TLS parameters on a URI
//! without TLS, are refused with a clear message rather than silently ignored.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::tls::InitiatorTlsSettings;

/// The NBD port registered with IANA.
pub const DEFAULT_PORT: u16 = 10809;

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A host name or IP address (IPv6 without brackets) and a port.
    Tcp { host: String, port: u16 },
    /// A Unix domain socket.
    Unix { socket: PathBuf },
}

/// A parsed NBD URI: where the server is and which export to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub endpoint: Endpoint,
    /// The export name; empty selects the server's default export.
    pub export: String,
    /// TLS settings for `nbds` URIs; `None` speaks plain text.
    pub tls: Option<InitiatorTlsSettings>,
}

/// Why a string is not a usable NBD URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error(
        "'{0}' is not a URI (expected nbd://host[:port]/export or nbd+unix:///export?socket=PATH)"
    )]
    NotUri(String),
    #[error("scheme '{0}' is not NBD (expected nbd:// or nbd+unix://)")]
    Scheme(String),
    #[error("TLS parameters such as '{0}' need an nbds:// or nbds+unix:// URI")]
    Tls(String),
    #[error("tls-verify-peer must be true or false, not '{0}'")]
    VerifyPeer(String),
    #[error("'{0}' is a vsock address, which the initiator does not support")]
    Vsock(String),
    #[error("the URI names no host (nbd://HOST[:PORT]/EXPORT)")]
    MissingHost,
    #[error("'{0}' is not a port number (1-65535)")]
    Port(String),
    #[error("IPv6 address '{0}' must be written in brackets: nbd://[{0}]/export")]
    UnbracketedIpv6(String),
    #[error("user names in NBD URIs are only used with TLS (nbds://USER@HOST/...)")]
    UserInfo,
    #[error("nbd+unix:// URIs take no host ('{0}'); write nbd+unix:///export?socket=PATH")]
    UnixHost(String),
    #[error("nbd+unix:// needs the socket path: nbd+unix:///export?socket=PATH")]
    MissingSocket,
    #[error("'socket=' is only valid with nbd+unix://")]
    SocketWithTcp,
    #[error("query parameter '{0}' is not supported")]
    Parameter(String),
    #[error("query parameter '{0}' is given twice")]
    DuplicateParameter(String),
    #[error("URI fragments ('#...') are not allowed; write '#' in an export name as %23")]
    Fragment,
    #[error("bad percent-encoding in '{0}'")]
    Percent(String),
}

impl NbdUri {
    /// `nbd://host:port/export`.
    pub fn tcp(host: impl Into<String>, port: u16, export: impl Into<String>) -> NbdUri {
        NbdUri {
            endpoint: Endpoint::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
            tls: None,
        }
    }

    /// `nbd+unix:///export?socket=PATH`.
    pub fn unix(socket: impl AsRef<Path>, export: impl Into<String>) -> NbdUri {
        NbdUri {
            endpoint: Endpoint::Unix {
                socket: socket.as_ref().to_path_buf(),
            },
            export: export.into(),
            tls: None,
        }
    }

    /// The same address inside TLS with these settings.
    pub fn with_tls(mut self, tls: InitiatorTlsSettings) -> NbdUri {
        self.tls = Some(tls);
        self
    }

    /// The same server with another export name.
    pub fn with_export(&self, export: impl Into<String>) -> NbdUri {
        NbdUri {
            endpoint: self.endpoint.clone(),
            export: export.into(),
            tls: self.tls.clone(),
        }
    }
}

impl FromStr for NbdUri {
    type Err = UriError;

    fn from_str(text: &str) -> Result<NbdUri, UriError> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| UriError::NotUri(text.to_string()))?;
        let (unix, secure) = match scheme.to_ascii_lowercase().as_str() {
            "nbd" => (false, false),
            "nbd+unix" => (true, false),
            "nbds" => (false, true),
            "nbds+unix" => (true, true),
            "nbd+vsock" | "nbds+vsock" => return Err(UriError::Vsock(text.to_string())),
            _ => return Err(UriError::Scheme(scheme.to_string())),
        };
        if rest.contains('#') {
            return Err(UriError::Fragment);
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash + 1..]),
            None => (rest, ""),
        };
        let (user, authority) = match authority.rsplit_once('@') {
            Some(_) if !secure => return Err(UriError::UserInfo),
            Some((user, rest)) => (Some(percent_decode(user)?), rest),
            None => (None, authority),
        };
        let export = percent_decode(path)?;

        let mut socket = None;
        let mut tls = InitiatorTlsSettings {
            username: user,
            ..InitiatorTlsSettings::default()
        };
        let mut seen = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(key)?;
            match key.as_str() {
                "socket" if !unix => return Err(UriError::SocketWithTcp),
                "socket" if socket.is_some() => return Err(UriError::DuplicateParameter(key)),
                "socket" => socket = Some(PathBuf::from(percent_decode(value)?)),
                name if name.starts_with("tls-") && !secure => return Err(UriError::Tls(key)),
                name if name.starts_with("tls-") && seen.contains(&key) => {
                    return Err(UriError::DuplicateParameter(key))
                }
                "tls-certificates" => tls.certificates = Some(percent_decode(value)?.into()),
                "tls-psk-file" => tls.psk_file = Some(percent_decode(value)?.into()),
                "tls-username" => tls.username = Some(percent_decode(value)?),
                "tls-hostname" => tls.hostname = Some(percent_decode(value)?),
                "tls-verify-peer" => {
                    tls.verify_peer = match percent_decode(value)?.to_ascii_lowercase().as_str() {
                        "true" | "1" | "yes" | "on" => true,
                        "false" | "0" | "no" | "off" => false,
                        other => return Err(UriError::VerifyPeer(other.to_string())),
                    }
                }
                _ => return Err(UriError::Parameter(key)),
            }
            seen.push(key);
        }

        let endpoint = if unix {
            if !authority.is_empty() {
                return Err(UriError::UnixHost(authority.to_string()));
            }
            match socket {
                Some(socket) if !socket.as_os_str().is_empty() => Endpoint::Unix { socket },
                _ => return Err(UriError::MissingSocket),
            }
        } else {
            let (host, port) = parse_authority(authority)?;
            Endpoint::Tcp { host, port }
        };
        Ok(NbdUri {
            endpoint,
            export,
            tls: secure.then_some(tls),
        })
    }
}

/// Splits `host[:port]` or `[v6][:port]`.
fn parse_authority(authority: &str) -> Result<(String, u16), UriError> {
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| UriError::NotUri(authority.to_string()))?;
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| UriError::NotUri(authority.to_string()))?,
            ),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err(UriError::UnbracketedIpv6(authority.to_string()))
            }
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(UriError::MissingHost);
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port != 0 && text.bytes().all(|b| b.is_ascii_digit()) => port,
            _ => return Err(UriError::Port(text.to_string())),
        },
    };
    Ok((percent_decode(host)?, port))
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Decodes `%XX` escapes; the result must be UTF-8 (NBD strings are).
fn percent_decode(text: &str) -> Result<String, UriError> {
    let bad = || UriError::Percent(text.to_string());
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let high = bytes
                .get(i + 1)
                .copied()
                .and_then(hex_value)
                .ok_or_else(bad)?;
            let low = bytes
                .get(i + 2)
                .copied()
                .and_then(hex_value)
                .ok_or_else(bad)?;
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Appends `text`, escaping every byte that is not allowed unescaped in a URI path
/// (RFC 3986 `pchar` and `/`) or, for query values, that would end the value.
fn percent_encode(out: &mut String, text: &str, query: bool) {
    for &byte in text.as_bytes() {
        let plain = byte.is_ascii_alphanumeric()
            || b"-._~!$'()*+,;:@/".contains(&byte)
            || (!query && b"&=".contains(&byte));
        if plain {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let secure = if self.tls.is_some() { "s" } else { "" };
        let user = self.tls.as_ref().and_then(|tls| tls.username.as_deref());
        let mut query = Vec::new();
        match &self.endpoint {
            Endpoint::Tcp { host, port } => {
                out.push_str(&format!("nbd{secure}://"));
                if let Some(user) = user {
                    percent_encode(&mut out, user, true);
                    out.push('@');
                }
                if host.contains(':') {
                    out.push('[');
                    out.push_str(host);
                    out.push(']');
                } else {
                    percent_encode(&mut out, host, false);
                }
                if *port != DEFAULT_PORT {
                    out.push_str(&format!(":{port}"));
                }
                out.push('/');
                percent_encode(&mut out, &self.export, false);
            }
            Endpoint::Unix { socket } => {
                out.push_str(&format!("nbd{secure}+unix://"));
                if let Some(user) = user {
                    percent_encode(&mut out, user, true);
                    out.push('@');
                }
                out.push('/');
                percent_encode(&mut out, &self.export, false);
                query.push(("socket", socket.to_string_lossy().into_owned()));
            }
        }
        if let Some(tls) = &self.tls {
            let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
            for (key, value) in [
                ("tls-certificates", path(&tls.certificates)),
                ("tls-psk-file", path(&tls.psk_file)),
                ("tls-hostname", tls.hostname.clone()),
                (
                    "tls-verify-peer",
                    (!tls.verify_peer).then(|| "false".to_string()),
                ),
            ] {
                if let Some(value) = value {
                    query.push((key, value));
                }
            }
        }
        for (i, (key, value)) in query.iter().enumerate() {
            out.push(if i == 0 { '?' } else { '&' });
            out.push_str(key);
            out.push('=');
            percent_encode(&mut out, value, true);
        }
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> NbdUri {
        text.parse()
            .unwrap_or_else(|e| panic!("{text} did not parse: {e}"))
    }

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri::tcp(host, port, export)
    }

    #[test]
    fn tcp_forms() {
        assert_eq!(
            parse("nbd://example.com:10810/disk"),
            tcp("example.com", 10810, "disk")
        );
        assert_eq!(
            parse("nbd://example.com/disk"),
            tcp("example.com", 10809, "disk")
        );
        assert_eq!(parse("nbd://example.com"), tcp("example.com", 10809, ""));
        assert_eq!(parse("nbd://example.com/"), tcp("example.com", 10809, ""));
        assert_eq!(parse("nbd://127.0.0.1:1/"), tcp("127.0.0.1", 1, ""));
        assert_eq!(parse("NBD://h/x"), tcp("h", 10809, "x"));
    }

    #[test]
    fn export_names_keep_further_slashes_and_decode_escapes() {
        assert_eq!(parse("nbd://h//abs/path").export, "/abs/path");
        assert_eq!(parse("nbd://h/a%20b%2Fc").export, "a b/c");
        assert_eq!(parse("nbd://h/caf%C3%A9").export, "café");
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(parse("nbd://[::1]:10810/d"), tcp("::1", 10810, "d"));
        assert_eq!(parse("nbd://[fe80::1]/d"), tcp("fe80::1", 10809, "d"));
        assert_eq!(
            "nbd://::1/d".parse::<NbdUri>(),
            Err(UriError::UnbracketedIpv6("::1".into()))
        );
    }

    #[test]
    fn unix_forms() {
        assert_eq!(
            parse("nbd+unix:///disk?socket=/tmp/nbd.sock"),
            NbdUri::unix("/tmp/nbd.sock", "disk")
        );
        assert_eq!(
            parse("nbd+unix:///?socket=/tmp/a%20b.sock"),
            NbdUri::unix("/tmp/a b.sock", "")
        );
        assert_eq!(
            parse("nbd+unix://?socket=rel.sock"),
            NbdUri::unix("rel.sock", "")
        );
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        let cases: &[(&str, UriError)] = &[
            (
                "example.com/disk",
                UriError::NotUri("example.com/disk".into()),
            ),
            ("http://h/d", UriError::Scheme("http".into())),
            ("nbd+vsock://1/d", UriError::Vsock("nbd+vsock://1/d".into())),
            (
                "nbds+vsock://1/d",
                UriError::Vsock("nbds+vsock://1/d".into()),
            ),
            (
                "nbds://h/d?tls-verify-peer=maybe",
                UriError::VerifyPeer("maybe".into()),
            ),
            (
                "nbds://h/d?tls-psk-file=/a&tls-psk-file=/b",
                UriError::DuplicateParameter("tls-psk-file".into()),
            ),
            ("nbd:///disk", UriError::MissingHost),
            ("nbd://:10809/disk", UriError::MissingHost),
            ("nbd://h:0/d", UriError::Port("0".into())),
            ("nbd://h:65536/d", UriError::Port("65536".into())),
            ("nbd://h:+1/d", UriError::Port("+1".into())),
            ("nbd://h:port/d", UriError::Port("port".into())),
            ("nbd://user@h/d", UriError::UserInfo),
            ("nbd://h/d?socket=/s", UriError::SocketWithTcp),
            (
                "nbd://h/d?tls-certificates=/x",
                UriError::Tls("tls-certificates".into()),
            ),
            ("nbd://h/d?frob=1", UriError::Parameter("frob".into())),
            ("nbd://h/d#frag", UriError::Fragment),
            ("nbd://h/d%2", UriError::Percent("d%2".into())),
            ("nbd://h/%ff", UriError::Percent("%ff".into())),
            ("nbd+unix:///disk", UriError::MissingSocket),
            ("nbd+unix:///disk?socket=", UriError::MissingSocket),
            (
                "nbd+unix://h/disk?socket=/s",
                UriError::UnixHost("h".into()),
            ),
            (
                "nbd+unix:///d?socket=/a&socket=/b",
                UriError::DuplicateParameter("socket".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(&text.parse::<NbdUri>().unwrap_err(), expected, "{text}");
        }
        // Messages name the problem and the expected form.
        let message = "nbd+unix:///disk"
            .parse::<NbdUri>()
            .unwrap_err()
            .to_string();
        assert!(message.contains("socket=PATH"), "{message}");
    }

    #[test]
    fn tls_forms() {
        let uri = parse("nbds://alice@example.com/disk?tls-psk-file=/etc/keys.psk");
        assert_eq!(uri.endpoint, tcp("example.com", 10809, "").endpoint);
        let tls = uri.tls.unwrap();
        assert_eq!(tls.username.as_deref(), Some("alice"));
        assert_eq!(tls.psk_file.as_deref(), Some(Path::new("/etc/keys.psk")));
        assert!(tls.verify_peer);
        let uri = parse(
            "NBDS+UNIX:///d?socket=/s&tls-certificates=/c&tls-username=bob&tls-verify-peer=false",
        );
        assert_eq!(uri.endpoint, NbdUri::unix("/s", "d").endpoint);
        let tls = uri.tls.unwrap();
        assert_eq!(tls.certificates.as_deref(), Some(Path::new("/c")));
        assert_eq!(tls.username.as_deref(), Some("bob"));
        assert!(!tls.verify_peer);
        assert!(parse("nbd://h/d").tls.is_none());
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "nbd://example.com/disk",
            "nbd://example.com:10810/disk",
            "nbd://example.com/",
            "nbd://[::1]:10810/d",
            "nbd://h//abs",
            "nbd://h/a%20b%3Fc%23d%25",
            "nbd+unix:///disk?socket=/tmp/nbd.sock",
            "nbd+unix:///?socket=/tmp/a%26b%20c.sock",
            "nbds://h/d",
            "nbds://alice@h:10810/d?tls-psk-file=/etc/keys.psk",
            "nbds://h/d?tls-certificates=/etc/pki/nbd&tls-hostname=disk.example&tls-verify-peer=false",
            "nbds+unix://alice@/d?socket=/run/nbd.sock&tls-psk-file=/k.psk",
        ] {
            let uri = parse(text);
            assert_eq!(uri.to_string(), text);
            assert_eq!(parse(&uri.to_string()), uri);
        }
        // The default port and a missing slash are normalised.
        assert_eq!(parse("nbd://h:10809").to_string(), "nbd://h/");
    }
}
