//! One NVMe/TCP connection of the initiator: one queue (admin or I/O). Commands
//! go out with a command ID from the queue's free list; a reader thread matches
//! what comes back (CapsuleResp, C2HData, R2T) to them, answers R2Ts with
//! H2CData, and hands each finished command to its sink. A submitter writes
//! its capsule itself when the socket is free; the reader sends H2CData itself
//! only as far as the socket takes it without waiting; everything else (the
//! rest of such H2CData, and capsules that find the socket busy) goes through a
//! writer thread (send.rs), so the reader never blocks on a full socket while the
//! target blocks on ours.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use blockwire_blockdev::IoBuf;

use super::error::InitiatorError;
use super::frame::{
    h2c_data_len, h2c_head, parse_c2h_header, put_capsule, write_h2c_data, C2HHeader,
    DATA_HEADER_LEN,
};
use super::send::{send_without_waiting, write_loop, Link, Outgoing, SharedFrame};
use crate::cqe::{Cqe, Status};
use crate::data_read::{read_data, READ_BUFFER};
use crate::pdu::digest::digest_matches;
use crate::pdu::{
    decode, pdu_len, Digests, Framing, IcReq, Pdu, PduType, COMMON_HEADER_LEN, DIGEST_LEN,
};
use crate::sqe::{Direction, SglDescriptor, Sqe};

/// A command's data: what a write sends, or the space a read fills.
#[derive(Debug)]
pub(crate) enum Payload {
    None,
    Owned(Vec<u8>),
    Io(IoBuf),
    /// A write's data while R2Ts are answered from it: the writer thread sends
    /// H2CData straight from the buffer, holding it meanwhile.
    Shared(Arc<IoBuf>),
}

impl Payload {
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Owned(v) => v,
            Payload::Io(b) => b,
            Payload::Shared(b) => b,
        }
    }

    /// Reads fill this; a shared buffer (a write's) is never filled.
    fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Payload::None => &mut [],
            Payload::Owned(v) => v,
            Payload::Io(b) => b,
            Payload::Shared(b) => Arc::get_mut(b).map_or(&mut [][..], |b| &mut b[..]),
        }
    }

    /// The payload as the buffer a request queue hands back.
    pub fn into_iobuf(self) -> IoBuf {
        match self {
            Payload::Io(b) => b,
            // The writer thread has let go of it unless the connection failed
            // in the middle of a send; then the data is copied.
            Payload::Shared(b) => Arc::try_unwrap(b).unwrap_or_else(|b| IoBuf::from_slice(&b)),
            _ => IoBuf::new(0),
        }
    }
}

/// The connection ended before the command was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lost;

/// A finished command.
#[derive(Debug)]
pub(crate) struct Done {
    pub tag: u64,
    pub result: Result<Cqe, Lost>,
    pub payload: Payload,
}

/// Where a finished command goes (called on the reader thread).
pub(crate) type Sink = Arc<dyn Fn(Done) + Send + Sync>;

struct Pending {
    tag: u64,
    payload: Payload,
    sink: Sink,
    direction: Direction,
}

struct Table {
    free: Vec<u16>,
    pending: HashMap<u16, Pending>,
    dead: bool,
}

/// What ICReq/ICResp settled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Negotiated {
    pub framing: Framing,
    pub maxh2cdata: u32,
}

/// One queue's TCP connection.
pub(crate) struct Connection {
    pub address: String,
    pub negotiated: Negotiated,
    /// Writes up to this many bytes travel in the command capsule.
    inline_max: usize,
    table: Mutex<Table>,
    freed: Condvar,
    /// Submitters waiting on `freed` for a command ID, counted under the
    /// table's lock: the reader notifies only when there is one (a notify is a
    /// system call, and every answer frees an ID).
    freed_waiters: AtomicUsize,
    /// PDUs the reader thread sends (H2CData), for the writer thread.
    out: Sender<Outgoing>,
    /// The socket's sending side: submitters write capsules to it directly,
    /// the writer thread its queue.
    sending: Arc<Mutex<Link>>,
    stream: TcpStream,
}

fn io_error(address: &str) -> impl Fn(std::io::Error) -> InitiatorError + '_ {
    move |source| InitiatorError::Io {
        address: address.to_owned(),
        source,
    }
}

/// Connects to `address`, trying each address it resolves to.
fn dial(address: &str, timeout: Duration) -> Result<TcpStream, InitiatorError> {
    let mut last = None;
    for addr in address.to_socket_addrs().map_err(io_error(address))? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(io_error(address)(last.unwrap_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
    })))
}

/// Reads one whole PDU into `buf` and decodes it.
fn read_pdu(
    reader: &mut impl Read,
    buf: &mut Vec<u8>,
    framing: &Framing,
) -> std::io::Result<Result<Pdu, crate::PduError>> {
    buf.resize(COMMON_HEADER_LEN, 0);
    reader.read_exact(buf)?;
    let len = match pdu_len(buf, framing) {
        Ok(len) => len,
        Err(e) => return Ok(Err(e)),
    };
    buf.resize(len.max(COMMON_HEADER_LEN), 0);
    reader.read_exact(&mut buf[COMMON_HEADER_LEN..])?;
    Ok(match decode(buf, framing) {
        Ok(Some((pdu, _))) => Ok(pdu),
        Ok(None) => Err(crate::PduError::Truncated),
        Err(e) => Err(e),
    })
}

impl Connection {
    /// Connects, exchanges ICReq/ICResp asking for `digests`, and starts the
    /// reader and writer threads. `depth`: commands in flight at most.
    /// `max_pdu_len`: the largest PDU accepted from the target.
    pub fn open(
        address: &str,
        digests: Digests,
        depth: u16,
        inline_max: usize,
        max_pdu_len: u32,
        timeout: Duration,
    ) -> Result<Arc<Connection>, InitiatorError> {
        let failed = io_error(address);
        let mut stream = dial(address, timeout)?;
        stream.set_nodelay(true).map_err(&failed)?;
        stream.set_read_timeout(Some(timeout)).map_err(&failed)?;
        let request = Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        });
        stream
            .write_all(&request.to_bytes(&Framing::default()))
            .map_err(&failed)?;
        let mut buf = Vec::new();
        let protocol = |reason: String| InitiatorError::Protocol {
            address: address.to_owned(),
            reason,
        };
        let resp = match read_pdu(&mut stream, &mut buf, &Framing::default()).map_err(&failed)? {
            Ok(Pdu::IcResp(resp)) => resp,
            Ok(Pdu::C2HTermReq(t)) => {
                return Err(protocol(format!(
                    "the target refused the connection (fatal error status {:#x})",
                    t.fes
                )))
            }
            Ok(other) => {
                return Err(protocol(format!(
                    "expected ICResp, got {:?}",
                    other.pdu_type()
                )))
            }
            Err(e) => return Err(protocol(format!("bad ICResp: {e}"))),
        };
        if resp.pfv != 0 || resp.maxh2cdata < crate::pdu::MIN_MAXH2CDATA || resp.cpda > 31 {
            return Err(protocol(format!("unusable ICResp {resp:?}")));
        }
        // The target may grant fewer digests than asked, never more.
        if (resp.digests.header && !digests.header) || (resp.digests.data && !digests.data) {
            return Err(protocol(
                "the target turned on digests not asked for".into(),
            ));
        }
        stream.set_read_timeout(None).map_err(&failed)?;
        let negotiated = Negotiated {
            framing: Framing {
                digests: resp.digests,
                send_pda: resp.cpda,
                max_pdu_len,
            },
            maxh2cdata: resp.maxh2cdata,
        };
        let (out, queued) = mpsc::channel();
        let sending = Arc::new(Mutex::new(Link::new(stream.try_clone().map_err(&failed)?)));
        let writer = sending.clone();
        let reader = stream.try_clone().map_err(&failed)?;
        let connection = Arc::new(Connection {
            address: address.to_owned(),
            negotiated,
            inline_max,
            table: Mutex::new(Table {
                free: (0..depth.max(1)).rev().collect(),
                pending: HashMap::new(),
                dead: false,
            }),
            freed: Condvar::new(),
            freed_waiters: AtomicUsize::new(0),
            out,
            sending,
            stream,
        });
        std::thread::Builder::new()
            .name("nvme-tcp-send".into())
            .spawn(move || write_loop(writer, queued))
            .map_err(&failed)?;
        let reading = connection.clone();
        std::thread::Builder::new()
            .name("nvme-tcp-recv".into())
            .spawn(move || reading.read_loop(reader))
            .map_err(&failed)?;
        Ok(connection)
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commands sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.lock().pending.len()
    }

    /// Whether the connection has ended.
    pub fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Sends `sqe` (its command ID and data pointer are filled here) with
    /// `payload`; waits while every command ID is in use. The answer, or
    /// [`Lost`], goes to `sink` with `tag`.
    pub fn submit(&self, sqe: Sqe, payload: Payload, tag: u64, sink: Sink) {
        let mut capsules = Vec::new();
        self.enqueue(sqe, payload, tag, sink, &mut capsules);
        self.send_capsules(&mut capsules);
    }

    /// Registers `sqe` with `payload` as [`submit`](Self::submit) does, but
    /// appends its capsule to `capsules` instead of sending it: a request queue
    /// sends what it gathered in one write ([`send_capsules`](Self::send_capsules)).
    /// While every command ID is in use, the capsules gathered so far are sent
    /// first (the answers that free an ID may be waiting for them).
    pub fn enqueue(
        &self,
        mut sqe: Sqe,
        mut payload: Payload,
        tag: u64,
        sink: Sink,
        capsules: &mut Vec<u8>,
    ) {
        let direction = sqe.direction();
        let mut table = self.lock();
        let cid = loop {
            if table.dead {
                drop(table);
                sink(Done {
                    tag,
                    result: Err(Lost),
                    payload,
                });
                return;
            }
            if let Some(cid) = table.free.pop() {
                break cid;
            }
            if !capsules.is_empty() {
                drop(table);
                self.send_capsules(capsules);
                table = self.lock();
                continue;
            }
            self.freed_waiters.fetch_add(1, Ordering::Relaxed);
            table = self.freed.wait(table).unwrap_or_else(|e| e.into_inner());
            self.freed_waiters.fetch_sub(1, Ordering::Relaxed);
        };
        sqe.set_cid(cid);
        let len = payload.len();
        let in_capsule = direction == Direction::ToController && len > 0 && len <= self.inline_max
            || sqe.opcode() == crate::opcodes::admin::FABRICS;
        if in_capsule {
            sqe.set_sgl(SglDescriptor::in_capsule(len as u32));
            put_capsule(capsules, &self.negotiated.framing, &sqe, payload.as_slice());
        } else {
            sqe.set_sgl(SglDescriptor::transport(len as u32));
            put_capsule(capsules, &self.negotiated.framing, &sqe, &[]);
            if direction == Direction::ToController {
                if let Payload::Io(buf) = payload {
                    payload = Payload::Shared(Arc::new(buf));
                }
            }
        }
        // Once in the table, a fatal error (which drains it) answers the
        // command even if its capsule is never sent.
        table.pending.insert(
            cid,
            Pending {
                tag,
                payload,
                sink,
                direction,
            },
        );
    }

    /// Sends the capsules [`enqueue`](Self::enqueue) gathered, and empties
    /// `capsules`: written here when the socket is free, otherwise queued for
    /// the writer thread, which gathers what piles up into fewer writes.
    pub fn send_capsules(&self, capsules: &mut Vec<u8>) {
        if capsules.is_empty() {
            return;
        }
        let link = match self.sending.try_lock() {
            Ok(link) => Some(link),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        // A link with H2CData still to finish is the writer thread's.
        let written = match link.filter(|link| link.free()) {
            Some(mut link) => link.stream.write_all(capsules),
            None => self
                .out
                .send(Outgoing::Bytes(std::mem::take(capsules)))
                .map_err(|_| std::io::Error::other("the sending thread is gone")),
        };
        capsules.clear();
        if written.is_err() {
            self.fail();
        }
    }

    /// Sends `sqe` and waits for its answer (at most `timeout`, after which the
    /// connection is closed: a command stuck on it leaves it unusable).
    pub fn call(
        &self,
        sqe: Sqe,
        payload: Payload,
        timeout: Option<Duration>,
    ) -> (Result<Cqe, Lost>, Payload) {
        let (tx, rx) = mpsc::sync_channel(1);
        let sink: Sink = Arc::new(move |done: Done| {
            let _ = tx.send(done);
        });
        self.submit(sqe, payload, 0, sink);
        let done = match timeout {
            Some(t) => rx.recv_timeout(t).ok(),
            None => rx.recv().ok(),
        };
        match done {
            Some(done) => (done.result, done.payload),
            None => {
                self.close();
                (Err(Lost), Payload::None)
            }
        }
    }

    /// Ends the connection: commands in flight fail with [`Lost`].
    pub fn close(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Marks the connection dead and fails everything in flight.
    fn fail(&self) {
        self.close();
        let pending: Vec<Pending> = {
            let mut table = self.lock();
            table.dead = true;
            table.pending.drain().map(|(_, p)| p).collect()
        };
        self.freed.notify_all();
        for p in pending {
            (p.sink)(Done {
                tag: p.tag,
                result: Err(Lost),
                payload: p.payload,
            });
        }
    }

    fn read_loop(self: Arc<Connection>, stream: TcpStream) {
        let mut reader = BufReader::with_capacity(READ_BUFFER, stream);
        let mut buf = Vec::new();
        let mut gathered = Gathered::default();
        loop {
            if reader.buffer().len() < COMMON_HEADER_LEN {
                // The next read may wait for the network: what is done goes now.
                gathered.flush();
            }
            if let Err(reason) = self.read_one(&mut reader, &mut buf, &mut gathered) {
                tracing::debug!("NVMe/TCP {}: connection ended: {reason}", self.address);
                break;
            }
        }
        gathered.flush();
        self.fail();
    }

    /// Reads and acts on one PDU; an error ends the connection. C2HData data is
    /// read straight into its command's buffer, everything else through the
    /// codec.
    fn read_one<R: Read>(
        &self,
        reader: &mut BufReader<R>,
        buf: &mut Vec<u8>,
        gathered: &mut Gathered,
    ) -> Result<(), String> {
        let framing = &self.negotiated.framing;
        let io = |e: std::io::Error| e.to_string();
        buf.resize(COMMON_HEADER_LEN, 0);
        reader.read_exact(buf).map_err(io)?;
        let len = pdu_len(buf, framing).map_err(|e| format!("bad PDU from the target: {e}"))?;
        if buf[0] == PduType::C2HData as u8 {
            let hdgst = if framing.digests.header {
                DIGEST_LEN
            } else {
                0
            };
            buf.resize(DATA_HEADER_LEN + hdgst, 0);
            reader
                .read_exact(&mut buf[COMMON_HEADER_LEN..])
                .map_err(io)?;
            let header = parse_c2h_header(buf, framing)?;
            return self.receive_c2h(reader, header, buf, gathered);
        }
        buf.resize(len.max(COMMON_HEADER_LEN), 0);
        reader
            .read_exact(&mut buf[COMMON_HEADER_LEN..])
            .map_err(io)?;
        match decode(buf, framing) {
            Ok(Some((pdu, _))) => self.handle(pdu, gathered),
            Ok(None) => Err("truncated PDU".into()),
            Err(e) => Err(format!("bad PDU from the target: {e}")),
        }
    }

    /// Reads a C2HData's data into its command's buffer (taken out of the
    /// table meanwhile, so submitters are not held up by the socket).
    fn receive_c2h<R: Read>(
        &self,
        reader: &mut BufReader<R>,
        header: C2HHeader,
        scratch: &mut Vec<u8>,
        gathered: &mut Gathered,
    ) -> Result<(), String> {
        let io = |e: std::io::Error| e.to_string();
        scratch.resize(header.padding, 0);
        reader.read_exact(scratch).map_err(io)?;
        let cid = header.cccid;
        let start = header.offset as usize;
        let end = start.saturating_add(header.len as usize);
        let mut payload = {
            let mut table = self.lock();
            let pending = table
                .pending
                .get_mut(&cid)
                .ok_or_else(|| format!("C2HData for unknown command {cid}"))?;
            if pending.direction != Direction::ToHost || end > pending.payload.len() {
                return Err(format!(
                    "C2HData {start}..{end} outside command {cid}'s buffer"
                ));
            }
            std::mem::replace(&mut pending.payload, Payload::None)
        };
        let mut result = read_data(reader, &mut payload.as_mut_slice()[start..end]).map_err(io);
        if result.is_ok() && header.data_digest {
            let mut stored = [0u8; DIGEST_LEN];
            result = reader.read_exact(&mut stored).map_err(io).and_then(|()| {
                if digest_matches(&payload.as_slice()[start..end], &stored) {
                    Ok(())
                } else {
                    Err(format!("C2HData data digest mismatch for command {cid}"))
                }
            });
        }
        if let Some(pending) = self.lock().pending.get_mut(&cid) {
            pending.payload = payload;
        }
        result?;
        if header.success {
            return self.finish(cid, Cqe::new(cid, Status::SUCCESS), gathered);
        }
        Ok(())
    }

    /// Acts on one PDU from the target; an error ends the connection.
    fn handle(&self, pdu: Pdu, gathered: &mut Gathered) -> Result<(), String> {
        match pdu {
            Pdu::CapsuleResp(resp) => self.finish(resp.cqe.cid, resp.cqe, gathered),
            Pdu::R2T(r2t) => {
                let table = self.lock();
                let pending = table
                    .pending
                    .get(&r2t.cccid)
                    .ok_or_else(|| format!("R2T for unknown command {}", r2t.cccid))?;
                let data = pending.payload.as_slice();
                let start = r2t.offset as usize;
                let end = start.saturating_add(r2t.length as usize);
                if pending.direction != Direction::ToController || end > data.len() || start == end
                {
                    return Err(format!(
                        "R2T {start}..{end} outside command {}'s data",
                        r2t.cccid
                    ));
                }
                let framing = &self.negotiated.framing;
                let chunk = self.negotiated.maxh2cdata as usize;
                let pieces: Vec<(usize, usize)> = (start..end)
                    .step_by(chunk)
                    .map(|at| (at, (at + chunk).min(end)))
                    .collect();
                let outgoing = if let Payload::Shared(shared) = &pending.payload {
                    // Headers here, data straight from the command's buffer.
                    let frames = pieces
                        .iter()
                        .map(|&(at, stop)| {
                            let (head, digest) = h2c_head(
                                framing,
                                r2t.cccid,
                                r2t.ttag,
                                at as u32,
                                stop == end,
                                &data[at..stop],
                            );
                            SharedFrame {
                                head,
                                data: at..stop,
                                digest,
                            }
                        })
                        .collect();
                    Outgoing::Shared {
                        buf: shared.clone(),
                        frames,
                    }
                } else {
                    // Every H2CData of this R2T in one pooled buffer: a fresh
                    // allocation of this size costs more than the copy.
                    let total = pieces
                        .iter()
                        .map(|&(at, stop)| h2c_data_len(framing, stop - at))
                        .sum();
                    let mut bytes = IoBuf::new(total);
                    let mut used = 0;
                    for &(at, stop) in &pieces {
                        used += write_h2c_data(
                            &mut bytes[used..],
                            framing,
                            r2t.cccid,
                            r2t.ttag,
                            at as u32,
                            stop == end,
                            &data[at..stop],
                        );
                    }
                    Outgoing::Pooled(bytes)
                };
                drop(table);
                let gone = |_| "the sending thread is gone".to_string();
                match send_without_waiting(&self.sending, outgoing) {
                    // On the wire.
                    Ok(Ok(false)) => Ok(()),
                    // The writer thread finishes it.
                    Ok(Ok(true)) => self.out.send(Outgoing::Resume).map_err(gone),
                    Ok(Err(outgoing)) => self.out.send(outgoing).map_err(gone),
                    Err(e) => Err(format!("sending H2CData failed: {e}")),
                }
            }
            Pdu::C2HTermReq(t) => Err(format!(
                "the target ended the connection (fatal error status {:#x}, information {:#x})",
                t.fes, t.fei
            )),
            other => Err(format!("unexpected {:?} from the target", other.pdu_type())),
        }
    }

    /// Frees the command's ID and gathers its answer for its sink.
    fn finish(&self, cid: u16, cqe: Cqe, gathered: &mut Gathered) -> Result<(), String> {
        let (pending, waiters) = {
            let mut table = self.lock();
            let pending = table
                .pending
                .remove(&cid)
                .ok_or_else(|| format!("completion for unknown command {cid}"))?;
            table.free.push(cid);
            // Read under the lock waiters count themselves in under: no
            // wake-up is lost.
            (pending, self.freed_waiters.load(Ordering::Relaxed))
        };
        if waiters > 0 {
            self.freed.notify_one();
        }
        gathered.0.push((
            pending.sink,
            Done {
                tag: pending.tag,
                result: Ok(cqe),
                payload: pending.payload,
            },
        ));
        Ok(())
    }
}

/// Answers the reader thread has read but not yet handed to their sinks: they
/// go together once everything that arrived has been read, so a queue's thread
/// wakes once per burst instead of once per command. Handed over by
/// [`flush`](Gathered::flush), and when dropped.
#[derive(Default)]
struct Gathered(Vec<(Sink, Done)>);

impl Gathered {
    fn flush(&mut self) {
        for (sink, done) in self.0.drain(..) {
            sink(done);
        }
    }
}

impl Drop for Gathered {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;
