//! Admission of a target's connections: the caps on connections overall, per client
//! address, and on unfinished ones (still in the NBD handshake or the iSCSI login)
//! per address, and which unfinished connection a cap closes to make room.
//!
//! A cap that refused the newest connection let one address lock out everybody who
//! shares it (issue 31: 50 unfinished NBD handshakes from 127.0.0.1 kept a good
//! client on 127.0.0.1 out, where qemu-nbd and tgtd served it). So a cap takes an
//! unfinished connection instead: the oldest one of the address at its cap, or, at
//! the cap on all connections, the oldest one of the address holding the most
//! unfinished ones. A connection that finished its handshake is never closed to make
//! room; when no unfinished connection can go, the newest is refused as before.
//!
//! No sockets here: [`AdmissionTable`] is the policy over a plain table, and says
//! which connection to close by its id; the target closes it (a `shutdown(2)` of a
//! clone of its socket), and the connection's own thread then fails its handshake
//! and cleans up as for any other peer that went away.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

/// The caps of one target. Connections without an address (Unix sockets) count
/// towards `connections` only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Open connections, finished or not.
    pub connections: usize,
    /// Open connections from one address, finished or not.
    pub per_address: usize,
    /// Connections from one address that have not finished their handshake.
    pub unfinished_per_address: usize,
}

/// Which cap a [`Verdict`] enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    Connections,
    PerAddress,
    UnfinishedPerAddress,
}

/// What to do with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it.
    Admit,
    /// Serve it, after closing the unfinished connection `id` to stay within `cap`.
    Evict { id: u64, cap: Cap },
    /// Close it at once: `cap` is reached and no unfinished connection can make room.
    Refuse(Cap),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    address: Option<IpAddr>,
    /// Admission order: lower is older.
    seq: u64,
    unfinished: bool,
}

/// The open connections of a target, as the admission policy sees them.
#[derive(Debug, Default)]
pub struct AdmissionTable {
    entries: HashMap<u64, Entry>,
    next_seq: u64,
}

impl AdmissionTable {
    /// What `limits` say about one more connection from `address`. Changes nothing.
    pub fn verdict(&self, address: Option<IpAddr>, limits: AdmissionLimits) -> Verdict {
        let global_full = self.entries.len() >= limits.connections;
        if global_full && !self.entries.values().any(|e| e.unfinished) {
            return Verdict::Refuse(Cap::Connections);
        }
        if let Some(address) = address {
            let from = || {
                self.entries
                    .values()
                    .filter(move |e| e.address == Some(address))
            };
            let cap = if from().count() >= limits.per_address {
                Some(Cap::PerAddress)
            } else if from().filter(|e| e.unfinished).count() >= limits.unfinished_per_address {
                Some(Cap::UnfinishedPerAddress)
            } else {
                None
            };
            if let Some(cap) = cap {
                // The address's own oldest unfinished one also frees a slot of
                // `connections`, should that cap be reached too.
                return match self.oldest_unfinished(Some(address)) {
                    Some(id) => Verdict::Evict { id, cap },
                    None => Verdict::Refuse(cap),
                };
            }
        }
        if global_full {
            return match self.busiest_address() {
                Some(busiest) => Verdict::Evict {
                    id: self
                        .oldest_unfinished(busiest)
                        .expect("the busiest address has an unfinished connection"),
                    cap: Cap::Connections,
                },
                None => Verdict::Refuse(Cap::Connections),
            };
        }
        Verdict::Admit
    }

    /// Decides on connection `id` from `address` and, unless it is refused, counts
    /// it as open and unfinished (and the evicted one as gone).
    pub fn admit(&mut self, id: u64, address: Option<IpAddr>, limits: AdmissionLimits) -> Verdict {
        let verdict = self.verdict(address, limits);
        match verdict {
            Verdict::Refuse(_) => return verdict,
            Verdict::Evict { id: victim, .. } => {
                self.entries.remove(&victim);
            }
            Verdict::Admit => {}
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            id,
            Entry {
                address,
                seq,
                unfinished: true,
            },
        );
        verdict
    }

    /// Connection `id` finished its handshake: no cap closes it from now on. False
    /// when it was evicted (or never admitted): its socket is being closed, and it
    /// must not be served.
    pub fn finish(&mut self, id: u64) -> bool {
        match self.entries.get_mut(&id) {
            Some(entry) => {
                entry.unfinished = false;
                true
            }
            None => false,
        }
    }

    /// Connection `id` has closed (a no-op for one already evicted).
    pub fn remove(&mut self, id: u64) {
        self.entries.remove(&id);
    }

    /// Connections counted now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Unfinished connections from `address`.
    pub fn unfinished(&self, address: Option<IpAddr>) -> usize {
        self.entries
            .values()
            .filter(|e| e.unfinished && e.address == address)
            .count()
    }

    fn oldest_unfinished(&self, address: Option<IpAddr>) -> Option<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| e.unfinished && e.address == address)
            .min_by_key(|(_, e)| e.seq)
            .map(|(&id, _)| id)
    }

    /// The address with the most unfinished connections (Unix sockets together as
    /// one); of equals, the one whose oldest unfinished connection is older.
    fn busiest_address(&self) -> Option<Option<IpAddr>> {
        // address -> (unfinished, oldest seq)
        let mut per_address: HashMap<Option<IpAddr>, (usize, u64)> = HashMap::new();
        for entry in self.entries.values().filter(|e| e.unfinished) {
            let counted = per_address.entry(entry.address).or_insert((0, u64::MAX));
            counted.0 += 1;
            counted.1 = counted.1.min(entry.seq);
        }
        per_address
            .into_iter()
            .max_by_key(|&(_, (count, oldest))| (count, std::cmp::Reverse(oldest)))
            .map(|(address, _)| address)
    }
}

/// An [`AdmissionTable`] shared by a target's accept and connection threads.
#[derive(Debug, Default)]
pub struct Admission(Mutex<AdmissionTable>);

impl Admission {
    /// Locks the table; [`AdmissionTable`] has the operations.
    pub fn lock(&self) -> MutexGuard<'_, AdmissionTable> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`AdmissionTable::admit`].
    pub fn admit(&self, id: u64, address: Option<IpAddr>, limits: AdmissionLimits) -> Verdict {
        self.lock().admit(id, address, limits)
    }

    /// [`AdmissionTable::finish`].
    pub fn finish(&self, id: u64) -> bool {
        self.lock().finish(id)
    }

    /// [`AdmissionTable::remove`].
    pub fn remove(&self, id: u64) {
        self.lock().remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: AdmissionLimits = AdmissionLimits {
        connections: 8,
        per_address: 5,
        unfinished_per_address: 3,
    };

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    /// Admits `ids` from `address`, each expected to be admitted outright.
    fn fill(table: &mut AdmissionTable, ids: std::ops::Range<u64>, address: Option<IpAddr>) {
        for id in ids {
            assert_eq!(table.admit(id, address, LIMITS), Verdict::Admit, "id {id}");
        }
    }

    /// Admits `ids` from `address` outright, each finishing its handshake.
    fn establish(table: &mut AdmissionTable, ids: std::ops::Range<u64>, address: Option<IpAddr>) {
        for id in ids {
            assert_eq!(table.admit(id, address, LIMITS), Verdict::Admit, "id {id}");
            assert!(table.finish(id));
        }
    }

    #[test]
    fn an_address_at_its_unfinished_cap_loses_its_oldest_unfinished_one() {
        let mut table = AdmissionTable::default();
        fill(&mut table, 0..3, ip(1));
        // Another address is not concerned.
        assert_eq!(table.verdict(ip(2), LIMITS), Verdict::Admit);
        // The fourth from the same address is served; the oldest goes.
        assert_eq!(
            table.admit(3, ip(1), LIMITS),
            Verdict::Evict {
                id: 0,
                cap: Cap::UnfinishedPerAddress
            }
        );
        assert_eq!(table.unfinished(ip(1)), 3);
        assert!(!table.finish(0), "an evicted connection must not be served");
        // A finished one is not the oldest unfinished any more.
        assert!(table.finish(1));
        assert_eq!(table.admit(4, ip(1), LIMITS), Verdict::Admit);
        assert_eq!(
            table.admit(5, ip(1), LIMITS),
            Verdict::Evict {
                id: 2,
                cap: Cap::UnfinishedPerAddress
            }
        );
    }

    #[test]
    fn finished_connections_are_never_evicted() {
        let mut table = AdmissionTable::default();
        establish(&mut table, 0..5, ip(1));
        // At the per-address cap with nothing unfinished: the newest is refused.
        assert_eq!(
            table.admit(5, ip(1), LIMITS),
            Verdict::Refuse(Cap::PerAddress)
        );
        establish(&mut table, 6..9, ip(2));
        // Eight finished: at the global cap, nothing to take.
        assert_eq!(
            table.admit(9, ip(3), LIMITS),
            Verdict::Refuse(Cap::Connections)
        );
        assert_eq!(table.len(), 8);
    }

    #[test]
    fn at_its_connection_cap_an_address_gives_up_an_unfinished_one() {
        let mut table = AdmissionTable::default();
        establish(&mut table, 0..2, ip(1));
        fill(&mut table, 2..3, ip(1));
        establish(&mut table, 3..4, ip(1));
        fill(&mut table, 4..5, ip(1));
        assert_eq!(
            table.admit(5, ip(1), LIMITS),
            Verdict::Evict {
                id: 2,
                cap: Cap::PerAddress
            }
        );
    }

    #[test]
    fn at_the_global_cap_the_address_with_most_unfinished_gives_one_up() {
        let mut table = AdmissionTable::default();
        fill(&mut table, 0..2, ip(1)); // two unfinished, older
        fill(&mut table, 2..5, ip(2)); // three unfinished
        establish(&mut table, 5..8, ip(3)); // never taken
        assert_eq!(
            table.admit(8, ip(4), LIMITS),
            Verdict::Evict {
                id: 2,
                cap: Cap::Connections
            }
        );
        // Now 10.0.0.1 and .2 hold two each: the one with the older goes first.
        assert_eq!(
            table.admit(9, ip(4), LIMITS),
            Verdict::Evict {
                id: 0,
                cap: Cap::Connections
            }
        );
        assert_eq!(table.len(), 8);
    }

    #[test]
    fn unix_sockets_have_no_address_caps_but_count_globally() {
        let mut table = AdmissionTable::default();
        fill(&mut table, 0..8, None);
        assert_eq!(
            table.admit(8, ip(1), LIMITS),
            Verdict::Evict {
                id: 0,
                cap: Cap::Connections
            }
        );
    }

    #[test]
    fn removal_frees_the_slot_and_forgets_the_evicted() {
        let mut table = AdmissionTable::default();
        fill(&mut table, 0..3, ip(1));
        table.remove(1);
        assert_eq!(table.admit(3, ip(1), LIMITS), Verdict::Admit);
        table.remove(1); // twice, as an evicted connection's thread does
        assert_eq!(table.len(), 3);
    }

    #[test]
    fn a_flood_from_one_address_leaves_its_newest_connections() {
        let mut table = AdmissionTable::default();
        for id in 0..300 {
            assert!(!matches!(
                table.admit(id, ip(1), LIMITS),
                Verdict::Refuse(_)
            ));
        }
        assert_eq!(table.unfinished(ip(1)), 3);
        assert!(table.finish(299) && table.finish(298) && table.finish(297));
        assert!(!table.finish(296));
    }
}
