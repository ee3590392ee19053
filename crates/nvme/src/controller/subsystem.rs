//! A subsystem: one export, served as one namespace (NSID 1), with its NQN, the
//! hosts allowed to connect, and identifiers that stay the same across restarts.

use std::sync::Arc;

use blockwire_blockdev::Device;

use super::health::IoStats;

/// The NQN prefix of an export's subsystem when the configuration names none.
pub const DEFAULT_NQN_PREFIX: &str = "nqn.2026-11.dev.blockwire:";
/// The one namespace of every subsystem.
pub const NSID: u32 = 1;

/// An NVM subsystem served by the target.
#[derive(Debug, Clone)]
pub struct Subsystem {
    /// The export's name (used for the serial number and the identifiers).
    pub name: String,
    pub nqn: String,
    pub device: Device,
    /// Host NQNs allowed to connect (empty: every host).
    pub allowed_hosts: Vec<String>,
    /// The namespace's reads and writes through every controller (SMART log).
    pub stats: Arc<IoStats>,
}

impl Subsystem {
    /// The subsystem of export `name`, under the default NQN, open to every host.
    pub fn new(name: &str, device: Device) -> Subsystem {
        Subsystem {
            name: name.to_owned(),
            nqn: default_nqn(name),
            device,
            allowed_hosts: Vec::new(),
            stats: Arc::default(),
        }
    }

    /// The same subsystem under another NQN.
    pub fn with_nqn(mut self, nqn: impl Into<String>) -> Subsystem {
        self.nqn = nqn.into();
        self
    }

    /// The same subsystem, open only to these host NQNs.
    pub fn with_allowed_hosts(mut self, hosts: Vec<String>) -> Subsystem {
        self.allowed_hosts = hosts;
        self
    }

    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allowed_hosts.is_empty() || self.allowed_hosts.iter().any(|h| h == hostnqn)
    }

    /// The logical block size: the device's minimum, at least 512 and a power of
    /// two (the LBA data size is a power of two, NVMe base 2.0 "LBA Format").
    pub fn block_size(&self) -> u32 {
        self.device
            .info()
            .block_sizes
            .minimum
            .max(512)
            .next_power_of_two()
    }

    /// The namespace's size in logical blocks (a partial last block is not served).
    pub fn blocks(&self) -> u64 {
        self.device.size() / u64::from(self.block_size())
    }

    /// 16 bytes derived from the NQN alone: the namespace's NGUID, and with the
    /// version bits set, its UUID. A host sees the same identifiers after a restart
    /// and on every path, which is what multipath matches namespaces by.
    pub fn nguid(&self) -> [u8; 16] {
        stable_id(&self.nqn)
    }

    /// A UUID (RFC 4122 layout, version 8: custom) from [`Subsystem::nguid`].
    pub fn uuid(&self) -> [u8; 16] {
        let mut id = stable_id(&format!("uuid:{}", self.nqn));
        id[6] = (id[6] & 0x0f) | 0x80;
        id[8] = (id[8] & 0x3f) | 0x80;
        id
    }

    /// The 20-character serial number: a hex digest of the NQN.
    pub fn serial(&self) -> String {
        let id = stable_id(&format!("serial:{}", self.nqn));
        id[..10].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The default NQN of export `name`.
pub fn default_nqn(name: &str) -> String {
    format!("{DEFAULT_NQN_PREFIX}{name}")
}

/// 16 bytes from `text` by two FNV-1a passes with different offsets: stable across
/// builds and platforms (no std hasher, whose output may change), not secret.
fn stable_id(text: &str) -> [u8; 16] {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let pass = |offset: u64| {
        text.bytes()
            .fold(offset, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
    };
    let mut id = [0; 16];
    id[..8].copy_from_slice(&pass(0xcbf2_9ce4_8422_2325).to_be_bytes());
    id[8..].copy_from_slice(&pass(0x6c62_272e_07bb_0142).to_be_bytes());
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::MemoryDevice;

    fn subsystem(name: &str) -> Subsystem {
        Subsystem::new(name, Device::from_device(MemoryDevice::new(1 << 20)))
    }

    #[test]
    fn default_nqn_and_sizes() {
        let s = subsystem("disk0");
        assert_eq!(s.nqn, "nqn.2026-11.dev.blockwire:disk0");
        assert_eq!(s.block_size(), 512);
        assert_eq!(s.blocks(), 2048);
    }

    #[test]
    fn identifiers_are_stable_and_distinct() {
        let a = subsystem("a");
        let a_again = subsystem("a");
        let b = subsystem("b");
        assert_eq!(a.nguid(), a_again.nguid());
        assert_eq!(a.uuid(), a_again.uuid());
        assert_ne!(a.nguid(), b.nguid());
        assert_ne!(a.nguid(), a.uuid());
        assert_eq!(a.uuid()[6] >> 4, 8);
        assert_eq!(a.serial().len(), 20);
        // Pinned: a change here changes every host's view of every export.
        assert_eq!(a.nguid(), stable_id("nqn.2026-11.dev.blockwire:a"),);
    }

    #[test]
    fn allowed_hosts() {
        let open = subsystem("x");
        assert!(open.allows("nqn.any"));
        let closed = open.with_allowed_hosts(vec!["nqn.h1".into()]);
        assert!(closed.allows("nqn.h1"));
        assert!(!closed.allows("nqn.h2"));
    }
}
