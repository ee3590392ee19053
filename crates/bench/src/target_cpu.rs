//! Where the target's CPU time comes from, so that every phase can report the
//! target's CPU% beside the bench's own (seed 003's Tables 1-3 put both sides'
//! load next to the throughput).
//!
//! In order of preference: the process the user named (`--target-pid`); for a
//! target on this host (a loopback address or a Unix socket), the process that
//! listens on the target's socket (the protocol's own port when the URI names none:
//! NBD 10809, iSCSI 3260), found through /proc; for a target on another host,
//! blockwire's own target reporting it over the network (`blockwire serve
//! --netserve`, asked with the netperf protocol's CPU sample). A target the bench
//! can see none of these ways gets no target CPU figure, and the run says so.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::meter::process_cpu_time;
use crate::netperf::{self, ClientConfig};
use crate::target::RemoteTarget;

/// A source of the target process's total CPU time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetCpu {
    /// A process on this host, read from /proc/PID/stat.
    Process(u32),
    /// blockwire's target on `host`, asked through its netserve at `port`.
    Netserve { host: String, port: u16 },
}

impl TargetCpu {
    /// The target's user + system CPU time so far; `None` when it cannot be read
    /// now (the process ended, the netserve stopped answering).
    pub fn sample(&self) -> Option<Duration> {
        match self {
            TargetCpu::Process(pid) => process_cpu_time(*pid),
            TargetCpu::Netserve { host, port } => netperf::sample_cpu(host, *port, &probe_config())
                .ok()
                .flatten(),
        }
    }
}

/// Short timeouts: a sample is taken before and after every phase.
fn probe_config() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(1),
        io_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    }
}

/// Finds where the CPU time of `remote`'s target can be read, for a run without
/// `--target-pid`. Returns the source and a line for the user saying which it is.
///
/// - A target on this host (a loopback address or a Unix socket): the process that
///   listens on the target's socket, at the URI's port or the protocol's own (NBD
///   10809, iSCSI 3260). A netserve on this host is used only when it is that same
///   process (`blockwire serve --netserve`): a `blockwire netserve` of its own
///   beside another target (tgtd, nbdkit) would report its idle self.
/// - A target on another host: its netserve (at `netserve_port`, else the default
///   port), which counts the target only when it runs inside it; the line says so.
pub fn discover(remote: &RemoteTarget, netserve_port: Option<u16>) -> Option<(TargetCpu, String)> {
    if remote.scheme == "aoe" || remote.scheme == "stripe" || remote.scheme == "rbd" {
        // Layer 2: no host to ask and no socket to look up; a stripe has several;
        // librbd talks to the whole cluster.
        return None;
    }
    let netserve_port = netserve_port.unwrap_or(netperf::DEFAULT_PORT);
    let netserve = || {
        matches!(
            netperf::sample_cpu(&remote.host, netserve_port, &probe_config()),
            Ok(Some(_))
        )
        .then(|| TargetCpu::Netserve {
            host: remote.host.clone(),
            port: netserve_port,
        })
    };
    // An NFS server on this host is often named by one of its own addresses
    // rather than loopback (ganesha binds one address); its listener is here too.
    let nfs_here = remote.scheme == "nfs" && is_own_address(&remote.host);
    if remote.host.is_empty() || is_loopback(&remote.host) || nfs_here {
        let (pid, place) = local_listener(remote)?;
        if pid == std::process::id() {
            // The target runs inside the bench (`blockwire demo`): its CPU is already
            // in the bench's own figure.
            return None;
        }
        let netserve_is_target = !remote.host.is_empty()
            && listening_tcp_inode(netserve_port).and_then(process_with_socket) == Some(pid);
        if netserve_is_target {
            if let Some(source) = netserve() {
                let line = format!(
                    "target CPU: reported by blockwire's netserve at {}:{netserve_port}",
                    remote.host
                );
                return Some((source, line));
            }
        }
        let name = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let line = format!(
            "target CPU: process {pid} ({}), which listens on {place}",
            name.trim()
        );
        return Some((TargetCpu::Process(pid), line));
    }
    let source = netserve()?;
    let line = format!(
        "target CPU: reported by blockwire's netserve at {}:{netserve_port} (the target's \
         only when that netserve runs inside it: blockwire serve --netserve)",
        remote.host
    );
    Some((source, line))
}

/// The process on this host listening on `remote`'s socket (its TCP port, or the
/// Unix socket of an `nbd+unix://` URI), and the socket's name for the user.
fn local_listener(remote: &RemoteTarget) -> Option<(u32, String)> {
    let (inode, place) = if remote.host.is_empty() {
        let socket = unix_socket_of(&remote.uri)?;
        (listening_unix_inode(&socket)?, socket)
    } else {
        let port = remote.tcp_port()?;
        (
            listening_tcp_inode(port)?,
            format!("{}:{port}", remote.host),
        )
    };
    Some((process_with_socket(inode)?, place))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether `host` is an address of this host (in this network namespace): binding a
/// socket to it succeeds only then.
fn is_own_address(host: &str) -> bool {
    host.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| std::net::TcpListener::bind((ip, 0)).is_ok())
}

/// The `socket=PATH` of an `nbd+unix://` URI.
fn unix_socket_of(uri: &str) -> Option<String> {
    let (_, query) = uri.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("socket="))
        .map(str::to_string)
}

/// The inode of the TCP socket listening on `port` (IPv4 or IPv6, any address), in
/// this network namespace.
fn listening_tcp_inode(port: u16) -> Option<u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .into_iter()
        .filter_map(|table| fs::read_to_string(table).ok())
        .find_map(|text| listening_tcp_inode_in(&text, port))
}

/// Parses a /proc/net/tcp{,6} table: `sl local_address rem_address st ... inode`,
/// addresses as `HEXADDR:HEXPORT`, state 0A = LISTEN, the inode in field 10.
fn listening_tcp_inode_in(table: &str, port: u16) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (_, local_port) = fields.get(1)?.rsplit_once(':')?;
        let listening = *fields.get(3)? == "0A";
        (listening && u16::from_str_radix(local_port, 16).ok()? == port)
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// The inode of the Unix socket listening at `path`.
fn listening_unix_inode(path: &str) -> Option<u64> {
    let text = fs::read_to_string("/proc/net/unix").ok()?;
    listening_unix_inode_in(&text, path)
}

/// Parses /proc/net/unix: `Num RefCount Protocol Flags Type St Inode Path`; a
/// listening socket has the accept flag (0x10000) set.
fn listening_unix_inode_in(table: &str, path: &str) -> Option<u64> {
    const ACCEPTS: u32 = 0x10000;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = u32::from_str_radix(fields.get(3)?, 16).ok()?;
        (flags & ACCEPTS != 0 && *fields.get(7)? == path)
            .then(|| fields.get(6)?.parse().ok())
            .flatten()
    })
}

/// The process holding socket `inode` open (the first found; a forking server's
/// children share it, and the first is the listener's owner more often than not).
fn process_with_socket(inode: u64) -> Option<u32> {
    let wanted = format!("socket:[{inode}]");
    let mut pids: Vec<u32> = fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter().find(|pid| {
        fs::read_dir(Path::new("/proc").join(pid.to_string()).join("fd"))
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .any(|fd| {
                fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == wanted.as_str())
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::TargetSpec;
    use crate::workloads::test_support::closed_port;

    fn remote(uri: &str) -> RemoteTarget {
        match TargetSpec::parse(uri) {
            TargetSpec::Remote(remote) => remote,
            other => panic!("{uri} parsed as {other:?}"),
        }
    }

    #[test]
    fn tcp_tables_give_the_listener_on_a_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:2A29 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4711 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:2A29 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4712 1 0000000000000000 20 4 30 10 -1\n\
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(listening_tcp_inode_in(table, 10793), Some(4711));
        assert_eq!(listening_tcp_inode_in(table, 22), Some(99));
        // An established connection on a port is not a listener.
        assert_eq!(listening_tcp_inode_in(table, 54321), None);
        assert_eq!(listening_tcp_inode_in("garbage\n1 2 3\n", 22), None);
    }

    #[test]
    fn unix_table_gives_the_listener_at_a_path() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
0000000000000000: 00000002 00000000 00010000 0001 01 5150 /tmp/nbd.sock\n\
0000000000000000: 00000003 00000000 00000000 0001 03 5151 /tmp/nbd.sock\n\
0000000000000000: 00000002 00000000 00010000 0001 01 77 @abstract\n";
        assert_eq!(listening_unix_inode_in(table, "/tmp/nbd.sock"), Some(5150));
        assert_eq!(listening_unix_inode_in(table, "/tmp/other.sock"), None);
    }

    #[test]
    fn unix_uris_name_their_socket() {
        assert_eq!(
            unix_socket_of("nbd+unix:///disk?socket=/run/nbd.sock").as_deref(),
            Some("/run/nbd.sock")
        );
        assert_eq!(unix_socket_of("nbd://host/disk"), None);
        assert!(is_loopback("127.0.0.1") && is_loopback("::1") && is_loopback("localhost"));
        assert!(!is_loopback("10.0.0.1"));
    }

    /// A child process listening on a free loopback port, and the port (python3 is
    /// on every machine the tests run on; without it there is nothing to look for).
    fn listener() -> Option<(std::process::Child, u16)> {
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys,time\n\
                 s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen()\n\
                 print(s.getsockname()[1], flush=True)\n\
                 time.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .ok()?;
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        Some((child, line.trim().parse().unwrap()))
    }

    #[test]
    fn a_listener_in_another_process_is_found_and_sampled() {
        let Some((mut child, port)) = listener() else {
            eprintln!("python3 not found; skipping");
            return;
        };
        // A netserve port with nothing on it: discovery falls back to /proc.
        let closed = closed_port();
        let found = discover(&remote(&format!("nbd://127.0.0.1:{port}/x")), Some(closed));
        let sampled = found.as_ref().and_then(|(source, _)| source.sample());
        let _ = child.kill();
        let _ = child.wait();
        let (source, line) = found.expect("the listener was not found");
        assert_eq!(source, TargetCpu::Process(child.id()));
        assert!(line.contains(&child.id().to_string()), "{line}");
        assert!(sampled.is_some());
    }

    #[test]
    fn an_iscsi_target_is_looked_for_on_its_own_port() {
        // iscsi:// without a port means 3260, not NBD's 10809; a CHAP name in front
        // of the host is not part of it.
        assert_eq!(remote("iscsi://h/iqn.2026-11.x:y/0").tcp_port(), Some(3260));
        assert_eq!(remote("nbd://h/e").tcp_port(), Some(10809));
        assert_eq!(
            remote("nvme+tcp://h/nqn.2026-11.dev.blockwire:d").tcp_port(),
            Some(4420)
        );
        assert_eq!(remote("nbds://alice@h/e").tcp_port(), Some(10809));
        assert_eq!(remote("nbds://alice@h/e").host, "h");
        assert!(is_own_address("127.0.0.1"));
        assert!(!is_own_address("192.0.2.1"));
        assert!(!is_own_address("not-an-address"));
        assert_eq!(remote("nfs://h/e/f").tcp_port(), Some(2049));
        assert_eq!(remote("nfs://h:2050/e/f?version=4").tcp_port(), Some(2050));
        assert_eq!(remote("aoe://eth0/e1.1").tcp_port(), None);
        assert_eq!(remote("nbd+unix:///e?socket=/s").tcp_port(), None);
        let Some((mut child, port)) = listener() else {
            eprintln!("python3 not found; skipping");
            return;
        };
        let uri = format!("iscsi://chap-user@127.0.0.1:{port}/iqn.2026-11.x:y/0");
        let found = discover(&remote(&uri), Some(closed_port()));
        let _ = child.kill();
        let _ = child.wait();
        let (source, line) = found.expect("the iSCSI target was not found");
        assert_eq!(source, TargetCpu::Process(child.id()));
        assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    }

    #[test]
    fn a_netserve_in_another_process_does_not_stand_for_the_target() {
        // A netserve of its own (here: in the test process) beside a target in
        // another process: its CPU is not the target's.
        let server = netperf::NetServer::bind("127.0.0.1:0", Default::default())
            .unwrap()
            .spawn()
            .unwrap();
        let Some((mut child, port)) = listener() else {
            eprintln!("python3 not found; skipping");
            server.stop().unwrap();
            return;
        };
        let found = discover(
            &remote(&format!("iscsi://127.0.0.1:{port}/iqn.2026-11.x:y/0")),
            Some(server.addr.port()),
        );
        let _ = child.kill();
        let _ = child.wait();
        server.stop().unwrap();
        let (source, line) = found.expect("the target was not found");
        assert_eq!(source, TargetCpu::Process(child.id()), "{line}");
    }

    #[test]
    fn nothing_listening_and_aoe_give_no_source() {
        let closed = closed_port();
        assert_eq!(
            discover(
                &remote(&format!("nbd://127.0.0.1:{closed}/x")),
                Some(closed)
            ),
            None
        );
        assert_eq!(discover(&remote("aoe://eth0/e1.1"), None), None);
    }
}
