//! The bed: a target namespace and an initiator namespace joined by N veth
//! channels, each with its MTU, an optional rate limit and its own /24, as seed 003
//! gives each channel its own subnet (§3.3). The namespaces and veths are
//! [`crate::netns`]'s; the bed names them per run and per bed and keeps the spec.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::matrix::BedSpec;
use crate::netns::{self, Channels, NamespacePair};

/// A built bed. Dropping it deletes both namespaces (and with them the veths).
#[derive(Debug)]
pub struct Bed {
    pub spec: BedSpec,
    pair: NamespacePair,
}

/// The prefix of every namespace this process makes: `bwlab-PID-`.
pub fn namespace_prefix() -> String {
    format!("bwlab-{}-", std::process::id())
}

impl Bed {
    /// Builds a bed. `index` makes the names unique within this run; the PID makes
    /// them unique among runs (tests run in parallel).
    pub fn build(spec: BedSpec) -> io::Result<Bed> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let index = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = namespace_prefix();
        let channels = Channels {
            count: spec.channels,
            mtu: spec.mtu,
            rate_mbit: spec.rate.mbit(),
            addressed: true,
        };
        let pair = NamespacePair::create(
            &format!("{prefix}{index}-t"),
            &format!("{prefix}{index}-i"),
            &channels,
        )?;
        Ok(Bed { spec, pair })
    }

    pub fn target_ns(&self) -> &str {
        self.pair.target_ns()
    }

    pub fn initiator_ns(&self) -> &str {
        self.pair.initiator_ns()
    }

    /// Runs `f` on a new thread inside the initiator namespace; sockets (and
    /// threads) it makes belong there.
    pub fn in_initiator<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        netns::enter_and_run(self.initiator_ns(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_carry_the_process_id() {
        assert!(namespace_prefix().contains(&std::process::id().to_string()));
    }
}
