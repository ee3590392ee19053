//! The NBD side of `blockwire serve`: the target's listeners and limits from
//! `[server]` (or the flags), and the URIs announced for each export.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, Result};
use blockwire_blockdev::size::format_size;
use blockwire_nbd::tls::TargetTlsSettings;
use blockwire_nbd::{ExportSet, NbdConfig, NbdTarget};

use crate::config::Config;
use crate::defaults::NBD_LISTEN;
use crate::serve_tls;

/// The addresses `addr` (HOST:PORT) stands for; the validation's message if none.
pub fn resolve(addr: &str) -> Result<Vec<SocketAddr>> {
    crate::config_validate::resolve(addr).map_err(|e| anyhow!(e))
}

/// The NBD target's listeners: `listen` and `sockets`, or loopback's NBD port
/// when neither is given.
pub fn listen_config(listen: &[String], sockets: &[PathBuf], workers: usize) -> Result<NbdConfig> {
    let mut tcp = Vec::new();
    let defaults = [NBD_LISTEN.to_string()];
    let listen = if listen.is_empty() && sockets.is_empty() {
        &defaults[..]
    } else {
        listen
    };
    for addr in listen {
        tcp.extend(resolve(addr)?);
    }
    Ok(NbdConfig {
        tcp,
        unix: sockets.to_vec(),
        workers,
        ..NbdConfig::default()
    })
}

/// What `[server]` asks of the NBD target serving `exports`: listeners, limits,
/// the default export and TLS (`tls_flags`, when given, override the file's keys).
pub fn config_from_file(
    file: &Config,
    exports: &mut ExportSet,
    workers: usize,
    tls_flags: Option<TargetTlsSettings>,
) -> Result<NbdConfig> {
    if let Some(name) = &file.server.default_export {
        exports.set_default(name).map_err(|e| anyhow!(e))?;
    }
    let mut config = listen_config(
        &file.server.listen,
        &file.server.socket,
        file.server.workers.unwrap_or(workers),
    )?;
    if let Some(max) = file.server.max_connections {
        config.max_connections = max;
    }
    // Both checked by Config::validate.
    if let Some(max) = file.server.max_connections_per_address {
        config.max_connections_per_address = max;
    }
    if let Some(max) = file.server.max_handshakes_per_address {
        config.max_handshakes_per_address = max;
    }
    if let Some(secs) = file.server.send_timeout {
        config.send_timeout = Duration::from_secs_f64(secs);
    }
    if let Some(limit) = file
        .server
        .unnegotiated_payload_limit()
        .map_err(|e| anyhow!(e))?
    {
        config.unnegotiated_payload_limit = limit;
    }
    config.tls = serve_tls::target_tls(tls_flags, Some(&file.server))?;
    Ok(config)
}

fn uri_host(addr: &SocketAddr) -> String {
    match addr {
        SocketAddr::V4(v4) => format!("{}:{}", v4.ip(), v4.port()),
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
    }
}

/// Prints each export's URIs: `nbds` when the target requires TLS.
pub fn announce(server: &NbdTarget, sockets: &[PathBuf], tls_required: bool) {
    let scheme = if tls_required { "nbds" } else { "nbd" };
    for export in server.exports().iter() {
        let info = export.device.info();
        let mode = if info.read_only {
            "read-only"
        } else {
            "read-write"
        };
        println!(
            "export '{}': {} bytes ({}), {mode}",
            export.name,
            info.size,
            format_size(info.size)
        );
        for addr in server.tcp_addrs() {
            println!("  {scheme}://{}/{}", uri_host(&addr), export.name);
        }
        for socket in sockets {
            println!(
                "  {scheme}+unix:///{}?socket={}",
                export.name,
                socket.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_the_default_listener_unless_a_socket_is_given() {
        let config = listen_config(&[], &[], 4).unwrap();
        assert_eq!(config.tcp, vec![NBD_LISTEN.parse::<SocketAddr>().unwrap()]);
        assert_eq!(config.workers, 4);
        let unix = listen_config(&[], &["/tmp/s".into()], 4).unwrap();
        assert!(unix.tcp.is_empty());
        assert_eq!(unix.unix, vec![PathBuf::from("/tmp/s")]);
    }

    #[test]
    fn server_keys_reach_the_target_config() {
        let text = "[server]\nlisten = \"127.0.0.1:0\"\nmax_connections = 7\n\
                    default_export = \"a\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n";
        let file: Config = toml::from_str(text).unwrap();
        let mut exports = ExportSet::new();
        let device =
            blockwire_blockdev::Device::from_device(blockwire_blockdev::MemoryDevice::new(1 << 20));
        exports
            .add(blockwire_nbd::Export::new("a", "", device))
            .unwrap();
        let config = config_from_file(&file, &mut exports, 3, None).unwrap();
        assert_eq!(config.max_connections, 7);
        assert_eq!(config.workers, 3);
        assert!(config.tls.is_none());
        assert_eq!(exports.default_export().unwrap().name, "a");
    }
}
