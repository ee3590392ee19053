//! The iSCSI target: listeners, connections, sessions and an orderly shutdown.
//!
//! [`IscsiTarget::bind`] opens the listeners (so the caller can print real
//! addresses, port 0 included); [`IscsiTarget::run`] serves until a
//! [`ShutdownHandle`] fires, then stops accepting, asks every logged-in initiator
//! to log out (an Asynchronous Message, RFC 7143 §11.9), waits for them for a grace
//! period, closes what is left and returns. Flushing the devices is the caller's:
//! one export may be served over several protocols.

mod command;
mod connection;
mod dispatch;
pub mod full_feature;
mod io;
mod naming;
mod reload;
mod session;
pub mod tasks;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::admission::{Admission, AdmissionLimits, Cap, Verdict};
use blockwire_blockdev::workers::WorkerPool;
use blockwire_blockdev::SessionMeter;
use blockwire_scsi::ScsiTarget;

use crate::login::{ChapConfig, LoginConfig, TargetEntry, TargetLimits};
use crate::pdu::{AsyncMessage, Pdu};

pub use naming::{decode_lun, encode_lun, initiator_port, transport_id};
pub use reload::ReloadHandle;

/// One iSCSI target (an IQN) and the SCSI target behind it.
#[derive(Clone)]
pub struct TargetDefinition {
    pub name: String,
    pub alias: Option<String>,
    pub scsi: Arc<ScsiTarget>,
    /// Initiator names allowed to log in (empty: everyone).
    pub allowed_initiators: Vec<String>,
    /// CHAP the initiator must pass to log in to this target.
    pub chap: Option<ChapConfig>,
}

/// Where and how the target listens.
pub struct IscsiConfig {
    pub listen: Vec<SocketAddr>,
    pub targets: Vec<TargetDefinition>,
    /// CHAP the initiator must pass for a discovery session.
    pub discovery_chap: Option<ChapConfig>,
    pub limits: TargetLimits,
    /// Threads that run commands.
    pub workers: usize,
    /// Open connections at most. At the cap, a new connection closes the oldest
    /// unfinished login of the address holding the most; with none, it is closed at
    /// once.
    pub max_connections: usize,
    /// Connections from one address that have not finished their login, at most:
    /// one address that opens many and never logs in must not lock anybody out,
    /// itself included, so a new one closes that address's oldest unfinished login.
    pub max_logins_per_address: usize,
    /// A login must finish within this time.
    pub login_timeout: Duration,
    /// A connection silent this long gets a NOP-In ping...
    pub nop_interval: Duration,
    /// ...and is closed when the ping is not answered within this time.
    pub nop_timeout: Duration,
    /// A send blocked this long (an initiator that stopped reading) ends the
    /// connection.
    pub send_timeout: Duration,
    /// How long a shutdown waits for initiators to log out.
    pub shutdown_grace: Duration,
    /// Told of each connection logged in to a target (by its name) and each one a
    /// limit refused.
    pub sessions: Option<Arc<dyn SessionMeter>>,
}

impl IscsiConfig {
    /// A configuration with defaults for everything but the addresses and targets.
    pub fn new(listen: Vec<SocketAddr>, targets: Vec<TargetDefinition>) -> IscsiConfig {
        IscsiConfig {
            listen,
            targets,
            discovery_chap: None,
            limits: TargetLimits::default(),
            workers: 16,
            max_connections: 256,
            max_logins_per_address: 16,
            login_timeout: Duration::from_secs(15),
            nop_interval: Duration::from_secs(30),
            nop_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            sessions: None,
        }
    }
}

/// State shared by the acceptors, connections and the shutdown.
pub(crate) struct Shared {
    /// The configuration it was bound with; its `targets` are in `served`.
    config: IscsiConfig,
    /// What is served now: a reload replaces it whole.
    served: RwLock<Served>,
    registry: session::Registry,
    pool: WorkerPool,
    stopping: AtomicBool,
    stop: Mutex<bool>,
    stopped: Condvar,
    next_id: AtomicU64,
    /// Every open connection (logged in or not): a clone of its socket and the
    /// address it came from.
    connections: Mutex<HashMap<u64, (TcpStream, std::net::IpAddr)>>,
    connections_changed: Condvar,
    /// Open connections by address and login state, for the limits; a connection
    /// is finished once its login completes (discovery sessions too).
    admission: Admission,
}

/// The targets served now, as login and the sessions see them.
struct Served {
    targets: Vec<TargetDefinition>,
    login: Arc<LoginConfig>,
    scsi_targets: HashMap<String, Arc<ScsiTarget>>,
}

impl Served {
    fn new(targets: Vec<TargetDefinition>, config: &IscsiConfig) -> Served {
        let login = LoginConfig {
            targets: targets
                .iter()
                .map(|t| TargetEntry {
                    name: t.name.clone(),
                    alias: t.alias.clone(),
                    portal_group_tag: 1,
                    allowed_initiators: t.allowed_initiators.clone(),
                    chap: t.chap.clone(),
                })
                .collect(),
            discovery_chap: config.discovery_chap.clone(),
            limits: config.limits.clone(),
            portals: config.listen.iter().map(portal_text).collect(),
        };
        let scsi_targets = targets
            .iter()
            .map(|t| (t.name.clone(), t.scsi.clone()))
            .collect();
        Served {
            targets,
            login: Arc::new(login),
            scsi_targets,
        }
    }
}

impl Shared {
    fn served(&self) -> std::sync::RwLockReadGuard<'_, Served> {
        self.served.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The SCSI target behind the iSCSI target `name`, if it is served now.
    fn scsi_target(&self, name: &str) -> Option<Arc<ScsiTarget>> {
        self.served().scsi_targets.get(name).cloned()
    }

    /// The login configuration for a connection that arrived on `portal`: a
    /// listener on a wildcard address reports the address the initiator reached.
    fn login_config_for(&self, portal: Option<SocketAddr>) -> Arc<LoginConfig> {
        let login = self.served().login.clone();
        match portal {
            Some(addr)
                if self
                    .config
                    .listen
                    .iter()
                    .any(|l| l.ip().is_unspecified() && l.port() == addr.port()) =>
            {
                let mut login = (*login).clone();
                login.portals = vec![portal_text(&addr)];
                Arc::new(login)
            }
            _ => login,
        }
    }

    fn lock_connections(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, (TcpStream, std::net::IpAddr)>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// "addr:port,tpgt" as SendTargets reports a portal (RFC 7143 §13.9).
fn portal_text(addr: &SocketAddr) -> String {
    match addr {
        SocketAddr::V4(v4) => format!("{}:{},1", v4.ip(), v4.port()),
        SocketAddr::V6(v6) => format!("[{}]:{},1", v6.ip(), v6.port()),
    }
}

/// Asks a running target to stop. Cheap to clone; safe from a signal thread.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Open connections now, logging in or logged in (for a status line).
    pub fn open_connections(&self) -> usize {
        self.0.lock_connections().len()
    }

    pub fn shutdown(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        *self.0.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.0.stopped.notify_all();
    }
}

/// An iSCSI target server.
pub struct IscsiTarget {
    listeners: Vec<TcpListener>,
    shared: Arc<Shared>,
}

impl IscsiTarget {
    /// Opens every listener.
    pub fn bind(config: IscsiConfig) -> std::io::Result<IscsiTarget> {
        if config.targets.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no iSCSI targets to serve",
            ));
        }
        let mut listeners = Vec::new();
        for addr in &config.listen {
            let listener = TcpListener::bind(addr).map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))
            })?;
            listeners.push(listener);
        }
        if listeners.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "no iSCSI address to listen on",
            ));
        }
        let bound: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let mut config = config;
        // Port 0 becomes the port the kernel gave, for SendTargets and portals.
        config.listen = bound;
        let served = Served::new(std::mem::take(&mut config.targets), &config);
        let pool = WorkerPool::new("iscsi-worker", config.workers);
        Ok(IscsiTarget {
            listeners,
            shared: Arc::new(Shared {
                config,
                served: RwLock::new(served),
                registry: session::Registry::default(),
                pool,
                stopping: AtomicBool::new(false),
                stop: Mutex::new(false),
                stopped: Condvar::new(),
                next_id: AtomicU64::new(0),
                connections: Mutex::new(HashMap::new()),
                connections_changed: Condvar::new(),
                admission: Admission::default(),
            }),
        })
    }

    /// The addresses actually bound (useful with port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.shared.config.listen.clone()
    }

    /// The targets' names, in configuration order.
    pub fn target_names(&self) -> Vec<String> {
        self.shared
            .served()
            .targets
            .iter()
            .map(|t| t.name.clone())
            .collect()
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// A handle that adds and removes targets while the target server runs.
    pub fn reload_handle(&self) -> ReloadHandle {
        ReloadHandle::new(self.shared.clone())
    }

    /// Serves until shut down; then asks initiators to log out and waits for them.
    pub fn run(self) -> std::io::Result<()> {
        let listeners: Vec<Arc<TcpListener>> = self.listeners.into_iter().map(Arc::new).collect();
        let acceptors: Vec<_> = listeners
            .iter()
            .map(|listener| {
                let listener = listener.clone();
                let shared = self.shared.clone();
                thread::Builder::new()
                    .name("iscsi-accept".into())
                    .spawn(move || accept_loop(&listener, &shared))
            })
            .collect::<std::io::Result<_>>()?;
        let shared = &self.shared;
        let mut stop = shared.stop.lock().unwrap_or_else(|e| e.into_inner());
        while !*stop {
            stop = shared.stopped.wait(stop).unwrap_or_else(|e| e.into_inner());
        }
        drop(stop);
        tracing::info!("iSCSI: shutting down; asking initiators to log out");
        for listener in &listeners {
            // SAFETY: shutdown(2) on a listening socket we own wakes a blocked accept().
            unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for acceptor in acceptors {
            let _ = acceptor.join();
        }
        let grace = shared.config.shutdown_grace;
        for session in shared.registry.all() {
            request_logout(&session, grace);
        }
        let deadline = Instant::now() + grace;
        let mut connections = shared.lock_connections();
        let mut forced = false;
        while !connections.is_empty() {
            let now = Instant::now();
            if now >= deadline && !forced {
                tracing::warn!(
                    "{} iSCSI connection(s) did not log out; closing them",
                    connections.len()
                );
                for (stream, _) in connections.values() {
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                }
                forced = true;
            }
            let wait = deadline
                .saturating_duration_since(now)
                .max(Duration::from_millis(100));
            connections = shared
                .connections_changed
                .wait_timeout(connections, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        tracing::info!("iSCSI: stopped");
        Ok(())
    }
}

/// Asks the initiator of `session` to log out within `grace`: AsyncEvent 1, with
/// Parameter3 the seconds it has (RFC 7143 §11.9.1).
fn request_logout(session: &session::Session, grace: Duration) {
    let message = Pdu::AsyncMessage(AsyncMessage {
        event: AsyncMessage::REQUEST_LOGOUT,
        parameter3: grace.as_secs().min(u64::from(u16::MAX)) as u16,
        ..AsyncMessage::default()
    })
    .encode(0);
    let _ = session.writer.send(
        io::Outgoing {
            bhs: message.bhs,
            ahs: &[],
            stat_sn: io::StatSn::Advance,
            data: &[],
        },
        session,
    );
}

/// The setting behind a cap, as logs and the refusal counter name it. The target
/// has no cap of its own on connections per address.
fn cap_name(cap: Cap) -> &'static str {
    match cap {
        Cap::Connections => "max_connections",
        Cap::PerAddress => "max_connections_per_address",
        Cap::UnfinishedPerAddress => "max_logins_per_address",
    }
}

fn refused(shared: &Shared, limit: &str) {
    if let Some(sessions) = &shared.config.sessions {
        sessions.refused(limit);
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("iSCSI accept failed: {e}");
                thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut connections = shared.lock_connections();
            let limits = AdmissionLimits {
                connections: shared.config.max_connections,
                per_address: usize::MAX,
                unfinished_per_address: shared.config.max_logins_per_address,
            };
            match shared.admission.admit(id, Some(peer.ip()), limits) {
                Verdict::Admit => {}
                Verdict::Evict { id: victim, cap } => {
                    // Its thread sees the socket end, fails the login and cleans up
                    // as for any initiator that went away.
                    if let Some((victim, _)) = connections.get(&victim) {
                        let _ = victim.shutdown(std::net::Shutdown::Both);
                    }
                    tracing::info!(
                        %peer,
                        "{} reached; closing the oldest unfinished iSCSI login to make room",
                        cap_name(cap)
                    );
                    refused(shared, &format!("{}_evicted", cap_name(cap)));
                }
                Verdict::Refuse(cap) => {
                    tracing::warn!(
                        %peer,
                        "{} reached and no unfinished iSCSI login to close; closing",
                        cap_name(cap)
                    );
                    refused(shared, cap_name(cap));
                    continue;
                }
            }
            match stream.try_clone() {
                Ok(clone) => connections.insert(id, (clone, peer.ip())),
                Err(e) => {
                    tracing::warn!("cannot track connection: {e}");
                    shared.admission.remove(id);
                    continue;
                }
            };
        }
        let shared_for_thread = shared.clone();
        let spawned = thread::Builder::new()
            .name(format!("iscsi-conn-{id}"))
            .spawn(move || {
                connection::serve(stream, id, shared_for_thread.clone());
                shared_for_thread.admission.remove(id);
                let mut connections = shared_for_thread.lock_connections();
                connections.remove(&id);
                shared_for_thread.connections_changed.notify_all();
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start a connection thread: {e}");
            shared.admission.remove(id);
            shared.lock_connections().remove(&id);
            shared.connections_changed.notify_all();
        }
    }
}
