//! Network namespaces joined by veth channels, the one implementation the lab's
//! bed and the integration tests share. Two namespaces, a target side and an
//! initiator side, joined by N veth pairs named `eth0`, `eth1`, ... in both; each
//! channel with its MTU, optionally its own /24 (10.77.K.1 target side, 10.77.K.2
//! initiator side) and a tc rate limit on both ends, so reads and writes are both
//! shaped. A thin layer over `ip` and `tc`; removed on drop. Needs CAP_NET_ADMIN.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::cleanup;

/// How the veth channels between the two namespaces are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Channels {
    /// Veth pairs between the namespaces.
    pub count: u32,
    pub mtu: u32,
    /// A tbf rate limit on both ends of every channel, in Mbit/s.
    pub rate_mbit: Option<u64>,
    /// Whether each channel gets its own /24 ([`target_addr`], [`initiator_addr`]);
    /// layer-2 protocols (AoE) need none.
    pub addressed: bool,
}

/// Two namespaces joined by veth channels. Dropping it deletes both namespaces,
/// which deletes the veth ends in them and with them their peers.
#[derive(Debug)]
pub struct NamespacePair {
    target: String,
    initiator: String,
    channels: u32,
}

impl NamespacePair {
    /// Creates namespaces `target` and `initiator` (deleting leftovers of the same
    /// names from a killed run first) and the channels between them. The names are
    /// in the lab's cleanup registry while they exist, so a lab interrupted by a
    /// signal removes them too.
    pub fn create(target: &str, initiator: &str, channels: &Channels) -> io::Result<NamespacePair> {
        let pair = NamespacePair {
            target: target.to_string(),
            initiator: initiator.to_string(),
            channels: channels.count,
        };
        // From here on, dropping `pair` (also on an early error) removes what exists.
        for ns in [&pair.target, &pair.initiator] {
            cleanup::delete_namespace(ns);
            let mut registry = cleanup::lock();
            registry.add_namespace(ns);
            run("ip", &["netns", "add", ns])?;
            drop(registry);
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        let mtu = channels.mtu.to_string();
        for channel in 0..channels.count {
            let name = interface(channel);
            // Made inside the namespaces, so the names never meet (or clash with)
            // the host's interfaces.
            run(
                "ip",
                &[
                    "-n",
                    &pair.target,
                    "link",
                    "add",
                    &name,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &name,
                    "netns",
                    &pair.initiator,
                ],
            )?;
            for (ns, addr) in [
                (&pair.target, target_addr(channel)),
                (&pair.initiator, initiator_addr(channel)),
            ] {
                run("ip", &["-n", ns, "link", "set", &name, "mtu", &mtu])?;
                if channels.addressed {
                    let cidr = format!("{addr}/24");
                    run("ip", &["-n", ns, "addr", "add", &cidr, "dev", &name])?;
                }
                if let Some(mbit) = channels.rate_mbit {
                    let mut args = vec!["-n".to_string(), ns.to_string()];
                    args.extend(tbf_args(&name, mbit));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    run("tc", &args)?;
                }
                run("ip", &["-n", ns, "link", "set", &name, "up"])?;
            }
        }
        Ok(pair)
    }

    /// The target-side namespace.
    pub fn target_ns(&self) -> &str {
        &self.target
    }

    /// The initiator-side namespace.
    pub fn initiator_ns(&self) -> &str {
        &self.initiator
    }

    /// The veth interface names, the same in both namespaces: `eth0`, `eth1`, ...
    pub fn interfaces(&self) -> Vec<String> {
        (0..self.channels).map(interface).collect()
    }
}

impl Drop for NamespacePair {
    fn drop(&mut self) {
        let mut registry = cleanup::lock();
        for ns in [&self.target, &self.initiator] {
            cleanup::delete_namespace(ns);
            registry.remove_namespace(ns);
        }
    }
}

/// Whether this process may build namespaces: effective CAP_NET_ADMIN (root has it).
pub fn have_net_admin() -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_NET_ADMIN) != 0)
}

/// Whether namespaces with veth pairs can really be made here (CAP_NET_ADMIN, `ip`
/// present, veth in the kernel): probed once by making one, then remembered.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        if !have_net_admin() {
            return false;
        }
        let probe = format!("bwprobe{}", std::process::id());
        let works = run("ip", &["netns", "add", &probe]).is_ok()
            && run(
                "ip",
                &[
                    "-n", &probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
                ],
            )
            .is_ok();
        cleanup::delete_namespace(&probe);
        works
    })
}

/// The target-side address of channel `k` (0-based).
pub fn target_addr(channel: u32) -> String {
    format!("10.77.{}.1", channel + 1)
}

/// The initiator-side address of channel `k`.
pub fn initiator_addr(channel: u32) -> String {
    format!("10.77.{}.2", channel + 1)
}

/// The interface of channel `k`, the same name in both namespaces.
pub fn interface(channel: u32) -> String {
    format!("eth{channel}")
}

/// tbf's bucket for a rate: at least one timer tick's worth of bytes (Linux
/// schedules a tbf qdisc by the jiffy; 4 ms at HZ=250) and at least 128 KiB, so a
/// 64 KiB GSO segment from the veth fits whole.
pub fn tbf_burst_bytes(mbit: u64) -> u64 {
    let per_tick = mbit * 1_000_000 / 8 / 250;
    per_tick.max(128 << 10)
}

/// tbf's queue as latency: long enough that an AoE window (no congestion control:
/// 256 frames of 9 KB are 2.3 MB) is queued rather than dropped at a gigabit.
pub const TBF_LATENCY_MS: u32 = 25;

/// The `tc` arguments that shape interface `dev` to `mbit` Mbit/s.
pub fn tbf_args(dev: &str, mbit: u64) -> Vec<String> {
    [
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        &format!("{mbit}mbit"),
        "burst",
        &tbf_burst_bytes(mbit).to_string(),
        "latency",
        &format!("{TBF_LATENCY_MS}ms"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A command that runs `program` in namespace `ns` (`ip netns exec`, which execs
/// the program: its PID is the child's); add arguments as usual.
pub fn command_in(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program);
    command
}

/// Runs `f` on a scoped thread that has joined network namespace `ns`; sockets (and
/// threads) it makes belong there. A panic in `f` is passed on.
pub fn enter_and_run<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = std::fs::File::open(Path::new("/run/netns").join(ns))?;
    std::thread::scope(|scope| {
        let joined = scope.spawn(|| {
            // SAFETY: setns(2) on a descriptor held open for the call; CLONE_NEWNET
            // changes only this thread's network namespace (and that of threads it
            // starts).
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(f())
        });
        joined
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Runs `program ARGS`; a failure becomes an error naming the command and its stderr.
fn run(program: &str, args: &[&str]) -> io::Result<()> {
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    blockwire_bench::child::die_with_parent(&mut command);
    let output = command
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run {program}: {e}")))?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_get_their_own_subnets_and_names() {
        assert_eq!(target_addr(0), "10.77.1.1");
        assert_eq!(initiator_addr(3), "10.77.4.2");
        assert_eq!(interface(2), "eth2");
    }

    #[test]
    fn the_token_bucket_holds_a_tick_and_a_gso_segment() {
        // 1 Gbit: 125 MB/s over 250 ticks = 500 kB per tick.
        assert_eq!(tbf_burst_bytes(1000), 500_000);
        // 200 Mbit: 100 kB per tick, raised to 128 KiB.
        assert_eq!(tbf_burst_bytes(200), 128 << 10);
        let args = tbf_args("eth1", 10_000);
        assert_eq!(
            args.join(" "),
            "qdisc replace dev eth1 root tbf rate 10000mbit burst 5000000 latency 25ms"
        );
    }

    #[test]
    fn a_pair_is_built_and_removed() {
        if !available() {
            eprintln!("skipped: needs CAP_NET_ADMIN and veth (network namespaces)");
            return;
        }
        let tag = std::process::id();
        let channels = Channels {
            count: 2,
            mtu: 9000,
            rate_mbit: Some(1000),
            addressed: true,
        };
        let pair = NamespacePair::create(&format!("bwut{tag}t"), &format!("bwut{tag}i"), &channels)
            .expect("build the namespace pair");
        assert_eq!(pair.interfaces(), ["eth0", "eth1"]);
        let shown = command_in(pair.initiator_ns(), "ip")
            .args(["-o", "addr", "show", "dev", "eth1"])
            .output()
            .expect("run ip addr show");
        assert!(String::from_utf8_lossy(&shown.stdout).contains("10.77.2.2/24"));
        // A TCP connection across channel 0 proves both ends are up and addressed.
        let listener = enter_and_run(pair.target_ns(), || {
            std::net::TcpListener::bind((target_addr(0).as_str(), 0))
        })
        .unwrap()
        .expect("listen on the target side");
        let port = listener.local_addr().unwrap().port();
        let connected = enter_and_run(pair.initiator_ns(), || {
            std::net::TcpStream::connect((target_addr(0).as_str(), port))
        })
        .unwrap();
        assert!(connected.is_ok(), "connect across eth0: {connected:?}");
        let target_ns = pair.target_ns().to_string();
        let inside = enter_and_run(&target_ns, || {
            std::fs::read_link("/proc/thread-self/ns/net")
        })
        .unwrap()
        .unwrap();
        let outside = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        assert_ne!(inside, outside);
        drop(pair);
        assert!(!Path::new("/run/netns").join(&target_ns).exists());
    }
}
