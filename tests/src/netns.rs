//! A network namespace lab for tests: two namespaces joined by veth pairs, made by
//! blockwire-lab's [`netns`](blockwire_lab::netns) module (the one the lab's bed
//! uses) and removed again on drop. Needs root; tests skip themselves with
//! [`require_root!`](crate::require_root) elsewhere.

use std::ffi::OsStr;
use std::io;
use std::process::Command;

use blockwire_lab::netns::{self, Channels, NamespacePair};

/// Two network namespaces joined by veth pairs; everything is removed on Drop (also
/// when a test panics).
#[derive(Debug)]
pub struct VethLab {
    pair: NamespacePair,
}

impl VethLab {
    /// Creates namespaces `bw<tag>t` (target side) and `bw<tag>i` (initiator side),
    /// joined by `links` veth pairs named `eth0`, `eth1`, ... on both sides, all set
    /// to `mtu` and up (as is `lo`), without addresses. `tag` must be unique per
    /// test, e.g. `format!("{}{}", short, std::process::id() % 100000)`. Leftovers
    /// with the same names (from a killed run) are deleted first.
    pub fn new(tag: &str, links: usize, mtu: usize) -> io::Result<VethLab> {
        let invalid = |what| io::Error::new(io::ErrorKind::InvalidInput, what);
        let channels = Channels {
            count: u32::try_from(links).map_err(|_| invalid("too many links"))?,
            mtu: u32::try_from(mtu).map_err(|_| invalid("MTU out of range"))?,
            rate_mbit: None,
            addressed: false,
        };
        let pair = NamespacePair::create(&format!("bw{tag}t"), &format!("bw{tag}i"), &channels)?;
        Ok(VethLab { pair })
    }

    /// The target-side namespace, `bw<tag>t`.
    pub fn target_ns(&self) -> &str {
        self.pair.target_ns()
    }

    /// The initiator-side namespace, `bw<tag>i`.
    pub fn initiator_ns(&self) -> &str {
        self.pair.initiator_ns()
    }

    /// The veth interface names, the same in both namespaces: `eth0`, `eth1`, ...
    pub fn interfaces(&self) -> Vec<String> {
        self.pair.interfaces()
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
        netns::command_in(ns, program)
    }

    /// Runs `f` on a new thread that has joined namespace `ns`; sockets it creates
    /// belong to that namespace (and stay there when the thread ends). Returns f's
    /// result; a panic in `f` is passed on.
    pub fn run_in<T: Send>(&self, ns: &str, f: impl FnOnce() -> T + Send) -> T {
        netns::enter_and_run(ns, f)
            .unwrap_or_else(|e| panic!("cannot enter network namespace {ns}: {e}"))
    }
}

/// Whether this process can build namespace labs: it may administer the network
/// and can create a network namespace with a veth pair in it (checked once).
pub fn available() -> bool {
    netns::available()
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
