//! `nfs://SERVER[:PORT]/EXPORT/PATH[?KEY=VALUE&...]`, libnfs' own URL form: the
//! last path component is the file, everything before it the export. Keys:
//! `version=3|4` (default 3), `connections=N` (ours: connections in the pool,
//! default [`DEFAULT_CONNECTIONS`]) and libnfs' own options, passed to it as they
//! are. A port in the authority is libnfs' `nfsport=` (libnfs 4 reads no port
//! there); MOUNT (NFSv3) still asks the portmapper unless `mountport=` is given.

use std::fmt;

/// Connections (libnfs contexts) when the URL names none: a context runs one
/// request at a time, so this many requests are in flight. Four keep a gigabit
/// link busy with the bench's 1 MiB sequential requests (each waits one round trip
/// and the server's write) without taking every ganesha worker on a 2-core host.
pub const DEFAULT_CONNECTIONS: usize = 4;

/// At most this many connections.
pub const MAX_CONNECTIONS: usize = 64;

/// libnfs 4.0's URL options (`nfs_set_context_args`), passed through.
const LIBNFS_OPTIONS: [&str; 11] = [
    "nfsport",
    "mountport",
    "uid",
    "gid",
    "tcp-syncnt",
    "readahead",
    "pagecache",
    "debug",
    "autoreconnect",
    "if",
    "dircache",
];

/// A parsed `nfs://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsUrl {
    /// Host name or address (an IPv6 address without its brackets).
    pub server: String,
    /// The NFS port, when the URL gives one (else 2049, or the portmapper's
    /// answer for NFSv3).
    pub port: Option<u16>,
    /// The export, with its leading '/': `/blockwire`.
    pub export: String,
    /// The file in the export, with its leading '/': `/disk.img`.
    pub file: String,
    /// NFS version: 3 or 4.
    pub version: u8,
    /// Connections in the pool; `None` for [`DEFAULT_CONNECTIONS`].
    pub connections: Option<usize>,
    /// libnfs options other than `version` and `nfsport`, in the URL's order.
    pub options: Vec<(String, String)>,
}

impl NfsUrl {
    /// Parses `text`; an error says what is wrong in one line.
    pub fn parse(text: &str) -> Result<NfsUrl, String> {
        let bad = |why: &str| {
            format!("'{text}': {why} (expected nfs://SERVER[:PORT]/EXPORT/FILE[?version=3|4&connections=N])")
        };
        if text.contains('\0') || text.chars().any(char::is_whitespace) {
            return Err(bad("a URL holds no spaces or NULs"));
        }
        let rest = match text.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("nfs") => rest,
            _ => return Err(bad("not an nfs:// URL")),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => return Err(bad("no export and file")),
        };
        let (server, port) = split_authority(authority).map_err(|why| bad(&why))?;
        let Some((export, file)) = path.rsplit_once('/') else {
            return Err(bad("no export and file"));
        };
        if export.is_empty() || export.split('/').skip(1).any(str::is_empty) {
            return Err(bad("no export (or an empty component in it)"));
        }
        if file.is_empty() {
            return Err(bad("no file after the export"));
        }
        let mut url = NfsUrl {
            server,
            port,
            export: export.to_string(),
            file: format!("/{file}"),
            version: 3,
            connections: None,
            options: Vec::new(),
        };
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| bad(&format!("option '{pair}' has no value")))?;
            match key {
                "version" => {
                    url.version = match value {
                        "3" => 3,
                        "4" => 4,
                        _ => return Err(bad(&format!("version must be 3 or 4, not '{value}'"))),
                    }
                }
                "connections" => {
                    let n: usize = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_CONNECTIONS).contains(n))
                        .ok_or_else(|| {
                            bad(&format!(
                                "connections must be 1 to {MAX_CONNECTIONS}, not '{value}'"
                            ))
                        })?;
                    url.connections = Some(n);
                }
                "nfsport" if url.port.is_some() => {
                    return Err(bad("a port both in the authority and as nfsport="))
                }
                "nfsport" => {
                    let port = value
                        .parse()
                        .map_err(|_| bad(&format!("nfsport '{value}' is not a port")))?;
                    url.port = Some(port);
                }
                key if LIBNFS_OPTIONS.contains(&key) => {
                    if value.contains(['/', '#']) {
                        return Err(bad(&format!("option {key} has an odd value '{value}'")));
                    }
                    url.options.push((key.to_string(), value.to_string()));
                }
                _ => return Err(bad(&format!("unknown option '{key}'"))),
            }
        }
        Ok(url)
    }

    /// Connections in the pool.
    pub fn connections(&self) -> usize {
        self.connections.unwrap_or(DEFAULT_CONNECTIONS)
    }

    /// The URL handed to libnfs' parser to set the context's options: libnfs'
    /// form (no port in the authority; the server is given to `nfs_mount`
    /// separately, so a placeholder stands for it).
    pub fn libnfs_options_url(&self) -> String {
        let mut url = format!(
            "nfs://server{}{}?version={}",
            self.export, self.file, self.version
        );
        if let Some(port) = self.port {
            url.push_str(&format!("&nfsport={port}"));
        }
        for (key, value) in &self.options {
            url.push_str(&format!("&{key}={value}"));
        }
        url
    }

    /// The server as `host` or `[v6]`, for messages and socket addresses.
    pub fn host(&self) -> String {
        if self.server.contains(':') {
            format!("[{}]", self.server)
        } else {
            self.server.clone()
        }
    }
}

impl fmt::Display for NfsUrl {
    /// The URL without its query: `nfs://SERVER[:PORT]/EXPORT/FILE`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nfs://{}", self.host())?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        write!(f, "{}{}", self.export, self.file)
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_authority(authority: &str) -> Result<(String, Option<u16>), String> {
    if authority.contains('@') {
        return Err("no user@ in an NFS URL (use uid= and gid=)".into());
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| "an unclosed '[' in the server".to_string())?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("'{after}' after the server's ']'")),
            },
        }
    } else {
        match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err("no server".into());
    }
    let port = match port {
        Some(text) => Some(
            text.parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("'{text}' is not a port"))?,
        ),
        None => None,
    };
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_component_is_the_file_and_the_rest_the_export() {
        let url = NfsUrl::parse("nfs://10.77.1.1/blockwire/disk.img").unwrap();
        assert_eq!(url.server, "10.77.1.1");
        assert_eq!(url.port, None);
        assert_eq!(url.export, "/blockwire");
        assert_eq!(url.file, "/disk.img");
        assert_eq!(url.version, 3);
        assert_eq!(url.connections(), DEFAULT_CONNECTIONS);
        let deep = NfsUrl::parse("nfs://srv/exports/vm/a.raw").unwrap();
        assert_eq!(
            (deep.export.as_str(), deep.file.as_str()),
            ("/exports/vm", "/a.raw")
        );
        assert_eq!(deep.to_string(), "nfs://srv/exports/vm/a.raw");
    }

    #[test]
    fn ports_versions_connections_and_libnfs_options_are_read() {
        let url =
            NfsUrl::parse("nfs://[fd00::1]:2050/e/f?version=4&connections=8&uid=0&mountport=635")
                .unwrap();
        assert_eq!(url.server, "fd00::1");
        assert_eq!(url.port, Some(2050));
        assert_eq!(url.version, 4);
        assert_eq!(url.connections(), 8);
        assert_eq!(url.to_string(), "nfs://[fd00::1]:2050/e/f");
        assert_eq!(
            url.libnfs_options_url(),
            "nfs://server/e/f?version=4&nfsport=2050&uid=0&mountport=635"
        );
        let port_as_option = NfsUrl::parse("nfs://h:1/e/f?version=3").unwrap();
        assert_eq!(port_as_option.port, Some(1));
        assert_eq!(
            NfsUrl::parse("nfs://h/e/f?nfsport=2049").unwrap().port,
            Some(2049)
        );
    }

    #[test]
    fn malformed_urls_are_refused_in_one_line() {
        for (text, why) in [
            ("nbd://h/e/f", "not an nfs:// URL"),
            ("nfs://h", "no export and file"),
            ("nfs://h/f", "no export"),
            ("nfs://h/e/", "no file"),
            ("nfs://h//f", "no export"),
            ("nfs:///e/f", "no server"),
            ("nfs://h:x/e/f", "not a port"),
            ("nfs://h:0/e/f", "not a port"),
            ("nfs://u@h/e/f", "no user@"),
            ("nfs://h/e/f?version=2", "version must be 3 or 4"),
            ("nfs://h/e/f?connections=0", "connections must be"),
            ("nfs://h/e/f?connections=65", "connections must be"),
            ("nfs://h/e/f?speed=9", "unknown option 'speed'"),
            ("nfs://h/e/f?uid", "has no value"),
            ("nfs://h:2049/e/f?nfsport=2049", "both"),
            ("nfs://h/e/f?uid=0/1", "odd value"),
            ("nfs://h/e f/x", "no spaces"),
        ] {
            let error = NfsUrl::parse(text).expect_err(text);
            assert!(error.contains(why), "{text}: {error}");
            assert!(!error.contains('\n'));
        }
    }
}
