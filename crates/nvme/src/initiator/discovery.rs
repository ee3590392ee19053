//! Discovery: connect to a discovery controller and read its log page, the
//! list of subsystems and the ports they are reached on.

use super::commands::{self, text};
use super::error::InitiatorError;
use super::options::NvmeOptions;
use super::session::Session;
use crate::fabrics::DISCOVERY_NQN;
use crate::opcodes::log;

/// Length of the log's header and of each entry.
const RECORD_LEN: usize = 1024;
/// Entries read at most (a log larger than this is cut).
const MAX_ENTRIES: u64 = 1024;

/// One entry of a discovery log (NVMe-oF 1.1, "Discovery Log Page Entry").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// Transport type: 3 is TCP.
    pub trtype: u8,
    /// Address family: 1 IPv4, 2 IPv6.
    pub adrfam: u8,
    /// Subsystem type: 1 a referral to another discovery controller, 2 an NVM
    /// subsystem, 3 the current discovery subsystem.
    pub subtype: u8,
    pub portid: u16,
    pub cntlid: u16,
    /// Transport service ID: the TCP port.
    pub trsvcid: String,
    /// Transport address: the host name or IP address.
    pub traddr: String,
    pub subnqn: String,
}

impl DiscoveryEntry {
    /// Reads one 1024-byte entry.
    pub fn parse(e: &[u8]) -> Option<DiscoveryEntry> {
        if e.len() < RECORD_LEN {
            return None;
        }
        Some(DiscoveryEntry {
            trtype: e[0],
            adrfam: e[1],
            subtype: e[2],
            portid: u16::from_le_bytes([e[4], e[5]]),
            cntlid: u16::from_le_bytes([e[6], e[7]]),
            trsvcid: text(&e[32..64]),
            traddr: text(&e[512..768]),
            subnqn: text(&e[256..512]),
        })
    }

    /// The `nvme+tcp://` URI of this entry's subsystem (namespace 1).
    pub fn uri(&self) -> String {
        let host = if self.traddr.contains(':') {
            format!("[{}]", self.traddr)
        } else {
            self.traddr.clone()
        };
        format!("{}{host}:{}/{}", super::SCHEME, self.trsvcid, self.subnqn)
    }
}

/// Connects to the discovery controller `options` name (its `subnqn` is set
/// to the discovery NQN whatever it was) and returns its log's entries.
pub fn discover(options: &NvmeOptions) -> Result<Vec<DiscoveryEntry>, InitiatorError> {
    let mut options = options.clone();
    options.subnqn = DISCOVERY_NQN.to_owned();
    let session = Session::connect(&options)?;
    // A log that changes while it is read is read again, a few times at most.
    for _ in 0..3 {
        if let Some(entries) = read_log(&session, &options)? {
            return Ok(entries);
        }
    }
    Err(InitiatorError::Protocol {
        address: options.address(),
        reason: "the discovery log kept changing while it was read".into(),
    })
}

/// Reads the log once: None when its generation counter moved meanwhile.
fn read_log(
    session: &Session,
    options: &NvmeOptions,
) -> Result<Option<Vec<DiscoveryEntry>>, InitiatorError> {
    let timeout = options.setup_timeout;
    let header = session.admin_data(
        commands::get_log_page(log::DISCOVERY, RECORD_LEN as u32, 0),
        RECORD_LEN,
        "Get Log Page (discovery)",
        timeout,
    )?;
    let genctr = u64::from_le_bytes(header[0..8].try_into().expect("8 bytes"));
    let count = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes")).min(MAX_ENTRIES);
    let mut entries = Vec::with_capacity(count as usize);
    // Read in pieces no larger than one command may move.
    let per_read = (session.max_transfer as usize / RECORD_LEN).max(1);
    let mut index = 0usize;
    while (index as u64) < count {
        let n = per_read.min(count as usize - index);
        let offset = (RECORD_LEN * (index + 1)) as u64;
        let data = session.admin_data(
            commands::get_log_page(log::DISCOVERY, (n * RECORD_LEN) as u32, offset),
            n * RECORD_LEN,
            "Get Log Page (discovery entries)",
            timeout,
        )?;
        entries.extend(data.chunks(RECORD_LEN).filter_map(DiscoveryEntry::parse));
        index += n;
    }
    let again = session.admin_data(
        commands::get_log_page(log::DISCOVERY, 16, 0),
        16,
        "Get Log Page (discovery header)",
        timeout,
    )?;
    Ok((again[0..8] == genctr.to_le_bytes()).then_some(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_fields_and_uri() {
        let mut e = vec![0u8; RECORD_LEN];
        e[0] = 3;
        e[1] = 1;
        e[2] = 2;
        e[4] = 1;
        e[6..8].copy_from_slice(&0xffffu16.to_le_bytes());
        e[32..36].copy_from_slice(b"4420");
        e[256..263].copy_from_slice(b"nqn.a:b");
        e[512..521].copy_from_slice(b"127.0.0.1");
        let entry = DiscoveryEntry::parse(&e).unwrap();
        assert_eq!(entry.trsvcid, "4420");
        assert_eq!(entry.subnqn, "nqn.a:b");
        assert_eq!((entry.portid, entry.cntlid), (1, 0xffff));
        assert_eq!(entry.uri(), "nvme+tcp://127.0.0.1:4420/nqn.a:b");
        assert!(DiscoveryEntry::parse(&e[..10]).is_none());
    }
}
