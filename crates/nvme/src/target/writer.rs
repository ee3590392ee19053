//! The sending half of a connection: PDUs framed with the negotiated digests and
//! alignment. Answers come from the connection thread, workers, the queue thread
//! and asynchronous events: each is queued whole, and whoever finds the socket
//! free sends everything queued in one vectored write (a read's data straight
//! from its buffer), checking the queue again after letting go. So no thread
//! sleeps on the socket while another sends, PDUs never interleave, and answers
//! that finish together leave together. A read served from the page cache goes
//! from the file's mapping into the socket in the same system call as the
//! headers around it (one copy, made by the kernel).

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use blockwire_blockdev::{Device, IoBuf, MappedRange};

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

/// Whole PDUs ready to go: encoded bytes, then a read's data (not copied) and
/// what follows it.
struct Frame {
    head: Vec<u8>,
    body: Body,
    tail: Vec<u8>,
}

/// A read's data in a frame.
enum Body {
    None,
    /// The device's buffer.
    Buffer(IoBuf),
    /// A range of the device's file mapping, read only by the kernel; the device
    /// is held so that the mapping lives until the frame is sent.
    Mapped {
        range: MappedRange,
        _device: Device,
    },
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::None => 0,
            Body::Buffer(buf) => buf.len(),
            Body::Mapped { range, .. } => range.len(),
        }
    }
}

impl Frame {
    fn len(&self) -> usize {
        self.head.len() + self.body.len() + self.tail.len()
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
        self.push(self.pdus_frame(pdus));
        self.send_queued();
        self.health()
    }

    /// [`send`](Self::send) from the connection thread while more PDUs wait to
    /// be read (an R2T in a burst of writes): queued to leave with the burst's
    /// other answers at the next [`flush`](Self::flush), in one system call.
    pub fn send_later(&self, pdus: &[Pdu]) -> std::io::Result<()> {
        if self.push(self.pdus_frame(pdus)) {
            self.send_queued();
        }
        self.health()
    }

    fn pdus_frame(&self, pdus: &[Pdu]) -> Frame {
        let mut head = Vec::with_capacity(pdus.iter().map(|p| p.data().len() + 96).sum());
        for pdu in pdus {
            pdu.encode(&self.framing, &mut head);
        }
        Frame {
            head,
            body: Body::None,
            tail: Vec::new(),
        }
    }

    /// Whether a read may be sent from the file's mapping: not when a data
    /// digest is due, which would have this process read the mapping (a file
    /// that shrank would kill it with SIGBUS, and a write landing between the
    /// digest and the kernel's copy would send a digest that does not match).
    pub fn sends_mapped(&self) -> bool {
        !self.framing.digests.data
    }

    /// Queues a successful read's completion with its data taken from `range` of
    /// `device`'s mapping ([`sends_mapped`](Self::sends_mapped) must be true), to
    /// leave at the next [`flush`](Self::flush) (or at once when a batch is full
    /// and the socket free).
    pub fn queue_mapped(
        &self,
        cqe: Cqe,
        range: MappedRange,
        device: Device,
        sq_flow_control_disabled: bool,
    ) {
        debug_assert!(self.sends_mapped());
        let success = sq_flow_control_disabled && cqe.result == 0;
        let mut head = Vec::with_capacity(64);
        let mut tail = Vec::new();
        DataPdu {
            cccid: cqe.cid,
            success,
            len: range.len(),
            digest_of: None,
        }
        .encode_head(&self.framing, &mut head);
        if !success {
            Pdu::CapsuleResp(CapsuleResp { cqe }).encode(&self.framing, &mut tail);
        }
        self.push(Frame {
            head,
            body: Body::Mapped {
                range,
                _device: device,
            },
            tail,
        });
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
                body: Body::None,
                tail,
            };
        }
        data.set_len(data.len().min(transfer_len as usize));
        let success = sq_flow_control_disabled && cqe.result == 0;
        let data_pdu = DataPdu {
            cccid: cqe.cid,
            success,
            len: data.len(),
            digest_of: Some(&data),
        };
        if let Some(digest) = data_pdu.encode_head(&self.framing, &mut head) {
            tail.extend_from_slice(&digest);
        }
        if !success {
            resp.encode(&self.framing, &mut tail);
        }
        Frame {
            head,
            body: Body::Buffer(data),
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

/// Where bytes go: a socket, or (in tests) anything that can take them.
trait IovecSink {
    /// Sends from the start of `iovecs`, as writev(2) does; returns bytes taken.
    fn send_iovecs(&mut self, iovecs: &[libc::iovec]) -> io::Result<usize>;
}

impl IovecSink for TcpStream {
    fn send_iovecs(&mut self, iovecs: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: msghdr is plain data; zeroed is an empty header.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = iovecs.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = iovecs.len() as _;
        // SAFETY: each iovec points into a frame's buffer or a live file mapping
        // (its frame holds the device that owns it) for the whole call; only the
        // kernel reads them, and a mapping of a file that shrank fails with EFAULT.
        let n = unsafe { libc::sendmsg(self.as_raw_fd(), &message, libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

fn iovec(ptr: *const u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: ptr as *mut libc::c_void,
        iov_len: len,
    }
}

/// Writes `frames` in order, in as few vectored writes as the socket allows.
fn write_frames(out: &mut impl IovecSink, frames: &[Frame]) -> io::Result<()> {
    let mut parts: Vec<libc::iovec> = Vec::with_capacity(frames.len() * 3);
    for frame in frames {
        parts.push(iovec(frame.head.as_ptr(), frame.head.len()));
        match &frame.body {
            Body::None => {}
            Body::Buffer(data) => parts.push(iovec(data.as_ptr(), data.len())),
            Body::Mapped { range, .. } => parts.push(iovec(range.as_ptr(), range.len())),
        }
        parts.push(iovec(frame.tail.as_ptr(), frame.tail.len()));
    }
    parts.retain(|p| p.iov_len > 0);
    for chunk in parts.chunks_mut(MAX_PARTS) {
        write_all_iovecs(out, chunk)?;
    }
    Ok(())
}

/// The only C2HData PDU of a command (offset 0, LAST set).
struct DataPdu<'a> {
    cccid: u16,
    /// SUCCESS: the PDU stands for the completion too.
    success: bool,
    /// Bytes of data.
    len: usize,
    /// The data, when its digest is due (None: never digested; the caller made
    /// sure the framing has no data digest).
    digest_of: Option<&'a [u8]>,
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
        let empty = self.len == 0;
        let data_at = if empty {
            after_header
        } else {
            align_up(after_header, (usize::from(framing.send_pda) + 1) * 4)
        };
        let ddgst = ddgst && !empty;
        let plen = if empty {
            after_header
        } else {
            data_at + self.len + if ddgst { DIGEST_LEN } else { 0 }
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
            pdo: if empty { 0 } else { data_at as u8 },
            plen: plen as u32,
        }
        .write(h);
        h[8..10].copy_from_slice(&self.cccid.to_le_bytes());
        // Bytes 12..16 hold the data offset: always 0, one PDU carries it all.
        h[16..20].copy_from_slice(&(self.len as u32).to_le_bytes());
        if hdgst {
            append_digest(out, start);
        }
        out.resize(start + data_at, 0);
        if !ddgst {
            return None;
        }
        let data = self
            .digest_of
            .expect("a data digest is only due for data held in a buffer");
        Some(crc32c(data).to_le_bytes())
    }
}

/// Writes every byte `parts` point at, in order, with as few system calls as the
/// socket allows (`parts` is advanced in place after short writes).
fn write_all_iovecs(out: &mut impl IovecSink, parts: &mut [libc::iovec]) -> io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let mut written = match out.send_iovecs(&parts[first..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the exported file shrank while a read's data was being sent",
                ))
            }
            Err(e) => return Err(e),
        };
        while first < parts.len() {
            let part = &mut parts[first];
            if written < part.iov_len {
                // SAFETY: written < iov_len keeps the pointer inside the part.
                part.iov_base = unsafe { (part.iov_base as *mut u8).add(written) }.cast();
                part.iov_len -= written;
                break;
            }
            written -= part.iov_len;
            first += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{iovec, write_all_iovecs, DataPdu, IovecSink};
    use crate::pdu::{C2HData, Digests, Framing, Pdu};

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
                len: bytes.len(),
                digest_of: Some(&bytes),
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

    /// A sink that takes at most `step` bytes per call.
    struct Trickle {
        out: Vec<u8>,
        step: usize,
    }

    impl IovecSink for Trickle {
        fn send_iovecs(&mut self, iovecs: &[libc::iovec]) -> std::io::Result<usize> {
            let mut left = self.step;
            for iov in iovecs {
                let n = iov.iov_len.min(left);
                // SAFETY: the test's iovecs point into live byte strings.
                let bytes = unsafe { std::slice::from_raw_parts(iov.iov_base as *const u8, n) };
                self.out.extend_from_slice(bytes);
                left -= n;
                if left == 0 {
                    break;
                }
            }
            Ok(self.step - left)
        }
    }

    #[test]
    fn vectored_writes_survive_short_writes() {
        let texts: [&[u8]; 4] = [b"head", b"", b"the data", b"tail"];
        for step in 1..20 {
            let mut parts: Vec<libc::iovec> =
                texts.iter().map(|t| iovec(t.as_ptr(), t.len())).collect();
            let mut w = Trickle {
                out: Vec::new(),
                step,
            };
            write_all_iovecs(&mut w, &mut parts).unwrap();
            assert_eq!(w.out, b"headthe datatail");
        }
    }

    /// A read sent from the file's mapping arrives as the C2HData the codec
    /// decodes, with the file's bytes, followed by its completion (or standing
    /// for it with SUCCESS).
    #[test]
    fn mapped_reads_send_the_file_bytes() {
        use crate::cqe::{Cqe, Status};
        use blockwire_blockdev::{Device, FileDevice, FileOptions};
        use std::io::Read;

        let path = std::env::temp_dir().join(format!("nvme-mapped-{}.img", std::process::id()));
        let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let device = Device::from_device(FileDevice::open(&path, FileOptions::default()).unwrap());
        std::fs::remove_file(&path).unwrap();
        let Some(range) = device.mapped_cached(4096, 128 * 1024).unwrap() else {
            // Without cachestat(2) (Linux < 6.5) residency is unknown: reads copy.
            eprintln!("no cachestat here: reads copy");
            return;
        };
        for (header, success) in [(false, false), (true, true)] {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (server, _) = listener.accept().unwrap();
            let framing = Framing {
                digests: Digests {
                    header,
                    data: false,
                },
                send_pda: 7,
                ..Framing::default()
            };
            let writer = super::Writer::new(server, framing);
            assert!(writer.sends_mapped());
            writer.queue_mapped(Cqe::new(9, Status::SUCCESS), range, device.clone(), success);
            writer.flush();
            drop(writer);
            let mut bytes = Vec::new();
            client.read_to_end(&mut bytes).unwrap();
            let (pdu, used) = crate::pdu::decode(&bytes, &framing).unwrap().unwrap();
            let Pdu::C2HData(d) = pdu else {
                panic!("{pdu:?}")
            };
            assert_eq!((d.cccid, d.last, d.success), (9, true, success));
            assert_eq!(d.data, &data[4096..4096 + 128 * 1024]);
            let rest = &bytes[used..];
            if success {
                assert!(rest.is_empty());
            } else {
                let (pdu, _) = crate::pdu::decode(rest, &framing).unwrap().unwrap();
                assert!(matches!(pdu, Pdu::CapsuleResp(r) if r.cqe.cid == 9));
            }
        }
        let digested = Framing {
            digests: Digests {
                header: false,
                data: true,
            },
            ..Framing::default()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        assert!(!super::Writer::new(server, digested).sends_mapped());
    }
}
