//! One TCP connection of the target: the login phase, then the socket side of the
//! full feature phase (RFC 7143 §6, §4.2). The protocol is the sans-IO
//! [`FullFeature`]; this thread reads PDUs and feeds it, sends what it queues, and
//! hands the commands it releases to the [`Dispatcher`].

use std::io;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::OpenSession;

use crate::login::{
    failure_response, status, LoginConfig, LoginMachine, LoginStep, Negotiated, SessionType,
};
use crate::pdu::{LoginResponse, Pdu};

use super::dispatch::Dispatcher;
use super::full_feature::{self, FullFeature, Segment, SegmentRead, Timers, Work};
use super::io::{Incoming, Outgoing, PduReader, PduWriter, ReadError};
use super::session::{Session, SessionKey};
use super::Shared;

/// Why a connection ended.
enum Ending {
    Closed,
    LoggedOut,
    Violation(String),
    Failed(io::Error),
}

impl From<full_feature::Ending> for Ending {
    fn from(e: full_feature::Ending) -> Ending {
        match e {
            full_feature::Ending::LoggedOut => Ending::LoggedOut,
            full_feature::Ending::ColdReset => Ending::Closed,
            full_feature::Ending::Violation(reason) => Ending::Violation(reason),
        }
    }
}

impl From<ReadError> for Ending {
    fn from(e: ReadError) -> Ending {
        match e {
            ReadError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ending::Closed,
            ReadError::Io(e) => Ending::Failed(e),
            other => Ending::Violation(other.to_string()),
        }
    }
}

impl From<io::Error> for Ending {
    fn from(e: io::Error) -> Ending {
        Ending::Failed(e)
    }
}

/// Serves one accepted connection until it ends.
pub(super) fn serve(stream: TcpStream, id: u64, shared: Arc<Shared>) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let portal = stream.local_addr().ok();
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(shared.config.send_timeout));
    let writer = match stream.try_clone() {
        Ok(clone) => Arc::new(PduWriter::new(clone, 0)),
        Err(e) => {
            tracing::warn!(%peer, "cannot clone socket: {e}");
            return;
        }
    };
    let mut reader = PduReader::new(stream);
    let login = shared.login_config_for(portal);
    let Some((negotiated, session)) =
        login_phase(&mut reader, &writer, &shared, login.clone(), id, &peer)
    else {
        return;
    };
    let initiator = negotiated.initiator_name.clone();
    // Discovery sessions serve no export: not counted.
    let target = negotiated.target_name.clone();
    let _open = match (&shared.config.sessions, &target) {
        (Some(meter), Some(target)) => Some(OpenSession::open(meter.as_ref(), target)),
        _ => None,
    };
    tracing::info!(
        %peer,
        initiator = %initiator,
        target = negotiated.target_name.as_deref().unwrap_or("(discovery)"),
        tsih = session.tsih,
        "logged in"
    );
    let timers = Timers {
        nop_interval: shared.config.nop_interval,
        nop_timeout: shared.config.nop_timeout,
    };
    let max_burst = negotiated.max_burst_length;
    let phase = FullFeature::new(
        negotiated,
        login,
        session.scsi.clone(),
        session.tasks.clone(),
        timers,
        Instant::now(),
    );
    let mut connection = Connection {
        reader,
        phase,
        dispatcher: Dispatcher::new(session.clone(), shared.clone(), max_burst),
        session: session.clone(),
    };
    let ending = connection.run();
    drop(connection);
    // Every command the connection started answers (or fails to) before the
    // session goes: SCSI state must not see a command after its nexus is gone.
    session.wait_executing(None);
    shared.registry.remove(&session);
    if let Some(scsi) = &session.scsi {
        scsi.nexus_lost(&session.nexus);
    }
    session.writer.shutdown();
    match ending {
        Ending::Closed => tracing::info!(%peer, initiator = %initiator, "connection closed"),
        Ending::LoggedOut => tracing::info!(%peer, initiator = %initiator, "logged out"),
        Ending::Violation(reason) => {
            tracing::warn!(%peer, initiator = %initiator, "closed connection: {reason}")
        }
        Ending::Failed(e) => {
            tracing::warn!(%peer, initiator = %initiator, "connection failed: {e}")
        }
    }
}

/// Runs the login phase; returns the negotiated parameters and the registered
/// session, or None when the login failed or the peer left.
fn login_phase(
    reader: &mut PduReader,
    writer: &Arc<PduWriter>,
    shared: &Arc<Shared>,
    login: Arc<LoginConfig>,
    id: u64,
    peer: &str,
) -> Option<(Negotiated, Arc<Session>)> {
    let deadline = Instant::now() + shared.config.login_timeout;
    let mut machine = LoginMachine::new(login);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() || reader.set_idle_timeout(Some(remaining)).is_err() {
            tracing::info!(%peer, "login not finished in time; closing");
            return None;
        }
        let (bhs, ahs) = match reader.read_header() {
            Ok(Incoming::Header { bhs, ahs }) => (bhs, ahs),
            Ok(Incoming::Idle) => {
                tracing::info!(%peer, "login not finished in time; closing");
                return None;
            }
            Ok(Incoming::Closed) => return None,
            Err(e) => {
                tracing::info!(%peer, "login failed: {e}");
                return None;
            }
        };
        let request = match Pdu::decode(&bhs, &ahs) {
            Ok(Pdu::LoginRequest(request)) => request,
            _ => {
                // Only Login Requests are valid before the full feature phase (§6.1).
                tracing::info!(%peer, opcode = bhs.opcode(), "a PDU other than Login during login; closing");
                return None;
            }
        };
        let data = match reader.read_data_vec(bhs.data_len()) {
            Ok(data) => data,
            Err(e) => {
                tracing::info!(%peer, "login failed: {e}");
                return None;
            }
        };
        match machine.handle(&request, &data) {
            LoginStep::Continue { response, data } => {
                send_login(writer, &response, &data).ok()?;
            }
            LoginStep::Fail {
                response,
                data,
                reason,
            } => {
                tracing::warn!(%peer, "login refused: {reason}");
                let _ = send_login(writer, &response, &data);
                return None;
            }
            LoginStep::Complete {
                mut response,
                data,
                negotiated,
            } => {
                if !shared.admission.finish(id) {
                    tracing::info!(%peer, "login closed by a connection limit");
                    return None;
                }
                let session = match establish(shared, writer, id, &negotiated) {
                    Ok(session) => session,
                    Err((status, reason)) => {
                        tracing::warn!(%peer, "login refused: {reason}");
                        let _ = send_login(writer, &failure_response(&response, status), &[]);
                        return None;
                    }
                };
                response.tsih = session.tsih;
                if send_login(writer, &response, &data).is_err() {
                    shared.registry.remove(&session);
                    return None;
                }
                writer.set_parameters(
                    negotiated.header_digest,
                    negotiated.data_digest,
                    negotiated.initiator_max_recv_data_segment_length,
                    negotiated.stat_sn,
                );
                reader.set_parameters(
                    negotiated.header_digest,
                    negotiated.data_digest,
                    negotiated.target_max_recv_data_segment_length,
                );
                return Some((negotiated, session));
            }
        }
    }
}

fn send_login(writer: &PduWriter, response: &LoginResponse, data: &[u8]) -> io::Result<()> {
    let header = Pdu::LoginResponse(response.clone()).encode(data.len() as u32);
    writer.send_unstamped(&header.bhs, data)
}

/// Creates (or reinstates) the session a completed login asked for. Errors carry
/// the login status (RFC 7143 §11.13.5) and a reason for the log.
fn establish(
    shared: &Arc<Shared>,
    writer: &Arc<PduWriter>,
    id: u64,
    negotiated: &Negotiated,
) -> Result<Arc<Session>, (u16, String)> {
    let key = SessionKey {
        initiator_name: negotiated.initiator_name.clone(),
        isid: negotiated.isid,
        target_name: negotiated.target_name.clone(),
    };
    let old = if negotiated.tsih == 0 {
        // Session reinstatement (§6.3.5): a new login with the ISID of a live
        // session ends the old one.
        shared.registry.find(&key)
    } else {
        match shared.registry.by_tsih(negotiated.tsih) {
            Some((old_key, old)) if old_key == key => Some(old),
            _ => {
                return Err((
                    status::SESSION_DOES_NOT_EXIST,
                    format!("no session with TSIH {}", negotiated.tsih),
                ))
            }
        }
    };
    if let Some(old) = old {
        tracing::info!(
            initiator = %key.initiator_name,
            tsih = old.tsih,
            "reinstating session: closing its old connection"
        );
        old.writer.shutdown();
        if !shared.registry.wait_removed(&old, Duration::from_secs(10)) {
            return Err((
                status::TARGET_ERROR,
                "the old session did not end in time".into(),
            ));
        }
    }
    if shared.stopping.load(Ordering::SeqCst) {
        return Err((
            status::SERVICE_UNAVAILABLE,
            "the target is shutting down".into(),
        ));
    }
    let scsi = match (&negotiated.session_type, &negotiated.target_name) {
        (SessionType::Normal, Some(name)) => match shared.scsi_target(name) {
            Some(scsi) => Some(scsi),
            None => return Err((status::TARGET_NOT_FOUND, format!("target {name} not found"))),
        },
        _ => None,
    };
    let tsih = shared.registry.allocate_tsih();
    let session = Arc::new(Session::new(
        tsih,
        id,
        &negotiated.initiator_name,
        negotiated.isid,
        scsi,
        writer.clone(),
        negotiated.exp_cmd_sn,
        shared.config.limits.cmd_window,
    ));
    shared.registry.insert(key, session.clone());
    Ok(session)
}

/// The socket side of the full feature phase of one connection.
struct Connection {
    reader: PduReader,
    phase: FullFeature,
    dispatcher: Dispatcher,
    session: Arc<Session>,
}

impl Connection {
    fn run(&mut self) -> Ending {
        let ending = self.serve_pdus();
        // A Logout Response may be among the held answers.
        let _ = self.session.writer.release();
        ending
    }

    fn serve_pdus(&mut self) -> Ending {
        let mut idle = Duration::ZERO;
        loop {
            if !self.reader.header_buffered() {
                // The next read may wait for the network: the answers held so far
                // go now.
                if let Err(e) = self.session.writer.release() {
                    return Ending::Failed(e);
                }
            }
            // The read timeout is set again only when it would fire late by more
            // than an eighth: setting it costs a system call, and an early wake-up
            // only asks the phase whether a timer is due.
            let now = Instant::now();
            let wait = match self.phase.next_timeout() {
                Some(deadline) => deadline
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1)),
                None => return Ending::Closed,
            };
            if idle.is_zero() || idle > wait + wait / 8 {
                if self.reader.set_idle_timeout(Some(wait)).is_err() {
                    return Ending::Closed;
                }
                idle = wait;
            }
            let result = match self.reader.read_header() {
                Ok(Incoming::Closed) => return Ending::Closed,
                Ok(Incoming::Idle) => {
                    self.phase.handle_timeout(Instant::now());
                    idle = Duration::ZERO;
                    Ok(())
                }
                Ok(Incoming::Header { bhs, ahs }) => {
                    // Answers to commands that arrived together leave together.
                    self.session.writer.hold();
                    self.feed(&bhs, &ahs)
                }
                Err(e) => return e.into(),
            };
            if let Err(ending) = result.and_then(|()| self.drain()) {
                return ending;
            }
            if let Some(ending) = self.phase.ending() {
                return ending.clone().into();
            }
        }
    }

    /// Hands one PDU to the phase, its data segment read where the phase wants it.
    fn feed(&mut self, bhs: &crate::pdu::Bhs, ahs: &[u8]) -> Result<(), Ending> {
        let len = bhs.data_len();
        let read = match self.phase.handle_header(Instant::now(), bhs, ahs) {
            Segment::Skip => self.reader.skip_data(len).map(|()| SegmentRead::Done),
            Segment::Collect => self.reader.read_data_vec(len).map(SegmentRead::Collected),
            Segment::Buffer => self
                .reader
                .read_data(self.phase.segment_buffer())
                .map(|()| SegmentRead::Done),
        };
        let read = match read {
            Ok(read) => read,
            Err(ReadError::DataDigest) => SegmentRead::DigestError,
            Err(e) => return Err(e.into()),
        };
        self.phase.handle_segment(Instant::now(), read);
        Ok(())
    }

    /// Sends what the phase queued and runs its work, until neither is left.
    fn drain(&mut self) -> Result<(), Ending> {
        loop {
            self.send_queued()?;
            let Some(work) = self.phase.poll_work() else {
                return Ok(());
            };
            match work {
                Work::Execute(job) => {
                    let reader = &self.reader;
                    self.dispatcher.run(job, || reader.more_waiting());
                }
                Work::Quiesce { task, reset } => {
                    // Nothing held waits behind a wait for other threads.
                    self.session.writer.release()?;
                    self.session.wait_executing(task);
                    if let (Some(kind), Some(scsi)) = (reset, &self.session.scsi) {
                        scsi.reset(kind, &self.session.nexus);
                    }
                    self.phase.quiesced();
                }
            }
        }
    }

    /// Sends every queued PDU in one batch (R2Ts for several bursts go together).
    fn send_queued(&mut self) -> Result<(), Ending> {
        let mut transmits = Vec::new();
        while let Some(transmit) = self.phase.poll_transmit() {
            transmits.push(transmit);
        }
        if transmits.is_empty() {
            return Ok(());
        }
        let headers: Vec<_> = transmits
            .iter()
            .map(|t| t.pdu.encode(t.data.len() as u32))
            .collect();
        let mut outgoing: Vec<Outgoing<'_>> = transmits
            .iter()
            .zip(&headers)
            .map(|(t, header)| Outgoing {
                bhs: header.bhs,
                ahs: &header.ahs,
                stat_sn: t.stat_sn,
                data: &t.data,
            })
            .collect();
        self.session
            .writer
            .send_all(&mut outgoing, &*self.session)?;
        Ok(())
    }
}
