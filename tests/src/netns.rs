//! A network namespace lab for tests: two namespaces joined by veth pairs, built with
//! iproute2 (`ip`) and removed again on drop. Needs root; tests skip themselves with
//! [`require_root!`](crate::require_root) elsewhere.

use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Two network namespaces joined by veth pairs; everything is removed on Drop (also
/// when a test panics).
#[derive(Debug)]
pub struct VethLab {
    target: String,
    initiator: String,
    links: usize,
}

impl VethLab {
    /// Creates namespaces `bw<tag>t` (target side) and `bw<tag>i` (initiator side),
    /// joined by `links` veth pairs named `eth0`, `eth1`, ... on both sides, all set
    /// to `mtu` and up (as is `lo`). `tag` must be unique per test, e.g.
    /// `format!("{}{}", short, std::process::id() % 100000)`. Leftovers with the same
    /// names (from a killed run) are deleted first.
    pub fn new(tag: &str, links: usize, mtu: usize) -> io::Result<VethLab> {
        let lab = VethLab {
            target: format!("bw{tag}t"),
            initiator: format!("bw{tag}i"),
            links,
        };
        for ns in [&lab.target, &lab.initiator] {
            if std::path::Path::new("/run/netns").join(ns).exists() {
                let _ = ip(&["netns", "del", ns]);
            }
        }
        // From here on, dropping `lab` (also on an early error) removes what exists.
        for ns in [&lab.target, &lab.initiator] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        let mtu = mtu.to_string();
        for name in lab.interfaces() {
            // Created inside the namespaces directly, so the names never meet (or
            // clash with) interfaces of the host namespace.
            ip(&[
                "-n",
                &lab.target,
                "link",
                "add",
                &name,
                "type",
                "veth",
                "peer",
                "name",
                &name,
                "netns",
                &lab.initiator,
            ])?;
            for ns in [&lab.target, &lab.initiator] {
                ip(&["-n", ns, "link", "set", &name, "mtu", &mtu, "up"])?;
            }
        }
        Ok(lab)
    }

    /// The target-side namespace, `bw<tag>t`.
    pub fn target_ns(&self) -> &str {
        &self.target
    }

    /// The initiator-side namespace, `bw<tag>i`.
    pub fn initiator_ns(&self) -> &str {
        &self.initiator
    }

    /// The veth interface names, the same in both namespaces: `eth0`, `eth1`, ...
    pub fn interfaces(&self) -> Vec<String> {
        (0..self.links).map(|i| format!("eth{i}")).collect()
    }

    /// Whether an XDP program is attached to `eth0` in namespace `ns`
    /// (`ip link show` names it `prog/xdp`).
    pub fn xdp_attached(&self, ns: &str) -> bool {
        let out = self
            .command_in(ns, "ip")
            .args(["link", "show", "eth0"])
            .output()
            .expect("run ip link show");
        String::from_utf8_lossy(&out.stdout).contains("prog/xdp")
    }

    /// A Command that runs `program` inside namespace `ns`
    /// (`ip netns exec NS program`); add arguments as usual.
    pub fn command_in(&self, ns: &str, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns]).arg(program);
        command
    }

    /// Runs `f` on a new thread that has joined namespace `ns`; sockets it creates
    /// belong to that namespace (and stay there when the thread ends). Returns f's
    /// result; a panic in `f` is passed on.
    pub fn run_in<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| {
            let joined = scope.spawn(|| {
                enter(ns).unwrap_or_else(|e| panic!("cannot enter network namespace {ns}: {e}"));
                f()
            });
            joined
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Drop for VethLab {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for ns in [&self.target, &self.initiator] {
            if !std::path::Path::new("/run/netns").join(ns).exists() {
                continue; // never made: `new` failed before it
            }
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("VethLab: {e}");
            }
        }
    }
}

/// Moves the calling thread into the network namespace `/run/netns/NS`.
fn enter(ns: &str) -> io::Result<()> {
    let file = std::fs::File::open(std::path::Path::new("/run/netns").join(ns))?;
    // SAFETY: setns(2) on a descriptor we hold open for the call; CLONE_NEWNET only
    // changes the calling thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `ip ARGS...`; a failure becomes an error carrying the command and its stderr.
fn ip(args: &[&str]) -> io::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run ip: {e}")))?;
    if !output.status.success() {
        return Err(io::Error::other(format!(
            "ip {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether this process can build namespace labs: it runs as root and can create a
/// network namespace with a veth pair in it (checked once, then remembered).
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return false;
        }
        let probe = format!("bwprobe{}", std::process::id());
        let works = ip(&["netns", "add", &probe]).is_ok()
            && ip(&[
                "-n", &probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
            ])
            .is_ok();
        let _ = ip(&["netns", "del", &probe]);
        works
    })
}

/// Returns early from a test, saying so, when network namespaces cannot be built
/// (not root, or no `ip netns`/veth).
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::netns::available() {
            eprintln!("skipped: needs root (network namespaces)");
            return;
        }
    };
}
