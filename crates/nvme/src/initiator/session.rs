//! One association with a controller: the admin queue, its I/O queues, and
//! the keep-alive that tells the controller the host is still there. Setting
//! it up is the sequence Linux's host follows: ICReq/ICResp and Connect on the
//! admin queue, CAP, CC.EN and CSTS.RDY, Identify, Number of Queues, then one
//! Connect per I/O queue, each on its own TCP connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::commands::{self, ControllerIdentity, NamespaceIdentity};
use super::connection::{Connection, Payload};
use super::error::InitiatorError;
use super::options::NvmeOptions;
use crate::cqe::Cqe;
use crate::fabrics::{Connect, ConnectData, PropertyCommand, DYNAMIC_CNTLID};
use crate::opcodes::property;
use crate::pdu::Digests;
use crate::sqe::Sqe;

/// Admin queue entries asked for (the most a fabrics controller must allow).
const ADMIN_DEPTH: u16 = 32;
/// I/O queue entries asked for, at most.
const IO_DEPTH: u16 = 128;
/// CC: enable, 64-byte SQEs (IOSQES 6), 16-byte CQEs (IOCQES 4).
const CC_ENABLE: u64 = 1 | (6 << 16) | (4 << 20);
/// CC.SHN: normal shutdown notification.
const CC_SHUTDOWN: u64 = 1 << 14;
/// Largest transfer per command when the controller sets no limit.
const DEFAULT_MAX_TRANSFER: u32 = 1 << 20;
/// Largest transfer per command this initiator uses at all.
const MAX_TRANSFER_CAP: u32 = 8 << 20;

/// A connected controller.
pub(crate) struct Session {
    pub address: String,
    pub admin: Arc<Connection>,
    pub io: Vec<Arc<Connection>>,
    pub controller: ControllerIdentity,
    /// Present unless this is a discovery controller.
    pub namespace: Option<NamespaceIdentity>,
    /// Bytes one command moves at most.
    pub max_transfer: u32,
    next: AtomicUsize,
    keep_alive: Mutex<Option<SyncSender<()>>>,
}

impl Session {
    /// Connects to the controller `options` name and sets it up.
    pub fn connect(options: &NvmeOptions) -> Result<Session, InitiatorError> {
        let address = options.address();
        let digests = Digests {
            header: options.header_digest,
            data: options.data_digest,
        };
        let timeout = options.setup_timeout;
        let discovery = options.is_discovery();
        // The admin queue's largest PDU: a log page of the most one command moves.
        let admin_pdu = MAX_TRANSFER_CAP + 4096;
        let admin = Connection::open(&address, digests, ADMIN_DEPTH, 0, admin_pdu, timeout)?;
        let kato = if discovery {
            0
        } else {
            options.keep_alive.as_millis().min(u128::from(u32::MAX)) as u32
        };
        let cntlid = connect_queue(options, &admin, 0, ADMIN_DEPTH, kato, DYNAMIC_CNTLID)
            .inspect_err(|_| admin.close())?;
        let mut session = Session {
            address: address.clone(),
            admin,
            io: Vec::new(),
            controller: ControllerIdentity::default(),
            namespace: None,
            max_transfer: DEFAULT_MAX_TRANSFER,
            next: AtomicUsize::new(0),
            keep_alive: Mutex::new(None),
        };
        let cap = session.property_get(property::CAP, true, timeout)?;
        session.enable(cap, timeout)?;
        let data = session.admin_data(
            commands::identify_controller(),
            4096,
            "Identify Controller",
            timeout,
        )?;
        session.controller = ControllerIdentity::parse(&data)
            .ok_or_else(|| session.protocol("short Identify Controller data"))?;
        // Controllers number pages from 4 KiB << CAP.MPSMIN.
        let page = 4096u64 << ((cap >> 48) & 0xf);
        session.max_transfer = match session.controller.mdts {
            0 => DEFAULT_MAX_TRANSFER,
            mdts => (page << mdts.min(20)).min(u64::from(MAX_TRANSFER_CAP)) as u32,
        };
        if discovery {
            return Ok(session);
        }
        let data = session.admin_data(
            commands::identify(crate::opcodes::cns::NAMESPACE, options.nsid),
            4096,
            "Identify Namespace",
            timeout,
        )?;
        session.namespace = Some(NamespaceIdentity::parse(&data).ok_or_else(|| {
            session.protocol(&format!(
                "namespace {} of {} is inactive or has a format this initiator cannot use",
                options.nsid, options.subnqn
            ))
        })?);
        let wanted = options.queues.clamp(1, 64) as u16;
        let cqe = session
            .admin(
                commands::set_queue_count(wanted),
                Payload::None,
                "Set Features (Number of Queues)",
                timeout,
            )?
            .0;
        // Both counts are 0's based; a controller may offer all 65536.
        let granted = (cqe.result as u16)
            .min((cqe.result >> 16) as u16)
            .saturating_add(1);
        let queues = wanted.min(granted);
        let depth = IO_DEPTH
            .min(((cap & 0xffff) as u16).saturating_add(1))
            .max(2);
        let inline = session
            .controller
            .inline_data()
            .min(session.max_transfer as usize);
        let max_pdu = session.max_transfer + 4096;
        for qid in 1..=queues {
            let queue = Connection::open(&address, digests, depth, inline, max_pdu, timeout)?;
            // A queue not yet in the session is closed here; the rest by Drop.
            connect_queue(options, &queue, qid, depth, 0, cntlid).inspect_err(|_| queue.close())?;
            session.io.push(queue);
        }
        session.start_keep_alive(options.keep_alive / 2);
        tracing::debug!(
            "NVMe/TCP {address}: controller {cntlid} of {}, {queues} I/O queue(s) of {depth}, {} bytes in capsule",
            options.subnqn,
            inline
        );
        Ok(session)
    }

    fn protocol(&self, reason: &str) -> InitiatorError {
        InitiatorError::Protocol {
            address: self.address.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Runs an admin command and checks its status.
    pub fn admin(
        &self,
        sqe: Sqe,
        payload: Payload,
        what: &'static str,
        timeout: Duration,
    ) -> Result<(Cqe, Payload), InitiatorError> {
        run_checked(&self.admin, &self.address, sqe, payload, what, timeout)
    }

    /// Runs an admin command that returns `len` bytes.
    pub fn admin_data(
        &self,
        sqe: Sqe,
        len: usize,
        what: &'static str,
        timeout: Duration,
    ) -> Result<Vec<u8>, InitiatorError> {
        match self
            .admin(sqe, Payload::Owned(vec![0; len]), what, timeout)?
            .1
        {
            Payload::Owned(data) => Ok(data),
            _ => Err(self.protocol("lost the data buffer")),
        }
    }

    fn property_get(
        &self,
        offset: u32,
        eight: bool,
        timeout: Duration,
    ) -> Result<u64, InitiatorError> {
        let sqe = PropertyCommand::Get {
            offset,
            eight_bytes: eight,
        }
        .to_sqe(0);
        Ok(self
            .admin(sqe, Payload::None, "Property Get", timeout)?
            .0
            .result)
    }

    fn property_set(
        &self,
        offset: u32,
        value: u64,
        timeout: Duration,
    ) -> Result<(), InitiatorError> {
        let sqe = PropertyCommand::Set {
            offset,
            eight_bytes: false,
            value,
        }
        .to_sqe(0);
        self.admin(sqe, Payload::None, "Property Set", timeout)
            .map(|_| ())
    }

    /// CC.EN = 1, then waits for CSTS.RDY (at most CAP.TO, in 500 ms units).
    fn enable(&self, cap: u64, timeout: Duration) -> Result<(), InitiatorError> {
        self.property_set(property::CC, CC_ENABLE, timeout)?;
        let limit = Duration::from_millis(500 * ((cap >> 24) & 0xff).max(1)).max(timeout);
        let start = Instant::now();
        loop {
            let csts = self.property_get(property::CSTS, false, timeout)?;
            if csts & 0b10 != 0 {
                return Err(self.protocol("controller fatal status while enabling"));
            }
            if csts & 1 != 0 {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(self.protocol("controller not ready in time (CSTS.RDY stays 0)"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A keep-alive every `interval` on the admin queue; when one goes
    /// unanswered every queue is closed, so requests in flight fail over to a
    /// new association instead of waiting on a dead one.
    fn start_keep_alive(&self, interval: Duration) {
        let (stop, stopped) = mpsc::sync_channel::<()>(1);
        let admin = self.admin.clone();
        let io = self.io.clone();
        let interval = interval.max(Duration::from_millis(100));
        let spawned = std::thread::Builder::new()
            .name("nvme-tcp-keepalive".into())
            .spawn(move || loop {
                match stopped.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let (result, _) =
                    admin.call(commands::keep_alive(), Payload::None, Some(interval * 2));
                if !matches!(result, Ok(cqe) if cqe.status.is_success()) {
                    tracing::warn!(
                        "NVMe/TCP {}: keep-alive unanswered; closing the queues",
                        admin.address
                    );
                    admin.close();
                    io.iter().for_each(|q| q.close());
                    return;
                }
            });
        if spawned.is_ok() {
            *self.keep_alive.lock().unwrap_or_else(|e| e.into_inner()) = Some(stop);
        }
    }

    /// The next I/O queue to use: the least busy of two neighbours in turn, so
    /// commands spread over every queue and a slow one is passed over.
    pub fn pick(&self) -> &Arc<Connection> {
        let n = self.io.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let second = (first + 1) % n;
        if self.io[second].in_flight() < self.io[first].in_flight() {
            &self.io[second]
        } else {
            &self.io[first]
        }
    }

    /// Whether any queue of this association has ended.
    pub fn is_broken(&self) -> bool {
        self.admin.is_dead() || self.io.iter().any(|q| q.is_dead())
    }

    /// Ends the association: a shutdown notification when the controller is
    /// still there (so it flushes its cache), then every connection closes.
    pub fn close(&self) {
        if let Some(stop) = self
            .keep_alive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            let _ = stop.try_send(());
        }
        if !self.is_broken() && self.namespace.is_some() {
            let _ = self.property_set(
                property::CC,
                CC_ENABLE | CC_SHUTDOWN,
                Duration::from_secs(2),
            );
        }
        self.io.iter().for_each(|q| q.close());
        self.admin.close();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close();
    }
}

/// Runs `sqe` on `queue`, turning a lost connection or a failed status into an
/// error naming `what`.
fn run_checked(
    queue: &Connection,
    address: &str,
    sqe: Sqe,
    payload: Payload,
    what: &'static str,
    timeout: Duration,
) -> Result<(Cqe, Payload), InitiatorError> {
    match queue.call(sqe, payload, Some(timeout)) {
        (Ok(cqe), payload) if cqe.status.is_success() => Ok((cqe, payload)),
        (Ok(cqe), _) => Err(InitiatorError::Command {
            address: address.to_owned(),
            what,
            status: cqe.status,
        }),
        (Err(_), _) => Err(InitiatorError::Protocol {
            address: address.to_owned(),
            reason: format!("connection lost during {what}"),
        }),
    }
}

/// Fabrics Connect of queue `qid`; returns the controller ID.
fn connect_queue(
    options: &NvmeOptions,
    queue: &Connection,
    qid: u16,
    depth: u16,
    kato: u32,
    cntlid: u16,
) -> Result<u16, InitiatorError> {
    let sqe = Connect {
        cid: 0,
        recfmt: 0,
        qid,
        sqsize: depth - 1,
        // I/O queues disable SQ flow control (CATTR bit 2): we bound what is in
        // flight by command IDs, never by SQHD, and it lets the target end a
        // read with its C2HData (SUCCESS) instead of a completion PDU more.
        cattr: if qid == 0 { 0 } else { 1 << 2 },
        kato,
    }
    .to_sqe();
    let data = ConnectData {
        host_id: options.hostid,
        cntlid,
        subnqn: options.subnqn.clone(),
        hostnqn: options.hostnqn.clone(),
    }
    .to_bytes();
    let what = if qid == 0 {
        "Connect (admin queue)"
    } else {
        "Connect (I/O queue)"
    };
    let (cqe, _) = run_checked(
        queue,
        &queue.address,
        sqe,
        Payload::Owned(data),
        what,
        options.setup_timeout,
    )?;
    Ok(cqe.result as u16)
}
