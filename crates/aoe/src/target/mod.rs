//! The AoE target: serves one device as shelf.slot on one or more interfaces.
//!
//! One receive thread per interface takes frames in batches (from a receive ring, or
//! recvmmsg), answers management commands at once, and gathers ATA reads and writes
//! whose sectors follow each other into one larger device I/O (a "run"). Devices that
//! complete inline (page cache, memory) are read and written on the receive thread;
//! others (direct I/O) run on a worker pool, so many runs are in flight while the
//! thread keeps receiving, and their runs may grow across batches. The request
//! engine ([`blockwire_engine`]) makes that choice and bounds the workers. Responses
//! go out in batches (sendmmsg).

mod access;
mod ata;
mod harness;
mod receiver;
mod spin;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use blockwire_blockdev::{Device, ReadModifyWrite};
use blockwire_engine::{Engine, EngineConfig, Policy, Request, Route, WorkerPool};

pub use access::{AccessState, Admission, ConfigAnswer};
pub use ata::{ata_error, classify, response_args, AtaAction, AtaLimits};
pub use harness::TargetHarness;

use crate::identify::Identity;
use crate::rawsock::{Interface, RawSocket, XdpHook};
use crate::wire::{sectors_per_frame, BROADCAST_SHELF, BROADCAST_SLOT, SECTOR_SIZE};

/// Frames a target says it can queue, by default (the initiator's window).
pub const DEFAULT_BUFFER_COUNT: u16 = 256;
/// The firmware version a blockwire target reports.
pub const FIRMWARE_VERSION: u16 = 0x0100;

/// How to serve a device over AoE.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Major address (0..=0xfffe).
    pub shelf: u16,
    /// Minor address (0..=0xfe).
    pub slot: u8,
    /// Interfaces to answer on.
    pub interfaces: Vec<String>,
    /// Frames the target advertises it can queue.
    pub buffer_count: u16,
    /// Threads for device I/O that may block (direct I/O, flush).
    pub workers: usize,
    /// The initial config string.
    pub config_string: Vec<u8>,
    /// Send and receive through the AF_XDP path, its program at this hook
    /// ([`crate::rawsock::xdp`]); None: packet sockets alone.
    pub xdp: Option<XdpHook>,
}

impl TargetConfig {
    /// A configuration with the defaults for everything but the address.
    pub fn new(shelf: u16, slot: u8, interfaces: Vec<String>) -> TargetConfig {
        TargetConfig {
            shelf,
            slot,
            interfaces,
            buffer_count: DEFAULT_BUFFER_COUNT,
            workers: 16,
            config_string: Vec::new(),
            xdp: None,
        }
    }
}

/// What every receive thread and worker shares.
struct Shared {
    device: Device,
    access: AccessState,
    shelf: u16,
    slot: u8,
    buffer_count: u16,
    identity: [u8; SECTOR_SIZE],
    sectors: u64,
    read_only: bool,
    /// Where device I/O runs: the receive thread when the device completes inline,
    /// else the workers, with at most the window's worth of requests there.
    engine: Engine,
    stop: AtomicBool,
}

impl Shared {
    /// Whether a run (a read, or a write of `len` bytes) runs on the receive
    /// thread: the engine's route for this device, decided by the device alone
    /// because a run gathered for a worker must own its data from its first frame.
    fn runs_inline(&self, write: bool, len: usize) -> bool {
        let request = if write {
            Request::write(len)
        } else {
            Request::read(len)
        };
        self.engine.route(request, || false) == Route::Inline
    }

    /// Checks the device and address; wraps a device with blocks larger than a
    /// sector (direct I/O) in read-modify-write.
    fn new(device: Device, config: &TargetConfig) -> io::Result<Shared> {
        if config.shelf == BROADCAST_SHELF || config.slot == BROADCAST_SLOT {
            return Err(invalid(format!(
                "e{}.{} is a broadcast address: shelf must be below 65535 and slot below 255",
                config.shelf, config.slot
            )));
        }
        let device = if device.info().block_sizes.minimum as usize > SECTOR_SIZE {
            Device::from_device(ReadModifyWrite::new(device, SECTOR_SIZE as u32))
        } else {
            device
        };
        let info = *device.info();
        let sectors = info.size / SECTOR_SIZE as u64;
        if sectors == 0 {
            return Err(invalid("the device is smaller than one sector".into()));
        }
        if !info.size.is_multiple_of(SECTOR_SIZE as u64) {
            tracing::warn!(
                "device size {} is not a multiple of 512: the last {} bytes are not served",
                info.size,
                info.size % SECTOR_SIZE as u64
            );
        }
        let identity = Identity {
            sectors,
            lba48: true,
            model: "blockwire AoE target".into(),
            serial: format!("e{}.{}", config.shelf, config.slot),
            firmware: env!("CARGO_PKG_VERSION").into(),
        };
        Ok(Shared {
            access: AccessState::with_config(&config.config_string),
            shelf: config.shelf,
            slot: config.slot,
            buffer_count: config.buffer_count.max(1),
            identity: identity.encode(),
            sectors,
            read_only: info.read_only,
            engine: Engine::new(EngineConfig {
                max_in_flight: usize::from(config.buffer_count.max(1)),
                policy: Policy::ByDevice {
                    completes_inline: info.completes_inline,
                },
            }),
            stop: AtomicBool::new(false),
            device,
        })
    }
}

/// Where a target's responses go: a raw socket, or a collector in tests.
pub trait FrameSink: Send + Sync {
    /// Sends whole Ethernet frames.
    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<()>;

    /// Sends frames each made of a head and a body (read data, sent from where it
    /// is), padded to the Ethernet minimum. By default each is joined and sent whole.
    fn send_gathered(&self, frames: &[(&[u8], &[u8])]) -> io::Result<()> {
        let joined: Vec<Vec<u8>> = frames
            .iter()
            .map(|(head, body)| {
                let mut frame = [*head, *body].concat();
                crate::wire::pad_to_minimum(&mut frame);
                frame
            })
            .collect();
        self.send_batch(&joined.iter().map(Vec::as_slice).collect::<Vec<_>>())
    }
}

impl FrameSink for RawSocket {
    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<()> {
        RawSocket::send_batch(self, frames)
    }

    fn send_gathered(&self, frames: &[(&[u8], &[u8])]) -> io::Result<()> {
        RawSocket::send_gathered(self, frames.iter().copied())
    }
}

/// One interface a target answers on.
struct Port {
    sink: Arc<dyn FrameSink>,
    interface: Interface,
    /// Sectors per ATA frame on this interface.
    max_sectors: u8,
}

impl Port {
    fn new(interface: Interface, sink: Arc<dyn FrameSink>) -> io::Result<Port> {
        let max_sectors = sectors_per_frame(interface.mtu);
        if max_sectors == 0 {
            return Err(invalid(format!(
                "{}: MTU {} cannot carry one 512-byte sector",
                interface.name, interface.mtu
            )));
        }
        Ok(Port {
            sink,
            interface,
            max_sectors,
        })
    }
}

/// A running AoE target. Stops (and flushes the device) on [`AoeTarget::stop`] or drop.
pub struct AoeTarget {
    shared: Arc<Shared>,
    ports: Vec<Arc<Port>>,
    receivers: Vec<JoinHandle<()>>,
    pool: Option<Arc<WorkerPool>>,
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

impl AoeTarget {
    /// Opens the interfaces and starts answering. A device whose minimum block is
    /// larger than a sector (direct I/O) is served through read-modify-write.
    pub fn start(device: Device, config: TargetConfig) -> io::Result<AoeTarget> {
        if config.interfaces.is_empty() {
            return Err(invalid("AoE needs at least one interface".into()));
        }
        let shared = Arc::new(Shared::new(device, &config)?);
        let mut ports = Vec::new();
        let mut sockets = Vec::new();
        for name in &config.interfaces {
            let interface = Interface::lookup(name)?;
            // Room for every frame the initiators may send at once, several times over.
            let frame = interface.mtu + 64;
            let buffer = (usize::from(config.buffer_count) * frame * 4).max(16 << 20);
            let socket = Arc::new(match config.xdp {
                Some(hook) => RawSocket::open_with_xdp(&interface, buffer, hook)?,
                None => RawSocket::open_with_ring(&interface, buffer)?,
            });
            ports.push(Arc::new(Port::new(interface, socket.clone())?));
            sockets.push(socket);
        }
        let pool = Arc::new(WorkerPool::new("aoe-worker", config.workers));
        let receivers = ports
            .iter()
            .zip(sockets)
            .map(|(port, socket)| {
                let (shared, port, pool) = (shared.clone(), port.clone(), pool.clone());
                thread::Builder::new()
                    .name(format!("aoe-{}", port.interface.name))
                    .spawn(move || receiver::run(&shared, &port, &socket, &pool))
            })
            .collect::<io::Result<Vec<_>>>()?;
        for port in &ports {
            let interface = &port.interface;
            tracing::info!(
                "AoE e{}.{} on {} (MTU {}, {} sectors per frame{})",
                config.shelf,
                config.slot,
                interface.name,
                interface.mtu,
                port.max_sectors,
                match config.xdp {
                    Some(hook) => format!(", AF_XDP at the {hook} hook"),
                    None => String::new(),
                }
            );
        }
        Ok(AoeTarget {
            shared,
            ports,
            receivers,
            pool: Some(pool),
        })
    }

    /// The interfaces the target answers on.
    pub fn interfaces(&self) -> Vec<Interface> {
        self.ports.iter().map(|p| p.interface.clone()).collect()
    }

    /// The management state (config string, mask and reserve lists).
    pub fn access(&self) -> &AccessState {
        &self.shared.access
    }

    /// Stops answering, waits for device I/O in flight, and flushes the device.
    pub fn stop(mut self) -> blockwire_blockdev::Result<()> {
        self.shut_down()
    }

    fn shut_down(&mut self) -> blockwire_blockdev::Result<()> {
        self.shared.stop.store(true, Ordering::SeqCst);
        for receiver in self.receivers.drain(..) {
            let _ = receiver.join();
        }
        self.shared.engine.wait_idle();
        // The last reference: joins the (idle) workers.
        self.pool.take();
        if self.shared.read_only || !self.shared.device.info().capabilities.flush.available() {
            Ok(())
        } else {
            self.shared.device.flush()
        }
    }
}

impl Drop for AoeTarget {
    fn drop(&mut self) {
        if !self.receivers.is_empty() || self.pool.is_some() {
            if let Err(e) = self.shut_down() {
                tracing::error!("AoE target: final flush failed: {e}");
            }
        }
    }
}
