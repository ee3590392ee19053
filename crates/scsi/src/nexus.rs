//! The I_T nexus a command arrives on.

/// Identifies an I_T nexus (initiator port + target port). The transport builds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Nexus {
    /// Initiator port name for logs and as the key for reservations, e.g.
    /// "iqn.x,i,0x23d000000001".
    pub initiator_port: String,
    /// SPC-4 TransportID of the initiator port, already encoded by the transport
    /// (PERSISTENT RESERVE IN READ FULL STATUS returns it).
    pub transport_id: Vec<u8>,
    /// Relative target port identifier (1-based).
    pub relative_target_port: u16,
}

impl Nexus {
    /// The key reservations and unit attentions are kept under: SAM-5 names an I_T
    /// nexus by its initiator port and target port, nothing else.
    pub fn key(&self) -> NexusKey {
        NexusKey {
            initiator_port: self.initiator_port.clone(),
            relative_target_port: self.relative_target_port,
        }
    }

    /// Whether `key` names this nexus (without allocating).
    pub fn is(&self, key: &NexusKey) -> bool {
        self.relative_target_port == key.relative_target_port
            && self.initiator_port == key.initiator_port
    }
}

/// The identity of an I_T nexus: initiator port name and relative target port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NexusKey {
    pub initiator_port: String,
    pub relative_target_port: u16,
}
