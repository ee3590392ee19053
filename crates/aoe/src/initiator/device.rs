//! The initiator as a [`BlockDevice`]: an AoE target reached over one or more local
//! interfaces.

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, BlockSizes, Capabilities, DeviceInfo, Error, ErrorKind, FastPath, Limits, Op,
    RequestQueue, Result, Support, WriteFlags,
};

use super::discovery::{self, format_mac, Found};
use super::engine::Engine;
use super::errors::device_error;
use super::queue::AoeQueue;
use super::session::{
    PathAddr, Plan, Session, SessionConfig, Stats, LBA28_LIMIT, LBA48_LIMIT, MAX_WINDOW,
};
use super::uri::AoeUri;
use crate::identify::Identity;
use crate::rawsock::{Interface, RawSocket};
use crate::wire::{sectors_per_frame, MacAddr, SECTOR_SIZE};

/// Window used when the target advertises more buffers than this (a target may
/// claim thousands; more outstanding frames only lengthen queues).
pub const DEFAULT_MAX_WINDOW: usize = 256;
/// Largest request the device takes in one call (the checked handle splits larger).
pub const MAX_TRANSFER: u32 = 32 << 20;

/// How an initiator opens a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AoeOptions {
    /// A request fails with [`ErrorKind::TimedOut`] when one of its frames stays
    /// unanswered this long despite retransmissions, or when the target answers
    /// nothing at all for this long.
    pub timeout: Duration,
    /// How long to wait for the target to answer the config query when opening.
    pub discovery_wait: Duration,
    /// Frames outstanding at once; by default the target's buffer count (at most
    /// [`DEFAULT_MAX_WINDOW`]).
    pub window: Option<u16>,
}

impl Default for AoeOptions {
    fn default() -> Self {
        AoeOptions {
            timeout: Duration::from_secs(10),
            discovery_wait: Duration::from_secs(1),
            window: None,
        }
    }
}

/// Why a target could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("network interface {name}: {source}")]
    Interface { name: String, source: io::Error },
    #[error("cannot open an AoE socket on {name}: {source}{hint}")]
    Socket {
        name: String,
        source: io::Error,
        hint: &'static str,
    },
    #[error("no AoE target {target} answered on {interfaces} within {waited:?}")]
    NotFound {
        target: String,
        interfaces: String,
        waited: Duration,
    },
    #[error("{target} did not answer IDENTIFY DEVICE: {source}")]
    Identify { target: String, source: Error },
    #[error("{target}: {reason}")]
    Protocol { target: String, reason: String },
    #[error("cannot start the AoE receiver threads: {0}")]
    Thread(io::Error),
}

/// One way to the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AoePath {
    /// The local interface.
    pub interface: Interface,
    /// The target's MAC on that interface's segment.
    pub target_mac: MacAddr,
}

/// An AoE target as a block device. Any number of threads may call it at once; their
/// frames share one window of the target's buffer count, spread round-robin over every
/// path (local interface × target MAC) that reaches the target.
pub struct AoeClient {
    uri: AoeUri,
    engine: Arc<Engine>,
    receivers: Vec<JoinHandle<()>>,
    paths: Vec<AoePath>,
    found: Found,
    identity: Identity,
    buffer_count: u16,
    sectors_per_frame: u8,
    window: usize,
    flush_ext: bool,
    info: DeviceInfo,
    /// The target and its paths, for messages.
    description: String,
}

impl std::fmt::Debug for AoeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AoeClient")
            .field("target", &self.description)
            .field("identity", &self.identity)
            .field("window", &self.window)
            .field("sectors_per_frame", &self.sectors_per_frame)
            .finish()
    }
}

/// IDENTIFY DEVICE word `n`.
fn identify_word(block: &[u8], n: usize) -> u16 {
    u16::from_le_bytes([block[2 * n], block[2 * n + 1]])
}

/// Whether FLUSH CACHE EXT is supported (word 83 bit 13, valid when bit 14 is set
/// and bit 15 clear).
fn supports_flush_ext(block: &[u8]) -> bool {
    let word = identify_word(block, 83);
    word & 0xc000 == 0x4000 && word & 0x2000 != 0
}

/// Largest power of two not above `n` (at least 1).
fn power_of_two_floor(n: u32) -> u32 {
    1 << (31 - n.max(1).leading_zeros())
}

impl AoeClient {
    /// Finds the target the URI names on each of its interfaces, asks it who it is
    /// (IDENTIFY DEVICE) and starts one receiver thread per interface.
    ///
    /// Needs CAP_NET_RAW (raw Ethernet sockets). Interfaces on which the target does
    /// not answer are left out, with a warning; it must answer on at least one.
    pub fn open(uri: &AoeUri, options: AoeOptions) -> std::result::Result<AoeClient, OpenError> {
        let target = uri.target_name();
        let mut sockets = Vec::new();
        for name in &uri.interfaces {
            let interface = Interface::lookup(name).map_err(|source| OpenError::Interface {
                name: name.clone(),
                source,
            })?;
            // Room for a full window of jumbo frames both ways.
            let buffer = (DEFAULT_MAX_WINDOW * (interface.mtu + 64) * 2).max(1 << 20);
            let socket = match uri.xdp {
                Some(hook) => RawSocket::open_with_xdp(&interface, buffer, hook),
                None => RawSocket::open_with_ring(&interface, buffer),
            };
            let socket = socket.map_err(|source| {
                let hint = match source.kind() {
                    io::ErrorKind::PermissionDenied => {
                        " (raw Ethernet sockets need root or CAP_NET_RAW)"
                    }
                    _ => "",
                };
                OpenError::Socket {
                    name: name.clone(),
                    source,
                    hint,
                }
            })?;
            sockets.push(socket);
        }

        let answers = discovery::query(&sockets, uri.shelf, uri.slot, options.discovery_wait, true)
            .map_err(|source| OpenError::Socket {
                name: uri.interfaces.join(","),
                source,
                hint: "",
            })?;
        if answers.is_empty() {
            return Err(OpenError::NotFound {
                target,
                interfaces: uri.interfaces.join(", "),
                waited: options.discovery_wait,
            });
        }
        for (index, socket) in sockets.iter().enumerate() {
            if !answers.iter().any(|(i, _)| *i == index) {
                tracing::warn!(
                    "{target} did not answer on {}; not using that interface",
                    socket.interface().name
                );
            }
        }

        // Keep only the sockets with answers, renumbered.
        let mut used: Vec<usize> = answers.iter().map(|(i, _)| *i).collect();
        used.sort_unstable();
        used.dedup();
        let mut path_addrs = Vec::new();
        let mut paths = Vec::new();
        for (index, found) in &answers {
            let socket = used.iter().position(|u| u == index).expect("used socket");
            path_addrs.push(PathAddr {
                socket,
                local: found.interface.mac,
                target: found.target_mac,
            });
            paths.push(AoePath {
                interface: found.interface.clone(),
                target_mac: found.target_mac,
            });
        }
        let sockets: Vec<RawSocket> = sockets
            .into_iter()
            .enumerate()
            .filter(|(i, _)| used.contains(i))
            .map(|(_, socket)| socket)
            .collect();

        let buffer_count = answers
            .iter()
            .map(|(_, f)| f.buffer_count)
            .min()
            .unwrap_or(1);
        let target_sectors = answers
            .iter()
            .map(|(_, f)| f.sector_count)
            .min()
            .unwrap_or(0);
        let local_sectors = sockets
            .iter()
            .map(|s| sectors_per_frame(s.interface().mtu))
            .min()
            .unwrap_or(1);
        if local_sectors == 0 {
            return Err(OpenError::Protocol {
                target,
                reason:
                    "an interface's MTU is too small for one sector per frame (at least 548 bytes)"
                        .into(),
            });
        }
        let per_frame = if target_sectors == 0 {
            local_sectors
        } else {
            target_sectors.min(local_sectors)
        }
        .max(1);
        let window = match options.window {
            Some(window) => usize::from(window).clamp(1, MAX_WINDOW),
            None => usize::from(buffer_count).clamp(1, DEFAULT_MAX_WINDOW),
        };
        let initial_rtt = answers.iter().map(|(_, f)| f.answered_in).min();
        let found = answers[0].1.clone();
        let description = format!(
            "{target} ({})",
            paths
                .iter()
                .map(|p| format!("{} via {}", format_mac(&p.target_mac), p.interface.name))
                .collect::<Vec<_>>()
                .join(", ")
        );

        let session = Session::new(SessionConfig {
            shelf: uri.shelf,
            slot: uri.slot,
            paths: path_addrs,
            window,
            sectors_per_frame: per_frame,
            lba48: false,
            flush_ext: false,
            timeout: options.timeout,
            initial_rtt,
            tag_seed: discovery::random_tag(),
        });
        let batch = window.clamp(8, 64);
        let (engine, receivers) =
            Engine::start(session, sockets, batch).map_err(OpenError::Thread)?;
        let mut client = AoeClient {
            uri: uri.clone(),
            engine,
            receivers,
            paths,
            found,
            identity: Identity {
                sectors: 0,
                lba48: false,
                model: String::new(),
                serial: String::new(),
                firmware: String::new(),
            },
            buffer_count,
            sectors_per_frame: per_frame,
            window,
            flush_ext: false,
            info: DeviceInfo::new(0),
            description,
        };
        // On failure from here, dropping `client` stops the receivers.
        client.identify()?;
        tracing::debug!(
            "opened {}: {} sectors, lba48 {}, window {}, {} sectors per frame",
            client.description,
            client.identity.sectors,
            client.identity.lba48,
            client.window,
            client.sectors_per_frame
        );
        Ok(client)
    }

    fn identify(&mut self) -> std::result::Result<(), OpenError> {
        let target = self.uri.target_name();
        let mut block = vec![0u8; SECTOR_SIZE];
        self.engine
            .execute(Plan::identify(), block.as_mut_ptr(), block.len())
            .map_err(|fault| OpenError::Identify {
                target: target.clone(),
                source: device_error(&fault, Op::Open, 0, 0, &self.description),
            })?;
        let protocol = |reason: &str| OpenError::Protocol {
            target: target.clone(),
            reason: reason.to_string(),
        };
        if !Identity::checksum_ok(&block) {
            return Err(protocol("the IDENTIFY DEVICE block fails its checksum"));
        }
        let mut identity = Identity::parse(&block).expect("a whole sector");
        if identity.sectors == 0 {
            return Err(protocol("the target reports a capacity of 0 sectors"));
        }
        // A target that answers again after an outage (a restart), or is found at
        // another MAC, must still be this device.
        self.engine.set_identity(identity.clone());
        let limit = if identity.lba48 {
            LBA48_LIMIT
        } else {
            LBA28_LIMIT
        };
        identity.sectors = identity.sectors.min(limit);
        self.flush_ext = identity.lba48 && supports_flush_ext(&block);
        self.engine.set_addressing(identity.lba48, self.flush_ext);
        let frame_bytes = u32::from(self.sectors_per_frame) * SECTOR_SIZE as u32;
        self.info = DeviceInfo {
            size: identity.sectors * SECTOR_SIZE as u64,
            block_sizes: BlockSizes {
                minimum: SECTOR_SIZE as u32,
                // Block sizes are powers of two (NBD and SCSI need them so); a frame
                // of 17 sectors (MTU 9000) gives 8 KiB.
                preferred: power_of_two_floor(frame_bytes).max(SECTOR_SIZE as u32),
                maximum: MAX_TRANSFER,
            },
            limits: Limits::default(),
            read_only: false,
            capabilities: Capabilities {
                flush: Support::Native,
                ..Capabilities::default()
            },
            rotational: false,
            completes_inline: false,
            consistent_across_handles: true,
            queue_wakes: false,
        };
        self.identity = identity;
        Ok(())
    }

    pub fn uri(&self) -> &AoeUri {
        &self.uri
    }

    /// The ways to the target in use: local interface and target MAC.
    pub fn paths(&self) -> &[AoePath] {
        &self.paths
    }

    pub fn shelf(&self) -> u16 {
        self.uri.shelf
    }

    pub fn slot(&self) -> u8 {
        self.uri.slot
    }

    /// `eSHELF.SLOT`.
    pub fn target_name(&self) -> String {
        self.uri.target_name()
    }

    /// What IDENTIFY DEVICE said: capacity, 48-bit support, model, serial, firmware.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The target's buffer count (the least any path advertised).
    pub fn buffer_count(&self) -> u16 {
        self.buffer_count
    }

    /// Frames outstanding at most.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Sectors per ATA frame in use.
    pub fn sectors_per_frame(&self) -> u8 {
        self.sectors_per_frame
    }

    /// Sectors per frame the target advertised.
    pub fn target_sectors_per_frame(&self) -> u8 {
        self.found.sector_count
    }

    /// The target's firmware version from the config answer.
    pub fn firmware_version(&self) -> u16 {
        self.found.firmware_version
    }

    /// The AoE version the target speaks.
    pub fn aoe_version(&self) -> u8 {
        self.found.aoe_version
    }

    /// The target's config string, as text.
    pub fn config_string(&self) -> String {
        self.found.config_text()
    }

    /// Whether flushes use FLUSH CACHE EXT (else FLUSH CACHE).
    pub fn flush_ext(&self) -> bool {
        self.flush_ext
    }

    /// Frames sent, retransmitted, answered and ignored so far.
    pub fn stats(&self) -> Stats {
        self.engine.stats()
    }

    /// The smoothed round-trip time (if measured) and the retransmission timeout.
    pub fn timing(&self) -> (Option<Duration>, Duration) {
        self.engine.timing()
    }

    /// The target and its paths, for messages.
    pub(crate) fn description(&self) -> &str {
        &self.description
    }

    /// The engine that runs requests.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The request's sectors after the checks every call makes.
    pub(crate) fn check(&self, op: Op, offset: u64, len: usize) -> Result<(u64, u64)> {
        let len64 = len as u64;
        let sector = SECTOR_SIZE as u64;
        if !offset.is_multiple_of(sector) || !len64.is_multiple_of(sector) {
            return Err(Error::new(ErrorKind::Misaligned, op, offset, len64)
                .with_detail("AoE moves 512-byte sectors"));
        }
        if len > MAX_TRANSFER as usize {
            return Err(Error::new(ErrorKind::TooLarge, op, offset, len64)
                .with_detail(format!("at most {MAX_TRANSFER} bytes per request")));
        }
        match offset.checked_add(len64) {
            Some(end) if end <= self.info.size => {}
            _ => {
                return Err(Error::new(ErrorKind::OutOfRange, op, offset, len64)
                    .with_detail(format!("device size is {}", self.info.size)))
            }
        }
        Ok((offset / sector, len64 / sector))
    }

    fn run(&self, plan: Plan, buffer: *mut u8, len: usize, op: Op, offset: u64) -> Result<()> {
        self.engine
            .execute(plan, buffer, len)
            .map_err(|fault| device_error(&fault, op, offset, len as u64, &self.description))
    }
}

impl BlockDevice for AoeClient {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let (lba, sectors) = self.check(Op::Read, offset, buf.len())?;
        if sectors == 0 {
            return Ok(());
        }
        let len = buf.len();
        self.run(
            Plan::read(lba, sectors),
            buf.as_mut_ptr(),
            len,
            Op::Read,
            offset,
        )
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let (lba, sectors) = self.check(Op::Write, offset, buf.len())?;
        if sectors > 0 {
            // The engine only reads a write's buffer.
            let ptr = buf.as_ptr().cast_mut();
            self.run(Plan::write(lba, sectors), ptr, buf.len(), Op::Write, offset)?;
        }
        if flags.fua {
            // ATA has no FUA write in AoE's command set: write, then flush.
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.run(Plan::flush(), std::ptr::null_mut(), 0, Op::Flush, 0)
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// The request queue is this client's one fast path.
impl FastPath for AoeClient {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(AoeQueue::new(self)))
    }
}

impl Drop for AoeClient {
    fn drop(&mut self) {
        // What a user tuning a link wants to see with -v: were frames lost?
        tracing::debug!("AoE {} closing: {:?}", self.uri, self.stats());
        self.engine.stop(std::mem::take(&mut self.receivers));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_ext_needs_a_valid_word_83() {
        let mut block = vec![0u8; SECTOR_SIZE];
        block[166..168].copy_from_slice(&0x7400u16.to_le_bytes());
        assert!(supports_flush_ext(&block));
        // vblade: FLUSH CACHE and 48-bit, no FLUSH CACHE EXT.
        block[166..168].copy_from_slice(&0x5400u16.to_le_bytes());
        assert!(!supports_flush_ext(&block));
        // Word not valid.
        block[166..168].copy_from_slice(&0xffffu16.to_le_bytes());
        assert!(!supports_flush_ext(&block));
        // Our own IDENTIFY block.
        let ours = Identity {
            sectors: 1 << 20,
            lba48: true,
            model: "m".into(),
            serial: "s".into(),
            firmware: "f".into(),
        }
        .encode();
        assert!(supports_flush_ext(&ours));
    }

    #[test]
    fn preferred_sizes_are_powers_of_two() {
        assert_eq!(power_of_two_floor(1024), 1024);
        assert_eq!(power_of_two_floor(17 * 512), 8192);
        assert_eq!(power_of_two_floor(255 * 512), 65536);
        assert_eq!(power_of_two_floor(512), 512);
        assert_eq!(power_of_two_floor(0), 1);
    }

    #[test]
    fn default_options() {
        let options = AoeOptions::default();
        assert_eq!(options.timeout, Duration::from_secs(10));
        assert_eq!(options.discovery_wait, Duration::from_secs(1));
        assert_eq!(options.window, None);
    }
}
