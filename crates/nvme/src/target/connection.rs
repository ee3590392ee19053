//! One connection (one queue): the ICReq/ICResp exchange, then PDUs in a loop.
//! Commands with data beyond the capsule get an R2T and wait for their H2CData;
//! device work goes through the request engine; a malformed PDU gets a
//! C2HTermReq and ends this connection only.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use blockwire_blockdev::IoBuf;
use blockwire_engine::{Engine, EngineConfig};

use super::io::{self, Answer};
use super::writer::Writer;
use super::{SessionGuard, Shared};
use crate::controller::{Action, Queue};
use crate::cqe::{Cqe, Status};
use crate::data_read::{read_data, READ_BUFFER};
use crate::pdu::{
    self, fes, CapsuleCmd, Digests, Framing, IcResp, Pdu, PduError, PduType, TermReq,
    COMMON_HEADER_LEN, R2T, TERM_REQ_MAX_DATA,
};
use crate::sqe::{Direction, Sqe};

/// Why the connection ends.
enum End {
    /// The host closed it, or the socket failed.
    Closed,
    /// The host sent something the transport cannot go on from.
    Fatal { fes: u16, fei: u32, header: Vec<u8> },
}

fn fatal(fes: u16, fei: u32, header: &[u8]) -> End {
    End::Fatal {
        fes,
        fei,
        header: header[..header.len().min(TERM_REQ_MAX_DATA)].to_vec(),
    }
}

/// A write waiting for its data (sent for by one R2T covering all of it).
struct PendingWrite {
    sqe: Sqe,
    /// Not zeroed: it goes to the device only once the host has filled all of it.
    data: IoBuf,
    received: usize,
}

/// Serves one connection until it ends.
pub(crate) fn serve(stream: TcpStream, id: u64, shared: Arc<Shared>, discovery_port: bool) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(shared.config.send_timeout));
    // Until the queue is connected; reads block without limit after that (the
    // keep-alive watchdog watches connected controllers).
    let _ = stream.set_read_timeout(Some(shared.config.connect_timeout));
    let local = stream.local_addr().ok();
    let peer = stream.peer_addr().ok();
    let write_half = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("NVMe/TCP: cannot clone a socket: {e}");
            return;
        }
    };
    let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
    let framing = match handshake(&mut reader, &write_half, &shared) {
        Ok(framing) => framing,
        Err(End::Closed) => return,
        Err(End::Fatal { fes, fei, header }) => {
            let writer = Writer::new(write_half, Framing::default());
            terminate(&writer, fes, fei, header);
            return;
        }
    };
    let writer = Arc::new(Writer::new(write_half, framing));
    let mut conn = Connection {
        queue: Queue::new(shared.core.clone(), local, discovery_port),
        shared: shared.clone(),
        id,
        writer: writer.clone(),
        engine: Engine::new(EngineConfig::default()),
        framing,
        pending: HashMap::new(),
        session: None,
    };
    let end = conn.read_loop(&mut reader);
    if let End::Fatal { fes, fei, header } = end {
        tracing::warn!(
            ?peer,
            fes,
            fei,
            "NVMe/TCP: malformed PDU; closing the connection"
        );
        terminate(&writer, fes, fei, header);
    }
    // Answers still on workers go out (or fail) before the queue, and with it an
    // admin queue's controller, goes.
    conn.engine.wait_idle();
    if let Some(controller) = conn.queue.controller() {
        if conn.queue.qid() == Some(0) {
            tracing::info!(cntlid = controller.cntlid, "NVMe controller disconnected");
        }
    }
}

fn terminate(writer: &Writer, fes: u16, fei: u32, header: Vec<u8>) {
    let _ = writer.send(&[Pdu::C2HTermReq(TermReq {
        fes,
        fei,
        data: header,
    })]);
}

/// Reads one PDU into `buf`; `Ok(None)` at a clean end of the stream.
fn read_pdu(
    reader: &mut impl Read,
    framing: &Framing,
    buf: &mut Vec<u8>,
) -> Result<Option<Pdu>, End> {
    read_common_header(reader, buf)?;
    read_rest(reader, framing, buf)
}

/// Reads the 8-byte common header into `buf`.
fn read_common_header(reader: &mut impl Read, buf: &mut Vec<u8>) -> Result<(), End> {
    buf.resize(COMMON_HEADER_LEN, 0);
    reader
        .read_exact(&mut buf[..COMMON_HEADER_LEN])
        .map_err(|_| End::Closed)
}

/// Reads the rest of the PDU whose common header `buf` holds, and decodes it.
fn read_rest(
    reader: &mut impl Read,
    framing: &Framing,
    buf: &mut Vec<u8>,
) -> Result<Option<Pdu>, End> {
    let plen = match pdu::pdu_len(buf, framing) {
        Ok(plen) => plen,
        Err(e) => return Err(fatal(e.fes(), e.fei(), buf)),
    };
    buf.resize(plen, 0);
    if reader.read_exact(&mut buf[COMMON_HEADER_LEN..]).is_err() {
        return Err(End::Closed);
    }
    match pdu::decode(buf, framing) {
        Ok(Some((pdu, _))) => Ok(Some(pdu)),
        Ok(None) => Err(fatal(fes::INVALID_PDU_HEADER_FIELD, 4, buf)),
        Err(PduError::DataDigest { cccid, .. }) => data_digest_mismatch(cccid),
        Err(e) => Err(fatal(e.fes(), e.fei(), buf)),
    }
}

/// The framing is intact but the data is not what the host sent: as Linux nvmet
/// does, the connection ends (the host reconnects and retries).
fn data_digest_mismatch<T>(cccid: u16) -> Result<T, End> {
    tracing::warn!(cccid, "NVMe/TCP: data digest mismatch; closing");
    Err(End::Closed)
}

/// ICReq in, ICResp out: the digests the host asked for, our MAXH2CDATA.
fn handshake(
    reader: &mut impl Read,
    write_half: &TcpStream,
    shared: &Shared,
) -> Result<Framing, End> {
    let mut buf = Vec::new();
    let initial = Framing::default();
    let icreq = match read_pdu(reader, &initial, &mut buf)? {
        Some(Pdu::IcReq(icreq)) => icreq,
        Some(_) => return Err(fatal(fes::PDU_SEQUENCE_ERROR, 0, &buf)),
        None => return Err(End::Closed),
    };
    if icreq.pfv != 0 {
        return Err(fatal(fes::UNSUPPORTED_PARAMETER, 8, &buf));
    }
    // HPDA is at most 31 (128-byte alignment).
    if icreq.hpda > 31 {
        return Err(fatal(fes::UNSUPPORTED_PARAMETER, 10, &buf));
    }
    let digests = Digests {
        header: icreq.digests.header,
        data: icreq.digests.data,
    };
    let icresp = Pdu::IcResp(IcResp {
        pfv: 0,
        cpda: 0,
        digests,
        maxh2cdata: shared.config.maxh2cdata,
    });
    let writer = Writer::new(write_half.try_clone().map_err(|_| End::Closed)?, initial);
    writer.send(&[icresp]).map_err(|_| End::Closed)?;
    Ok(Framing {
        digests,
        send_pda: icreq.hpda,
        max_pdu_len: shared.max_pdu_len(),
    })
}

struct Connection {
    queue: Queue,
    shared: Arc<Shared>,
    id: u64,
    writer: Arc<Writer>,
    engine: io::NvmeEngine,
    framing: Framing,
    /// Writes waiting for H2CData, by command ID (also their R2T's transfer tag).
    pending: HashMap<u16, PendingWrite>,
    session: Option<SessionGuard>,
}

impl Connection {
    fn read_loop(&mut self, reader: &mut BufReader<TcpStream>) -> End {
        let mut buf = Vec::new();
        loop {
            // Answers held back for the burst leave before a read that may block.
            self.flush_unless_buffered(reader, COMMON_HEADER_LEN);
            if let Err(end) = read_common_header(reader, &mut buf) {
                return end;
            }
            if let Ok(plen) = pdu::pdu_len(&buf, &self.framing) {
                self.flush_unless_buffered(reader, plen.saturating_sub(COMMON_HEADER_LEN));
            }
            if buf[0] == PduType::H2CData as u8 {
                // Data goes straight from the socket into its command's buffer.
                match self.h2c_data(reader, &mut buf) {
                    Ok(()) => continue,
                    Err(end) => return end,
                }
            }
            let pdu = match read_rest(reader, &self.framing, &mut buf) {
                Ok(Some(pdu)) => pdu,
                Ok(None) => return End::Closed,
                Err(end) => return end,
            };
            // Writes waiting for their data are more work coming too.
            let more_waiting = !reader.buffer().is_empty() || !self.pending.is_empty();
            let result = match pdu {
                Pdu::CapsuleCmd(capsule) => self.capsule(capsule, more_waiting),
                Pdu::H2CTermReq(term) => {
                    tracing::warn!(
                        fes = term.fes,
                        fei = term.fei,
                        "NVMe/TCP: the host ended the connection"
                    );
                    return End::Closed;
                }
                // Only a host's PDUs may come from a host.
                _ => Err(fatal(fes::INVALID_PDU_HEADER_FIELD, 0, &buf)),
            };
            if let Err(end) = result {
                return end;
            }
        }
    }

    /// Sends the answers held back unless `need` more bytes are already read.
    fn flush_unless_buffered(&self, reader: &BufReader<TcpStream>, need: usize) {
        if reader.buffer().len() < need {
            self.writer.flush();
        }
    }

    fn capsule(&mut self, capsule: CapsuleCmd, more_waiting: bool) -> Result<(), End> {
        let CapsuleCmd { sqe, data } = capsule;
        let sgl = sqe.sgl();
        let direction = sqe.direction();
        let settings = &self.shared.core.settings;
        let refuse = |status: Status| {
            let mut cqe = Cqe::new(sqe.cid(), status);
            cqe.sq_id = self.queue.qid().unwrap_or(0);
            self.queue.record_failure(&sqe, &cqe);
            self.writer.complete(cqe);
            Ok(())
        };
        if !data.is_empty() {
            // In-capsule data: the SGL says so and its length matches.
            if !sgl.is_in_capsule() || sgl.address != 0 {
                return refuse(Status::SGL_DESCRIPTOR_TYPE_INVALID);
            }
            if sgl.length as usize != data.len() || data.len() > settings.inline_data_size as usize
            {
                return refuse(Status::DATA_SGL_LENGTH_INVALID);
            }
            return self.execute(sqe, IoBuf::from(data), more_waiting);
        }
        if direction == Direction::ToController && sgl.length > 0 {
            if sgl.is_in_capsule() {
                return refuse(Status::DATA_SGL_LENGTH_INVALID);
            }
            if !sgl.is_transport() {
                return refuse(Status::SGL_DESCRIPTOR_TYPE_INVALID);
            }
            if sgl.length > settings.max_transfer() {
                return refuse(Status::DATA_SGL_LENGTH_INVALID);
            }
            if self.pending.contains_key(&sqe.cid()) {
                return refuse(Status::CID_CONFLICT);
            }
            if self.pending.len() >= usize::from(self.queue.sq_size()) {
                return Err(fatal(fes::PDU_SEQUENCE_ERROR, 0, &[]));
            }
            // One R2T for all of it; the host splits it by MAXH2CDATA.
            self.pending.insert(
                sqe.cid(),
                PendingWrite {
                    sqe,
                    data: IoBuf::new(sgl.length as usize),
                    received: 0,
                },
            );
            let r2t = Pdu::R2T(R2T {
                cccid: sqe.cid(),
                ttag: sqe.cid(),
                offset: 0,
                length: sgl.length,
            });
            // In a burst, R2Ts leave together (the read loop flushes before
            // it could block).
            let sent = if more_waiting {
                self.writer.send_later(&[r2t])
            } else {
                self.writer.send(&[r2t])
            };
            return sent.map_err(|_| End::Closed);
        }
        if direction == Direction::ToHost && sgl.length > settings.max_transfer() {
            return refuse(Status::DATA_SGL_LENGTH_INVALID);
        }
        self.execute(sqe, IoBuf::new(0), more_waiting)
    }

    /// An H2CData PDU whose common header `buf` holds: its header is checked, then
    /// its data read into the write it answers.
    fn h2c_data(
        &mut self,
        reader: &mut BufReader<TcpStream>,
        buf: &mut Vec<u8>,
    ) -> Result<(), End> {
        if let Err(e) = pdu::pdu_len(buf, &self.framing) {
            return Err(fatal(e.fes(), e.fei(), buf));
        }
        let head_len = pdu::data_header_len(&self.framing);
        buf.resize(head_len, 0);
        reader
            .read_exact(&mut buf[COMMON_HEADER_LEN..])
            .map_err(|_| End::Closed)?;
        let h = pdu::decode_data_header(buf, &self.framing)
            .map_err(|e| fatal(e.fes(), e.fei(), buf))?;
        let header = &buf[..head_len.min(24)];
        let Some(pending) = self.pending.get_mut(&h.cccid) else {
            return Err(fatal(fes::INVALID_PDU_HEADER_FIELD, 8, header));
        };
        if h.ttag != h.cccid {
            return Err(fatal(fes::INVALID_PDU_HEADER_FIELD, 10, header));
        }
        let offset = h.offset as usize;
        let end = offset + h.length as usize;
        if offset != pending.received || end > pending.data.len() {
            return Err(fatal(fes::DATA_OUT_OF_RANGE, 12, header));
        }
        if h.length > self.shared.config.maxh2cdata {
            return Err(fatal(fes::DATA_LIMIT_EXCEEDED, 16, header));
        }
        let complete = end == pending.data.len();
        if complete != h.last {
            return Err(fatal(fes::PDU_SEQUENCE_ERROR, 1, header));
        }
        // Padding up to the data offset, then the data, then its digest.
        let mut skip = [0u8; 256];
        let pad = h.data_at - head_len;
        reader
            .read_exact(&mut skip[..pad])
            .map_err(|_| End::Closed)?;
        let data = &mut pending.data[offset..end];
        read_data(reader, data).map_err(|_| End::Closed)?;
        if h.data_digest {
            let mut digest = [0u8; pdu::DIGEST_LEN];
            reader.read_exact(&mut digest).map_err(|_| End::Closed)?;
            if !pdu::digest::digest_matches(data, &digest) {
                return data_digest_mismatch(h.cccid);
            }
        }
        pending.received = end;
        if complete {
            let pending = self.pending.remove(&h.cccid).expect("present");
            // A write read exactly to its end leaves the buffer empty while the
            // host waits on the other R2Ts: those count as more work coming.
            let more_waiting = !reader.buffer().is_empty() || !self.pending.is_empty();
            return self.execute(pending.sqe, pending.data, more_waiting);
        }
        Ok(())
    }

    fn execute(&mut self, sqe: Sqe, data: IoBuf, more_waiting: bool) -> Result<(), End> {
        let was_connected = self.queue.qid().is_some();
        let answer = Answer {
            transfer_len: if sqe.direction() == Direction::ToHost {
                sqe.sgl().length
            } else {
                0
            },
            sq_flow_control_disabled: self.queue.sq_flow_control_disabled(),
        };
        let action = self.queue.submit(&sqe, data, Instant::now());
        if !was_connected && self.queue.qid().is_some() {
            self.connected();
        }
        let answer = Answer {
            sq_flow_control_disabled: self.queue.sq_flow_control_disabled(),
            ..answer
        };
        match action {
            Action::Complete(reply) => {
                self.writer
                    .reply(reply, answer.transfer_len, answer.sq_flow_control_disabled)
            }
            Action::Deferred => {}
            Action::Io(cmd) => {
                let inline = if more_waiting {
                    io::Inline::Batch
                } else {
                    io::Inline::Send
                };
                io::run(
                    &self.engine,
                    &self.shared.pool,
                    &self.writer,
                    cmd,
                    answer,
                    inline,
                    || more_waiting,
                )
            }
        }
        Ok(())
    }

    /// The queue just connected: the watchdog learns its controller, an admin
    /// queue takes asynchronous events, an I/O queue counts as a session.
    fn connected(&mut self) {
        let Some(controller) = self.queue.controller().cloned() else {
            return;
        };
        if let Err(e) = self.writer.clear_read_timeout() {
            tracing::debug!("NVMe/TCP: cannot clear the connect timeout: {e}");
        }
        self.shared.track_controller(self.id, controller.clone());
        if self.queue.qid() == Some(0) {
            let writer = self.writer.clone();
            controller.set_notifier(Box::new(move |cqe| writer.complete(cqe)));
        } else if let Some(subsystem) = controller.subsystem() {
            // Nothing is in flight yet: the engine may change now.
            if let Some(queue) = io::start_queue(&subsystem.device, &self.writer) {
                self.engine = Engine::new(EngineConfig::default()).with_queue(Some(queue));
            }
            if let Some(meter) = &self.shared.config.sessions {
                self.session = Some(SessionGuard::open(meter.clone(), subsystem.name.clone()));
            }
        }
    }
}
