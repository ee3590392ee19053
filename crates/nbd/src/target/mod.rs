//! The NBD target: listeners, connections and an orderly shutdown.
//!
//! [`NbdTarget::bind`] opens the listeners (so the caller can print real addresses,
//! port 0 included); [`NbdTarget::run`] serves until a [`ShutdownHandle`] fires, then
//! stops accepting, lets every connection finish the requests it has read, flushes
//! every export and returns.

mod connection;
mod export;
mod large;
mod negotiation;
mod queued;
mod reload;
mod session;
mod stream;
mod writer;

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::admission::{Admission, AdmissionLimits, Cap, Verdict};
use blockwire_blockdev::{OpenSession, SessionMeter};

pub use blockwire_blockdev::workers::WorkerPool;
pub use connection::{negotiate, negotiate_secure, transmit, Ending, Negotiated, RequestSource};
pub use export::{Export, ExportSet};
pub use negotiation::{transmission_flags, HandshakeError, Negotiation, Step, BASE_ALLOCATION_ID};
pub use reload::ReloadHandle;
pub use session::{
    Action, FileSlice, Job, Reply, ReplyData, Session, DEFAULT_UNNEGOTIATED_PAYLOAD_LIMIT,
};
pub use stream::Stream;
pub use writer::{ReplySink, ReplyWriter};

use crate::tls::{TargetTls, TlsStream};

/// Socket send buffer for each connection. With room for a few 1 MiB replies the
/// connection thread can queue the next reply while the client still drains the last
/// one; the kernel's autotuned default starts at 16 KiB and measured ~25% slower for
/// 1 MiB sequential reads on loopback.
const SEND_BUFFER: usize = 4 << 20;

/// How long a shutdown waits for connections to finish their requests before it
/// closes them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Where and how a server listens.
#[derive(Debug, Clone)]
pub struct NbdConfig {
    pub tcp: Vec<SocketAddr>,
    pub unix: Vec<PathBuf>,
    /// Threads for requests that may block (flush, FUA, cache misses).
    pub workers: usize,
    /// Open connections at most. At the cap, a new connection closes the oldest
    /// unfinished handshake of the address holding the most; with none, it is
    /// closed at once.
    pub max_connections: usize,
    /// Connections from one address still in the handshake, at most: one address
    /// that opens many and never finishes them must not lock anybody out, itself
    /// included, so a new one closes that address's oldest unfinished handshake.
    pub max_handshakes_per_address: usize,
    /// Connections from one address at most, so one client cannot take every
    /// connection the server allows. At the cap a new one closes that address's
    /// oldest unfinished handshake; with none, it is closed at once.
    pub max_connections_per_address: usize,
    /// A client must finish the handshake within this time.
    pub handshake_timeout: Duration,
    /// A client that reads no reply for this long (its socket takes no more) is cut
    /// off: the replies waiting for it stop holding the server's threads.
    pub send_timeout: Duration,
    /// The largest read or write served to a client that never learned our block
    /// sizes (NBD_OPT_EXPORT_NAME, or NBD_OPT_GO without NBD_INFO_BLOCK_SIZE),
    /// streamed through bounded buffers; clients that learned them keep the
    /// advertised maximum.
    pub unnegotiated_payload_limit: u32,
    /// Told of each connection in transmission and each one a limit refused.
    pub sessions: Option<Arc<dyn SessionMeter>>,
    /// TLS credentials and policy; `None` serves plain text only.
    pub tls: Option<Arc<TargetTls>>,
}

impl Default for NbdConfig {
    fn default() -> Self {
        NbdConfig {
            tcp: Vec::new(),
            unix: Vec::new(),
            workers: 16,
            max_connections: 256,
            max_handshakes_per_address: 16,
            max_connections_per_address: 128,
            handshake_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(30),
            unnegotiated_payload_limit: DEFAULT_UNNEGOTIATED_PAYLOAD_LIMIT,
            sessions: None,
            tls: None,
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(listener) => {
                let (stream, _) = listener.accept()?;
                // Replies are written whole; never hold a small one back.
                stream.set_nodelay(true)?;
                let stream = Stream::Tcp(stream);
                stream.set_send_buffer(SEND_BUFFER);
                Ok(stream)
            }
            Listener::Unix(listener, _) => {
                let stream = Stream::Unix(listener.accept()?.0);
                stream.set_send_buffer(SEND_BUFFER);
                Ok(stream)
            }
        }
    }

    fn fd(&self) -> i32 {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, _) => l.as_raw_fd(),
        }
    }
}

#[derive(Default)]
struct Shared {
    /// The exports new connections negotiate against; a reload replaces the set.
    exports: RwLock<Arc<ExportSet>>,
    stopping: AtomicBool,
    stop: Mutex<bool>,
    stopped: Condvar,
    next_id: AtomicU64,
    /// Open connections: a clone of each socket, to shut them down, and the export
    /// each one is in transmission with.
    connections: Mutex<HashMap<u64, Tracked>>,
    connections_changed: Condvar,
    /// Open connections by address and handshake state, for the limits.
    admission: Admission,
}

/// One open connection, as the server tracks it.
struct Tracked {
    stream: Stream,
    /// Set once the connection entered transmission.
    export: Option<Arc<Export>>,
}

impl Shared {
    fn current_exports(&self) -> Arc<ExportSet> {
        self.exports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn lock_connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Tracked>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Asks a running server to stop. Cheap to clone; safe from a signal thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// How many client connections are open now, in the handshake or after it.
    pub fn open_connections(&self) -> usize {
        self.0
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    pub fn shutdown(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        *self.0.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.stopped.notify_all();
    }
}

/// An NBD server over a set of exports.
pub struct NbdTarget {
    config: NbdConfig,
    listeners: Vec<Listener>,
    shared: Arc<Shared>,
}

fn bind_unix(path: &Path) -> io::Result<UnixListener> {
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; refusing to replace it",
                    path.display()
                ),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is in use by another server", path.display()),
            ));
        }
        // A socket nobody listens on: left over from a server that died.
        std::fs::remove_file(path)?;
    }
    UnixListener::bind(path)
}

impl NbdTarget {
    /// Opens every listener in `config`.
    pub fn bind(exports: ExportSet, config: NbdConfig) -> io::Result<NbdTarget> {
        if exports.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no exports to serve",
            ));
        }
        let mut listeners = Vec::new();
        for addr in &config.tcp {
            let listener = TcpListener::bind(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
            listeners.push(Listener::Tcp(listener));
        }
        for path in &config.unix {
            let listener = bind_unix(path).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot listen on {}: {e}", path.display()),
                )
            })?;
            listeners.push(Listener::Unix(listener, path.clone()));
        }
        if listeners.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no address to listen on",
            ));
        }
        let shared = Shared {
            exports: RwLock::new(Arc::new(exports)),
            ..Shared::default()
        };
        Ok(NbdTarget {
            config,
            listeners,
            shared: Arc::new(shared),
        })
    }

    /// The TCP addresses actually bound (useful with port 0).
    pub fn tcp_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| match l {
                Listener::Tcp(l) => l.local_addr().ok(),
                Listener::Unix(..) => None,
            })
            .collect()
    }

    /// The exports served now.
    pub fn exports(&self) -> Arc<ExportSet> {
        self.shared.current_exports()
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// A handle that replaces the exports while the server runs.
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle::new(self.shared.clone(), SHUTDOWN_GRACE)
    }

    /// Serves until shut down; then drains connections, flushes exports and returns.
    pub fn run(self) -> io::Result<()> {
        let pool = Arc::new(WorkerPool::new("nbd-worker", self.config.workers));
        let listeners: Vec<Arc<Listener>> = self.listeners.into_iter().map(Arc::new).collect();
        let acceptors: Vec<_> = listeners
            .iter()
            .map(|listener| {
                let ctx = AcceptContext {
                    listener: listener.clone(),
                    pool: pool.clone(),
                    shared: self.shared.clone(),
                    config: self.config.clone(),
                };
                thread::Builder::new()
                    .name("nbd-accept".into())
                    .spawn(move || ctx.accept_loop())
            })
            .collect::<io::Result<_>>()?;

        let mut stop = self.shared.stop.lock().unwrap_or_else(|e| e.into_inner());
        while !*stop {
            stop = self
                .shared
                .stopped
                .wait(stop)
                .unwrap_or_else(|e| e.into_inner());
        }
        drop(stop);
        tracing::info!("shutting down: no new connections; finishing requests in flight");

        for listener in &listeners {
            // SAFETY: shutdown on a listening socket we own wakes a blocked accept().
            unsafe { libc::shutdown(listener.fd(), libc::SHUT_RDWR) };
        }
        for acceptor in acceptors {
            let _ = acceptor.join();
        }
        {
            let mut connections = self.shared.lock_connections();
            for tracked in connections.values() {
                // Reading stops; requests already read are still answered.
                let _ = tracked.stream.shutdown(Shutdown::Read);
            }
            let deadline = Instant::now() + SHUTDOWN_GRACE;
            let mut forced = false;
            while !connections.is_empty() {
                let now = Instant::now();
                if now >= deadline && !forced {
                    // A client that stopped reading replies would block its
                    // connection forever; cut it off.
                    tracing::warn!(
                        "{} connection(s) still busy; closing them",
                        connections.len()
                    );
                    for tracked in connections.values() {
                        let _ = tracked.stream.shutdown(Shutdown::Both);
                    }
                    forced = true;
                }
                let wait = deadline
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(100));
                connections = self
                    .shared
                    .connections_changed
                    .wait_timeout(connections, wait)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        drop(pool);
        let mut result = Ok(());
        for export in self.shared.current_exports().iter() {
            if export.device.info().read_only
                || !export.device.info().capabilities.flush.available()
            {
                continue;
            }
            if let Err(e) = export.device.flush() {
                tracing::error!(export = %export.name, "final flush failed: {e}");
                result = Err(io::Error::other(format!(
                    "final flush of export '{}' failed: {e}",
                    export.name
                )));
            }
        }
        for listener in &listeners {
            if let Listener::Unix(_, path) = listener.as_ref() {
                let _ = std::fs::remove_file(path);
            }
        }
        tracing::info!("stopped");
        result
    }
}

struct AcceptContext {
    listener: Arc<Listener>,
    pool: Arc<WorkerPool>,
    shared: Arc<Shared>,
    config: NbdConfig,
}

impl AcceptContext {
    fn refused(&self, limit: &str) {
        if let Some(sessions) = &self.config.sessions {
            sessions.refused(limit);
        }
    }

    fn limits(&self) -> AdmissionLimits {
        AdmissionLimits {
            connections: self.config.max_connections,
            per_address: self.config.max_connections_per_address,
            unfinished_per_address: self.config.max_handshakes_per_address,
        }
    }

    fn accept_loop(self) {
        loop {
            let accepted = self.listener.accept();
            if self.shared.stopping.load(Ordering::SeqCst) {
                return;
            }
            let stream = match accepted {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    // Out of file descriptors and the like: do not spin.
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
            let peer_ip = stream.peer_ip();
            {
                let mut connections = self
                    .shared
                    .connections
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                match self.shared.admission.admit(id, peer_ip, self.limits()) {
                    Verdict::Admit => {}
                    Verdict::Evict { id: victim, cap } => {
                        // Its handshake thread sees the socket end, fails and
                        // cleans up as for any client that went away.
                        if let Some(tracked) = connections.get(&victim) {
                            let _ = tracked.stream.shutdown(Shutdown::Both);
                        }
                        tracing::info!(
                            peer = %stream.peer(),
                            "{} reached; closing the oldest unfinished handshake to make room",
                            cap_name(cap)
                        );
                        self.refused(&format!("{}_evicted", cap_name(cap)));
                    }
                    Verdict::Refuse(cap) => {
                        tracing::warn!(
                            peer = %stream.peer(),
                            "{} reached and no unfinished handshake to close; closing",
                            cap_name(cap)
                        );
                        self.refused(cap_name(cap));
                        continue;
                    }
                }
                match stream.try_clone() {
                    Ok(clone) => connections.insert(
                        id,
                        Tracked {
                            stream: clone,
                            export: None,
                        },
                    ),
                    Err(e) => {
                        tracing::warn!("cannot track connection: {e}");
                        self.shared.admission.remove(id);
                        continue;
                    }
                };
            }
            // Read once per connection: a reload changes what later connections see,
            // never what this one negotiates against.
            let exports = self.shared.current_exports();
            let (pool, shared) = (self.pool.clone(), self.shared.clone());
            let limits = ConnectionLimits {
                handshake_timeout: self.config.handshake_timeout,
                send_timeout: self.config.send_timeout,
                unnegotiated_payload_limit: self.config.unnegotiated_payload_limit,
            };
            let sessions = self.config.sessions.clone();
            let tls = self.config.tls.clone();
            let spawned = thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .spawn(move || {
                    let handshake_done = |export: Option<&Arc<Export>>| {
                        if !shared.admission.finish(id) {
                            // Evicted by a limit as the handshake ended.
                            return false;
                        }
                        if let Some(tracked) = shared.lock_connections().get_mut(&id) {
                            tracked.export = export.cloned();
                        }
                        true
                    };
                    let tls = tls.as_deref();
                    serve_connection_reporting(
                        stream,
                        exports,
                        &pool,
                        limits,
                        tls,
                        handshake_done,
                        sessions.as_deref(),
                    );
                    shared.admission.remove(id);
                    let mut connections =
                        shared.connections.lock().unwrap_or_else(|e| e.into_inner());
                    connections.remove(&id);
                    shared.connections_changed.notify_all();
                });
            if let Err(e) = spawned {
                tracing::error!("cannot start a connection thread: {e}");
                self.shared.admission.remove(id);
                let mut connections = self
                    .shared
                    .connections
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                connections.remove(&id);
                self.shared.connections_changed.notify_all();
            }
        }
    }
}

/// The setting behind a cap, as logs and the refusal counter name it.
fn cap_name(cap: Cap) -> &'static str {
    match cap {
        Cap::Connections => "max_connections",
        Cap::PerAddress => "max_connections_per_address",
        Cap::UnfinishedPerAddress => "max_handshakes_per_address",
    }
}

/// Serves one connection from handshake to close.
pub fn serve_connection(
    stream: Stream,
    exports: Arc<ExportSet>,
    pool: &WorkerPool,
    handshake_timeout: Duration,
) {
    let defaults = NbdConfig::default();
    let limits = ConnectionLimits {
        handshake_timeout,
        send_timeout: defaults.send_timeout,
        unnegotiated_payload_limit: defaults.unnegotiated_payload_limit,
    };
    serve_connection_reporting(stream, exports, pool, limits, None, |_| true, None);
}

/// What one connection takes from the server's configuration.
#[derive(Debug, Clone, Copy)]
struct ConnectionLimits {
    handshake_timeout: Duration,
    send_timeout: Duration,
    unnegotiated_payload_limit: u32,
}

/// [`serve_connection`], with TLS offered when `tls` is given, calling
/// `handshake_done` once the handshake has ended, with the export when the client
/// entered transmission (a false answer: a limit closed the connection meanwhile,
/// so it is not served), and counting the connection in `sessions` while it is in
/// transmission.
fn serve_connection_reporting(
    mut stream: Stream,
    exports: Arc<ExportSet>,
    pool: &WorkerPool,
    limits: ConnectionLimits,
    tls: Option<&TargetTls>,
    handshake_done: impl FnOnce(Option<&Arc<Export>>) -> bool,
    sessions: Option<&dyn SessionMeter>,
) {
    let ConnectionLimits {
        handshake_timeout,
        send_timeout,
        unnegotiated_payload_limit,
    } = limits;
    let peer = stream.peer();
    tracing::debug!(%peer, "connected");
    let _ = stream.set_read_timeout(Some(handshake_timeout));
    let negotiated = negotiate_secure(&mut stream, exports, &peer, tls);
    let (mut session, secure) = match negotiated {
        Ok(Negotiated::Plain(session)) => (session, None),
        Ok(Negotiated::Tls(session, secure)) => (session, Some(secure)),
        Ok(Negotiated::Refused) => {
            handshake_done(None);
            return;
        }
        Err(e) => {
            handshake_done(None);
            tracing::info!(%peer, "handshake ended: {e}");
            return;
        }
    };
    if !handshake_done(Some(session.export())) {
        tracing::info!(%peer, "handshake closed by a connection limit");
        return;
    }
    if session.export().is_retired() {
        // A reload removed the export while this client negotiated; the drain
        // may already have looked for its connections, so this one closes itself.
        tracing::info!(%peer, export = %session.export().name, "export removed during the handshake; closing");
        return;
    }
    let _ = stream.set_read_timeout(None);
    // sendfile(2) would put plaintext on the wire: under TLS every byte goes
    // through the seal.
    session.set_zero_copy_reads(secure.is_none() && stream.peer_is_remote());
    session.set_mapped_reads(secure.is_none());
    session.set_unnegotiated_payload_limit(unnegotiated_payload_limit);
    let export = session.export().clone();
    let _open = sessions.map(|meter| OpenSession::open(meter, &export.name));
    // `headers` says which framing was negotiated (simple, structured, extended):
    // the interop tests read it to prove a peer did not silently fall back.
    tracing::info!(
        %peer,
        export = %export.name,
        structured = session.structured(),
        headers = ?session.framing(),
        sizes_negotiated = session.sizes_negotiated(),
        tls = secure.as_ref().map_or("off", |s| s.description()),
        "client entered transmission"
    );
    // A send that makes no progress for `send_timeout` fails; the writer then
    // shuts the socket down, which ends the connection.
    let _ = stream.set_write_timeout(Some(send_timeout));
    let clone = match stream.try_clone() {
        Ok(clone) => clone,
        Err(e) => {
            tracing::warn!(%peer, "cannot clone socket: {e}");
            return;
        }
    };
    let session = Arc::new(session);
    let ending = match secure {
        None => transmit(session, stream, Arc::new(ReplyWriter::new(clone)), pool),
        Some(secure) => {
            let closer = stream.try_clone().ok();
            let writer = Arc::new(ReplyWriter::new(TlsStream::new(clone, secure.clone())));
            let ending = transmit(
                session,
                TlsStream::new(stream, secure.clone()),
                writer,
                pool,
            );
            if let (Ending::Disconnect, Some(socket)) = (&ending, closer) {
                // proto.md: on NBD_CMD_DISC the server closes the TLS session first.
                TlsStream::new(socket, secure).close();
            }
            ending
        }
    };
    match ending {
        Ending::Disconnect | Ending::Closed => {
            tracing::info!(%peer, export = %export.name, "client disconnected")
        }
        Ending::Violation(reason) => {
            tracing::warn!(%peer, export = %export.name, "closed connection: {reason}")
        }
        Ending::Failed(e) => tracing::warn!(%peer, export = %export.name, "connection failed: {e}"),
    }
}
