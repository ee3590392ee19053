//! The sending half of a connection: PDUs framed with the negotiated digests and
//! alignment. Answers come from the connection thread, workers, the queue thread
//! and asynchronous events: each is queued whole, and whoever finds the socket
//! free sends everything queued in one vectored write (a read's data straight
//! from its buffer), checking the queue again after letting go. So no thread
//! sleeps on the socket while another sends, PDUs never interleave, and answers
//! that finish together leave together.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use blockwire_blockdev::IoBuf;

use crate::controller::Reply;
use crate::cqe::Cqe;
use crate::pdu::digest::{append_digest, crc32c};
use crate::pdu::{align_up, flags, CapsuleResp, CommonHeader, Framing, Pdu, PduType, DIGEST_LEN};

/// Answers the connection thread holds back while it has more commands to read
/// are sent once they reach this many bytes ...
const BATCH_BYTES: usize = 256 * 1024;
/// ... or this many answers.
const BATCH_FRAMES: usize = 64;
/// Buffers per vectored write (Linux takes at most 1024).
const MAX_PARTS: usize = 512;

pub(crate) struct Writer {
    sink: Mutex<Sending>,
    queued: Mutex<Queue>,
    /// A send failed: the connection is over and later answers are dropped.
    broken: AtomicBool,
    framing: Framing,
}

/// What the thread holding the socket uses.
struct Sending {
    stream: TcpStream,
    /// The frames being sent, swapped with the queue's (keeps the allocation).
    batch: Vec<Frame>,
}

/// Frames waiting for the socket.
#[derive(Default)]
struct Queue {
    frames: Vec<Frame>,
    bytes: usize,
}

/// Whole PDUs ready to go: encoded bytes, then a read's data (borrowed from
/// the device's buffer, not copied) and what follows it.
struct Frame {
    head: Vec<u8>,
    data: Option<IoBuf>,
    tail: Vec<u8>,
}

impl Frame {
    fn len(&self) -> usize {
        self.head.len() + self.data.as_ref().map_or(0, |d| d.len()) + self.tail.len()
    }
}

impl Writer {
    pub fn new(stream: TcpStream, framing: Framing) -> Writer {
        Writer {
            sink: Mutex::new(Sending {
                stream,
                batch: Vec::new(),
            }),
            queued: Mutex::new(Queue::default()),
            broken: AtomicBool::new(false),
            framing,
        }
    }

    /// Lets reads on the socket (a clone shares its options) wait without limit.
    pub fn clear_read_timeout(&self) -> std::io::Result<()> {
        lock(&self.sink).stream.set_read_timeout(None)
    }

    /// Sends `pdus`, behind whatever is queued. An error: the connection failed.
    pub fn send(&self, pdus: &[Pdu]) -> std::io::Result<()> {
        let mut head = Vec::with_capacity(pdus.iter().map(|p| p.data().len() + 96).sum());
        for pdu in pdus {
            pdu.encode(&self.framing, &mut head);
        }
        self.push(Frame {
            head,
            data: None,
            tail: Vec::new(),
        });
        self.send_queued();
        self.health()
    }

    /// Sends a completion: for a successful command with data for the host,
    /// C2HData first (at most `transfer_len` bytes, what the host's SGL asked
    /// for), standing for the completion too when the host disabled SQ flow
    /// control.
    pub fn reply(&self, reply: Reply, transfer_len: u32, sq_flow_control_disabled: bool) {
        self.push(self.reply_frame(reply, transfer_len, sq_flow_control_disabled));
        self.send_queued();
    }

    /// [`reply`](Self::reply) from the connection thread while more commands
    /// wait to be read: the answer waits in the queue, to leave with the others
    /// of the burst, until [`flush`](Self::flush) (or a batch is full).
    pub fn reply_later(&self, reply: Reply, transfer_len: u32, sq_flow_control_disabled: bool) {
        let full = self.push(self.reply_frame(reply, transfer_len, sq_flow_control_disabled));
        if full {
            self.send_queued();
        }
    }

    /// Sends whatever is queued.
    pub fn flush(&self) {
        if !lock(&self.queued).frames.is_empty() {
            self.send_queued();
        }
    }

    /// Sends a completion with no data.
    pub fn complete(&self, cqe: Cqe) {
        if let Err(e) = self.send(&[Pdu::CapsuleResp(CapsuleResp { cqe })]) {
            tracing::debug!("NVMe/TCP: cannot send a completion: {e}");
        }
    }

    fn reply_frame(
        &self,
        reply: Reply,
        transfer_len: u32,
        sq_flow_control_disabled: bool,
    ) -> Frame {
        let Reply { cqe, mut data } = reply;
        let resp = Pdu::CapsuleResp(CapsuleResp { cqe });
        let mut head = Vec::with_capacity(64);
        let mut tail = Vec::new();
        if !(cqe.status.is_success() && !data.is_empty() && transfer_len > 0) {
            resp.encode(&self.framing, &mut head);
            return Frame {
                head,
                data: None,
                tail,
            };
        }
        data.set_len(data.len().min(transfer_len as usize));
        let success = sq_flow_control_disabled && cqe.result == 0;
        let data_pdu = DataPdu {
            cccid: cqe.cid,
            success,
            data: &data,
        };
        if let Some(digest) = data_pdu.encode_head(&self.framing, &mut head) {
            tail.extend_from_slice(&digest);
        }
        if !success {
            resp.encode(&self.framing, &mut tail);
        }
        Frame {
            head,
            data: Some(data),
            tail,
        }
    }

    /// Queues `frame`; true when the queue holds a batch worth sending.
    fn push(&self, frame: Frame) -> bool {
        let mut queued = lock(&self.queued);
        queued.bytes += frame.len();
        queued.frames.push(frame);
        queued.bytes >= BATCH_BYTES || queued.frames.len() >= BATCH_FRAMES
    }

    fn health(&self) -> std::io::Result<()> {
        if self.broken.load(Ordering::Relaxed) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "NVMe/TCP connection already failed",
            ));
        }
        Ok(())
    }

    /// Sends what is queued if the socket is free, until the queue stays empty.
    fn send_queued(&self) {
        loop {
            let mut guard = match self.sink.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                // The holder looks at the queue again after letting go.
                Err(TryLockError::WouldBlock) => return,
            };
            let sending = &mut *guard;
            loop {
                {
                    let mut queued = lock(&self.queued);
                    std::mem::swap(&mut queued.frames, &mut sending.batch);
                    queued.bytes = 0;
                }
                if sending.batch.is_empty() {
                    break;
                }
                if !self.broken.load(Ordering::Relaxed) {
                    if let Err(e) = write_frames(&mut sending.stream, &sending.batch) {
                        tracing::debug!("NVMe/TCP: cannot send: {e}");
                        // A PDU may be half-sent: the connection cannot go on. Its
                        // reader sees the end.
                        self.broken.store(true, Ordering::Relaxed);
                        let _ = sending.stream.shutdown(std::net::Shutdown::Both);
                    }
                }
                // Dropping the frames returns read buffers to their pool.
                sending.batch.clear();
            }
            drop(guard);
            // A frame queued between the last look and letting go found the socket
            // taken and left it to us.
            if lock(&self.queued).frames.is_empty() {
                return;
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `frames` in order, in as few vectored writes as the socket allows.
fn write_frames(out: &mut impl Write, frames: &[Frame]) -> std::io::Result<()> {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(frames.len() * 3);
    for frame in frames {
        parts.push(&frame.head);
        if let Some(data) = &frame.data {
            parts.push(data);
        }
        parts.push(&frame.tail);
    }
    parts.retain(|p| !p.is_empty());
    for chunk in parts.chunks(MAX_PARTS) {
        write_all_vectored(out, chunk)?;
    }
    Ok(())
}

/// The only C2HData PDU of a command (offset 0, LAST set), its data borrowed.
struct DataPdu<'a> {
    cccid: u16,
    /// SUCCESS: the PDU stands for the completion too.
    success: bool,
    data: &'a [u8],
}

impl DataPdu<'_> {
    /// Appends what comes before the data (header, header digest, padding up to
    /// the host's alignment) to `out`; returns the data digest that follows the
    /// data, when the framing has one. The same bytes `Pdu::encode` writes for a
    /// C2HData holding the data, without the data having to be a `Vec`.
    fn encode_head(&self, framing: &Framing, out: &mut Vec<u8>) -> Option<[u8; DIGEST_LEN]> {
        let pdu_type = PduType::C2HData;
        let hlen = pdu_type.header_len();
        let hdgst = framing.digests.header && pdu_type.may_have_header_digest();
        let ddgst = framing.digests.data && pdu_type.may_have_data_digest();
        let after_header = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let data_at = if self.data.is_empty() {
            after_header
        } else {
            align_up(after_header, (usize::from(framing.send_pda) + 1) * 4)
        };
        let ddgst = ddgst && !self.data.is_empty();
        let plen = if self.data.is_empty() {
            after_header
        } else {
            data_at + self.data.len() + if ddgst { DIGEST_LEN } else { 0 }
        };
        let mut pdu_flags = flags::DATA_LAST;
        if self.success {
            pdu_flags |= flags::DATA_SUCCESS;
        }
        if hdgst {
            pdu_flags |= flags::HDGSTF;
        }
        if ddgst {
            pdu_flags |= flags::DDGSTF;
        }
        let start = out.len();
        out.resize(start + hlen, 0);
        let h = &mut out[start..];
        CommonHeader {
            pdu_type: pdu_type as u8,
            flags: pdu_flags,
            hlen: hlen as u8,
            pdo: if self.data.is_empty() {
                0
            } else {
                data_at as u8
            },
            plen: plen as u32,
        }
        .write(h);
        h[8..10].copy_from_slice(&self.cccid.to_le_bytes());
        // Bytes 12..16 hold the data offset: always 0, one PDU carries it all.
        h[16..20].copy_from_slice(&(self.data.len() as u32).to_le_bytes());
        if hdgst {
            append_digest(out, start);
        }
        out.resize(start + data_at, 0);
        ddgst.then(|| crc32c(self.data).to_le_bytes())
    }
}

/// Writes every byte of `parts`, in order, with as few system calls as the socket
/// allows.
fn write_all_vectored(out: &mut impl Write, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut part = 0;
    let mut offset = 0;
    while part < parts.len() {
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&parts[part][offset..])
            .chain(parts[part + 1..].iter().copied())
            .filter(|p| !p.is_empty())
            .map(std::io::IoSlice::new)
            .collect();
        if slices.is_empty() {
            return Ok(());
        }
        let mut written = match out.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while part < parts.len() && written >= parts[part].len() - offset {
            written -= parts[part].len() - offset;
            part += 1;
            offset = 0;
        }
        offset += written;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{write_all_vectored, DataPdu};
    use crate::pdu::{C2HData, Digests, Framing, Pdu};
    use std::io::Write;

    /// Answers from many threads, some sent at once and some held back, all
    /// arrive whole: each C2HData carries its command's data and is followed by
    /// its completion.
    #[test]
    fn answers_from_many_threads_arrive_whole() {
        use crate::controller::Reply;
        use crate::cqe::{Cqe, Status};
        use blockwire_blockdev::IoBuf;
        use std::io::Read;
        use std::sync::Arc;

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let framing = Framing {
            digests: Digests {
                header: true,
                data: true,
            },
            ..Framing::default()
        };
        let writer = Arc::new(super::Writer::new(server, framing));
        const THREADS: u16 = 4;
        const EACH: u16 = 50;
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let writer = writer.clone();
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let cid = t * EACH + i;
                        let len = 512 * (usize::from(cid % 9) + 1);
                        let data = IoBuf::from(vec![cid as u8; len]);
                        let reply = Reply {
                            cqe: Cqe::new(cid, Status::SUCCESS),
                            data,
                        };
                        if i % 3 == 0 {
                            writer.reply_later(reply, len as u32, false);
                        } else {
                            writer.reply(reply, len as u32, false);
                        }
                    }
                    writer.flush();
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        drop(writer);
        let mut bytes = Vec::new();
        let mut client = client;
        client.read_to_end(&mut bytes).unwrap();
        let mut at = 0;
        let mut data_for = None;
        let mut completed = 0;
        while at < bytes.len() {
            let (pdu, used) = crate::pdu::decode(&bytes[at..], &framing).unwrap().unwrap();
            at += used;
            match pdu {
                Pdu::C2HData(d) => {
                    assert!(data_for.is_none(), "data before the last completion");
                    assert!(d.data.iter().all(|&b| b == d.cccid as u8));
                    assert_eq!(d.data.len(), 512 * (usize::from(d.cccid % 9) + 1));
                    data_for = Some(d.cccid);
                }
                Pdu::CapsuleResp(r) => {
                    assert_eq!(data_for.take(), Some(r.cqe.cid));
                    completed += 1;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(completed, THREADS * EACH);
    }

    #[test]
    fn data_pdus_encode_as_the_codec_does() {
        for (header, data, send_pda, len, success) in [
            (false, false, 0, 4096, false),
            (true, true, 0, 4096, true),
            (true, false, 3, 100, false),
            (false, true, 31, 1, true),
            (true, true, 0, 0, false),
        ] {
            let framing = Framing {
                digests: Digests { header, data },
                send_pda,
                ..Framing::default()
            };
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let expected = Pdu::C2HData(C2HData {
                cccid: 0x1234,
                offset: 0,
                last: true,
                success,
                data: bytes.clone(),
            })
            .to_bytes(&framing);
            let pdu = DataPdu {
                cccid: 0x1234,
                success,
                data: &bytes,
            };
            let mut out = Vec::new();
            let digest = pdu.encode_head(&framing, &mut out);
            out.extend_from_slice(&bytes);
            out.extend(digest.into_iter().flatten());
            assert_eq!(
                out, expected,
                "digests {header}/{data}, pda {send_pda}, {len} bytes"
            );
        }
    }

    /// A writer that takes at most `step` bytes per call.
    struct Trickle {
        out: Vec<u8>,
        step: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step);
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn vectored_writes_survive_short_writes() {
        let parts: [&[u8]; 4] = [b"head", b"", b"the data", b"tail"];
        for step in 1..20 {
            let mut w = Trickle {
                out: Vec::new(),
                step,
            };
            write_all_vectored(&mut w, &parts).unwrap();
            assert_eq!(w.out, b"headthe datatail");
        }
    }
}
