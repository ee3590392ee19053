//! The NVMe/TCP target: listeners, one thread per connection (one queue each),
//! a watchdog for keep-alive, reload, and an orderly shutdown.
//!
//! [`NvmeTarget::bind`] opens the I/O and discovery listeners (so the caller can
//! print real addresses, port 0 included); [`NvmeTarget::run`] serves until a
//! [`ShutdownHandle`] fires, then stops accepting and closes every connection
//! (hosts reconnect to the next target within their controller-loss timeout).
//! The transport only moves capsules and data; commands are the controller's
//! ([`crate::controller`]), device work goes through the request engine.

mod connection;
mod io;
mod reload;
mod writer;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::SessionMeter;
use blockwire_engine::WorkerPool;

use crate::controller::{Controller, Core, Settings, Subsystem};

pub use reload::ReloadHandle;

/// The NVMe/TCP port (IANA) for I/O queues.
pub const DEFAULT_PORT: u16 = 4420;
/// The discovery service's port.
pub const DEFAULT_DISCOVERY_PORT: u16 = 8009;

/// Where and how the target listens.
pub struct NvmeConfig {
    /// I/O listeners (they also accept discovery connections, as nvmet's ports).
    pub listen: Vec<SocketAddr>,
    /// Discovery-only listeners (port 8009 by convention); may be empty.
    pub discovery_listen: Vec<SocketAddr>,
    /// What the controllers report and accept.
    pub settings: Settings,
    /// MAXH2CDATA offered in ICResp: the most data one H2CData PDU carries.
    pub maxh2cdata: u32,
    /// The address discovery reports for the I/O listeners, instead of their own:
    /// for hosts behind NAT (a VM on user-mode networking reaches the host's
    /// 127.0.0.1 as 10.0.2.2). None: the listeners' addresses, a wildcard one as
    /// the address the host reached.
    pub advertised: Option<std::net::IpAddr>,
    /// A connection must have sent ICReq and connected its queue (Connect) within
    /// this time, or it is closed: idle sockets cannot hold threads.
    pub connect_timeout: Duration,
    /// A send blocked this long (a host that stopped reading) ends the connection.
    pub send_timeout: Duration,
    /// Threads that run device work that would block.
    pub workers: usize,
    /// Open connections at most; more are closed at once.
    pub max_connections: usize,
    /// How long a reload leaves the controllers of a removed subsystem before it
    /// closes them (they get the namespace-changed event first).
    pub removal_grace: Duration,
    /// Told of each I/O queue connected to a subsystem (by export name) and each
    /// connection a limit refused.
    pub sessions: Option<Arc<dyn SessionMeter>>,
}

impl NvmeConfig {
    /// A configuration with defaults for everything but the I/O listeners.
    pub fn new(listen: Vec<SocketAddr>) -> NvmeConfig {
        NvmeConfig {
            listen,
            discovery_listen: Vec::new(),
            settings: Settings::default(),
            maxh2cdata: 1 << 20,
            advertised: None,
            connect_timeout: Duration::from_secs(15),
            send_timeout: Duration::from_secs(60),
            workers: 16,
            max_connections: 1024,
            removal_grace: Duration::from_secs(2),
            sessions: None,
        }
    }
}

/// Counts an I/O queue as an open session of an export until dropped.
pub(crate) struct SessionGuard {
    meter: Arc<dyn SessionMeter>,
    export: String,
}

impl SessionGuard {
    fn open(meter: Arc<dyn SessionMeter>, export: String) -> SessionGuard {
        meter.opened(&export);
        SessionGuard { meter, export }
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.meter.closed(&self.export);
    }
}

/// One open connection, as the watchdog and the shutdown see it.
struct Tracked {
    stream: TcpStream,
    controller: Option<Arc<Controller>>,
}

/// State shared by acceptors, connections, the watchdog and the handles.
pub(crate) struct Shared {
    config: NvmeConfig,
    core: Arc<Core>,
    pool: WorkerPool,
    stopping: AtomicBool,
    stop: Mutex<bool>,
    stopped: Condvar,
    next_id: AtomicU64,
    connections: Mutex<HashMap<u64, Tracked>>,
    connections_changed: Condvar,
}

impl Shared {
    fn lock_connections(&self) -> MutexGuard<'_, HashMap<u64, Tracked>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The largest PDU a host may send: a capsule with in-capsule data, or an
    /// H2CData of MAXH2CDATA, with headers, digests and alignment.
    fn max_pdu_len(&self) -> u32 {
        self.config
            .maxh2cdata
            .max(self.core.settings.inline_data_size)
            + 256
    }

    fn track_controller(&self, id: u64, controller: Arc<Controller>) {
        if let Some(tracked) = self.lock_connections().get_mut(&id) {
            tracked.controller = Some(controller);
        }
    }

    /// Closes every connection whose controller is dead or whose keep-alive ran
    /// out.
    fn close_expired(&self, now: Instant) {
        for tracked in self.lock_connections().values() {
            if let Some(controller) = &tracked.controller {
                if controller.keep_alive_expired(now) {
                    tracing::info!(
                        cntlid = controller.cntlid,
                        "NVMe controller ended (keep-alive timeout, disconnect or removal)"
                    );
                    let _ = tracked.stream.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }
}

/// Asks a running target to stop. Cheap to clone; safe from a signal thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Open connections now (queues, connected or not).
    pub fn open_connections(&self) -> usize {
        self.0.lock_connections().len()
    }

    pub fn shutdown(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        *self.0.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.stopped.notify_all();
    }
}

/// An NVMe/TCP target server.
pub struct NvmeTarget {
    listeners: Vec<(TcpListener, bool)>,
    shared: Arc<Shared>,
    local_addrs: Vec<SocketAddr>,
    discovery_addrs: Vec<SocketAddr>,
}

/// A discovery address another program holds, most likely another target's
/// discovery controller on the conventional port 8009 (its io::Error's kind is
/// `AddrInUse`; callers that know their flags add how to choose another).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryInUse {
    pub addr: SocketAddr,
}

impl std::fmt::Display for DiscoveryInUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot listen for NVMe/TCP discovery on {}: the address is in use (by another target's discovery controller?)",
            self.addr
        )
    }
}

impl std::error::Error for DiscoveryInUse {}

/// Binds the discovery listeners; an address in use is a [`DiscoveryInUse`].
fn bind_discovery(addrs: &[SocketAddr]) -> std::io::Result<Vec<TcpListener>> {
    addrs
        .iter()
        .map(|&addr| {
            TcpListener::bind(addr).map_err(|e| match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    std::io::Error::new(e.kind(), DiscoveryInUse { addr })
                }
                _ => std::io::Error::new(
                    e.kind(),
                    format!("cannot listen for NVMe/TCP discovery on {addr}: {e}"),
                ),
            })
        })
        .collect()
}

fn bind_all(addrs: &[SocketAddr]) -> std::io::Result<Vec<TcpListener>> {
    addrs
        .iter()
        .map(|addr| {
            TcpListener::bind(addr)
                .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
        })
        .collect()
}

impl NvmeTarget {
    /// Opens every listener.
    pub fn bind(
        config: NvmeConfig,
        subsystems: Vec<Arc<Subsystem>>,
    ) -> std::io::Result<NvmeTarget> {
        if config.listen.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no NVMe/TCP address to listen on",
            ));
        }
        if config.maxh2cdata < crate::pdu::MIN_MAXH2CDATA {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "MAXH2CDATA {} is below the minimum of {}",
                    config.maxh2cdata,
                    crate::pdu::MIN_MAXH2CDATA
                ),
            ));
        }
        let io_listeners = bind_all(&config.listen)?;
        let discovery_listeners = bind_discovery(&config.discovery_listen)?;
        let local_addrs: Vec<SocketAddr> = io_listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let discovery_addrs: Vec<SocketAddr> = discovery_listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let core = Arc::new(Core::new(config.settings.clone(), subsystems));
        // Port 0 becomes the port the kernel gave, for the discovery log.
        core.set_ports(local_addrs.clone());
        core.set_advertised(config.advertised);
        let pool = WorkerPool::new("nvme-worker", config.workers.max(1));
        let listeners = io_listeners
            .into_iter()
            .map(|l| (l, false))
            .chain(discovery_listeners.into_iter().map(|l| (l, true)))
            .collect();
        Ok(NvmeTarget {
            listeners,
            local_addrs,
            discovery_addrs,
            shared: Arc::new(Shared {
                config,
                core,
                pool,
                stopping: AtomicBool::new(false),
                stop: Mutex::new(false),
                stopped: Condvar::new(),
                next_id: AtomicU64::new(0),
                connections: Mutex::new(HashMap::new()),
                connections_changed: Condvar::new(),
            }),
        })
    }

    /// The I/O addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.local_addrs.clone()
    }

    /// The discovery-only addresses actually bound.
    pub fn discovery_addrs(&self) -> Vec<SocketAddr> {
        self.discovery_addrs.clone()
    }

    /// The subsystems' NQNs, in configuration order.
    pub fn subsystem_nqns(&self) -> Vec<String> {
        self.shared
            .core
            .subsystems()
            .iter()
            .map(|s| s.nqn.clone())
            .collect()
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// A handle that adds and removes subsystems while the target runs.
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle::new(self.shared.clone())
    }

    /// Serves until shut down; then closes every connection and waits for their
    /// threads.
    pub fn run(self) -> std::io::Result<()> {
        let listeners: Vec<(Arc<TcpListener>, bool)> = self
            .listeners
            .into_iter()
            .map(|(l, discovery)| (Arc::new(l), discovery))
            .collect();
        let acceptors: Vec<_> = listeners
            .iter()
            .map(|(listener, discovery)| {
                let listener = listener.clone();
                let shared = self.shared.clone();
                let discovery = *discovery;
                thread::Builder::new()
                    .name("nvme-accept".into())
                    .spawn(move || accept_loop(&listener, &shared, discovery))
            })
            .collect::<std::io::Result<_>>()?;
        let shared = &self.shared;
        let mut stop = shared.stop.lock().unwrap_or_else(|e| e.into_inner());
        while !*stop {
            // The watchdog: keep-alive is checked every quarter second.
            stop = shared
                .stopped
                .wait_timeout(stop, Duration::from_millis(250))
                .unwrap_or_else(|e| e.into_inner())
                .0;
            shared.close_expired(Instant::now());
        }
        drop(stop);
        tracing::info!("NVMe/TCP: shutting down");
        for (listener, _) in &listeners {
            // SAFETY: shutdown(2) on a listening socket we own wakes a blocked accept().
            unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for acceptor in acceptors {
            let _ = acceptor.join();
        }
        let mut connections = shared.lock_connections();
        for tracked in connections.values() {
            let _ = tracked.stream.shutdown(std::net::Shutdown::Both);
        }
        while !connections.is_empty() {
            connections = shared
                .connections_changed
                .wait_timeout(connections, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        tracing::info!("NVMe/TCP: stopped");
        Ok(())
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, discovery: bool) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("NVMe/TCP accept failed: {e}");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut connections = shared.lock_connections();
            if connections.len() >= shared.config.max_connections {
                tracing::warn!(%peer, "max_connections reached; closing an NVMe/TCP connection");
                if let Some(sessions) = &shared.config.sessions {
                    sessions.refused("max_connections");
                }
                continue;
            }
            match stream.try_clone() {
                Ok(clone) => connections.insert(
                    id,
                    Tracked {
                        stream: clone,
                        controller: None,
                    },
                ),
                Err(e) => {
                    tracing::warn!("cannot track an NVMe/TCP connection: {e}");
                    continue;
                }
            };
        }
        let for_thread = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("nvme-conn-{id}"))
            .spawn(move || {
                connection::serve(stream, id, for_thread.clone(), discovery);
                for_thread.lock_connections().remove(&id);
                for_thread.connections_changed.notify_all();
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start an NVMe/TCP connection thread: {e}");
            shared.lock_connections().remove(&id);
            shared.connections_changed.notify_all();
        }
    }
}
