//! An AF_XDP data path for AoE sockets, opt-in (`serve --aoe-xdp`, `aoe://...?xdp`).
//!
//! A small XDP program on the interface hands AoE frames arriving on receive queue 0
//! to an AF_XDP socket in copy mode, and everything else on to the kernel's stack as
//! before; frames are sent from the same socket. Per frame this skips most of the
//! packet-socket path (on a veth pair at MTU 1500, a bare frame bouncer moved about a
//! third more frames per second through AF_XDP's generic hook than through
//! AF_PACKET: `bench/aoe-frame-ceiling.sh`).
//!
//! AoE frames that arrive on another receive queue pass to the kernel and still reach
//! the socket's packet half ([`RawSocket`](super::RawSocket) keeps both). Non-IP
//! frames carry no flow hash, so NICs that spread frames over queues by hash
//! generally put them on queue 0.
//!
//! The cost of opting in:
//! - the interface's XDP hook is ours while the socket lives (another XDP program
//!   makes the attach fail);
//! - frames must fit a 4 KiB UMEM chunk behind the kernel's headroom (MTU up to
//!   3822: no jumbo frames). The MTU is checked when the socket opens; raised
//!   later, larger frames are dropped;
//! - captures on the interface (tcpdump, tshark) see neither the AoE frames the
//!   program redirects nor the ones sent from the AF_XDP socket;
//! - the generic hook adds its work (headroom for the program) to every frame the
//!   interface receives, AoE or not.

mod bpf;
mod xsk;

use std::io;
use std::sync::Arc;

pub use bpf::Hook;
pub(super) use xsk::Xsk;

use super::{Interface, ETH_HEADER_LEN};

/// The largest MTU the AF_XDP path takes: a frame with a VLAN tag must fit a UMEM
/// chunk behind the kernel's headroom.
pub const MAX_MTU: usize = xsk::MAX_FRAME - ETH_HEADER_LEN - 4;

/// One interface's AF_XDP socket and the redirect that feeds it.
///
/// A receive batch holding frames keeps the socket (not the redirect) alive past
/// its `RawSocket`: until the batch is dropped too, queue 0 stays bound and a new
/// AF_XDP path on the interface fails to bind.
#[derive(Debug)]
pub(super) struct XdpPath {
    pub xsk: Arc<Xsk>,
    /// Detaches the program when dropped, after `xsk` is dropped.
    _redirect: bpf::Redirect,
}

impl XdpPath {
    pub fn open(interface: &Interface, hook: Hook) -> io::Result<XdpPath> {
        if interface.mtu > MAX_MTU {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "MTU {} is above the {MAX_MTU} an AF_XDP frame can take here; \
                     leave out the AF_XDP option for jumbo frames",
                    interface.mtu
                ),
            ));
        }
        let ifindex = interface.index as u32;
        let redirect = bpf::Redirect::attach(ifindex, hook)?;
        let xsk = Xsk::open(ifindex, 0).map_err(|e| context(e, "AF_XDP socket on queue 0"))?;
        redirect.feed(&xsk)?;
        Ok(XdpPath {
            xsk: Arc::new(xsk),
            _redirect: redirect,
        })
    }
}

/// `err` with what was being done when it happened in front.
pub(super) fn context(err: io::Error, what: &str) -> io::Error {
    io::Error::new(err.kind(), format!("{what}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_mtu_is_what_the_docs_quote() {
        // docs/aoe.md and `serve --help` say 3822: a page, less the kernel's 256
        // bytes of headroom, the Ethernet header and a VLAN tag.
        assert_eq!(MAX_MTU, 3822);
    }
}
