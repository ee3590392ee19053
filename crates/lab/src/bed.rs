//! The bed: a target namespace and an initiator namespace joined by N veth
//! channels, each with its MTU, an optional rate limit (tc tbf on both ends, so
//! reads and writes are both shaped) and its own /24: 10.77.K.1 on the target side,
//! 10.77.K.2 on the initiator side, as seed 003 gives each channel its own subnet
//! (§3.3). A thin layer over `ip` and `tc`; removed on drop.

use std::io;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::cleanup;
use crate::matrix::BedSpec;

/// A built bed. Dropping it deletes both namespaces (and with them the veths).
#[derive(Debug)]
pub struct Bed {
    pub spec: BedSpec,
    target: String,
    initiator: String,
}

/// Whether this process may build beds: effective CAP_NET_ADMIN (root has it).
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

/// The prefix of every namespace this process makes: `bwlab-PID-`.
pub fn namespace_prefix() -> String {
    format!("bwlab-{}-", std::process::id())
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

impl Bed {
    /// Builds a bed. `index` makes the names unique within this run; the PID makes
    /// them unique among runs (tests run in parallel).
    pub fn build(spec: BedSpec) -> io::Result<Bed> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let index = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = namespace_prefix();
        let bed = Bed {
            spec,
            target: format!("{prefix}{index}-t"),
            initiator: format!("{prefix}{index}-i"),
        };
        // From here on, dropping `bed` (also on an early error) removes what exists.
        for ns in [&bed.target, &bed.initiator] {
            let mut registry = cleanup::lock();
            registry.add_namespace(ns);
            run("ip", &["netns", "add", ns])?;
            drop(registry);
            run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        let mtu = spec.mtu.to_string();
        for channel in 0..spec.channels {
            let name = interface(channel);
            // Made inside the namespaces, so the names never meet the host's.
            run(
                "ip",
                &[
                    "-n",
                    &bed.target,
                    "link",
                    "add",
                    &name,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &name,
                    "netns",
                    &bed.initiator,
                ],
            )?;
            for (ns, addr) in [
                (&bed.target, target_addr(channel)),
                (&bed.initiator, initiator_addr(channel)),
            ] {
                run("ip", &["-n", ns, "link", "set", &name, "mtu", &mtu])?;
                run(
                    "ip",
                    &["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", &name],
                )?;
                if let Some(mbit) = spec.rate.mbit() {
                    let mut args = vec!["-n".to_string(), ns.to_string()];
                    args.extend(tbf_args(&name, mbit));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    run("tc", &args)?;
                }
                run("ip", &["-n", ns, "link", "set", &name, "up"])?;
            }
        }
        Ok(bed)
    }

    pub fn target_ns(&self) -> &str {
        &self.target
    }

    pub fn initiator_ns(&self) -> &str {
        &self.initiator
    }

    /// A command that runs `program` in namespace `ns` (`ip netns exec`, which
    /// execs the program: its PID is the child's).
    pub fn command_in(ns: &str, program: &std::path::Path) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]).arg(program);
        command
    }

    /// Runs `f` on a new thread inside the initiator namespace; sockets (and
    /// threads) it makes belong there.
    pub fn in_initiator<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        enter_and_run(&self.initiator, f)
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let mut registry = cleanup::lock();
        for ns in [&self.target, &self.initiator] {
            cleanup::delete_namespace(ns);
            registry.remove_namespace(ns);
        }
    }
}

/// Runs `f` on a scoped thread that has joined network namespace `ns`.
pub fn enter_and_run<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let file = std::fs::File::open(std::path::Path::new("/run/netns").join(ns))?;
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
            "{program} {} failed: {}",
            args.join(" "),
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
        assert!(namespace_prefix().contains(&std::process::id().to_string()));
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
}
