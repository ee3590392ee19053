//! Is an AoE address free? Asked before a target starts answering for it.
//!
//! AoE has no address assignment: two targets answering one shelf.slot on a segment
//! both take every initiator's frames, and each initiator uses whichever answered
//! first, so writes land on two disks and reads come from either — silent data
//! corruption. [`who_answers`] sends the Query Config Information request (AoEr11
//! §3.2) that initiators use to find a target, to the address about to be served,
//! and reports the first target that answers.
//!
//! What it cannot see:
//!
//! - a target on this host (or network namespace) on the same interface: a packet
//!   socket bound to the AoE ethertype receives frames from the wire only, never
//!   another local socket's outgoing frames, so a second target here hears nothing
//!   of our query (nor would a local initiator reach it). [`LocalClaim`] covers
//!   blockwire processes of one network namespace;
//! - a target that does not answer us: one whose MAC mask list leaves our MAC out,
//!   or one busy for longer than the wait.

use std::fmt;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use crate::initiator::discovery::{self, format_mac, Found};
use crate::initiator::uri::target_name;
use crate::rawsock::{Interface, RawSocket};
use crate::wire::{MacAddr, BROADCAST_SHELF, BROADCAST_SLOT};

/// How long [`who_answers`] listens by default. Targets answer a config query in
/// well under a millisecond on a LAN; the query is sent four times in this span
/// (every quarter), in case one is lost.
pub const DEFAULT_WAIT: Duration = Duration::from_millis(300);

/// A target that already answers an address on an interface. Its `Display` is the
/// whole sentence: "another AoE target (MAC 02:00:00:00:00:aa) already answers
/// e1.2 on eth0".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressTaken {
    /// The local interface the answer came in on.
    pub interface: String,
    pub shelf: u16,
    pub slot: u8,
    /// The answering target's MAC address.
    pub mac: MacAddr,
}

impl AddressTaken {
    /// `eSHELF.SLOT`.
    pub fn target_name(&self) -> String {
        target_name(self.shelf, self.slot)
    }
}

impl fmt::Display for AddressTaken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "another AoE target (MAC {}) already answers {} on {}",
            format_mac(&self.mac),
            self.target_name(),
            self.interface
        )
    }
}

impl std::error::Error for AddressTaken {}

/// Asks on `interface` whether a target answers `shelf`.`slot`: sends a config
/// query to it (a broadcast, re-sent every quarter of `wait` while unanswered) and
/// returns the first target that answers, or `None` when none did within `wait`
/// ([`DEFAULT_WAIT`] suits a LAN). Returns shortly after the first answer.
///
/// Call it before the target starts answering (our own answers would not count
/// anyway: frames from the interface's own MAC are ignored). It needs what the
/// target needs: CAP_NET_RAW and an interface that is up. See the module
/// documentation for what it cannot see.
///
/// ```no_run
/// use blockwire_aoe::probe::{who_answers, DEFAULT_WAIT};
///
/// if let Some(taken) = who_answers("eth0", 1, 2, DEFAULT_WAIT)? {
///     // "another AoE target (MAC 02:..:aa) already answers e1.2 on eth0"
///     return Err(taken.into());
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn who_answers(
    interface: &str,
    shelf: u16,
    slot: u8,
    wait: Duration,
) -> io::Result<Option<AddressTaken>> {
    Ok(who_answers_on(&[interface], shelf, slot, wait)?
        .into_iter()
        .next())
}

/// [`who_answers`] on several interfaces at once (one query each, in parallel, so
/// the whole probe takes one `wait`): every target that answers, one entry per
/// interface and MAC, in the order of `interfaces`.
pub fn who_answers_on<S: AsRef<str>>(
    interfaces: &[S],
    shelf: u16,
    slot: u8,
    wait: Duration,
) -> io::Result<Vec<AddressTaken>> {
    if shelf == BROADCAST_SHELF || slot == BROADCAST_SLOT {
        // A target never serves the broadcast address; asking for it would count
        // every target on the segment as a conflict.
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not an address a target can serve",
                target_name(shelf, slot)
            ),
        ));
    }
    let interfaces = interfaces
        .iter()
        .map(|name| Interface::lookup(name.as_ref()))
        .collect::<io::Result<Vec<_>>>()?;
    let sockets = interfaces
        .iter()
        .map(|interface| RawSocket::open(interface, 0))
        .collect::<io::Result<Vec<_>>>()?;
    // `settle`: an interface stops listening a few round trips after its first
    // answer rather than at the end of `wait`.
    let answers = discovery::query(&sockets, shelf, slot, wait, true)?;
    Ok(taken(&interfaces, answers))
}

/// The answers that show another target: not from an interface's own MAC (our own
/// query, should a driver loop it back), one per interface and MAC, in interface
/// order.
fn taken(interfaces: &[Interface], answers: Vec<(usize, Found)>) -> Vec<AddressTaken> {
    let mut answers: Vec<(usize, Found)> = answers
        .into_iter()
        .filter(|(index, found)| found.target_mac != interfaces[*index].mac)
        .collect();
    answers.sort_by_key(|(index, found)| (*index, found.answered_in));
    let mut taken: Vec<AddressTaken> = Vec::new();
    for (_, found) in answers {
        let entry = AddressTaken {
            interface: found.interface.name,
            shelf: found.shelf,
            slot: found.slot,
            mac: found.target_mac,
        };
        if !taken.contains(&entry) {
            taken.push(entry);
        }
    }
    taken
}

/// A claim on an AoE address by this process, held until dropped, that other
/// blockwire processes of the same network namespace see: the piece
/// [`who_answers`] cannot do, since local targets never hear each other's queries.
///
/// It is an abstract Unix socket named after interface and address: abstract names
/// belong to the network namespace (as interface names do), and the kernel frees
/// one when its socket closes, also when the process is killed, so no stale claim
/// outlives a crash. Other programs (vblade) do not take or check it.
#[derive(Debug)]
pub struct LocalClaim {
    _socket: UnixDatagram,
    name: String,
}

impl LocalClaim {
    /// Claims `shelf`.`slot` on `interface`. Fails with [`io::ErrorKind::AddrInUse`]
    /// and a sentence saying so when another process (or another claim of this
    /// one) holds it.
    pub fn take(interface: &str, shelf: u16, slot: u8) -> io::Result<LocalClaim> {
        let name = claim_name(interface, shelf, slot);
        let address = SocketAddr::from_abstract_name(name.as_bytes())?;
        match UnixDatagram::bind_addr(&address) {
            Ok(socket) => Ok(LocalClaim {
                _socket: socket,
                name,
            }),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "another blockwire process on this host already serves {} on {interface}",
                    target_name(shelf, slot)
                ),
            )),
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!(
                    "claiming AoE {} on {interface}: {e}",
                    target_name(shelf, slot)
                ),
            )),
        }
    }

    /// The abstract socket name held (for diagnostics).
    pub fn name(&self) -> &str {
        &self.name
    }
}

fn claim_name(interface: &str, shelf: u16, slot: u8) -> String {
    format!("blockwire/aoe/{interface}/{}", target_name(shelf, slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interface(name: &str, last: u8) -> Interface {
        Interface {
            name: name.into(),
            index: i32::from(last),
            mac: [2, 0, 0, 0, 0, last],
            mtu: 1500,
        }
    }

    fn found(interface: &Interface, mac: MacAddr, micros: u64) -> Found {
        Found {
            interface: interface.clone(),
            target_mac: mac,
            shelf: 1,
            slot: 2,
            buffer_count: 16,
            firmware_version: 0x4019,
            sector_count: 2,
            aoe_version: 1,
            config: Vec::new(),
            answered_in: Duration::from_micros(micros),
        }
    }

    #[test]
    fn the_message_names_mac_address_and_interface() {
        let taken = AddressTaken {
            interface: "eth0".into(),
            shelf: 1,
            slot: 2,
            mac: [0, 0x1b, 0x21, 0xa, 0xb, 0xff],
        };
        assert_eq!(
            taken.to_string(),
            "another AoE target (MAC 00:1b:21:0a:0b:ff) already answers e1.2 on eth0"
        );
    }

    #[test]
    fn answers_from_our_own_mac_do_not_count_and_others_are_listed_once() {
        let eth0 = interface("eth0", 1);
        let eth1 = interface("eth1", 2);
        let interfaces = [eth0.clone(), eth1.clone()];
        let other = [2, 0, 0, 0, 0, 0xaa];
        let answers = vec![
            (1, found(&eth1, other, 90)),
            (0, found(&eth0, eth0.mac, 10)),
            (0, found(&eth0, other, 50)),
            (0, found(&eth0, other, 70)),
        ];
        let taken = taken(&interfaces, answers);
        let seen: Vec<(&str, MacAddr)> = taken
            .iter()
            .map(|t| (t.interface.as_str(), t.mac))
            .collect();
        assert_eq!(seen, vec![("eth0", other), ("eth1", other)]);
        assert!(super::taken(&interfaces, vec![(0, found(&eth0, eth0.mac, 1))]).is_empty());
    }

    #[test]
    fn the_broadcast_address_is_refused() {
        for (shelf, slot) in [(BROADCAST_SHELF, 2), (1, BROADCAST_SLOT)] {
            let err = who_answers("lo", shelf, slot, Duration::ZERO).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        }
    }

    #[test]
    fn a_local_claim_is_exclusive_until_dropped() {
        // A name no other test or process uses.
        let interface = format!("t{}", std::process::id());
        let claim = LocalClaim::take(&interface, 7, 9).unwrap();
        assert!(claim.name().ends_with("/e7.9"), "{}", claim.name());
        let err = LocalClaim::take(&interface, 7, 9).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(
            err.to_string()
                .contains(&format!("already serves e7.9 on {interface}")),
            "{err}"
        );
        // Other addresses and interfaces are free.
        let _other_slot = LocalClaim::take(&interface, 7, 10).unwrap();
        let _other_interface = LocalClaim::take(&format!("{interface}x"), 7, 9).unwrap();
        drop(claim);
        let _again = LocalClaim::take(&interface, 7, 9).unwrap();
    }
}
